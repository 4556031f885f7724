/* The daemon's process state: one struct server, passed explicitly to every part of the process
 * (the HTTP layer reaches it through each request). main fills cfg, server_start opens the
 * storage and starts the services; main then starts HTTP (api/) over it and calls
 * server_set_ready. At the end: server_quiesce, main stops HTTP, server_stop. This layer knows
 * no HTTP. */
#ifndef DAPOD_SERVER_H
#define DAPOD_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "config.h"
#include "error.h"
#include "judge.h"

struct store;
struct workers;
struct bus;
struct jobs_service;
struct admit;
struct completions;

/* Request counters for GET /metrics, by method and status, plus a latency histogram. Updated
 * with relaxed atomics from the HTTP threads (one request = one update, in the completion
 * callback); read without a lock, so a scrape may see a request counted in one family and not
 * yet in another. */
enum server_http_method {
  SRV_M_GET = 0,
  SRV_M_HEAD,
  SRV_M_POST,
  SRV_M_PUT,
  SRV_M_DELETE,
  SRV_M_PATCH,
  SRV_M_OPTIONS,
  SRV_M_OTHER,
  SRV_M_COUNT
};
#define SRV_STATUS_MIN 100
#define SRV_STATUS_MAX 599
#define SRV_N_STATUS (SRV_STATUS_MAX - SRV_STATUS_MIN + 1)
/* Upper bounds (seconds) of the latency buckets; +Inf is implicit. */
#define SRV_LATENCY_BUCKETS 12
extern const double server_latency_bounds[SRV_LATENCY_BUCKETS];

struct server_counters {
  atomic_uint_fast64_t requests[SRV_M_COUNT][SRV_N_STATUS];     /* by method and status */
  atomic_uint_fast64_t latency_bucket[SRV_LATENCY_BUCKETS + 1]; /* non-cumulative; last: +Inf */
  atomic_uint_fast64_t latency_count;
  atomic_uint_fast64_t latency_sum_us; /* microseconds */
};

struct server {
  struct config cfg;          /* effective configuration; owned (config_deinit in server_stop) */
  struct store *store;        /* SQLite storage, the truth; owned; NULL until server_start */
  char *files_dir;            /* data_dir/files: uploaded datasets (owned) */
  int64_t started_at;         /* Unix seconds of server_start */
  struct timespec start_mono; /* CLOCK_MONOTONIC at server_start: dapod_uptime_seconds */
  atomic_int ready;           /* 1 from server_set_ready (services and HTTP up) to server_quiesce */
  int port;      /* the bound HTTP port (the configured one, or the one picked for 0) */
  int quiesced;  /* server_quiesce ran */
  int jobs_left; /* jobs still running after the shutdown grace (server_quiesce) */
  struct server_counters counters; /* GET /metrics */
  struct admit *admit;             /* the memory ledger of jobs and completions (admit.h); owned */
  struct workers *workers;         /* job threads, each with its compute pool (workers.h); owned */
  struct completions *completions; /* POST /v1/completions' queue and threads (completions.h);
                                      owned */
  struct bus *bus;                 /* wake-ups for event readers after an event is stored; owned */
  char *jobs_dir;                  /* data_dir/jobs: one output folder per job (owned) */
  struct jobs_service *jobsvc;     /* job creation's checks, kept and threaded (jobs.h); owned */
  /* the judge models dapod serves itself, answered by the completion service (judge_serve.h);
     its chat is NULL until the service runs */
  struct judge_served served;
  /* Guards cfg.api_keys, the one setting that changes at run time (SIGHUP): readers are the
   * HTTP threads (api_auth), the writer server_set_api_keys. Writer-preferring, so that a
   * reload is not starved by a steady stream of requests. */
  pthread_rwlock_t keys_lock;
};

/* Initialises s around cfg, which is moved in (the caller's struct is zeroed and must not be
 * deinitialised again): s then owns it. cfg must have passed config_finish. */
void server_init(struct server *s, struct config *cfg);

/* Replaces cfg.api_keys with *keys (moved in: *keys receives the old set, which the caller
 * frees) atomically: a request is checked against the old set or the new one, never a mix.
 * Thread-safe. */
void server_set_api_keys(struct server *s, struct config_api_keys *keys);

/* Opens the storage under cfg.data_dir (creating data_dir, data_dir/files and data_dir/jobs),
 * recovers the jobs a previous process left live (workers_recover), starts the bus, the memory
 * ledger, the workers and the completion service. On failure everything started is stopped again
 * and e names the problem. Not thread-safe; call once. */
int server_start(struct server *s, struct dapo_err *e);

/* HTTP is up on port: /readyz answers ready from now on. */
void server_set_ready(struct server *s, int port);

/* Shutdown, first half (before HTTP stops): not ready; completions still waiting end (those
 * sampling finish); running jobs are asked to pause at a safe point (queued again for the next
 * start) and get up to cfg.shutdown_grace_s to reach it; the bus closes, so every event stream,
 * long-poll and completion wait ends. Idempotent. */
void server_quiesce(struct server *s);

/* Shutdown, second half (after HTTP stopped: no request uses s any more): server_quiesce if not
 * done, the completion threads and the workers are joined, storage closed; then frees everything
 * s owns, cfg included. When
 * a job is still running after the grace period, the workers and storage are left to the
 * process's exit (the job is recovered at the next start). Safe after a failed or no
 * server_start; idempotent. */
void server_stop(struct server *s);

/* A job's events changed in the store (an event appended, a status set): publishes its last
 * event id on the bus, waking its stream readers and long-polls. Thread-safe. */
void server_job_changed(struct server *s, const char *job_id);

/* Counts one finished request (method as sent, status as answered, duration in seconds) in
 * s->counters. Thread-safe (relaxed atomics). */
void server_count_request(struct server *s, const char *method, int status, double seconds);

/* Name of a method bucket ("GET", ..., "other"). Borrowed static string. */
const char *server_method_name(enum server_http_method m);

struct judge_policy;
/* The memory running jobs and completions may use together, by their plans (core/rl/runner.h
 * mem_plan; server/completions.h): memory_limit_bytes, or the machine's physical memory when that
 * is 0. It is the limit of the server's memory ledger (admit.h), where a worker reserves a job's
 * plan as it claims it: the next queued job starts only when its plan fits what running jobs and
 * completions leave free (queue order is kept: the job waits at the head, and models the
 * completion service keeps open are closed to make room); job creation refuses a job whose plan
 * alone exceeds it. */
uint64_t server_memory_limit(const struct server *srv);

/* The judge policy of srv's configuration (hosts borrowed from srv->cfg). */
void server_judge_policy(const struct server *srv, struct judge_policy *pol);

struct pool;
/* Moves every thread of compute pool p (the calling thread, its owner, included) onto
 * cfg.compute_cpus; nothing when that is empty. Called by each job worker and completion thread
 * on its own pool at start. */
void server_pin_compute(const struct server *s, struct pool *p);

/* Seconds since server_start (monotonic clock). */
double server_uptime(const struct server *s);

#endif
