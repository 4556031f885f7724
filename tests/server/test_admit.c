/* The memory ledger (server/admit.h), label unit: reservations fit with the cache counted, a
 * claim counts the cache as free and has the hook close kept models before it returns, a kept
 * model cannot be taken back while the ledger is over its limit, listeners hear of memory given
 * back (and no more once removed), and claims from several threads never take the same memory. */
#include <pthread.h>
#include <stdint.h>

#include "admit.h"
#include "check.h"

struct seen {
  int freed;     /* listener calls */
  uint64_t over; /* last reclaim request */
  int reclaims;  /* hook calls */
  uint64_t kept; /* what the hook may give back (one kept model) */
  struct admit *a;
};

static void on_freed(void *ctx) {
  ((struct seen *)ctx)->freed++;
}

static void reclaim(void *ctx, uint64_t over) {
  struct seen *s = ctx;
  s->reclaims++;
  s->over = over;
  if (s->kept) admit_uncache(s->a, s->kept);
  s->kept = 0;
}

/* A claim that takes want bytes when they fit free. */
static int take(void *ctx, uint64_t free, uint64_t *taken) {
  uint64_t want = *(const uint64_t *)ctx;
  if (want > free) return 1;
  *taken = want;
  return 0;
}

static void test_ledger(void) {
  struct admit *a = admit_new(1000);
  struct seen s = {.a = a};
  struct admit_stats st;
  CHECK(admit_listen(a, on_freed, &s) == 0);
  admit_set_reclaim(a, reclaim, &s);

  CHECK(admit_try(a, 600) == 0);
  CHECK(admit_try(a, 401) == 1); /* 600 + 401 > 1000 */
  CHECK(admit_try(a, 400) == 0);
  admit_release(a, 400);
  CHECK(s.freed == 1);
  /* a model of 300 bytes kept open: reservations count it, a claim does not */
  admit_to_cache(a, 300); /* reserved 300, cached 300 */
  admit_stats(a, &st);
  CHECK(st.reserved == 300 && st.cached == 300 && st.limit == 1000);
  CHECK(s.freed == 1); /* caching frees nothing */
  CHECK(admit_try(a, 401) == 1);
  CHECK(admit_try(a, 400) == 0);
  admit_release(a, 400);
  CHECK(s.freed == 2);

  /* a job of 600 bytes: fits only if the kept model goes, which the hook does before the claim
   * returns */
  s.kept = 300;
  uint64_t want = 600;
  CHECK(admit_claim(a, take, &want) == 0);
  CHECK(s.reclaims == 1 && s.over == 200);
  admit_stats(a, &st);
  CHECK(st.reserved == 900 && st.cached == 0);
  CHECK(s.freed == 3); /* the hook's uncache */
  want = 101;
  CHECK(admit_claim(a, take, &want) == 1); /* nothing fits: nothing taken, no hook */
  CHECK(s.reclaims == 1);
  admit_release(a, 600);

  /* a kept model is not taken back while a claim waits for the hook */
  admit_to_cache(a, 300); /* reserved 0, cached 300 */
  CHECK(admit_from_cache(a, 300) == 0);
  admit_to_cache(a, 300);
  admit_set_reclaim(a, NULL, NULL); /* no hook: the ledger stays over after this claim */
  want = 900;
  CHECK(admit_claim(a, take, &want) == 0);
  CHECK(admit_from_cache(a, 300) == 1);
  CHECK(admit_try(a, 1) == 1);
  admit_uncache(a, 300); /* the model is closed: back under the limit */
  CHECK(admit_try(a, 100) == 0);
  admit_release(a, 1000);

  /* no more calls once removed */
  int before = s.freed;
  admit_unlisten(a, on_freed, &s);
  CHECK(admit_try(a, 10) == 0);
  admit_release(a, 10);
  CHECK(s.freed == before);
  admit_stats(a, &st);
  CHECK(st.reserved == 0 && st.cached == 0);
  admit_free(a);
}

/* Threads claiming and giving back 100-byte pieces of a 1000-byte ledger: never more than ten
 * held at once. */
struct worker {
  struct admit *a;
  int *held, *most;
  pthread_mutex_t *mu;
};

static void *claimer(void *arg) {
  struct worker *w = arg;
  uint64_t want = 100;
  for (int i = 0; i < 2000; i++) {
    if (admit_claim(w->a, take, &want)) continue;
    pthread_mutex_lock(w->mu);
    if (++*w->held > *w->most) *w->most = *w->held;
    pthread_mutex_unlock(w->mu);
    pthread_mutex_lock(w->mu);
    --*w->held;
    pthread_mutex_unlock(w->mu);
    admit_release(w->a, 100);
  }
  return NULL;
}

static void test_threads(void) {
  struct admit *a = admit_new(1000);
  int held = 0, most = 0;
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  struct worker w = {a, &held, &most, &mu};
  pthread_t th[16];
  for (int i = 0; i < 16; i++) pthread_create(&th[i], NULL, claimer, &w);
  for (int i = 0; i < 16; i++) pthread_join(th[i], NULL);
  CHECK(most >= 1 && most <= 10);
  struct admit_stats st;
  admit_stats(a, &st);
  CHECK(st.reserved == 0);
  admit_free(a);
}

int main(void) {
  test_ledger();
  test_threads();
  return check_done("test_admit");
}
