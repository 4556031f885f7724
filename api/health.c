/* Handlers: GET /healthz (liveness), GET /readyz (readiness: storage open, workers up),
 * GET /metrics (Prometheus text exposition 0.0.4: HTTP requests by method and status, request
 * latency histogram, uptime, jobs by status from the store, busy workers, tokens generated and
 * trained, the completion service's queue, outcomes and model cache, the memory ledger). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "completions.h"
#include "handlers.h"
#include "jobs.h"
#include "http.h"
#include "server.h"
#include "store.h"
#include "workers.h"

int api_health_live(struct api_req *r) {
  return api_reply_json_steal(r, 200, json_pack("{s:s}", "status", "ok"));
}

int api_health_ready(struct api_req *r) {
  if (!atomic_load(&r->srv->ready) || !r->srv->store)
    return api_reply_error(r, API_ERR_UNAVAILABLE, "not ready: storage is not open", NULL);
  if (!workers_up(r->srv->workers))
    return api_reply_error(r, API_ERR_UNAVAILABLE, "not ready: the workers are not running", NULL);
  return api_reply_json_steal(r, 200, json_pack("{s:s}", "status", "ready"));
}

/* A growable text buffer with a hard cap; a failed append sets oom and is otherwise a no-op. */
struct text {
  char *s;
  size_t len, cap;
  int oom;
};
#define TEXT_MAX ((size_t)4 << 20)

static void add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct text *t, const char *fmt, ...) {
  if (t->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->oom = 1;
      return;
    }
    if (t->s && (size_t)n < t->cap - t->len) {
      t->len += (size_t)n;
      return;
    }
    size_t want = t->cap ? t->cap * 2 : 8192;
    while (want < t->len + (size_t)n + 1) want *= 2;
    char *ns = want <= TEXT_MAX ? realloc(t->s, want) : NULL;
    if (!ns) {
      t->oom = 1;
      return;
    }
    t->s = ns, t->cap = want;
  }
}

/* Counts of every job by status: one pass over the job list (pages of STORE_PAGE_MAX).
 * TODO(store): a COUNT(*) GROUP BY status in the store would make this O(1) per scrape. */
static int count_jobs(struct store *st, int64_t counts[STORE_JOB_NSTATUS]) {
  char after[STORE_ID_MAX] = "";
  for (;;) {
    struct store_job_list l = {0};
    struct dapo_err e = {0};
    int rc = store_job_list(st, NULL, NULL, STORE_PAGE_MAX, after[0] ? after : NULL, &l, &e);
    if (rc) return rc;
    for (size_t i = 0; i < l.n; i++)
      if ((int)l.v[i].status >= 0 && l.v[i].status < STORE_JOB_NSTATUS) counts[l.v[i].status]++;
    int more = l.has_more && l.n;
    if (more) snprintf(after, sizeof after, "%s", l.v[l.n - 1].id);
    store_job_list_deinit(&l);
    if (!more) return 0;
  }
}

int api_health_metrics(struct api_req *r) {
  struct server *s = r->srv;
  struct server_counters *c = &s->counters;
  struct text t = {0};
  add(&t, "# HELP dapod_http_requests_total HTTP requests answered, by method and status.\n"
          "# TYPE dapod_http_requests_total counter\n");
  for (int m = 0; m < SRV_M_COUNT; m++)
    for (int k = 0; k < SRV_N_STATUS; k++) {
      uint64_t v = atomic_load_explicit(&c->requests[m][k], memory_order_relaxed);
      if (v)
        add(&t, "dapod_http_requests_total{method=\"%s\",status=\"%d\"} %llu\n",
            server_method_name((enum server_http_method)m), SRV_STATUS_MIN + k,
            (unsigned long long)v);
    }
  add(&t, "# HELP dapod_http_request_duration_seconds Time from a request's first byte to its "
          "completion.\n"
          "# TYPE dapod_http_request_duration_seconds histogram\n");
  uint64_t cum = 0;
  for (int b = 0; b <= SRV_LATENCY_BUCKETS; b++) {
    cum += atomic_load_explicit(&c->latency_bucket[b], memory_order_relaxed);
    if (b < SRV_LATENCY_BUCKETS)
      add(&t, "dapod_http_request_duration_seconds_bucket{le=\"%g\"} %llu\n",
          server_latency_bounds[b], (unsigned long long)cum);
    else
      add(&t, "dapod_http_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
          (unsigned long long)cum);
  }
  add(&t, "dapod_http_request_duration_seconds_sum %.6f\n",
      (double)atomic_load_explicit(&c->latency_sum_us, memory_order_relaxed) / 1e6);
  add(&t, "dapod_http_request_duration_seconds_count %llu\n", (unsigned long long)cum);
  add(&t,
      "# HELP dapod_uptime_seconds Seconds since the daemon started.\n"
      "# TYPE dapod_uptime_seconds gauge\n"
      "dapod_uptime_seconds %.3f\n",
      server_uptime(s));
  add(&t,
      "# HELP dapod_ready 1 when the daemon is ready to serve (GET /readyz).\n"
      "# TYPE dapod_ready gauge\n"
      "dapod_ready %d\n",
      atomic_load(&s->ready) && s->store ? 1 : 0);
  int64_t counts[STORE_JOB_NSTATUS] = {0};
  if (s->store && !count_jobs(s->store, counts)) {
    add(&t, "# HELP dapod_jobs Jobs by status.\n# TYPE dapod_jobs gauge\n");
    for (int k = 0; k < STORE_JOB_NSTATUS; k++)
      add(&t, "dapod_jobs{status=\"%s\"} %lld\n", store_job_status_name((enum store_job_status)k),
          (long long)counts[k]);
  }
  uint64_t gen = 0, trained = 0;
  workers_tokens(s->workers, &gen, &trained);
  add(&t,
      "# HELP dapod_workers Job threads.\n# TYPE dapod_workers gauge\ndapod_workers %d\n"
      "# HELP dapod_workers_busy Job threads running a job now.\n"
      "# TYPE dapod_workers_busy gauge\ndapod_workers_busy %d\n"
      "# HELP dapod_tokens_generated_total Tokens sampled by jobs since the daemon started.\n"
      "# TYPE dapod_tokens_generated_total counter\ndapod_tokens_generated_total %llu\n"
      "# HELP dapod_tokens_trained_total Response tokens trained on since the daemon started.\n"
      "# TYPE dapod_tokens_trained_total counter\ndapod_tokens_trained_total %llu\n"
      "# HELP dapod_metrics_list_renders_total Job metrics lists read from the store and rendered "
      "(requests that found no current kept list).\n"
      "# TYPE dapod_metrics_list_renders_total counter\ndapod_metrics_list_renders_total %llu\n",
      s->cfg.workers, workers_busy(s->workers), (unsigned long long)gen,
      (unsigned long long)trained,
      (unsigned long long)api_jobs_metrics_renders(r->caches->metrics));
  struct completions_stats cs;
  completions_stats(s->completions, &cs);
  add(&t,
      "# HELP dapod_completion_threads Threads sampling completions.\n"
      "# TYPE dapod_completion_threads gauge\ndapod_completion_threads %d\n"
      "# HELP dapod_completions_waiting Completions queued or waiting for memory "
      "(completion_queue bounds them).\n"
      "# TYPE dapod_completions_waiting gauge\ndapod_completions_waiting %d\n"
      "# HELP dapod_completions_waiting_memory 1 while the next completion waits for memory.\n"
      "# TYPE dapod_completions_waiting_memory gauge\ndapod_completions_waiting_memory %d\n"
      "# HELP dapod_completions_running Completions being sampled now.\n"
      "# TYPE dapod_completions_running gauge\ndapod_completions_running %d\n"
      "# HELP dapod_completions_total Completions since the daemon started, by how they ended.\n"
      "# TYPE dapod_completions_total counter\n",
      cs.threads, cs.waiting, cs.waiting_memory, cs.running);
  for (int k = 0; k < COMPLETION_OUTCOMES; k++)
    add(&t, "dapod_completions_total{outcome=\"%s\"} %llu\n",
        completion_outcome_name((enum completion_outcome)k), (unsigned long long)cs.outcomes[k]);
  add(&t,
      "# HELP dapod_completion_model_loads_total Models opened for completions (weights loaded).\n"
      "# TYPE dapod_completion_model_loads_total counter\ndapod_completion_model_loads_total %llu\n"
      "# HELP dapod_completion_model_evictions_total Kept models closed to make room.\n"
      "# TYPE dapod_completion_model_evictions_total counter\n"
      "dapod_completion_model_evictions_total %llu\n"
      "# HELP dapod_completion_models_open Models open for completions (in use or kept).\n"
      "# TYPE dapod_completion_models_open gauge\ndapod_completion_models_open %d\n",
      (unsigned long long)cs.model_loads, (unsigned long long)cs.model_evictions, cs.models_cached);
  if (s->admit) {
    struct admit_stats ms;
    admit_stats(s->admit, &ms);
    add(&t,
        "# HELP dapod_memory_limit_bytes Memory that jobs and completions may use together.\n"
        "# TYPE dapod_memory_limit_bytes gauge\ndapod_memory_limit_bytes %llu\n"
        "# HELP dapod_memory_reserved_bytes Memory reserved by running jobs and completions.\n"
        "# TYPE dapod_memory_reserved_bytes gauge\ndapod_memory_reserved_bytes %llu\n"
        "# HELP dapod_memory_cached_bytes Weights of models kept open that no completion uses "
        "now (given back when memory is needed).\n"
        "# TYPE dapod_memory_cached_bytes gauge\ndapod_memory_cached_bytes %llu\n",
        (unsigned long long)ms.limit, (unsigned long long)ms.reserved,
        (unsigned long long)ms.cached);
  }
  uint64_t ran = 0, kept = 0, offloaded = 0;
  jobs_service_counts(s->jobsvc, &ran, &kept, &offloaded);
  add(&t,
      "# HELP dapod_job_checks_total Checks of a new job's data against its model: run (on the "
      "request's thread or the checker's), answered from a kept check, and of those run, run on "
      "the checker thread (datasets over job_check_inline_bytes).\n"
      "# TYPE dapod_job_checks_total counter\n"
      "dapod_job_checks_total{how=\"ran\"} %llu\ndapod_job_checks_total{how=\"kept\"} %llu\n"
      "dapod_job_checks_total{how=\"offloaded\"} %llu\n",
      (unsigned long long)ran, (unsigned long long)kept, (unsigned long long)offloaded);
  if (t.oom) {
    free(t.s);
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory building the metrics", NULL);
  }
  int rc = api_reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", t.s, t.len);
  free(t.s);
  return rc;
}
