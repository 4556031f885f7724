/* The event bus (bus.h): a hash table of per-job entries {last published id, condition
 * variable} under one mutex, plus a generation counter with its own condition variable for
 * waiters interested in any job. Entries live until their job is forgotten: one small struct per
 * job that published in this process. */
#include "bus.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBUCKETS 256
#define JOB_ID_MAX 64

struct entry {
  char job_id[JOB_ID_MAX];
  int64_t last_id;
  int waiters;
  pthread_cond_t cond;
  struct entry *next;
};

struct bus {
  pthread_mutex_t mu;
  pthread_cond_t any; /* generation changed */
  uint64_t gen;
  int closed;
  struct entry *buckets[NBUCKETS];
};

static unsigned hash(const char *s) {
  unsigned h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h % NBUCKETS;
}

static int cond_init_mono(pthread_cond_t *c) {
  pthread_condattr_t a;
  if (pthread_condattr_init(&a)) return -1;
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(c, &a);
  pthread_condattr_destroy(&a);
  return rc ? -1 : 0;
}

/* The absolute CLOCK_MONOTONIC time timeout_ms from now. */
static struct timespec deadline_in(int timeout_ms) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  if (timeout_ms < 0) timeout_ms = 0;
  t.tv_sec += timeout_ms / 1000;
  t.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

struct bus *bus_new(void) {
  struct bus *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  if (pthread_mutex_init(&b->mu, NULL)) {
    free(b);
    return NULL;
  }
  if (cond_init_mono(&b->any)) {
    pthread_mutex_destroy(&b->mu);
    free(b);
    return NULL;
  }
  return b;
}

void bus_free(struct bus *b) {
  if (!b) return;
  for (int i = 0; i < NBUCKETS; i++) {
    struct entry *x = b->buckets[i];
    while (x) {
      struct entry *next = x->next;
      pthread_cond_destroy(&x->cond);
      free(x);
      x = next;
    }
  }
  pthread_cond_destroy(&b->any);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

/* The entry of job_id, created when create is set (NULL: none, or out of memory). Locked. */
static struct entry *find(struct bus *b, const char *job_id, int create) {
  unsigned h = hash(job_id);
  for (struct entry *x = b->buckets[h]; x; x = x->next)
    if (!strcmp(x->job_id, job_id)) return x;
  if (!create || strlen(job_id) >= JOB_ID_MAX) return NULL;
  struct entry *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  if (cond_init_mono(&x->cond)) {
    free(x);
    return NULL;
  }
  memcpy(x->job_id, job_id, strlen(job_id) + 1);
  x->next = b->buckets[h];
  b->buckets[h] = x;
  return x;
}

void bus_publish(struct bus *b, const char *job_id, int64_t event_id) {
  pthread_mutex_lock(&b->mu);
  struct entry *x = find(b, job_id, 1);
  if (x && event_id > x->last_id) {
    x->last_id = event_id;
    pthread_cond_broadcast(&x->cond);
  }
  /* Without an entry (out of memory) waiters of this job still see the generation change. */
  b->gen++;
  pthread_cond_broadcast(&b->any);
  pthread_mutex_unlock(&b->mu);
}

int64_t bus_last_id(struct bus *b, const char *job_id) {
  pthread_mutex_lock(&b->mu);
  struct entry *x = find(b, job_id, 0);
  int64_t id = x ? x->last_id : 0;
  pthread_mutex_unlock(&b->mu);
  return id;
}

int bus_wait(struct bus *b, const char *job_id, int64_t after_id, int timeout_ms) {
  struct timespec until = deadline_in(timeout_ms);
  pthread_mutex_lock(&b->mu);
  struct entry *x = find(b, job_id, 1);
  int rc = 0;
  if (!x) { /* out of memory: a bounded sleep on the generation instead */
    uint64_t g = b->gen;
    while (!b->closed && b->gen == g)
      if (pthread_cond_timedwait(&b->any, &b->mu, &until) == ETIMEDOUT) break;
    rc = b->closed ? -1 : b->gen != g;
    pthread_mutex_unlock(&b->mu);
    return rc;
  }
  x->waiters++;
  for (;;) {
    if (b->closed) {
      rc = -1;
      break;
    }
    if (x->last_id > after_id) {
      rc = 1;
      break;
    }
    if (pthread_cond_timedwait(&x->cond, &b->mu, &until) == ETIMEDOUT) {
      rc = b->closed ? -1 : x->last_id > after_id;
      break;
    }
  }
  x->waiters--;
  pthread_mutex_unlock(&b->mu);
  return rc;
}

uint64_t bus_generation(struct bus *b) {
  pthread_mutex_lock(&b->mu);
  uint64_t g = b->gen;
  pthread_mutex_unlock(&b->mu);
  return g;
}

uint64_t bus_wait_any(struct bus *b, uint64_t seen, int timeout_ms) {
  struct timespec until = deadline_in(timeout_ms);
  pthread_mutex_lock(&b->mu);
  while (!b->closed && b->gen == seen)
    if (pthread_cond_timedwait(&b->any, &b->mu, &until) == ETIMEDOUT) break;
  uint64_t g = b->gen;
  pthread_mutex_unlock(&b->mu);
  return g;
}

void bus_kick(struct bus *b) {
  pthread_mutex_lock(&b->mu);
  b->gen++;
  pthread_cond_broadcast(&b->any);
  pthread_mutex_unlock(&b->mu);
}

void bus_forget(struct bus *b, const char *job_id) {
  pthread_mutex_lock(&b->mu);
  unsigned h = hash(job_id);
  for (struct entry **p = &b->buckets[h]; *p; p = &(*p)->next) {
    struct entry *x = *p;
    if (strcmp(x->job_id, job_id)) continue;
    if (x->waiters) {
      pthread_cond_broadcast(&x->cond); /* they time out or see the job gone in the store */
    } else {
      *p = x->next;
      pthread_cond_destroy(&x->cond);
      free(x);
    }
    break;
  }
  b->gen++;
  pthread_cond_broadcast(&b->any);
  pthread_mutex_unlock(&b->mu);
}

void bus_close(struct bus *b) {
  pthread_mutex_lock(&b->mu);
  b->closed = 1;
  b->gen++;
  pthread_cond_broadcast(&b->any);
  for (int i = 0; i < NBUCKETS; i++)
    for (struct entry *x = b->buckets[i]; x; x = x->next) pthread_cond_broadcast(&x->cond);
  pthread_mutex_unlock(&b->mu);
}

int bus_closed(struct bus *b) {
  pthread_mutex_lock(&b->mu);
  int c = b->closed;
  pthread_mutex_unlock(&b->mu);
  return c;
}
