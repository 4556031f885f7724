/* Job creation and admission (jobs.h): resolve the body once, check it, store it queued with
 * what was resolved, wake a worker; and the spec a worker runs from what was stored. */
#include "jobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "registry.h"
#include "server.h"
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
  if (!f.valid) {
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
  workers_judge_policy(srv, &pol);
  size_t before = json_array_size(errors);
  if (jobspec_parse(run, &pol, spec, errors) < 0) return -1;
  return (int)(json_array_size(errors) - before);
}

/* The memory-limit refusal, naming every part of the plan. */
static int refuse_memory(json_t *errors, const struct mem_plan *plan, uint64_t limit) {
  char msg[512];
  snprintf(msg, sizeof msg,
           "the job needs %.1f MiB (weights %.1f, gradients %.1f, optimizer %.1f, reference "
           "model %.1f, activations %.1f, generation %.1f, buffers %.1f) but the memory limit "
           "is %.1f MiB (memory_limit_bytes); lower micro_batch_tokens, gen_batch_size or "
           "max_new_tokens, or pick a smaller model",
           plan->total / 1048576.0, plan->weights / 1048576.0, plan->gradients / 1048576.0,
           plan->optimizer / 1048576.0, plan->reference / 1048576.0, plan->activations / 1048576.0,
           plan->generation / 1048576.0, plan->buffers / 1048576.0, limit / 1048576.0);
  return dapo_errors_add(errors, "hyperparameters", msg);
}

/* What the job object shows of the resolved spec (judge, hyperparameters, seed, memory) and
 * what the worker runs ("run": the resolved body). NULL out of memory. */
static json_t *resolved_of(const struct job_spec *spec, const struct mem_plan *plan,
                           const json_t *run) {
  json_t *all = jobspec_to_json(spec);
  json_t *o =
      all ? json_pack("{s:O, s:O, s:O, s:o, s:O}", "judge", json_object_get(all, "judge"),
                      "hyperparameters", json_object_get(all, "hyperparameters"), "seed",
                      json_object_get(all, "seed"), "memory", mem_plan_to_json(plan), "run", run)
          : NULL;
  json_decref(all);
  return o;
}

int jobs_create(struct server *srv, const struct jobs_new *req, struct store_job *job, int *existed,
                json_t *errors, struct dapo_err *e) {
  char id[STORE_ID_MAX];
  memset(job, 0, sizeof *job);
  *existed = 0;
  if (!json_is_object(req->body)) {
    if (dapo_errors_add(errors, "", "expected a JSON object with at least model and training_file"))
      return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return DAPO_EINVAL;
  }
  /* a provisional name for the judge spec's checks; the store names the job, and the worker
   * runs it under that name (jobs_run_spec) */
  if (store_new_id("job", id)) return dapo_errf(e, DAPO_EIO, "no job id");
  json_t *run = NULL, *resolved = NULL;
  struct job_spec spec;
  struct mem_plan plan = {0};
  memset(&spec, 0, sizeof spec);
  size_t base = json_array_size(errors);
  /* every problem of the body at once: ids and fields together; then the model and data, then
   * the memory the plan needs, each only when what it reads is sound */
  int oom = resolve_body(srv, req->body, req->owner, id, &run, errors) < 0;
  if (!oom) oom = parse_run(srv, run, &spec, errors) < 0;
  if (!oom && json_array_size(errors) == base) oom = runner_check_job(&spec, &plan, errors) < 0;
  uint64_t limit = workers_memory_limit(srv);
  if (!oom && json_array_size(errors) == base && plan.total > limit)
    oom = refuse_memory(errors, &plan, limit) != 0;
  int rc = 0;
  if (oom)
    rc = dapo_errf(e, DAPO_ENOMEM, "out of memory validating the job");
  else if (json_array_size(errors) != base)
    rc = DAPO_EINVAL;
  else if (!(resolved = resolved_of(&spec, &plan, run)))
    rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
  if (!rc) {
    const json_t *md = json_object_get(req->body, "metadata");
    struct store_job_new nj = {
        .owner = req->owner ? req->owner : "",
        .spec = req->body,
        .resolved = resolved,
        .metadata = json_is_object(md) ? md : NULL,
        .suffix = json_string_value(json_object_get(req->body, "suffix")),
        .training_file = json_string_value(json_object_get(req->body, "training_file")),
        .validation_file = json_string_value(json_object_get(req->body, "validation_file")),
        .total_steps = spec.hp.total_steps,
        .idempotency_key = req->idempotency_key,
        .max_queued = srv->cfg.max_queued_jobs,
        .max_live_owner = req->owner ? srv->cfg.max_jobs_per_key : 0,
    };
    rc = store_job_insert(srv->store, &nj, job, existed, e);
  }
  json_decref(resolved);
  json_decref(run);
  jobspec_deinit(&spec);
  if (rc || *existed) return rc;
  LOG(INFO, "job %s queued (model %s)", job->id,
      json_string_value(json_object_get(req->body, "model")));
  server_job_changed(srv, job->id);
  workers_wake(srv->workers);
  return 0;
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
