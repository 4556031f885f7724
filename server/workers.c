/* The job threads (workers.h): claim, take the admitted spec (jobs.h), run, record; the
 * in-memory cancel/pause words and phase of running jobs; startup recovery and the shutdown
 * pause. */
#include "workers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "admit.h"
#include "bus.h"
#include "jobs.h"
#include "launch.h"
#include "log.h"
#include "parse.h"
#include "pool.h"
#include "registry.h"
#include "runner.h"
#include "server.h"
#include "store.h"

/* A worker waits this long for a wake-up before looking at the queue again anyway (a safety
 * net: every queueing wakes it), and this long after a failed claim (a store error). */
#define IDLE_RECHECK_MS 30000
#define CLAIM_RETRY_MS 1000

/* The in-memory words of the job a worker runs, which the runner polls; "" = idle. */
struct running {
  char job_id[STORE_ID_MAX];
  char phase[32]; /* what the runner does now, "" before its first phase (workers_phase) */
  /* The latest progress report of the step under way (workers_progress); has_progress 0 before
   * the first and once the step's metrics are recorded. */
  int has_progress;
  struct runner_progress progress; /* .pass points at progress_pass */
  char progress_pass[16];
  /* Set by HTTP threads (workers_signal) and the stop, read by the runner: relaxed __atomic
   * loads and stores only (a plain volatile access is a data race, which ThreadSanitizer reports)
   */
  volatile int cancel, pause;
};

struct worker {
  struct workers *w;
  int idx;
  pthread_t th;
  int started;
  struct pool *pool; /* owned: this worker's compute threads */
  struct running run;
};

struct workers {
  struct server *srv;
  pthread_mutex_t mu;  /* guards everything below and every worker's run */
  pthread_cond_t wake; /* a job was queued, or stopping */
  pthread_cond_t idle; /* a worker finished a job */
  uint64_t gen;        /* wake-ups so far */
  int stopping;
  int busy;      /* workers running a job */
  int listening; /* on_memory_freed is one of the ledger's listeners */
  int n;
  struct worker *v;
  atomic_uint_fast64_t tokens_generated, tokens_trained;
};

/* ---- small helpers ---- */

static struct timespec mono_in(int ms) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

int workers_job_dir(const struct server *srv, const char *job_id, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s/jobs/%s", srv->cfg.data_dir, job_id);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* Appends a "log" event {level, message, step} to job_id and publishes it. */
static void log_event(struct server *srv, const char *job_id, const char *level, int64_t step,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void log_event(struct server *srv, const char *job_id, const char *level, int64_t step,
                      const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_t *d =
      json_pack("{s:s, s:s, s:I}", "level", level, "message", msg, "step", (json_int_t)step);
  struct dapo_err e = {0};
  if (!d || store_event_append(srv->store, job_id, "log", d, NULL, &e))
    LOG(WARN, "job %s: could not record a log event (%s): %s", job_id, d ? e.msg : "no memory",
        msg);
  json_decref(d);
  server_job_changed(srv, job_id);
}

/* ---- one running job ---- */

/* Sorted set of steps (events already in the store). */
struct steps {
  int64_t *v;
  size_t n, cap;
};

static int steps_has(const struct steps *s, int64_t x) {
  size_t lo = 0, hi = s->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (s->v[mid] == x) return 1;
    if (s->v[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return 0;
}

static int steps_add(struct steps *s, int64_t x) {
  if (steps_has(s, x)) return 0;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    int64_t *nv = realloc(s->v, cap * sizeof *nv);
    if (!nv) return -1;
    s->v = nv, s->cap = cap;
  }
  size_t i = s->n;
  while (i > 0 && s->v[i - 1] > x) {
    s->v[i] = s->v[i - 1];
    i--;
  }
  s->v[i] = x;
  s->n++;
  return 0;
}

struct jobrun {
  struct worker *wk;
  struct server *srv;
  const char *id; /* borrowed: the claimed job's id */
  char out[PATH_MAX];
  int64_t step;                   /* the job's recorded step (only ever raised) */
  struct steps train, eval, ckpt; /* steps whose events are already stored */
  json_t *latest;                 /* latest_metrics as recorded (owned) */
};

/* Eval metrics carry "eval/..." keys only; train metrics none. */
static const char *metrics_kind(const json_t *data) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)data, key, v) if (!strncmp(key, "eval/", 5)) return "eval";
  return "train";
}

/* Reads which metrics and checkpoint events the job already has (a restart recomputes steps
 * after its last checkpoint bit-identically; their events must not be stored twice). */
static int load_seen(struct jobrun *jr) {
  int64_t after = 0;
  for (;;) {
    struct store_event_list l = {0};
    struct dapo_err e = {0};
    int rc = store_event_list(jr->srv->store, jr->id, after, STORE_EVENTS_MAX, &l, &e);
    if (rc) {
      LOG(ERROR, "job %s: reading its events: %s", jr->id, e.msg);
      return rc;
    }
    for (size_t i = 0; i < l.n && !rc; i++) {
      const struct store_event *ev = &l.v[i];
      json_t *st = json_object_get(ev->data, "step");
      if (!json_is_integer(st)) continue;
      int64_t s = json_integer_value(st);
      if (!strcmp(ev->type, "metrics"))
        rc = steps_add(strcmp(metrics_kind(ev->data), "eval") ? &jr->train : &jr->eval, s);
      else if (!strcmp(ev->type, "checkpoint"))
        rc = steps_add(&jr->ckpt, s);
    }
    int more = l.has_more && l.n;
    if (l.n) after = l.v[l.n - 1].id;
    store_event_list_deinit(&l);
    if (rc) return DAPO_ENOMEM;
    if (!more) return 0;
  }
}

/* Stores an event and publishes its id (known here: no second store call to read it back). */
static int append_event(struct jobrun *jr, const char *type, const json_t *data) {
  struct dapo_err e = {0};
  int64_t id = 0;
  int rc = store_event_append(jr->srv->store, jr->id, type, data, &id, &e);
  if (rc) {
    LOG(ERROR, "job %s: storing a %s event: %s", jr->id, type, e.msg);
    return rc;
  }
  bus_publish(jr->srv->bus, jr->id, id);
  return 0;
}

/* Records a step's metrics (row, the job's step and latest_metrics, the event) once: a step
 * recomputed after a restart is not stored again. */
static int record_metrics(struct jobrun *jr, int64_t step, int eval, int64_t generated,
                          int64_t trained, const json_t *data) {
  struct dapo_err e = {0};
  const char *kind = eval ? "eval" : "train";
  struct steps *seen = eval ? &jr->eval : &jr->train;
  /* the step's (or its evaluation's) passes are over: the job object shows no progress, also
   * for a step recomputed after a restart */
  pthread_mutex_lock(&jr->wk->w->mu);
  jr->wk->run.has_progress = 0;
  pthread_mutex_unlock(&jr->wk->w->mu);
  /* A step recomputed after a restart is not stored again: the row and the event already there
   * stay the pair that was announced (the timings of a recomputation differ). */
  if (steps_has(seen, step)) return 0;
  /* latest_metrics: the newest step's training metrics, with its evaluation merged in */
  struct store_job_patch p = {0};
  json_t *latest = NULL;
  if (!eval && step >= jr->step) {
    latest = json_deep_copy(data);
    p.set = STORE_SET_STEP | STORE_SET_METRICS;
    p.step = step;
  } else if (eval && step == jr->step) {
    latest = jr->latest ? json_deep_copy(jr->latest) : json_object();
    if (latest) json_object_update(latest, (json_t *)data);
    p.set = STORE_SET_METRICS;
  }
  if (p.set && !latest) return DAPO_ENOMEM;
  p.latest_metrics = latest;
  /* the row, the job's step and the event in one transaction: a crash between them left a job
   * at a step whose metrics event was missing until the step was recomputed (the crash test) */
  int64_t id = 0;
  int rc = store_metrics_record(jr->srv->store, jr->id, step, kind, data, &p, &id, &e);
  if (rc) {
    json_decref(latest);
    LOG(ERROR, "job %s: recording the metrics of step %" PRId64 ": %s", jr->id, step, e.msg);
    return rc;
  }
  bus_publish(jr->srv->bus, jr->id, id);
  if (p.set) {
    json_decref(jr->latest);
    jr->latest = latest;
    if (!eval) jr->step = step;
  }
  if (generated > 0) atomic_fetch_add(&jr->wk->w->tokens_generated, (uint_fast64_t)generated);
  if (trained > 0) atomic_fetch_add(&jr->wk->w->tokens_trained, (uint_fast64_t)trained);
  return steps_add(seen, step) ? DAPO_ENOMEM : 0;
}

/* Removes the index rows of checkpoints the runner pruned (keep_checkpoints). */
static void prune_rows(struct jobrun *jr) {
  struct store_ckpt_list l = {0};
  struct dapo_err e = {0};
  if (store_ckpt_list(jr->srv->store, jr->id, &l, &e)) return;
  for (size_t i = 0; i < l.n; i++) {
    char p[PATH_MAX + 32];
    struct stat st;
    snprintf(p, sizeof p, "%s/trainer_state.json", l.v[i].path);
    if (stat(p, &st) == 0) continue;
    if (store_ckpt_delete(jr->srv->store, jr->id, l.v[i].step, &e))
      LOG(WARN, "job %s: unlisting the pruned checkpoint of step %" PRId64 ": %s", jr->id,
          l.v[i].step, e.msg);
  }
  store_ckpt_list_deinit(&l);
}

/* Indexes the complete checkpoint of step in folder dir with its manifest and metrics (borrowed,
 * may be NULL), and announces it once: the row and its event in one transaction (a crash between
 * two left the index listing a checkpoint with no event until the next start's fill_gaps). */
static int record_checkpoint(struct jobrun *jr, int64_t step, const char *dir,
                             const struct ckpt_manifest *man, const json_t *metrics) {
  json_t *files = json_array();
  for (int i = 0; files && i < man->n; i++) {
    const struct ckpt_file *f = &man->files[i];
    if (json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "name", f->name, "bytes",
                                               (json_int_t)f->bytes, "sha256", f->sha256))) {
      json_decref(files);
      files = NULL;
    }
  }
  if (!files) return DAPO_ENOMEM;
  struct dapo_err e = {0};
  json_t *d = NULL; /* the event, unless this step's was stored before */
  int told = steps_has(&jr->ckpt, step), rc = 0;
  int64_t id = 0;
  if (!told) {
    char model[STORE_ID_MAX + 32];
    registry_ckpt_id(jr->id, (long long)step, model, sizeof model);
    d = json_pack("{s:I, s:s, s:O, s:O?}", "step", (json_int_t)step, "model", model, "files", files,
                  "metrics", metrics && !json_is_null(metrics) ? metrics : NULL);
    if (!d) rc = DAPO_ENOMEM;
  }
  if (!rc)
    rc = told ? store_ckpt_put(jr->srv->store, jr->id, step, dir, files, metrics, &e)
              : store_ckpt_record(jr->srv->store, jr->id, step, dir, files, metrics, d, &id, &e);
  json_decref(files);
  json_decref(d);
  if (rc) {
    if (e.msg[0])
      LOG(ERROR, "job %s: indexing the checkpoint of step %" PRId64 ": %s", jr->id, step, e.msg);
    return rc;
  }
  if (!told) {
    bus_publish(jr->srv->bus, jr->id, id);
    if (steps_add(&jr->ckpt, step)) rc = DAPO_ENOMEM;
  }
  prune_rows(jr);
  return rc;
}

static int on_metrics(void *ctx, const struct runner_metrics *m) {
  return record_metrics(ctx, m->step, m->eval, m->tokens_generated, m->tokens_trained, m->data);
}

static int on_checkpoint(void *ctx, const struct runner_checkpoint *c) {
  return record_checkpoint(ctx, c->step, c->path, c->manifest, c->metrics);
}

static int on_log(void *ctx, const char *level, int64_t step, const char *message) {
  struct jobrun *jr = ctx;
  json_t *d =
      json_pack("{s:s, s:s, s:I}", "level", level, "message", message, "step", (json_int_t)step);
  int rc = d ? append_event(jr, "log", d) : DAPO_ENOMEM;
  json_decref(d);
  return rc;
}

/* The phase lives in memory only: a step changes it about twenty times (sampling and judging
 * per generation round), it means nothing after a restart, and a store transaction (fsync) for
 * each took 10-15% of a tiny job's step time and queued the job behind the readers. */
static void on_phase(void *ctx, const char *phase) {
  struct jobrun *jr = ctx;
  struct workers *w = jr->wk->w;
  pthread_mutex_lock(&w->mu);
  snprintf(jr->wk->run.phase, sizeof jr->wk->run.phase, "%s", phase);
  pthread_mutex_unlock(&w->mu);
}

/* A progress report as the event's data and the job object's progress (new reference). */
static json_t *progress_json(const struct runner_progress *p) {
  int gen = !strcmp(p->pass, "generation") || !strcmp(p->pass, "evaluation");
  return json_pack("{s:I, s:s, s:i, s:I, s:I, s:s, s:I}", "step", (json_int_t)p->step, "pass",
                   p->pass, "round", p->round, "done", (json_int_t)p->done, "total",
                   (json_int_t)p->total, "unit", gen ? "sequences" : "micro_batches", "tokens",
                   (json_int_t)p->tokens);
}

/* Progress of a long pass of the step: a stored "progress" event, so that the events list and a
 * stream that reconnects have it as well as a live one, and the latest report in memory for the
 * job object (workers_progress). The runner reports only passes above progress_min_work, at most
 * 21 times a pass, so their store writes cost nothing noticeable (docs/TRAINING.md, "Progress").
 * Progress is not worth failing a job over: a write that fails is logged. */
static void on_progress(void *ctx, const struct runner_progress *p) {
  struct jobrun *jr = ctx;
  struct workers *w = jr->wk->w;
  struct running *run = &jr->wk->run;
  json_t *d = progress_json(p);
  if (!d || append_event(jr, "progress", d))
    LOG(WARN,
        "job %s: could not record a progress event (step %" PRId64 ", %s %" PRId64 " of %" PRId64
        ")",
        jr->id, p->step, p->pass, p->done, p->total);
  json_decref(d);
  /* after the event: a job object that shows a report finds it in the events list too */
  pthread_mutex_lock(&w->mu);
  run->progress = *p;
  snprintf(run->progress_pass, sizeof run->progress_pass, "%s", p->pass);
  run->progress.pass = run->progress_pass;
  run->has_progress = 1;
  pthread_mutex_unlock(&w->mu);
}

/* Before a (re)start: the runner resumes from the newest complete checkpoint N without telling
 * of it again. A previous process may have died after writing it but before its checkpoint or
 * its step's metrics event was stored; those are recorded now from the folder. */
static int fill_gaps(struct jobrun *jr) {
  /* A multi-process job's ranks can outlive a daemon that died (until the launcher's
   * PR_SET_PDEATHSIG reaches them) and write checkpoints of steps whose metrics nobody recorded.
   * A checkpoint more than one step past the last recorded step is set aside, so that its steps
   * are computed again (bit-identically) and each is told once. An in-process job never leaves
   * one: it dies with the daemon. */
  int64_t told = jr->train.n ? jr->train.v[jr->train.n - 1] : 0, n;
  while ((n = runner_latest_checkpoint(jr->out)) > told + 1 && n > 0) {
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/checkpoints/step-%" PRId64, jr->out, n);
    if (ckpt_remove_folder(dir)) {
      LOG(ERROR, "job %s: cannot remove %s: %s", jr->id, dir, strerror(errno));
      break;
    }
    log_event(jr->srv, jr->id, "warning", told,
              "the checkpoint of step %" PRId64 " was written after the last step this daemon "
              "recorded (%" PRId64 "): removed, its steps are computed again",
              n, told);
  }
  n = runner_latest_checkpoint(jr->out);
  if (n < 0 || (steps_has(&jr->ckpt, n) && (n == 0 || steps_has(&jr->train, n)))) return 0;
  char dir[PATH_MAX + 64], p[PATH_MAX + 96];
  snprintf(dir, sizeof dir, "%s/checkpoints/step-%" PRId64, jr->out, n);
  snprintf(p, sizeof p, "%s/trainer_state.json", dir);
  json_error_t je;
  json_t *state = json_load_file(p, 0, &je);
  json_t *metrics = json_object_get(state, "metrics");
  if (json_is_null(metrics)) metrics = NULL;
  int rc = 0;
  if (!steps_has(&jr->ckpt, n)) {
    struct ckpt_manifest man;
    struct dapo_err e = {0};
    rc = ckpt_manifest_read(dir, &man, &e);
    if (rc)
      LOG(ERROR, "job %s: reading the checkpoint of step %" PRId64 ": %s", jr->id, n, e.msg);
    else
      rc = record_checkpoint(jr, n, dir, &man, metrics);
  }
  if (!rc && n > 0 && metrics && !steps_has(&jr->train, n))
    rc = record_metrics(jr, n, 0, 0, 0, metrics);
  json_decref(state);
  return rc;
}

static json_t *error_json(const struct runner_result *res) {
  const struct failure_info *f = failure_info(res->failure);
  return json_pack("{s:s, s:s, s:s?, s:s}", "code", f->name, "message",
                   res->message[0] ? res->message : f->meaning, "param",
                   res->param[0] ? res->param : NULL, "category", f->category);
}

static void set_status(struct server *srv, const char *id, enum store_job_status to,
                       const json_t *error, const json_t *extra) {
  struct dapo_err e = {0};
  if (store_job_set_status(srv->store, id, to, error, extra, NULL, &e))
    LOG(ERROR, "job %s: setting status %s: %s", id, store_job_status_name(to), e.msg);
  server_job_changed(srv, id);
}

/* Records how runner_run ended. */
static void finish(struct jobrun *jr, const struct runner_result *res) {
  struct server *srv = jr->srv;
  struct store_job cur;
  struct dapo_err e = {0};
  enum store_job_status now = STORE_JOB_RUNNING;
  if (!store_job_get(srv->store, jr->id, NULL, &cur, &e)) {
    now = cur.status;
    store_job_deinit(&cur);
  }
  json_t *err = NULL;
  switch (res->status) {
  case RUNNER_SUCCEEDED:
    LOG(INFO, "job %s succeeded at step %" PRId64, jr->id, res->step);
    set_status(srv, jr->id, STORE_JOB_SUCCEEDED, NULL, NULL);
    break;
  case RUNNER_CANCELLED:
    LOG(INFO, "job %s cancelled at step %" PRId64, jr->id, res->step);
    set_status(srv, jr->id, STORE_JOB_CANCELLED, NULL, NULL);
    break;
  case RUNNER_FAILED:
    LOG(INFO, "job %s failed at step %" PRId64 ": %s (%s): %s", jr->id, res->step,
        failure_info(res->failure)->name, failure_info(res->failure)->category, res->message);
    err = error_json(res);
    set_status(srv, jr->id, STORE_JOB_FAILED, err, NULL);
    json_decref(err);
    break;
  case RUNNER_PAUSED:
    if (now == STORE_JOB_CANCELLING) {
      set_status(srv, jr->id, STORE_JOB_CANCELLED, NULL, NULL);
    } else if (now == STORE_JOB_PAUSING) {
      LOG(INFO, "job %s paused after step %" PRId64, jr->id, res->step);
      set_status(srv, jr->id, STORE_JOB_PAUSED, NULL, NULL);
    } else {
      /* the daemon is stopping: queued again, keeping its place */
      log_event(srv, jr->id, "info", res->step,
                "the daemon is stopping: the job stopped after step %" PRId64
                " with a checkpoint and is queued again; it resumes from there when the daemon "
                "starts",
                res->step);
      set_status(srv, jr->id, STORE_JOB_QUEUED, NULL, NULL);
    }
    break;
  }
}

static void run_job(struct worker *wk, struct store_job *job) {
  struct workers *w = wk->w;
  struct server *srv = w->srv;
  struct jobrun jr = {.wk = wk, .srv = srv, .id = job->id, .step = job->step};
  if (job->latest_metrics) jr.latest = json_incref(job->latest_metrics);
  server_job_changed(srv, job->id); /* the claim's "running" event */

  pthread_mutex_lock(&w->mu);
  int stopping = w->stopping;
  if (!stopping) {
    snprintf(wk->run.job_id, sizeof wk->run.job_id, "%s", job->id);
    wk->run.phase[0] = '\0';
    wk->run.has_progress = 0;
    __atomic_store_n(&wk->run.cancel, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wk->run.pause, 0, __ATOMIC_RELAXED);
    w->busy++;
  }
  pthread_mutex_unlock(&w->mu);
  if (stopping) { /* claimed as the daemon began to stop: back to the queue, same place */
    set_status(srv, job->id, STORE_JOB_QUEUED, NULL, NULL);
    json_decref(jr.latest);
    return;
  }
  /* A request that reached the store before the record existed. */
  struct store_job cur;
  struct dapo_err e = {0};
  if (!store_job_get(srv->store, job->id, NULL, &cur, &e)) {
    if (cur.cancel_requested || cur.status == STORE_JOB_CANCELLING)
      __atomic_store_n(&wk->run.cancel, 1, __ATOMIC_RELAXED);
    if (cur.pause_requested || cur.status == STORE_JOB_PAUSING)
      __atomic_store_n(&wk->run.pause, 1, __ATOMIC_RELAXED);
    store_job_deinit(&cur);
  }

  json_t *errors = json_array();
  struct job_spec spec;
  struct runner_result res = {0};
  int n = errors ? jobs_run_spec(srv, job, &spec, errors) : -1;
  if (n != 0) {
    res.status = RUNNER_FAILED;
    json_t *x = json_array_get(errors, 0);
    res.failure = n < 0 ? FAIL_OUT_OF_MEMORY : FAIL_INVALID_SPEC;
    snprintf(res.param, sizeof res.param, "%s",
             n < 0 ? "" : json_string_value(json_object_get(x, "field")));
    snprintf(res.message, sizeof res.message, "%s",
             n < 0 ? "out of memory" : json_string_value(json_object_get(x, "message")));
  } else if (workers_job_dir(srv, job->id, jr.out, sizeof jr.out) ||
             (mkdir(jr.out, 0700) && errno != EEXIST)) {
    res.status = RUNNER_FAILED;
    res.failure = FAIL_IO_ERROR;
    snprintf(res.message, sizeof res.message, "cannot create the job's folder %.400s: %s", jr.out,
             strerror(errno));
  } else if (load_seen(&jr) || fill_gaps(&jr)) {
    res.status = RUNNER_FAILED;
    res.failure = FAIL_EVENT_STORE_FAILED;
    snprintf(res.message, sizeof res.message, "could not read or record the job's events");
  } else {
    struct judge_policy pol;
    server_judge_policy(srv, &pol);
    struct runner_hooks hooks = {.ctx = &jr,
                                 .metrics = on_metrics,
                                 .checkpoint = on_checkpoint,
                                 .log = on_log,
                                 .phase = on_phase,
                                 .progress = on_progress};
    struct runner_opts opts = {.judge_policy = &pol,
                               .cancel = &wk->run.cancel,
                               .pause = &wk->run.pause,
                               .progress_min_work =
                                   srv->cfg.progress_every_pass ? 0 : RUNNER_PROGRESS_MIN_WORK,
                               .pool = wk->pool};
    LOG(INFO, "job %s: running (worker %d, step %" PRId64 " of %" PRId64 ")", job->id, wk->idx,
        job->step, job->total_steps);
    if (spec.processes > 1) /* ranks started by the configured launcher (launch.h) */
      launch_run(&srv->cfg, &spec, jr.out, &hooks, &opts, &res);
    else
      runner_run(&spec, jr.out, &hooks, &opts, &res);
  }
  jobspec_deinit(&spec);
  json_decref(errors);

  finish(&jr, &res);

  pthread_mutex_lock(&w->mu);
  wk->run.job_id[0] = '\0';
  wk->run.phase[0] = '\0';
  wk->run.has_progress = 0;
  w->busy--;
  pthread_cond_broadcast(&w->idle);
  pthread_mutex_unlock(&w->mu);
  free(jr.train.v);
  free(jr.eval.v);
  free(jr.ckpt.v);
  json_decref(jr.latest);
}

/* admit_claim's decision: the next queued job when its plan fits what the ledger has free. */
struct claim {
  struct store *store;
  struct store_job *job;
  struct dapo_err *e;
  int rc; /* store_job_claim_within's */
};

static int claim_within(void *ctx, uint64_t free, uint64_t *taken) {
  struct claim *c = ctx;
  c->rc = store_job_claim_within(c->store, free, c->job, c->e);
  if (c->rc) return c->rc == STORE_EFULL || c->rc == STORE_ENOTFOUND ? 1 : -1;
  *taken = store_job_memory(c->job);
  return 0;
}

static void *worker_main(void *arg) {
  struct worker *wk = arg;
  struct workers *w = wk->w;
  struct admit *ledger = w->srv->admit;
  server_pin_compute(wk->w->srv, wk->pool);
  pthread_mutex_lock(&w->mu);
  while (!w->stopping) {
    uint64_t seen = w->gen;
    pthread_mutex_unlock(&w->mu);
    struct store_job job;
    struct dapo_err e = {0};
    /* the claim and the memory account change together (under the ledger's lock): two workers,
     * or a worker and a completion, never both take the same free memory */
    struct claim c = {.store = w->srv->store, .job = &job, .e = &e};
    admit_claim(ledger, claim_within, &c);
    int rc = c.rc;
    if (!rc) {
      uint64_t need = store_job_memory(&job);
      run_job(wk, &job);
      store_job_deinit(&job);
      admit_release(ledger, need); /* memory came free: wakes a job waiting for it (workers_wake) */
      pthread_mutex_lock(&w->mu);
      continue;
    }
    if (rc == STORE_EFULL)
      LOG(DEBUG, "worker %d: the next job waits for memory: %s", wk->idx, e.msg);
    else if (rc != STORE_ENOTFOUND)
      LOG(ERROR, "worker %d: claiming a job: %s", wk->idx, e.msg);
    if (rc == STORE_EFULL) rc = STORE_ENOTFOUND; /* wait for a wake-up like an empty queue */
    struct timespec until = mono_in(rc == STORE_ENOTFOUND ? IDLE_RECHECK_MS : CLAIM_RETRY_MS);
    pthread_mutex_lock(&w->mu);
    while (!w->stopping && w->gen == seen)
      if (pthread_cond_timedwait(&w->wake, &w->mu, &until) == ETIMEDOUT) break;
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* ---- the pool of workers ---- */

/* The ledger's listener: memory came free (a job or a completion ended, a kept model was
 * closed), so a job waiting at the head of the queue may fit now. */
static void on_memory_freed(void *ctx) {
  workers_wake(ctx);
}

struct workers *workers_start(struct server *srv, struct dapo_err *e) {
  struct workers *w = calloc(1, sizeof *w);
  if (!w) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return NULL;
  }
  w->srv = srv;
  w->n = srv->cfg.workers > 0 ? srv->cfg.workers : 1;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->wake, &ca);
  pthread_cond_init(&w->idle, &ca);
  pthread_condattr_destroy(&ca);
  if (!(w->v = calloc((size_t)w->n, sizeof *w->v))) {
    workers_free(w);
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return NULL;
  }
  if (admit_listen(srv->admit, on_memory_freed, w)) {
    workers_free(w);
    dapo_errf(e, DAPO_EINVAL, "the memory ledger has no room for another listener");
    return NULL;
  }
  w->listening = 1;
  for (int i = 0; i < w->n; i++) {
    struct worker *wk = &w->v[i];
    wk->w = w;
    wk->idx = i;
    if (!(wk->pool = pool_new(srv->cfg.blas_threads > 0 ? srv->cfg.blas_threads : 1))) {
      workers_stop(w, 0);
      workers_free(w);
      dapo_errf(e, DAPO_ENOMEM, "worker %d: cannot start its compute threads", i);
      return NULL;
    }
    int err = pthread_create(&wk->th, NULL, worker_main, wk);
    if (err) {
      workers_stop(w, 0);
      workers_free(w);
      dapo_errf(e, DAPO_EIO, "cannot start worker %d: %s", i, strerror(err));
      return NULL;
    }
    wk->started = 1;
  }
  LOG(INFO, "%d worker%s, %d compute thread%s each", w->n, w->n > 1 ? "s" : "",
      srv->cfg.blas_threads, srv->cfg.blas_threads > 1 ? "s" : "");
  return w;
}

void workers_wake(struct workers *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->gen++;
  pthread_cond_broadcast(&w->wake);
  pthread_mutex_unlock(&w->mu);
}

int workers_signal(struct workers *w, const char *job_id, int cancel, int pause) {
  if (!w) return 0;
  int found = 0;
  pthread_mutex_lock(&w->mu);
  for (int i = 0; i < w->n; i++) {
    struct running *run = &w->v[i].run;
    if (strcmp(run->job_id, job_id)) continue;
    if (cancel) __atomic_store_n(&run->cancel, 1, __ATOMIC_RELAXED);
    if (pause) __atomic_store_n(&run->pause, 1, __ATOMIC_RELAXED);
    found = 1;
  }
  pthread_mutex_unlock(&w->mu);
  return found;
}

int workers_phase(struct workers *w, const char *job_id, char *buf, size_t cap) {
  int found = 0;
  if (cap) buf[0] = '\0';
  if (!w || !cap) return 0;
  pthread_mutex_lock(&w->mu);
  for (int i = 0; i < w->n && !found; i++) {
    const struct running *run = &w->v[i].run;
    if (strcmp(run->job_id, job_id) || !run->phase[0]) continue;
    snprintf(buf, cap, "%s", run->phase);
    found = 1;
  }
  pthread_mutex_unlock(&w->mu);
  return found;
}

json_t *workers_progress(struct workers *w, const char *job_id) {
  json_t *o = NULL;
  if (!w) return NULL;
  pthread_mutex_lock(&w->mu);
  for (int i = 0; i < w->n; i++) {
    const struct running *run = &w->v[i].run;
    if (strcmp(run->job_id, job_id) || !run->has_progress) continue;
    o = progress_json(&run->progress);
    break;
  }
  pthread_mutex_unlock(&w->mu);
  return o;
}

int workers_busy(struct workers *w) {
  if (!w) return 0;
  pthread_mutex_lock(&w->mu);
  int n = w->busy;
  pthread_mutex_unlock(&w->mu);
  return n;
}

int workers_up(struct workers *w) {
  if (!w) return 0;
  pthread_mutex_lock(&w->mu);
  int up = !w->stopping;
  pthread_mutex_unlock(&w->mu);
  return up;
}

void workers_tokens(struct workers *w, uint64_t *generated, uint64_t *trained) {
  *generated = w ? atomic_load(&w->tokens_generated) : 0;
  *trained = w ? atomic_load(&w->tokens_trained) : 0;
}

int workers_stop(struct workers *w, int grace_s) {
  if (!w) return 0;
  struct timespec until = mono_in(grace_s * 1000);
  pthread_mutex_lock(&w->mu);
  w->stopping = 1;
  for (int i = 0; i < w->n; i++)
    if (w->v && w->v[i].run.job_id[0]) {
      LOG(INFO, "job %s: asking it to stop at a safe point", w->v[i].run.job_id);
      __atomic_store_n(&w->v[i].run.pause, 1, __ATOMIC_RELAXED);
    }
  pthread_cond_broadcast(&w->wake);
  while (w->busy > 0)
    if (pthread_cond_timedwait(&w->idle, &w->mu, &until) == ETIMEDOUT) break;
  int left = w->busy;
  pthread_mutex_unlock(&w->mu);
  return left;
}

void workers_free(struct workers *w) {
  if (!w) return;
  if (w->listening) admit_unlisten(w->srv->admit, on_memory_freed, w);
  pthread_mutex_lock(&w->mu);
  w->stopping = 1;
  pthread_cond_broadcast(&w->wake);
  pthread_mutex_unlock(&w->mu);
  for (int i = 0; w->v && i < w->n; i++) {
    if (w->v[i].started) pthread_join(w->v[i].th, NULL);
    pool_free(w->v[i].pool);
  }
  free(w->v);
  pthread_cond_destroy(&w->wake);
  pthread_cond_destroy(&w->idle);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

/* ---- startup recovery ---- */

int workers_recover(struct server *srv, struct dapo_err *e) {
  struct store_job_list l = {0};
  int rc = store_job_list_live(srv->store, &l, e);
  if (rc) return rc;
  for (size_t i = 0; i < l.n; i++) {
    const struct store_job *j = &l.v[i];
    char out[PATH_MAX];
    int64_t ck = workers_job_dir(srv, j->id, out, sizeof out) ? -1 : runner_latest_checkpoint(out);
    char from[96];
    if (ck >= 0)
      snprintf(from, sizeof from, "its newest complete checkpoint (step %" PRId64 ")", ck);
    else
      snprintf(from, sizeof from, "the start (it has no complete checkpoint yet)");
    switch (j->status) {
    case STORE_JOB_RUNNING:
      LOG(INFO, "job %s was running when the daemon stopped: queued again", j->id);
      set_status(srv, j->id, STORE_JOB_QUEUED, NULL, NULL);
      log_event(srv, j->id, "warning", j->step,
                "the daemon stopped while the job was running (last recorded step %" PRId64
                "); it is queued again and resumes from %s",
                j->step, from);
      break;
    case STORE_JOB_PAUSING:
      LOG(INFO, "job %s was pausing when the daemon stopped: paused", j->id);
      set_status(srv, j->id, STORE_JOB_PAUSED, NULL, NULL);
      log_event(srv, j->id, "info", j->step,
                "the daemon stopped while the job was pausing; it is paused, and resume "
                "continues from %s",
                from);
      break;
    case STORE_JOB_CANCELLING:
      LOG(INFO, "job %s was cancelling when the daemon stopped: cancelled", j->id);
      set_status(srv, j->id, STORE_JOB_CANCELLED, NULL, NULL);
      break;
    default: break;
    }
  }
  store_job_list_deinit(&l);
  return 0;
}
