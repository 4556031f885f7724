/* The compute path's thread pool (core/engine/pool.h): pool_split covers [0, total) exactly in
 * nearly equal parts, and pool_run calls each thread's share once per run, the caller's included,
 * for 1 to 3 threads. */
#include <stdatomic.h>

#include "check.h"
#include "pool.h"

struct pool_probe {
  atomic_int calls[8];
  atomic_int n_seen;
};

static void pool_task(void *ctx, int i, int n) {
  struct pool_probe *p = ctx;
  atomic_fetch_add(&p->calls[i], 1);
  atomic_store(&p->n_seen, n);
}

static void check_pool(void) {
  for (int total = 0; total < 40; total++)
    for (int n = 1; n <= 7; n++) {
      int next = 0;
      for (int i = 0; i < n; i++) {
        int lo, hi;
        pool_split(total, i, n, &lo, &hi);
        CHECK_MSG(lo == next && hi >= lo && hi - lo <= total / n + 1, "split %d/%d of %d", i, n,
                  total);
        next = hi;
      }
      CHECK(next == total);
    }
  for (int threads = 1; threads <= 3; threads++) {
    struct pool *pl = pool_new(threads);
    CHECK(pl && pool_threads(pl) == threads);
    struct pool_probe p = {0};
    for (int round = 0; round < 5; round++) pool_run(pl, pool_task, &p);
    CHECK(atomic_load(&p.n_seen) == threads);
    for (int i = 0; i < 8; i++) CHECK(atomic_load(&p.calls[i]) == (i < threads ? 5 : 0));
    pool_free(pl);
  }
  CHECK(pool_cpu_count() >= 1);
}

int main(void) {
  check_pool();
  return check_done("test_pool");
}
