/* Fixed thread pool (pool.h). */
#include "pool.h"

#include <pthread.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <unistd.h>

extern void openblas_set_num_threads(int);

struct pool {
  int n;
  pthread_t *th;
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  unsigned long gen; /* incremented per pool_run */
  int pending;       /* workers still running the current job */
  int quit;
  void (*fn)(void *, int, int);
  void *ctx;
};

struct worker_arg {
  struct pool *p;
  int idx;
};

static _Thread_local struct pool *tl_pool;

struct pool *pool_current(void) {
  return tl_pool;
}
void pool_set_current(struct pool *p) {
  tl_pool = p;
}

int pool_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

void pool_split(int total, int i, int n, int *lo, int *hi) {
  int base = total / n, extra = total % n;
  *lo = i * base + (i < extra ? i : extra);
  *hi = *lo + base + (i < extra);
}

static void *worker(void *arg) {
  struct worker_arg wa = *(struct worker_arg *)arg;
  free(arg);
  struct pool *p = wa.p;
  unsigned long seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->quit && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
    if (p->quit) break;
    seen = p->gen;
    void (*fn)(void *, int, int) = p->fn;
    void *ctx = p->ctx;
    pthread_mutex_unlock(&p->mu);
    fn(ctx, wa.idx, p->n);
    pthread_mutex_lock(&p->mu);
    if (--p->pending == 0) pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

struct pool *pool_new(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  struct pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n_threads;
  p->th = calloc((size_t)n_threads, sizeof *p->th);
  if (!p->th || pthread_mutex_init(&p->mu, NULL)) {
    free(p->th);
    free(p);
    return NULL;
  }
  pthread_cond_init(&p->go, NULL);
  pthread_cond_init(&p->done, NULL);
  openblas_set_num_threads(1);
  for (int i = 1; i < n_threads; i++) {
    struct worker_arg *wa = malloc(sizeof *wa);
    if (wa) {
      wa->p = p;
      wa->idx = i;
    }
    if (!wa || pthread_create(&p->th[i], NULL, worker, wa)) {
      free(wa);
      p->n = i; /* run with the workers we have */
      break;
    }
  }
  return p;
}

void pool_free(struct pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->quit = 1;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
  pthread_cond_destroy(&p->go);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->mu);
  free(p->th);
  free(p);
}

int pool_threads(const struct pool *p) {
  return p ? p->n : 1;
}

void pool_run(struct pool *p, void (*fn)(void *ctx, int i, int n), void *ctx) {
  if (!p || p->n == 1) {
    fn(ctx, 0, 1);
    return;
  }
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->ctx = ctx;
  p->pending = p->n - 1;
  p->gen++;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  fn(ctx, 0, p->n);
  pthread_mutex_lock(&p->mu);
  while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

/* The spin budget of a barrier wait, in pause instructions (tens of cycles each): adapted by
 * pool_barrier_wait between these bounds. */
enum { SPIN_MIN = 64, SPIN_MAX = 4096 };

void pool_barrier_init(struct pool_barrier *b) {
  __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&b->phase, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&b->sleepers, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&b->spin, SPIN_MAX, __ATOMIC_RELAXED);
}

static void futex_wait(int *addr, int val) {
  syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(int *addr) {
  syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

int pool_barrier_wait(struct pool_barrier *b, int n) {
  if (n <= 1) return 0;
  int ph = __atomic_load_n(&b->phase, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == n) {
    /* the last one resets the count before releasing the others, who may arrive at the next
     * barrier at once */
    __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->phase, ph + 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST)) futex_wake_all(&b->phase);
    return 0;
  }
  /* Spin first: the threads of a pool normally run on cores of their own and arrive within
   * microseconds. The budget adapts: it shrinks by half after every wait that had to sleep
   * (another process holds the core the awaited thread needs: spinning only delays it) and grows
   * by an eighth after every wait that spinning ended. Measured (docs/ENGINE.md): a fixed budget
   * of 4096 made decoding 8-14% faster than 256 on a quiet machine and 40% slower with a CPU hog
   * on one of the two cores. */
  int lim = __atomic_load_n(&b->spin, __ATOMIC_RELAXED);
  for (int spins = 0; spins < lim; spins++) {
    if (__atomic_load_n(&b->phase, __ATOMIC_ACQUIRE) != ph) {
      if (lim < SPIN_MAX) __atomic_store_n(&b->spin, lim + lim / 8 + 1, __ATOMIC_RELAXED);
      return 0;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  __atomic_store_n(&b->spin, lim / 2 > SPIN_MIN ? lim / 2 : SPIN_MIN, __ATOMIC_RELAXED);
  __atomic_add_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&b->phase, __ATOMIC_SEQ_CST) == ph) futex_wait(&b->phase, ph);
  __atomic_sub_fetch(&b->sleepers, 1, __ATOMIC_RELAXED);
  return 1;
}
