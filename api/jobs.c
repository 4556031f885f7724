/* Handlers: POST /v1/jobs (create: validated at once, every problem listed; Idempotency-Key),
 * GET /v1/jobs (list: ?status=&limit=&after=), GET /v1/jobs/{id} (?wait=N long-polls for a
 * status change on a suspended connection), DELETE /v1/jobs/{id} (finished jobs, with their
 * folder), POST /v1/jobs/{id}/cancel|pause|resume (the status machine; the full job object back),
 * GET /v1/jobs/{id}/metrics (JSON array, one object per step; ?format=csv). */
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <microhttpd.h>

#include "bus.h"
#include "handlers.h"
#include "http.h"
#include "log.h"
#include "jobs.h"
#include "registry.h"
#include "parse.h"
#include "runner.h"
#include "server.h"
#include "store.h"
#include "workers.h"

#define IDEMPOTENCY_KEY_MAX 255
#define WAIT_MAX_S 600 /* ?wait=N: the longest long-poll */
#define CSV_MAX ((size_t)64 << 20)
#define METRICS_CACHE 16                          /* rendered metrics lists kept (by job id) */
#define METRICS_CACHE_MAX_BYTES ((size_t)8 << 20) /* larger lists are not kept */

/* ---- the job object ---- */

static json_t *or_null(json_t *v) {
  return v ? json_incref(v) : json_null();
}

static json_t *time_or_null(int64_t t) {
  return t ? json_integer(t) : json_null();
}

/* The job object of API.md (new reference; NULL when out of memory). */
static json_t *job_json(struct server *srv, const struct store_job *j) {
  json_t *spec = j->spec, *res = j->resolved;
  json_t *o = json_object();
  if (!o) return NULL;
  json_object_set_new(o, "id", json_string(j->id));
  json_object_set_new(o, "object", json_string("job"));
  json_object_set_new(o, "status", json_string(store_job_status_name(j->status)));
  char phase[32];
  int live = j->status == STORE_JOB_RUNNING || j->status == STORE_JOB_PAUSING ||
             j->status == STORE_JOB_CANCELLING;
  json_object_set_new(o, "phase",
                      live && workers_phase(srv->workers, j->id, phase, sizeof phase)
                          ? json_string(phase)
                          : json_null());
  json_t *progress = live ? workers_progress(srv->workers, j->id) : NULL;
  json_object_set_new(o, "progress", progress ? progress : json_null());
  json_object_set_new(o, "queue_position",
                      j->status == STORE_JOB_QUEUED && j->queue_position
                          ? json_integer(j->queue_position)
                          : json_null());
  json_object_set_new(o, "model", or_null(json_object_get(spec, "model")));
  json_object_set_new(o, "training_file", json_string(j->training_file));
  json_object_set_new(o, "validation_file",
                      j->validation_file ? json_string(j->validation_file) : json_null());
  const char *method = json_string_value(json_object_get(res, "method"));
  json_object_set_new(o, "method", json_string(method ? method : "dapo"));
  json_object_set_new(o, "judge", or_null(json_object_get(res, "judge")));
  json_object_set_new(o, "hyperparameters", or_null(json_object_get(res, "hyperparameters")));
  json_object_set_new(o, "seed", or_null(json_object_get(res, "seed")));
  json_object_set_new(o, "chat_template", or_null(json_object_get(spec, "chat_template")));
  json_t *dtype = json_object_get(spec, "checkpoint_dtype");
  json_object_set_new(o, "checkpoint_dtype",
                      json_is_string(dtype) ? json_incref(dtype) : json_string("auto"));
  json_object_set_new(o, "adapter", or_null(json_object_get(res, "adapter")));
  json_object_set_new(o, "episode", or_null(json_object_get(res, "episode")));
  json_object_set_new(o, "response_format", or_null(json_object_get(res, "response_format")));
  json_object_set_new(o, "memory", or_null(json_object_get(res, "memory")));
  json_object_set_new(o, "metadata", j->metadata ? json_incref(j->metadata) : json_object());
  json_object_set_new(o, "suffix", j->suffix ? json_string(j->suffix) : json_null());
  json_object_set_new(o, "step", json_integer(j->step));
  json_object_set_new(o, "total_steps", json_integer(j->total_steps));
  json_object_set_new(o, "created_at", json_integer(j->created_at));
  json_object_set_new(o, "started_at", time_or_null(j->started_at));
  json_object_set_new(o, "finished_at", time_or_null(j->finished_at));
  json_object_set_new(o, "error", or_null(j->error));
  json_object_set_new(o, "latest_metrics", or_null(j->latest_metrics));
  json_t *steps = json_array();
  for (size_t i = 0; steps && i < j->n_ckpt; i++)
    json_array_append_new(steps, json_integer(j->ckpt_steps[i]));
  int64_t last = j->n_ckpt ? j->ckpt_steps[j->n_ckpt - 1] : -1;
  json_object_set_new(o, "checkpoints", steps ? steps : json_null());
  char model[STORE_ID_MAX + 32];
  registry_ckpt_id(j->id, (long long)last, model, sizeof model);
  json_object_set_new(o, "fine_tuned_model",
                      j->status == STORE_JOB_SUCCEEDED && last >= 0 ? json_string(model)
                                                                    : json_null());
  return o;
}

int api_job_load(struct api_req *r, const char *id, struct store_job *out) {
  struct dapo_err e = {0};
  int rc = store_job_get(r->srv->store, id, r->owner, out, &e);
  if (!rc) return 0;
  if (rc == STORE_ENOTFOUND)
    api_reply_errorf(r, API_ERR_NOT_FOUND, "no such job: %.64s", id);
  else
    api_reply_store_error(r, rc, &e);
  return -1;
}

static int reply_job(struct api_req *r, int status, const struct store_job *j) {
  return api_reply_json_steal(r, status, job_json(r->srv, j));
}

/* ---- create ---- */

/* A creation whose data the checker thread checks: the task and how long the request waits. */
struct create_wait {
  struct server *srv;
  struct jobs_task *task;
  int64_t deadline_ms;
};

static void create_wait_free(void *ctx) {
  struct create_wait *w = ctx;
  jobs_task_release(w->srv, w->task);
  free(w);
}

#define CREATE_WAIT_MAX_MS (15 * 60 * 1000) /* the longest a creation waits for its check */

int api_jobs_create(struct api_req *r) {
  const char *key = api_header(r, "Idempotency-Key");
  struct create_wait *w = r->ctx;
  if (!w && key && (!*key || strlen(key) > IDEMPOTENCY_KEY_MAX))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST, "Idempotency-Key: must be 1..%d characters",
                            IDEMPOTENCY_KEY_MAX);
  json_t *errors = json_array();
  if (!errors) return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  struct store_job job;
  struct dapo_err e = {0};
  int existed = 0, rc;
  if (!w) {
    struct jobs_new req = {.body = r->json, .owner = r->owner, .idempotency_key = key};
    struct jobs_task *task = NULL;
    rc = jobs_create(r->srv, &req, &job, &existed, errors, &task, &e);
    if (rc == JOBS_PENDING) {
      if (!(w = calloc(1, sizeof *w))) {
        jobs_task_release(r->srv, task);
        json_decref(errors);
        return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
      }
      *w = (struct create_wait){r->srv, task, api_now_ms() + CREATE_WAIT_MAX_MS};
      r->ctx = w;
      r->ctx_free = create_wait_free;
    }
  } else {
    rc = jobs_create_resume(r->srv, w->task, &job, &existed, errors, &e);
  }
  if (rc == JOBS_PENDING) { /* the checker thread has it: wait for its ticket, suspended */
    json_decref(errors);
    int sw = api_now_ms() < w->deadline_ms
                 ? api_wait_event(r, jobs_task_ticket(w->task), 0, w->deadline_ms)
                 : -1;
    if (sw == 0) return 0;
    if (sw == 1) return api_jobs_create(r); /* done already */
    return api_reply_error(r, API_ERR_UNAVAILABLE,
                           api_now_ms() < w->deadline_ms
                               ? "the daemon is stopping: submit the job again when it is back"
                               : "checking the job's data took too long: try again",
                           NULL);
  }
  if (rc == DAPO_EINVAL) {
    size_t n = json_array_size(errors);
    char detail[64];
    if (!json_is_object(r->json))
      snprintf(detail, sizeof detail, "the body must be a JSON object");
    else
      snprintf(detail, sizeof detail, "%zu problem%s in the job", n, n > 1 ? "s" : "");
    return api_reply_error(r, API_ERR_VALIDATION_FAILED, detail, errors);
  }
  json_decref(errors);
  if (rc == DAPO_ENOMEM) return api_reply_error(r, API_ERR_UNAVAILABLE, e.msg, NULL);
  if (rc == STORE_ECONFLICT)
    return api_reply_errorf(r, API_ERR_CONFLICT,
                            "Idempotency-Key '%.64s' was used before with a different body", key);
  if (rc == STORE_EFULL) {
    rc = api_reply_error(r, API_ERR_TOO_MANY_REQUESTS, e.msg, NULL);
    api_reply_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "30");
    return rc;
  }
  if (rc) return api_reply_store_error(r, rc, &e);
  char loc[STORE_ID_MAX + 16];
  snprintf(loc, sizeof loc, "/v1/jobs/%s", job.id);
  rc = reply_job(r, existed ? 200 : 201, &job);
  store_job_deinit(&job);
  if (!rc) api_reply_header(r, MHD_HTTP_HEADER_LOCATION, loc);
  return rc;
}

/* ---- read ---- */

int api_jobs_list(struct api_req *r) {
  int limit;
  const char *after;
  if (api_page_params(r, &limit, &after)) return 0;
  const char *status = api_query(r, "status");
  struct dapo_err e = {0};
  enum store_job_status st;
  if (status && store_job_status_parse(status, &st, &e))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST, "status: %s", e.msg);
  struct store_job_list l = {0};
  int rc = store_job_list(r->srv->store, r->owner, status, limit, after, &l, &e);
  if (rc == STORE_ENOTFOUND)
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST, "after: no such job '%.64s'", after);
  if (rc) return api_reply_store_error(r, rc, &e);
  json_t *data = json_array();
  for (size_t i = 0; data && i < l.n; i++)
    if (json_array_append_new(data, job_json(r->srv, &l.v[i]))) {
      json_decref(data);
      data = NULL;
    }
  json_t *o = api_list_json(data, l.has_more, l.n ? json_string(l.v[l.n - 1].id) : NULL);
  store_job_list_deinit(&l);
  return api_reply_json_steal(r, 200, o);
}

/* ?wait=N: the status seen first and the deadline (kept across suspensions in r->ctx). */
struct long_poll {
  enum store_job_status status0;
  int64_t deadline_ms;
};

/* The newest event of the job that the bus has announced (0 without a bus). Read before the job
 * itself: a status committed after the read is announced with a newer id, so waiting for one
 * newer than this cannot miss it (the store's last id, read after the job, could already hold
 * that status's event while the job read showed the old status: the wait then slept past it). */
static int64_t announced(struct api_req *r, const char *id) {
  return r->srv->bus ? bus_last_id(r->srv->bus, id) : 0;
}

int api_jobs_get(struct api_req *r) {
  const char *id = r->params[0];
  struct long_poll *lp = r->ctx;
  struct store_job job;
  int64_t seen = 0;
  if (!lp) {
    const char *w = api_query(r, "wait");
    int wait = 0;
    if (w && parse_int(w, 0, WAIT_MAX_S, &wait, "wait", NULL))
      return api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                              "wait: '%.32s' is not a number of seconds in [0, %d]", w, WAIT_MAX_S);
    if (wait > 0) seen = announced(r, id);
    if (api_job_load(r, id, &job)) return 0;
    if (wait > 0 && !store_job_status_terminal(job.status)) {
      if (!(lp = calloc(1, sizeof *lp))) {
        store_job_deinit(&job);
        return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
      }
      lp->status0 = job.status;
      lp->deadline_ms = api_now_ms() + (int64_t)wait * 1000;
      r->ctx = lp;
      r->ctx_free = free;
    }
  } else { /* resumed */
    seen = announced(r, id);
    if (api_job_load(r, id, &job)) return 0;
  }
  /* A few rounds at most: each is a status read, then a wait for the next event. */
  for (int round = 0; lp && round < 8; round++) {
    if (job.status != lp->status0 || api_now_ms() >= lp->deadline_ms) break;
    int rc = api_wait_event(r, id, seen, lp->deadline_ms);
    if (rc == 0) {
      store_job_deinit(&job);
      return 0; /* suspended: this handler runs again on the next event or the deadline */
    }
    if (rc < 0) break;
    store_job_deinit(&job);
    seen = announced(r, id);
    if (api_job_load(r, id, &job)) return 0;
  }
  int rc = reply_job(r, 200, &job);
  store_job_deinit(&job);
  return rc;
}

/* ---- lifecycle ---- */

/* Replies 409 for a request the status machine refuses, with the job's current status. */
static int reply_transition(struct api_req *r, const char *id, const char *what,
                            const struct dapo_err *e) {
  struct store_job job;
  if (api_job_load(r, id, &job)) return 0;
  const char *name = store_job_status_name(job.status);
  json_t *ext = json_pack("{s:s}", "job_status", name);
  char detail[640];
  snprintf(detail, sizeof detail, "job %s is %s: it cannot be %s (%s)", id, name, what, e->msg);
  int rc = api_reply_error_ext(r, API_ERR_CONFLICT, detail, NULL, ext);
  json_decref(ext);
  store_job_deinit(&job);
  return rc;
}

enum action { ACT_CANCEL = API_JOB_CANCEL, ACT_PAUSE = API_JOB_PAUSE, ACT_RESUME = API_JOB_RESUME };

int api_job_request(struct api_req *r, int act, struct store_job *job, struct dapo_err *e) {
  struct server *srv = r->srv;
  const char *id = r->params[0];
  int rc = act == ACT_CANCEL  ? store_job_request_cancel(srv->store, id, r->owner, job, e)
           : act == ACT_PAUSE ? store_job_request_pause(srv->store, id, r->owner, job, e)
                              : store_job_request_resume(srv->store, id, r->owner, job, e);
  if (rc) return rc;
  if (act == ACT_CANCEL) workers_signal(srv->workers, id, 1, 0);
  if (act == ACT_PAUSE) workers_signal(srv->workers, id, 0, 1);
  server_job_changed(srv, id);
  if (act == ACT_RESUME) workers_wake(srv->workers);
  return 0;
}

static int lifecycle(struct api_req *r, enum action act) {
  const char *id = r->params[0];
  struct store_job job;
  struct dapo_err e = {0};
  int rc = api_job_request(r, act, &job, &e);
  if (rc == STORE_ETRANSITION)
    return reply_transition(r, id,
                            act == ACT_CANCEL  ? "cancelled"
                            : act == ACT_PAUSE ? "paused"
                                               : "resumed",
                            &e);
  if (rc == STORE_ENOTFOUND)
    return api_reply_errorf(r, API_ERR_NOT_FOUND, "no such job: %.64s", id);
  if (rc) return api_reply_store_error(r, rc, &e);
  rc = reply_job(r, 200, &job);
  store_job_deinit(&job);
  return rc;
}

int api_jobs_cancel(struct api_req *r) {
  return lifecycle(r, ACT_CANCEL);
}

int api_jobs_pause(struct api_req *r) {
  return lifecycle(r, ACT_PAUSE);
}

int api_jobs_resume(struct api_req *r) {
  return lifecycle(r, ACT_RESUME);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)ftw;
  if ((flag == FTW_DP ? rmdir(path) : unlink(path)) && errno != ENOENT)
    LOG(WARN, "deleting %s: %s", path, strerror(errno));
  return 0;
}

int api_jobs_delete(struct api_req *r) {
  struct server *srv = r->srv;
  const char *id = r->params[0];
  struct dapo_err e = {0};
  int rc = store_job_delete(srv->store, id, r->owner, &e);
  if (rc == STORE_ESTATE) return reply_transition(r, id, "deleted before it has finished", &e);
  if (rc == STORE_ENOTFOUND)
    return api_reply_errorf(r, API_ERR_NOT_FOUND, "no such job: %.64s", id);
  if (rc) return api_reply_store_error(r, rc, &e);
  char dir[4096];
  if (!workers_job_dir(srv, id, dir, sizeof dir))
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); /* a missing folder is fine */
  bus_forget(srv->bus, id);
  LOG(INFO, "job %s deleted", id);
  return api_reply_json_steal(
      r, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "job", "deleted", 1));
}

/* ---- metrics ---- */

/* One object per step: the training metrics with the step's evaluation merged in. */
static json_t *metrics_rows(const struct store_metric_list *l) {
  json_t *rows = json_array();
  json_t *cur = NULL;
  int64_t cur_step = -1;
  for (size_t i = 0; rows && i < l->n; i++) {
    if (!cur || l->v[i].step != cur_step) {
      cur = json_object();
      if (!cur || json_array_append_new(rows, cur)) {
        json_decref(rows);
        return NULL;
      }
      cur_step = l->v[i].step;
      json_object_set_new(cur, "step", json_integer(cur_step));
    }
    json_object_update(cur, l->v[i].data);
  }
  return rows;
}

static int cmp_keys(const void *a, const void *b) {
  const char *x = *(const char *const *)a, *y = *(const char *const *)b;
  if (!strcmp(x, "step")) return -1;
  if (!strcmp(y, "step")) return 1;
  return strcmp(x, y);
}

/* A CSV field: numbers and booleans as JSON writes them, strings quoted ("" doubled). */
static void csv_value(FILE *f, const json_t *v) {
  if (!v || json_is_null(v)) return;
  if (json_is_string(v)) {
    fputc('"', f);
    for (const char *p = json_string_value(v); *p; p++) {
      if (*p == '"') fputc('"', f);
      fputc(*p, f);
    }
    fputc('"', f);
    return;
  }
  char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
  if (t) fputs(t, f);
  free(t);
}

static int reply_csv(struct api_req *r, const json_t *rows) {
  json_t *keyset = json_object();
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)row, k, v) json_object_set_new(keyset, k, json_true());
  }
  size_t nk = json_object_size(keyset);
  const char **keys = malloc(sizeof *keys * (nk ? nk : 1));
  char *buf = NULL;
  size_t len = 0;
  FILE *f = keys ? open_memstream(&buf, &len) : NULL;
  if (!f) {
    free(keys);
    json_decref(keyset);
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  }
  size_t n = 0;
  const char *k;
  json_t *v;
  json_object_foreach(keyset, k, v) keys[n++] = k;
  qsort(keys, n, sizeof *keys, cmp_keys);
  for (size_t c = 0; c < n; c++) fprintf(f, "%s%s", c ? "," : "", keys[c]);
  fputs("\r\n", f);
  json_array_foreach(rows, i, row) {
    for (size_t c = 0; c < n; c++) {
      if (c) fputc(',', f);
      csv_value(f, json_object_get(row, keys[c]));
    }
    fputs("\r\n", f);
  }
  int bad = fclose(f) != 0 || len > CSV_MAX;
  free(keys);
  json_decref(keyset);
  int rc = bad ? api_reply_error(r, API_ERR_UNAVAILABLE, "the CSV does not fit", NULL)
               : api_reply_text(r, 200, "text/csv; charset=utf-8", buf, len);
  free(buf);
  return rc;
}

/* ---- the rendered metrics list, kept per job ----
 * A dashboard (or wrk) polling GET /v1/jobs/{id}/metrics would otherwise read and parse every
 * row under the store's lock and render the whole array on each request, which also delays the
 * job's own writes. The JSON body is kept with the job's owner and the store's metrics
 * generation it was read at, and served (one copy) while store_metrics_gen has not moved.
 * When it has, one request renders the list again and the others asking for the same job wait
 * for it (at most METRICS_WAIT_MS) instead of all reading the store at once after every step. */

#define METRICS_WAIT_MS 2000

struct metrics_slot {
  char job[STORE_ID_MAX];
  char *owner;  /* the job's owner (owned) */
  uint64_t gen; /* store_metrics_gen of the rows rendered */
  char *body;   /* the reply body (owned), NULL: empty slot */
  size_t len;
  char rendering[STORE_ID_MAX]; /* the job a request is rendering for this slot, "" none */
  uint64_t rendering_gen;       /* ... at least at this generation */
};

struct api_metrics_cache {
  pthread_mutex_t mu;
  pthread_cond_t rendered; /* a renderer finished (kept a list or gave up) */
  uint64_t renders;        /* JSON lists read and rendered (atomic) */
  struct metrics_slot v[METRICS_CACHE];
};

struct api_metrics_cache *api_metrics_cache_new(void) {
  struct api_metrics_cache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->mu, NULL);
  pthread_condattr_t ca; /* the deadline of a waiting request is on the monotonic clock */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->rendered, &ca);
  pthread_condattr_destroy(&ca);
  return c;
}

void api_metrics_cache_free(struct api_metrics_cache *c) {
  if (!c) return;
  for (int i = 0; i < METRICS_CACHE; i++) free(c->v[i].owner), free(c->v[i].body);
  pthread_cond_destroy(&c->rendered);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

uint64_t api_jobs_metrics_renders(const struct api_metrics_cache *c) {
  return c ? __atomic_load_n(&c->renders, __ATOMIC_RELAXED) : 0;
}

static struct metrics_slot *metrics_slot(struct api_metrics_cache *c, const char *job) {
  return &c->v[api_fnv1a(API_FNV_SEED, job) % METRICS_CACHE];
}

/* Replies the kept body of job id when it is current (generation >= gen) and visible to r: 1
 * (and *rc the reply's result). Else 0, and *claimed = 1 when this request is now the one
 * rendering job id (it must call metrics_render_done). While another request renders the job's
 * current list, waits for it first. */
static int metrics_from_cache(struct api_req *r, const char *id, uint64_t gen, int *rc,
                              int *claimed) {
  struct api_metrics_cache *c = r->caches->metrics;
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until); /* the condition variable's clock */
  until.tv_sec += METRICS_WAIT_MS / 1000;
  until.tv_nsec += (long)(METRICS_WAIT_MS % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  int hit = 0;
  *claimed = 0;
  pthread_mutex_lock(&c->mu);
  struct metrics_slot *m = metrics_slot(c, id);
  for (;;) {
    if (m->body && m->gen >= gen && !strcmp(m->job, id) &&
        (!r->owner || !strcmp(m->owner, r->owner))) {
      *rc = api_reply_text(r, 200, "application/json; charset=utf-8", m->body, m->len);
      hit = 1;
      break;
    }
    if (!strcmp(m->rendering, id) && m->rendering_gen >= gen) {
      if (pthread_cond_timedwait(&c->rendered, &c->mu, &until) == ETIMEDOUT)
        break; /* render it ourselves */
      continue;
    }
    if (!m->rendering[0]) {
      snprintf(m->rendering, sizeof m->rendering, "%s", id);
      m->rendering_gen = gen;
      *claimed = 1;
    }
    break;
  }
  pthread_mutex_unlock(&c->mu);
  return hit;
}

/* The rendering of job id claimed by metrics_from_cache is over (a list kept, or an error). */
static void metrics_render_done(struct api_metrics_cache *c, const char *id) {
  pthread_mutex_lock(&c->mu);
  struct metrics_slot *m = metrics_slot(c, id);
  if (!strcmp(m->rendering, id)) m->rendering[0] = 0;
  pthread_cond_broadcast(&c->rendered);
  pthread_mutex_unlock(&c->mu);
}

/* Keeps body (stolen) as job id's list at generation gen, unless a newer one is kept. */
static void metrics_to_cache(struct api_metrics_cache *c, const char *id, const char *owner,
                             uint64_t gen, char *body, size_t len) {
  char *o = len <= METRICS_CACHE_MAX_BYTES ? strdup(owner ? owner : "") : NULL;
  if (!o) {
    free(body);
    return;
  }
  pthread_mutex_lock(&c->mu);
  struct metrics_slot *m = metrics_slot(c, id);
  if (m->body && !strcmp(m->job, id) && m->gen >= gen) {
    free(o), free(body); /* another request kept the same or a newer list */
  } else {
    free(m->owner), free(m->body);
    snprintf(m->job, sizeof m->job, "%s", id);
    m->owner = o, m->gen = gen, m->body = body, m->len = len;
  }
  pthread_mutex_unlock(&c->mu);
}

/* Reads, renders and replies job id's metrics list (JSON, kept for the next requests, or CSV). */
static int metrics_render(struct api_req *r, const char *id, int csv) {
  struct store_job job;
  if (api_job_load(r, id, &job)) return 0;
  struct store_metric_list l = {0};
  struct dapo_err e = {0};
  int rc = store_metrics_list(r->srv->store, id, &l, &e);
  if (rc) {
    store_job_deinit(&job);
    return api_reply_store_error(r, rc, &e);
  }
  json_t *rows = metrics_rows(&l);
  uint64_t gen = l.gen;
  store_metric_list_deinit(&l);
  if (!rows) {
    store_job_deinit(&job);
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  }
  if (csv) {
    store_job_deinit(&job);
    rc = reply_csv(r, rows);
    json_decref(rows);
    return rc;
  }
  __atomic_add_fetch(&r->caches->metrics->renders, 1, __ATOMIC_RELAXED);
  /* the body api_reply_json_steal would send: compact JSON and a newline */
  size_t n = json_dumpb(rows, NULL, 0, JSON_COMPACT);
  char *body = n ? malloc(n + 1) : NULL;
  if (body && json_dumpb(rows, body, n, JSON_COMPACT) == n) {
    body[n] = '\n';
    rc = api_reply_text(r, 200, "application/json; charset=utf-8", body, n + 1);
    metrics_to_cache(r->caches->metrics, id, job.owner, gen, body, n + 1);
    json_decref(rows);
  } else {
    free(body);
    rc = api_reply_json_steal(r, 200, rows);
  }
  store_job_deinit(&job);
  return rc;
}

int api_jobs_metrics(struct api_req *r) {
  const char *id = r->params[0];
  const char *format = api_query(r, "format");
  if (format && strcmp(format, "json") && strcmp(format, "csv"))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST, "format: '%.32s' is not json or csv",
                            format);
  if (format && !strcmp(format, "csv")) return metrics_render(r, id, 1);
  int rc, claimed;
  if (metrics_from_cache(r, id, store_metrics_gen(r->srv->store), &rc, &claimed)) return rc;
  rc = metrics_render(r, id, 0);
  if (claimed) metrics_render_done(r->caches->metrics, id);
  return rc;
}
