/* The memory ledger (admit.h): two sums under one mutex, the listeners called after memory came
 * free, and the reclaim hook of the model cache. */
#include "admit.h"

#include <pthread.h>
#include <stdlib.h>

#include "log.h"

struct listener {
  void (*fn)(void *ctx);
  void *ctx;
};

struct admit {
  pthread_mutex_t mu;  /* guards everything below */
  pthread_cond_t idle; /* calling reached 0 */
  uint64_t limit;
  uint64_t reserved, cached;
  struct listener listeners[ADMIT_LISTENERS]; /* fn NULL: a free slot */
  int calling; /* threads calling listeners or the hook now (admit_unlisten waits for 0) */
  void (*reclaim)(void *ctx, uint64_t over);
  void *reclaim_ctx;
};

struct admit *admit_new(uint64_t limit) {
  struct admit *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  if (pthread_mutex_init(&a->mu, NULL)) {
    free(a);
    return NULL;
  }
  if (pthread_cond_init(&a->idle, NULL)) {
    pthread_mutex_destroy(&a->mu);
    free(a);
    return NULL;
  }
  a->limit = limit;
  return a;
}

void admit_free(struct admit *a) {
  if (!a) return;
  if (a->reserved || a->cached)
    LOG(WARN, "memory ledger: %llu bytes reserved and %llu cached at exit",
        (unsigned long long)a->reserved, (unsigned long long)a->cached);
  pthread_cond_destroy(&a->idle);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

uint64_t admit_limit(const struct admit *a) {
  return a->limit; /* set once by admit_new */
}

void admit_stats(struct admit *a, struct admit_stats *out) {
  pthread_mutex_lock(&a->mu);
  *out = (struct admit_stats){.limit = a->limit, .reserved = a->reserved, .cached = a->cached};
  pthread_mutex_unlock(&a->mu);
}

/* limit - held, 0 when held is over it. Locked. */
static uint64_t room(const struct admit *a, uint64_t held) {
  return held < a->limit ? a->limit - held : 0;
}

int admit_try(struct admit *a, uint64_t bytes) {
  pthread_mutex_lock(&a->mu);
  int fits = bytes <= room(a, a->reserved + a->cached);
  if (fits) a->reserved += bytes;
  pthread_mutex_unlock(&a->mu);
  return fits ? 0 : 1;
}

/* Calls every listener without the lock (admit_unlisten waits for the calls to end). */
static void notify(struct admit *a) {
  struct listener l[ADMIT_LISTENERS];
  pthread_mutex_lock(&a->mu);
  for (int i = 0; i < ADMIT_LISTENERS; i++) l[i] = a->listeners[i];
  a->calling++;
  pthread_mutex_unlock(&a->mu);
  for (int i = 0; i < ADMIT_LISTENERS; i++)
    if (l[i].fn) l[i].fn(l[i].ctx);
  pthread_mutex_lock(&a->mu);
  if (--a->calling == 0) pthread_cond_broadcast(&a->idle);
  pthread_mutex_unlock(&a->mu);
}

/* Takes bytes off *sum; a release of more than is held is a bug of the caller, logged and
 * survived. Locked. */
static void take_off(uint64_t *sum, uint64_t bytes, const char *what) {
  if (bytes > *sum) {
    LOG(ERROR, "memory ledger: %s %llu bytes but only %llu are held", what,
        (unsigned long long)bytes, (unsigned long long)*sum);
    bytes = *sum;
  }
  *sum -= bytes;
}

void admit_release(struct admit *a, uint64_t bytes) {
  if (!bytes) return;
  pthread_mutex_lock(&a->mu);
  take_off(&a->reserved, bytes, "releasing");
  pthread_mutex_unlock(&a->mu);
  notify(a);
}

void admit_to_cache(struct admit *a, uint64_t bytes) {
  pthread_mutex_lock(&a->mu);
  take_off(&a->reserved, bytes, "caching");
  a->cached += bytes;
  pthread_mutex_unlock(&a->mu);
}

int admit_from_cache(struct admit *a, uint64_t bytes) {
  pthread_mutex_lock(&a->mu);
  int ok = a->reserved + a->cached <= a->limit;
  if (ok) {
    take_off(&a->cached, bytes, "using cached");
    a->reserved += bytes;
  }
  pthread_mutex_unlock(&a->mu);
  return ok ? 0 : 1;
}

void admit_uncache(struct admit *a, uint64_t bytes) {
  if (!bytes) return;
  pthread_mutex_lock(&a->mu);
  take_off(&a->cached, bytes, "uncaching");
  pthread_mutex_unlock(&a->mu);
  notify(a);
}

int admit_claim(struct admit *a, int (*claim)(void *ctx, uint64_t free, uint64_t *taken),
                void *ctx) {
  uint64_t taken = 0;
  pthread_mutex_lock(&a->mu);
  int rc = claim(ctx, room(a, a->reserved), &taken);
  if (rc) taken = 0;
  a->reserved += taken;
  uint64_t held = a->reserved + a->cached;
  uint64_t over = held > a->limit ? held - a->limit : 0;
  void (*reclaim)(void *, uint64_t) = over ? a->reclaim : NULL;
  void *rctx = a->reclaim_ctx;
  if (reclaim) a->calling++;
  pthread_mutex_unlock(&a->mu);
  if (!reclaim) return rc;
  reclaim(rctx, over);
  pthread_mutex_lock(&a->mu);
  if (--a->calling == 0) pthread_cond_broadcast(&a->idle);
  pthread_mutex_unlock(&a->mu);
  return rc;
}

void admit_set_reclaim(struct admit *a, void (*reclaim)(void *ctx, uint64_t over), void *ctx) {
  pthread_mutex_lock(&a->mu);
  a->reclaim = reclaim;
  a->reclaim_ctx = ctx;
  while (!reclaim && a->calling) pthread_cond_wait(&a->idle, &a->mu);
  pthread_mutex_unlock(&a->mu);
}

int admit_listen(struct admit *a, void (*fn)(void *ctx), void *ctx) {
  int rc = -1;
  pthread_mutex_lock(&a->mu);
  for (int i = 0; i < ADMIT_LISTENERS && rc; i++)
    if (!a->listeners[i].fn) {
      a->listeners[i] = (struct listener){fn, ctx};
      rc = 0;
    }
  pthread_mutex_unlock(&a->mu);
  return rc;
}

void admit_unlisten(struct admit *a, void (*fn)(void *ctx), void *ctx) {
  pthread_mutex_lock(&a->mu);
  for (int i = 0; i < ADMIT_LISTENERS; i++)
    if (a->listeners[i].fn == fn && a->listeners[i].ctx == ctx) a->listeners[i].fn = NULL;
  while (a->calling) pthread_cond_wait(&a->idle, &a->mu);
  pthread_mutex_unlock(&a->mu);
}
