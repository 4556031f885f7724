/* Job creation and admission (jobs.h): resolve the body once, check it, store it queued with
 * what was resolved, wake a worker; and the spec a worker runs from what was stored. */
#include "jobs.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bus.h"
#include "log.h"
#include "registry.h"
#include "server.h"
#include "sha256.h"
#include "workers.h"

/* Maps the file id in body[field] to its path, or records why it cannot be used. 0 or -1 (out
 * of memory). */
static int map_file(struct server *srv, json_t *body, const char *field, const char *owner,
                    json_t *errors) {
  const char *id = json_string_value(json_object_get(body, field));
  if (!id || !*id) return 0; /* missing or mistyped: jobspec_parse reports it */
  struct store_file f;
  struct dapo_err e = {0};
  char msg[300];
  int rc = store_file_get(srv->store, id, owner, &f, &e);
  if (rc == STORE_ENOTFOUND) {
    snprintf(msg, sizeof msg, "no such file: '%.128s'", id);
    return dapo_errors_add(errors, field, msg) ? -1 : 0;
  }
  if (rc == DAPO_ENOMEM) return -1;
  if (rc) {
    snprintf(msg, sizeof msg, "file '%.64s' cannot be read: %.200s", id, e.msg);
    return dapo_errors_add(errors, field, msg) ? -1 : 0;
  }
  /* an upload is validated as a DAPO file; a supervised or DPO job's lines (completions,
   * weights, pairs) are checked by its own rules when the job is (runner_check_data), each named
   * by line */
  const char *method = json_string_value(json_object_get(body, "method"));
  int supervised = method && (!strcmp(method, "supervised") || !strcmp(method, "dpo"));
  if (!f.valid && !supervised) {
    snprintf(msg, sizeof msg,
             "file '%.64s' is invalid (%zu problems reported; GET /v1/files/%.64s lists them): "
             "upload a corrected file",
             id, json_array_size(f.errors), id);
    rc = dapo_errors_add(errors, field, msg);
  } else {
    rc = json_object_set_new(body, field, json_string(f.path));
  }
  store_file_deinit(&f);
  return rc ? -1 : 0;
}

/* The body with every id resolved (model -> lm_open's spec, file ids -> paths, job_id set) into
 * *run_out (owned), problems appended to errors. Returns 0 (see errors for problems) or -1 out
 * of memory. */
static int resolve_body(struct server *srv, const json_t *body, const char *owner,
                        const char *job_id, json_t **run_out, json_t *errors) {
  *run_out = NULL;
  json_t *b = json_deep_copy(body);
  if (!b) return -1;
  int rc = 0;
  if (json_object_get(b, "job_id")) {
    rc = dapo_errors_add(errors, "job_id", "unknown field (the daemon names the job)");
    json_object_del(b, "job_id");
  }
  const char *model = json_string_value(json_object_get(b, "model"));
  if (!rc && model && *model) {
    char *path = NULL, msg[512];
    int m = registry_resolve(srv, model, owner, &path, NULL, msg, sizeof msg);
    if (m < 0 || (!m && json_object_set_new(b, "model", json_string(path))))
      rc = -1;
    else if (m > 0)
      rc = dapo_errors_add(errors, "model", msg);
    free(path);
  }
  if (!rc) rc = map_file(srv, b, "training_file", owner, errors);
  if (!rc) rc = map_file(srv, b, "validation_file", owner, errors);
  if (!rc && json_object_set_new(b, "job_id", json_string(job_id))) rc = -1;
  if (rc) {
    json_decref(b);
    return -1;
  }
  *run_out = b;
  return 0;
}

/* Parses a resolved body into spec; the problem count, or -1 out of memory. */
static int parse_run(struct server *srv, const json_t *run, struct job_spec *spec, json_t *errors) {
  struct judge_policy pol;
  server_judge_policy(srv, &pol);
  /* the ranks of a multi-process job judge without the daemon's completion service
   * (launch.c): a judge model the daemon serves itself is refused under its field */
  const json_t *np = json_object_get(json_object_get(run, "resources"), "processes");
  if (json_is_integer(np) && json_integer_value(np) > 1) pol.served = NULL;
  size_t before = json_array_size(errors);
  if (jobspec_parse(run, &pol, spec, errors) < 0) return -1;
  /* a multi-process job needs the configured launcher (docs/SCALE.md) */
  char msg[200];
  if (spec->processes > 1 && !srv->cfg.launcher[0])
    dapo_errors_add(errors, "resources.processes",
                    "this daemon runs every job in one process: no launcher is configured (the "
                    "launcher setting); ask for 1 process or leave resources out");
  else if (spec->processes > srv->cfg.max_processes) {
    snprintf(msg, sizeof msg, "at most %d processes on this daemon (max_processes)",
             srv->cfg.max_processes);
    dapo_errors_add(errors, "resources.processes", msg);
  }
  return (int)(json_array_size(errors) - before);
}

/* The memory-limit refusal, naming every part of the plan (of each of the job's processes). */
static int refuse_memory(json_t *errors, const struct mem_plan *plan, int processes,
                         uint64_t limit) {
  char msg[600], each[64] = "";
  if (processes > 1) snprintf(each, sizeof each, " in %d processes, each", processes);
  snprintf(msg, sizeof msg,
           "the job needs %.1f MiB%s (weights %.1f, gradients %.1f, optimizer %.1f, reference "
           "model %.1f, activations %.1f, generation %.1f, buffers %.1f) but the memory limit "
           "is %.1f MiB (memory_limit_bytes); lower micro_batch_tokens, gen_batch_size or "
           "max_new_tokens, or pick a smaller model",
           plan->total / 1048576.0 * processes, each, plan->weights / 1048576.0,
           plan->gradients / 1048576.0, plan->optimizer / 1048576.0, plan->reference / 1048576.0,
           plan->activations / 1048576.0, plan->generation / 1048576.0, plan->buffers / 1048576.0,
           limit / 1048576.0);
  return dapo_errors_add(errors, "hyperparameters", msg);
}

/* What the job object shows of the resolved spec (judge, hyperparameters, seed, memory, adapter,
 * episode, response_format) and
 * what the worker runs ("run": the resolved body). NULL out of memory. */
static json_t *resolved_of(const struct job_spec *spec, const struct mem_plan *plan,
                           const json_t *run) {
  json_t *all = jobspec_to_json(spec), *mem = mem_plan_to_json(plan);
  /* a multi-process job: every process holds the plan; the total (what admission reserves)
   * counts them all */
  if (mem && spec->processes > 1 &&
      (json_object_set_new(mem, "processes", json_integer(spec->processes)) ||
       json_object_set_new(mem, "per_process_bytes", json_integer((json_int_t)plan->total)) ||
       json_object_set_new(mem, "total_bytes",
                           json_integer((json_int_t)(plan->total * (uint64_t)spec->processes))))) {
    json_decref(mem);
    mem = NULL;
  }
  /* a supervised job has no judge and always a method; a DAPO job's method only when named */
  json_t *o =
      all && mem
          ? json_pack("{s:O*, s:O*, s:O, s:O, s:o, s:O, s:O*, s:O*, s:O*}", "method",
                      json_object_get(all, "method"), "judge", json_object_get(all, "judge"),
                      "hyperparameters", json_object_get(all, "hyperparameters"), "seed",
                      json_object_get(all, "seed"), "memory", mem, "run", run, "adapter",
                      json_object_get(all, "adapter"), "episode", json_object_get(all, "episode"),
                      "response_format", json_object_get(all, "response_format"))
          : (json_decref(mem), NULL);
  json_decref(all);
  return o;
}

/* ---- the check of a job's data, kept and run off the request's thread ---- */

#define CHECK_CACHE 64     /* checks kept (least recently used goes) */
#define CHECK_QUEUE_MAX 64 /* checks waiting for the checker thread */

struct check_entry {
  char key[65]; /* "" empty */
  uint64_t used;
  struct runner_data_facts f;
  json_t *errors; /* the check's problems (owned) */
};

/* A job being admitted whose data the checker thread checks. Shared by the request (which waits
 * for it, suspended) and the checker: two references. */
struct jobs_task {
  int refs; /* under jobs_service.mu */
  int done; /* the check ran (facts and errors are set) */
  char ticket[STORE_ID_MAX];
  json_t *body;      /* the request body (a reference) */
  char *owner, *key; /* NULL: none */
  json_t *run;       /* the resolved body (owned) */
  struct job_spec spec;
  char check_key[65];
  struct runner_data_facts f;
  json_t *errors; /* the check's problems (owned) */
  struct jobs_task *next;
};

struct jobs_service {
  struct server *srv;
  pthread_mutex_t mu;
  pthread_cond_t cond; /* a task was queued, or stopping */
  struct check_entry cache[CHECK_CACHE];
  uint64_t tick;
  struct jobs_task *head, *tail;
  int queued, stopping, started;
  pthread_t th;
  atomic_uint_fast64_t ran, kept, offloaded;
};

/* The identity of what runner_check_data reads: the model's files (a preset's name; a folder's
 * config, tokenizer and tokenizer_config by size and modification time), the datasets (paths of
 * immutable uploads), the chat template, max_new_tokens and the method (a supervised or DPO job's
 * lines are checked by other rules, which max_sequence_tokens and truncate change). SHA-256 hex
 * into out. */
static void check_key(const struct job_spec *spec, char out[65]) {
  struct dapo_sha256 c;
  dapo_sha256_begin(&c);
  char line[PATH_MAX + 128];
  int n = snprintf(line, sizeof line, "model=%s\n", spec->model);
  dapo_sha256_feed(&c, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
  static const char *const files[] = {"config.json", "tokenizer.json", "tokenizer_config.json"};
  for (int i = 0; i < 3; i++) {
    char p[PATH_MAX + 64];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", spec->model, files[i]);
    if (stat(p, &st)) continue;
    n = snprintf(line, sizeof line, "%s %lld %lld.%09ld\n", files[i], (long long)st.st_size,
                 (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    dapo_sha256_feed(&c, line, (size_t)n);
  }
  n = snprintf(line, sizeof line,
               "method=%d\ntrain=%s\nval=%s\nmax_new=%d\nmax_seq=%d\ntruncate=%d\ntemplate=",
               spec->hp.method, spec->training_file ? spec->training_file : "",
               spec->validation_file ? spec->validation_file : "", spec->hp.max_new_tokens,
               spec->hp.max_sequence_tokens, spec->hp.truncate);
  dapo_sha256_feed(&c, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
  char *tpl = spec->chat_template
                  ? json_dumps(spec->chat_template, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY)
                  : NULL;
  dapo_sha256_feed(&c, tpl ? tpl : "auto", strlen(tpl ? tpl : "auto"));
  free(tpl);
  dapo_sha256_end_hex(&c, out);
}

/* The kept check of key: facts into *f and its problems appended to errors. 1 when kept. */
static int cache_get(struct jobs_service *js, const char *key, struct runner_data_facts *f,
                     json_t *errors) {
  int hit = 0;
  pthread_mutex_lock(&js->mu);
  for (int i = 0; i < CHECK_CACHE && !hit; i++) {
    struct check_entry *c = &js->cache[i];
    if (strcmp(c->key, key)) continue;
    c->used = ++js->tick;
    *f = c->f;
    json_array_extend(errors, c->errors);
    hit = 1;
  }
  pthread_mutex_unlock(&js->mu);
  if (hit) atomic_fetch_add(&js->kept, 1);
  return hit;
}

static void cache_put(struct jobs_service *js, const char *key, const struct runner_data_facts *f,
                      const json_t *errors) {
  json_t *copy = json_deep_copy(errors);
  if (!copy) return;
  pthread_mutex_lock(&js->mu);
  struct check_entry *victim = &js->cache[0];
  for (int i = 0; i < CHECK_CACHE; i++) {
    struct check_entry *c = &js->cache[i];
    if (!strcmp(c->key, key)) {
      victim = c;
      break;
    }
    if (c->used < victim->used) victim = c;
  }
  json_decref(victim->errors);
  snprintf(victim->key, sizeof victim->key, "%s", key);
  victim->used = ++js->tick;
  victim->f = *f;
  victim->errors = copy;
  pthread_mutex_unlock(&js->mu);
}

/* Runs the check of spec (problems appended to errors) and keeps it under key. */
static int check_now(struct jobs_service *js, const struct job_spec *spec, const char *key,
                     struct runner_data_facts *f, json_t *errors) {
  json_t *mine = json_array();
  if (!mine) return -1;
  runner_check_data(spec, f, mine);
  if (js) {
    atomic_fetch_add(&js->ran, 1);
    cache_put(js, key, f, mine);
  }
  int rc = json_array_extend(errors, mine) ? -1 : 0;
  json_decref(mine);
  return rc;
}

static void task_release(struct jobs_service *js, struct jobs_task *t) {
  if (!t) return;
  pthread_mutex_lock(&js->mu);
  int last = --t->refs == 0;
  pthread_mutex_unlock(&js->mu);
  if (!last) return;
  bus_forget(js->srv->bus, t->ticket); /* both the request and the checker are done with it */
  json_decref(t->body);
  free(t->owner);
  free(t->key);
  json_decref(t->run);
  jobspec_deinit(&t->spec);
  json_decref(t->errors);
  free(t);
}

static void *checker_main(void *arg) {
  struct jobs_service *js = arg;
  pthread_mutex_lock(&js->mu);
  for (;;) {
    while (!js->head && !js->stopping) pthread_cond_wait(&js->cond, &js->mu);
    struct jobs_task *t = js->head;
    if (!t) break; /* stopping, nothing left */
    js->head = t->next;
    if (!js->head) js->tail = NULL;
    js->queued--;
    pthread_mutex_unlock(&js->mu);
    json_t *errors = json_array();
    struct runner_data_facts f = {0};
    if (errors && !js->stopping)
      check_now(js, &t->spec, t->check_key, &f, errors);
    else if (errors)
      dapo_errors_add(errors, "", "the daemon is stopping: submit the job again when it is back");
    pthread_mutex_lock(&js->mu);
    t->f = f;
    t->errors = errors;
    t->done = 1;
    pthread_mutex_unlock(&js->mu);
    bus_publish(js->srv->bus, t->ticket, 1); /* the request waiting for it runs again */
    task_release(js, t);
    pthread_mutex_lock(&js->mu);
  }
  pthread_mutex_unlock(&js->mu);
  return NULL;
}

struct jobs_service *jobs_service_start(struct server *srv, struct dapo_err *e) {
  struct jobs_service *js = calloc(1, sizeof *js);
  if (!js) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return NULL;
  }
  js->srv = srv;
  pthread_mutex_init(&js->mu, NULL);
  pthread_cond_init(&js->cond, NULL);
  int err = pthread_create(&js->th, NULL, checker_main, js);
  if (err) {
    jobs_service_stop(js);
    dapo_errf(e, DAPO_EIO, "cannot start the job checker: %s", strerror(err));
    return NULL;
  }
  js->started = 1;
  return js;
}

void jobs_service_stop(struct jobs_service *js) {
  if (!js) return;
  pthread_mutex_lock(&js->mu);
  js->stopping = 1;
  pthread_cond_broadcast(&js->cond);
  pthread_mutex_unlock(&js->mu);
  if (js->started) pthread_join(js->th, NULL);
  for (int i = 0; i < CHECK_CACHE; i++) json_decref(js->cache[i].errors);
  pthread_cond_destroy(&js->cond);
  pthread_mutex_destroy(&js->mu);
  free(js);
}

void jobs_service_counts(const struct jobs_service *js, uint64_t *ran, uint64_t *kept,
                         uint64_t *offloaded) {
  *ran = js ? atomic_load(&js->ran) : 0;
  *kept = js ? atomic_load(&js->kept) : 0;
  *offloaded = js ? atomic_load(&js->offloaded) : 0;
}

/* Bytes of the job's datasets (what the check reads). */
static int64_t data_bytes(const struct job_spec *spec) {
  struct stat st;
  int64_t n = 0;
  if (spec->training_file && !stat(spec->training_file, &st)) n += st.st_size;
  if (spec->validation_file && !stat(spec->validation_file, &st)) n += st.st_size;
  return n;
}

/* ---- creation ---- */

/* The last part of creation, once the data is checked (problems already in errors): the memory
 * plan against the limit, then the store; wakes a worker. */
static int finish_admission(struct server *srv, const json_t *body, const char *owner,
                            const char *key, const struct job_spec *spec, const json_t *run,
                            const struct runner_data_facts *f, size_t base, struct store_job *job,
                            int *existed, json_t *errors, struct dapo_err *e) {
  struct mem_plan plan = {0};
  uint64_t limit = server_memory_limit(srv);
  /* the adapter against the model (not part of the kept data check: it is the job's own), then
   * the plan, as GET /v1/models/{id} makes it (runner_plan_job) */
  /* on an adapter checkpoint the job continues its adapter: planned and shown with it */
  struct job_spec shown = *spec;
  if (f->model_ok) {
    const struct lora_config *ad = runner_job_adapter(spec, f, errors);
    if (ad) shown.has_adapter = 1, shown.adapter = *ad;
    runner_plan_job(&f->cfg, ad, &spec->hp, &spec->episode, f->max_prompt_tokens,
                    spec->validation_file != NULL, spec->response_format != NULL, &plan, errors);
  }
  if (json_array_size(errors) == base && f->model_ok &&
      plan.total * (uint64_t)spec->processes > limit &&
      refuse_memory(errors, &plan, spec->processes, limit))
    return dapo_errf(e, DAPO_ENOMEM, "out of memory validating the job");
  if (json_array_size(errors) != base) return DAPO_EINVAL;
  json_t *resolved = resolved_of(&shown, &plan, run);
  if (!resolved) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  const json_t *md = json_object_get(body, "metadata");
  struct store_job_new nj = {
      .owner = owner ? owner : "",
      .spec = body,
      .resolved = resolved,
      .metadata = json_is_object(md) ? md : NULL,
      .suffix = json_string_value(json_object_get(body, "suffix")),
      .training_file = json_string_value(json_object_get(body, "training_file")),
      .validation_file = json_string_value(json_object_get(body, "validation_file")),
      .total_steps = spec->hp.method != METHOD_DAPO
                         ? hparams_sft_total_steps(&spec->hp, f->train_examples)
                         : spec->hp.total_steps,
      .idempotency_key = key,
      .max_queued = srv->cfg.max_queued_jobs,
      .max_live_owner = owner ? srv->cfg.max_jobs_per_key : 0,
  };
  int rc = store_job_insert(srv->store, &nj, job, existed, e);
  json_decref(resolved);
  if (rc || *existed) return rc;
  LOG(INFO, "job %s queued (model %s)", job->id, json_string_value(json_object_get(body, "model")));
  server_job_changed(srv, job->id);
  workers_wake(srv->workers);
  return 0;
}

static char *dup_or_null(const char *s) {
  return s ? strdup(s) : NULL;
}

int jobs_create(struct server *srv, const struct jobs_new *req, struct store_job *job, int *existed,
                json_t *errors, struct jobs_task **pending, struct dapo_err *e) {
  char id[STORE_ID_MAX];
  memset(job, 0, sizeof *job);
  *existed = 0;
  if (pending) *pending = NULL;
  if (!json_is_object(req->body)) {
    if (dapo_errors_add(errors, "", "expected a JSON object with at least model and training_file"))
      return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return DAPO_EINVAL;
  }
  /* a provisional name for the judge spec's checks; the store names the job, and the worker
   * runs it under that name (jobs_run_spec) */
  if (store_new_id("job", id)) return dapo_errf(e, DAPO_EIO, "no job id");
  json_t *run = NULL;
  struct job_spec spec;
  memset(&spec, 0, sizeof spec);
  size_t base = json_array_size(errors);
  /* every problem of the body at once: ids and fields together; then the model and data, then
   * the memory the plan needs, each only when what it reads is sound */
  int rc = resolve_body(srv, req->body, req->owner, id, &run, errors) < 0 ||
                   parse_run(srv, run, &spec, errors) < 0
               ? dapo_errf(e, DAPO_ENOMEM, "out of memory validating the job")
           : json_array_size(errors) != base ? DAPO_EINVAL
                                             : 0;
  struct jobs_service *js = srv->jobsvc;
  struct runner_data_facts f = {0};
  char key[65];
  if (!rc) {
    check_key(&spec, key);
    if (js && cache_get(js, key, &f, errors)) {
      /* kept from an earlier job on the same model, data and template */
    } else if (js && pending && (uint64_t)data_bytes(&spec) > srv->cfg.job_check_inline_bytes) {
      /* a large dataset: checked by the checker thread while the request waits suspended */
      struct jobs_task *t = calloc(1, sizeof *t);
      if (!t || store_new_id("chk", t->ticket)) {
        free(t);
        rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
      } else {
        t->refs = 2;
        /* a copy: jansson's reference counts are not for sharing across threads */
        t->body = json_deep_copy(req->body);
        t->owner = dup_or_null(req->owner);
        t->key = dup_or_null(req->idempotency_key);
        int copied = t->body && (!req->owner || t->owner) && (!req->idempotency_key || t->key);
        t->run = run, run = NULL;
        t->spec = spec;
        memset(&spec, 0, sizeof spec);
        memcpy(t->check_key, key, sizeof key);
        pthread_mutex_lock(&js->mu);
        int full = !copied || js->queued >= CHECK_QUEUE_MAX || js->stopping;
        if (!full) {
          if (js->tail)
            js->tail->next = t;
          else
            js->head = t;
          js->tail = t;
          js->queued++;
          pthread_cond_signal(&js->cond);
        }
        pthread_mutex_unlock(&js->mu);
        if (full) {
          t->refs = 1;
          task_release(js, t);
          rc = !copied ? dapo_errf(e, DAPO_ENOMEM, "out of memory")
                       : dapo_errf(e, STORE_EFULL, "%d jobs are being checked: retry shortly",
                                   CHECK_QUEUE_MAX);
        } else {
          atomic_fetch_add(&js->offloaded, 1);
          *pending = t;
          return JOBS_PENDING;
        }
      }
    } else if (check_now(js, &spec, key, &f, errors)) {
      rc = dapo_errf(e, DAPO_ENOMEM, "out of memory validating the job");
    }
  }
  if (!rc)
    rc = finish_admission(srv, req->body, req->owner, req->idempotency_key, &spec, run, &f, base,
                          job, existed, errors, e);
  json_decref(run);
  jobspec_deinit(&spec);
  return rc;
}

const char *jobs_task_ticket(const struct jobs_task *t) {
  return t->ticket;
}

int jobs_create_resume(struct server *srv, struct jobs_task *t, struct store_job *job, int *existed,
                       json_t *errors, struct dapo_err *e) {
  memset(job, 0, sizeof *job);
  *existed = 0;
  pthread_mutex_lock(&srv->jobsvc->mu);
  int done = t->done;
  pthread_mutex_unlock(&srv->jobsvc->mu);
  if (!done) return JOBS_PENDING;
  size_t base = json_array_size(errors);
  if (!t->errors || json_array_extend(errors, t->errors))
    return dapo_errf(e, DAPO_ENOMEM, "out of memory validating the job");
  return finish_admission(srv, t->body, t->owner, t->key, &t->spec, t->run, &t->f, base, job,
                          existed, errors, e);
}

void jobs_task_release(struct server *srv, struct jobs_task *t) {
  task_release(srv->jobsvc, t);
}

int jobs_run_spec(struct server *srv, const struct store_job *job, struct job_spec *spec,
                  json_t *errors) {
  memset(spec, 0, sizeof *spec);
  const json_t *run = json_object_get(job->resolved, "run");
  if (json_is_object(run)) { /* named by the store's id (the body was resolved before it) */
    json_t *r = json_copy((json_t *)run);
    if (!r || json_object_set_new(r, "job_id", json_string(job->id))) {
      json_decref(r);
      return -1;
    }
    int n = parse_run(srv, r, spec, errors);
    json_decref(r);
    return n;
  }
  /* a job queued by a version that stored no resolved body: resolved now */
  json_t *b = NULL;
  size_t base = json_array_size(errors);
  if (resolve_body(srv, job->spec, NULL, job->id, &b, errors)) return -1;
  int n = parse_run(srv, b, spec, errors);
  json_decref(b);
  return n < 0 ? -1 : (int)(json_array_size(errors) - base);
}
