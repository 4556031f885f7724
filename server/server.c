/* The daemon's process state (server.h): start storage, recovery, bus, the memory ledger, workers
 * and completions; quiesce and stop them in reverse; and the request counters behind
 * GET /metrics. HTTP is main's. */
#include "server.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admit.h"
#include "bus.h"
#include "completions.h"
#include "grader.h"
#include "jobs.h"
#include "judge_serve.h"
#include "log.h"
#include "pool.h"
#include "store.h"
#include "workers.h"

const double server_latency_bounds[SRV_LATENCY_BUCKETS] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                           0.25,  0.5,   1,    2.5,   5,    10};

void server_init(struct server *s, struct config *cfg) {
  memset(s, 0, sizeof *s);
  s->cfg = *cfg;
  memset(cfg, 0, sizeof *cfg);
  pthread_rwlockattr_t a;
  pthread_rwlockattr_init(&a);
  pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&s->keys_lock, &a);
  pthread_rwlockattr_destroy(&a);
}

void server_set_api_keys(struct server *s, struct config_api_keys *keys) {
  pthread_rwlock_wrlock(&s->keys_lock);
  struct config_api_keys old = s->cfg.api_keys;
  s->cfg.api_keys = *keys;
  pthread_rwlock_unlock(&s->keys_lock);
  *keys = old;
}

/* Removes "<id>.jsonl.tmp" files a previous process left behind (uploads cut short by a crash):
 * they were never inserted, so nothing refers to them. */
static void sweep_tmp_uploads(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t n = strlen(de->d_name);
    if (n <= 10 || strcmp(de->d_name + n - 10, ".jsonl.tmp")) continue;
    char p[4096];
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= sizeof p) continue;
    if (!unlink(p)) LOG(INFO, "removed an unfinished upload: %s", p);
  }
  closedir(d);
}

/* dir/name as a new string, created (mode 0700) when missing. */
static char *make_subdir(const char *dir, const char *name, struct dapo_err *e) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (!p) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return NULL;
  }
  snprintf(p, n, "%s/%s", dir, name);
  if (mkdir(p, 0700) && errno != EEXIST) {
    dapo_errf(e, DAPO_EIO, "%s: %s", p, strerror(errno));
    free(p);
    return NULL;
  }
  return p;
}

/* compute_cpus: this thread (and so every thread started after it: HTTP, workers) runs on the
 * other CPUs; the workers move themselves and their compute pools onto compute_cpus. */
static int keep_off_compute_cpus(const struct config *c, struct dapo_err *e) {
  struct config_cpus cpus;
  if (config_parse_cpus(c->compute_cpus, &cpus, e)) return dapo_err_prefix(e, "compute_cpus: ");
  cpu_set_t rest;
  CPU_ZERO(&rest);
  int n = 0;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  for (int i = 0; i < online && i < 1024 && i < CPU_SETSIZE; i++)
    if (!cpus.on[i]) CPU_SET(i, &rest), n++;
  if (!n || pthread_setaffinity_np(pthread_self(), sizeof rest, &rest))
    return dapo_errf(e, DAPO_EINVAL, "compute_cpus: cannot keep the other threads off %s",
                     c->compute_cpus);
  LOG(INFO, "compute_cpus %s: jobs train there; HTTP and the rest use the other %d CPU%s",
      c->compute_cpus, n, n > 1 ? "s" : "");
  return 0;
}

int server_start(struct server *s, struct dapo_err *e) {
  clock_gettime(CLOCK_MONOTONIC, &s->start_mono);
  s->started_at = (int64_t)time(NULL);
  if (!(s->store = store_open(s->cfg.data_dir, e))) return e ? e->code : DAPO_EIO;
  if (!(s->files_dir = make_subdir(s->cfg.data_dir, "files", e)) ||
      !(s->jobs_dir = make_subdir(s->cfg.data_dir, "jobs", e))) {
    int rc = e ? e->code : DAPO_EIO;
    server_stop(s);
    return rc;
  }
  sweep_tmp_uploads(s->files_dir);
  if (!(s->bus = bus_new())) {
    server_stop(s);
    return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  }
  if (!(s->admit = admit_new(server_memory_limit(s)))) {
    server_stop(s);
    return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  }
  if (!(s->jobsvc = jobs_service_start(s, e))) {
    server_stop(s);
    return e ? e->code : DAPO_EIO;
  }
  int rc = workers_recover(s, e);
  if (!rc && *s->cfg.compute_cpus) rc = keep_off_compute_cpus(&s->cfg, e);
  /* the completion service first: the served judge models of the jobs the workers take run on it */
  if (!rc && !(s->completions = completions_start(s, e))) rc = e ? e->code : DAPO_EIO;
  if (!rc) {
    s->served = (struct judge_served){judge_serve_chat, judge_serve_check, s};
    struct judge_policy pol;
    server_judge_policy(s, &pol);
    rc = grader_models_check(s->cfg.judge_models, &pol, "judge_models", e);
  }
  if (!rc && !(s->workers = workers_start(s, e))) rc = e ? e->code : DAPO_EIO;
  if (rc) {
    server_stop(s);
    return rc;
  }
  return 0;
}

void server_set_ready(struct server *s, int port) {
  s->port = port;
  atomic_store(&s->ready, 1);
}

void server_quiesce(struct server *s) {
  atomic_store(&s->ready, 0);
  if (s->quiesced) return;
  s->quiesced = 1;
  completions_quiesce(s->completions); /* waiting completions end now, not after the jobs' grace */
  if (s->workers) {
    s->jobs_left = workers_stop(s->workers, s->cfg.shutdown_grace_s);
    if (s->jobs_left)
      LOG(WARN,
          "%d job%s did not reach a safe point within shutdown_grace_s (%d s); %s recovered "
          "at the next start",
          s->jobs_left, s->jobs_left > 1 ? "s" : "", s->cfg.shutdown_grace_s,
          s->jobs_left > 1 ? "they are" : "it is");
  }
  if (s->bus) bus_close(s->bus); /* event streams and long-polls end */
}

void server_stop(struct server *s) {
  server_quiesce(s);
  if (s->jobs_left) return; /* a worker still uses the store and the bus: the exit ends it */
  completions_free(s->completions); /* before the workers: it calls them through the ledger */
  s->completions = NULL;
  workers_free(s->workers);
  s->workers = NULL;
  admit_free(s->admit);
  s->admit = NULL;
  jobs_service_stop(s->jobsvc); /* after HTTP: no request holds a check any more */
  s->jobsvc = NULL;
  bus_free(s->bus);
  s->bus = NULL;
  store_close(s->store);
  s->store = NULL;
  free(s->files_dir);
  s->files_dir = NULL;
  free(s->jobs_dir);
  s->jobs_dir = NULL;
  config_deinit(&s->cfg);
}

void server_job_changed(struct server *s, const char *job_id) {
  int64_t id = 0;
  struct dapo_err e = {0};
  if (!s->bus || !s->store) return;
  if (store_event_last_id(s->store, job_id, &id, &e)) {
    LOG(WARN, "job %s: reading its last event id: %s", job_id, e.msg);
    bus_kick(s->bus); /* readers re-read the store on any wake-up */
    return;
  }
  bus_publish(s->bus, job_id, id);
}

static enum server_http_method method_of(const char *m) {
  static const char *const NAMES[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"};
  for (int i = 0; i < (int)(sizeof NAMES / sizeof NAMES[0]); i++)
    if (!strcmp(m, NAMES[i])) return (enum server_http_method)i;
  return SRV_M_OTHER;
}

const char *server_method_name(enum server_http_method m) {
  static const char *const NAMES[SRV_M_COUNT] = {"GET",    "HEAD",  "POST",    "PUT",
                                                 "DELETE", "PATCH", "OPTIONS", "other"};
  return (int)m >= 0 && m < SRV_M_COUNT ? NAMES[m] : "other";
}

void server_count_request(struct server *s, const char *method, int status, double seconds) {
  struct server_counters *c = &s->counters;
  if (status >= SRV_STATUS_MIN && status <= SRV_STATUS_MAX)
    atomic_fetch_add_explicit(&c->requests[method_of(method)][status - SRV_STATUS_MIN], 1,
                              memory_order_relaxed);
  int b = 0;
  while (b < SRV_LATENCY_BUCKETS && seconds > server_latency_bounds[b]) b++;
  atomic_fetch_add_explicit(&c->latency_bucket[b], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->latency_count, 1, memory_order_relaxed);
  if (seconds > 0)
    atomic_fetch_add_explicit(&c->latency_sum_us, (uint_fast64_t)(seconds * 1e6),
                              memory_order_relaxed);
}

double server_uptime(const struct server *s) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - s->start_mono.tv_sec) +
         (double)(t.tv_nsec - s->start_mono.tv_nsec) / 1e9;
}

/* Each thread of the pool (its owner's included) moves onto compute_cpus. */
static void pin_task(void *ctx, int i, int n) {
  const cpu_set_t *set = ctx;
  (void)i, (void)n;
  if (pthread_setaffinity_np(pthread_self(), sizeof *set, set))
    LOG(WARN, "compute_cpus: a compute thread could not be moved (%s)", strerror(errno));
}

void server_pin_compute(const struct server *s, struct pool *p) {
  struct config_cpus cpus;
  struct dapo_err e = {0};
  if (!*s->cfg.compute_cpus || config_parse_cpus(s->cfg.compute_cpus, &cpus, &e))
    return; /* checked by config_finish */
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int i = 0; i < 1024 && i < CPU_SETSIZE; i++)
    if (cpus.on[i]) CPU_SET(i, &set);
  pool_run(p, pin_task, &set);
}

uint64_t server_memory_limit(const struct server *srv) {
  if (srv->cfg.memory_limit_bytes) return srv->cfg.memory_limit_bytes;
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : UINT64_MAX;
}

void server_judge_policy(const struct server *srv, struct judge_policy *pol) {
  const struct config_list *hosts = &srv->cfg.judge_allowed_hosts;
  *pol = (struct judge_policy){.allowed_hosts = (const char *const *)hosts->v,
                               .n_allowed = hosts->n,
                               .allow_private = srv->cfg.judge_allow_private,
                               .judge_models = srv->cfg.judge_models,
                               .served = srv->served.chat ? &srv->served : NULL};
}
