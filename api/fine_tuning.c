/* Handlers: OpenAI's fine-tuning surface as the official `openai` SDK drives it
 * (../shared/design/OPENAI_COMPAT.md, docs/OPENAI.md), a translation onto the native job service:
 *   POST /v1/fine_tuning/jobs            method.reinforcement -> a native body (judge "grader",
 *                                        the RFT hyperparameters mapped onto DAPO's knobs);
 *                                        method.supervised -> a native supervised body,
 *                                        method.dpo -> a native dpo body; then
 *                                        jobs_create; SDK retries give the same job back
 *                                        (a succeeded supervised or DPO job's result CSV is
 *                                        made when the job is first rendered: sft_result_file)
 *   GET  /v1/fine_tuning/jobs[/{id}]     FineTuningJob objects (list: after, limit, metadata[k])
 *   POST /v1/fine_tuning/jobs/{id}/cancel|pause|resume (empty bodies)
 *   GET  /v1/fine_tuning/jobs/{id}/events       FineTuningJobEvent, newest first
 *   GET  /v1/fine_tuning/jobs/{id}/checkpoints  FineTuningJobCheckpoint, newest first
 *   POST /v1/fine_tuning/alpha/graders/run|validate
 * Errors are OpenAI's {"error": {...}} (openai.h). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <microhttpd.h>

#include "grader.h"
#include "handlers.h"
#include "http.h"
#include "jobs.h"
#include "judge.h"
#include "log.h"
#include "openai.h"
#include "registry.h"
#include "server.h"
#include "sha256.h"
#include "store.h"

#define FT_LIST_MAX 100
#define RETRY_WINDOW_S 600 /* an SDK retry finds the job created this long ago at most */
#define AUTO_BATCH 8       /* batch_size "auto": the native prompt_batch_size default */
#define BASE_LR 1e-5       /* learning_rate_multiplier 1: the native learning_rate default */
#define BASE_GROUP 8       /* compute_multiplier 1: the native group_size default */
#define SFT_AUTO_BATCH 8   /* supervised batch_size "auto": the native batch_size default */
#define SFT_AUTO_EPOCHS 3  /* supervised n_epochs "auto": OpenAI's usual pick for small files */
#define SFT_MAX_LRM 1000   /* learning_rate_multiplier at most: 1e-2 with BASE_LR */
#define DPO_AUTO_BETA 0.1  /* dpo beta "auto": the native default (TRL's and OpenAI's) */

/* The template of models without one (the presets): the message texts, one after another. */
static const char DEFAULT_TEMPLATE[] = REGISTRY_DEFAULT_TEMPLATE;
/* The same for supervised jobs, whose trained end of an assistant turn is its newline. */
static const char SFT_TEMPLATE[] = "{\"system\": \"{content}\\n\", \"user\": \"{content}\", "
                                   "\"assistant\": \"{content}\\n\", \"stop\": \"\\n\"}";

/* ---- shared with chat.c (openai.h) ---- */

int api_oai_path(const char *path) {
  return !strncmp(path, "/v1/fine_tuning/", 16) || !strcmp(path, "/v1/fine_tuning") ||
         !strncmp(path, "/v1/chat/", 9);
}

json_t *api_oai_error_body(int status, const char *type, const char *param, const char *code,
                           const char *message) {
  if (!type)
    type = status >= 500   ? "server_error"
           : status == 401 ? "authentication_error"
           : status == 403 ? "permission_error"
           : status == 429 ? "rate_limit_error"
                           : "invalid_request_error";
  return json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", dapo_json_text(message), "type",
                   type, "param", param ? dapo_json_text(param) : json_null(), "code",
                   code ? json_string(code) : json_null());
}

int api_oai_error(struct api_req *r, int status, const char *type, const char *param,
                  const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int rc = api_reply_json_steal(r, status, api_oai_error_body(status, type, param, code, msg));
  if (!rc && status >= 400 && status < 500 && status != 408 && status != 429)
    api_reply_header(r, "x-should-retry", "false");
  return rc;
}

void api_oai_model_name(const char *base, const char *suffix, const char *job_id, long long step,
                        char *buf, size_t cap) {
  if (step >= 0)
    snprintf(buf, cap, "ft:%s:dapod:%s:%s:ckpt-step-%lld", base, suffix ? suffix : "", job_id,
             step);
  else
    snprintf(buf, cap, "ft:%s:dapod:%s:%s", base, suffix ? suffix : "", job_id);
}

int api_oai_model_native(struct api_req *r, const char *model, char *native, size_t cap,
                         char *job_id, size_t jcap) {
  long long step = -1;
  if (!api_oai_model_parse(model, job_id, jcap, &step)) return 0;
  if (step < 0) { /* the job's last checkpoint */
    struct store_job sj;
    struct dapo_err e = {0};
    if (!store_job_get(r->srv->store, job_id, r->owner, &sj, &e)) {
      step = sj.n_ckpt ? sj.ckpt_steps[sj.n_ckpt - 1] : -1;
      store_job_deinit(&sj);
    }
  }
  registry_ckpt_id(job_id, step, native, cap);
  return 1;
}

/* The model an OpenAI job shows (*shown: the ft: name it was created from, else its spec's
 * model; borrowed from j) and the base its fine-tuned names carry (into base: an ft: name's own
 * base, so a model fine-tuned twice is still "ft:tiny:..."). */
static void job_models(const struct store_job *j, const char **shown, char *base, size_t cap) {
  const char *given = json_string_value(json_object_get(j->metadata, "dapod_model"));
  *shown = given ? given : json_string_value(json_object_get(j->spec, "model"));
  if (!*shown) *shown = "";
  const char *b = *shown, *end = NULL;
  if (!strncmp(b, "ft:", 3) && (end = strchr(b + 3, ':'))) b += 3;
  snprintf(base, cap, "%.*s", end ? (int)(end - b) : (int)strlen(b), b);
}

int api_oai_model_parse(const char *name, char *job_id, size_t cap, long long *step) {
  if (strncmp(name, "ft:", 3)) return 0;
  const char *end = name + strlen(name), *ck = strstr(name, ":ckpt-step-");
  *step = -1;
  if (ck) {
    char *stop;
    long long s = strtoll(ck + 11, &stop, 10);
    if (*stop || s < 0 || stop == ck + 11) return 0;
    *step = s;
    end = ck;
  }
  const char *colon = end;
  while (colon > name && colon[-1] != ':') colon--;
  if ((size_t)(end - colon) + 1 > cap || end == colon) return 0;
  memcpy(job_id, colon, (size_t)(end - colon));
  job_id[end - colon] = '\0';
  return 1;
}

/* ---- the job object ---- */

static const char *oai_status(enum store_job_status s) {
  switch (s) {
  case STORE_JOB_QUEUED: return "queued";
  case STORE_JOB_RUNNING:
  case STORE_JOB_PAUSING:
  case STORE_JOB_CANCELLING: return "running";
  case STORE_JOB_PAUSED: return "paused";
  case STORE_JOB_SUCCEEDED: return "succeeded";
  case STORE_JOB_FAILED: return "failed";
  case STORE_JOB_CANCELLED: return "cancelled";
  default: break;
  }
  return "failed";
}

static json_t *or_null(const json_t *v) {
  return v ? json_incref((json_t *)v) : json_null();
}

/* The RFT hyperparameters of a stored job, read back from its native knobs. */
static json_t *rft_hparams(const json_t *hp, const json_t *meta) {
  json_t *o = json_object();
  const json_t *echo = json_object_get(meta, "hyperparameters");
  if (json_is_object(echo)) json_object_update(o, (json_t *)echo);
  if (!json_object_get(o, "batch_size"))
    json_object_set_new(o, "batch_size", or_null(json_object_get(hp, "prompt_batch_size")));
  return o;
}

/* The OpenAI hyperparameters of a supervised or DPO job (with beta), from its resolved native
 * knobs. */
static json_t *sft_hparams(const json_t *hp) {
  json_t *o = json_pack("{s:O?, s:f, s:O?}", "batch_size", json_object_get(hp, "batch_size"),
                        "learning_rate_multiplier",
                        json_number_value(json_object_get(hp, "learning_rate")) / BASE_LR,
                        "n_epochs", json_object_get(hp, "epochs"));
  if (o && json_object_get(hp, "beta")) json_object_set(o, "beta", json_object_get(hp, "beta"));
  return o;
}

/* A supervised or DPO (dpo) job's metrics rows as its result CSV (one row a trained step, the
 * step's validation beside it or empty cells; a DPO job's accuracy columns hold
 * rewards/accuracy) into *csv (malloc'd), and its trained tokens (the sum of train/tokens).
 * 0, or an error code. */
static int sft_results(struct store *st, const char *job_id, int dpo, char **csv, int64_t *tokens) {
  const char *acc = dpo ? "rewards/accuracy" : "train/mean_token_accuracy";
  const char *vacc = dpo ? "valid/rewards/accuracy" : "valid/mean_token_accuracy";
  struct store_metric_list l = {0};
  struct dapo_err e = {0};
  *tokens = 0;
  if (csv) *csv = NULL;
  int rc = store_metrics_list(st, job_id, &l, &e);
  if (rc) return rc;
  size_t cap = 128 + l.n * 192, used = 0; /* a row: 5 cells of at most 25 characters */
  char *out = csv ? malloc(cap) : NULL;
  if (csv && !out) {
    store_metric_list_deinit(&l);
    return DAPO_ENOMEM;
  }
  if (out)
    used = (size_t)snprintf(out, cap,
                            "step,train_loss,train_accuracy,valid_loss,"
                            "valid_mean_token_accuracy\n");
  for (size_t i = 0; i < l.n; i++) {
    const struct store_metric *m = &l.v[i];
    if (strcmp(m->kind, "train")) continue;
    *tokens += json_integer_value(json_object_get(m->data, "train/tokens"));
    if (!out) continue;
    const json_t *ev = NULL; /* the eval row of this step follows it */
    if (i + 1 < l.n && l.v[i + 1].step == m->step && !strcmp(l.v[i + 1].kind, "eval"))
      ev = l.v[i + 1].data;
    char vl[40] = "", va[40] = "";
    if (ev) {
      snprintf(vl, sizeof vl, "%.17g", json_number_value(json_object_get(ev, "valid/loss")));
      snprintf(va, sizeof va, "%.17g", json_number_value(json_object_get(ev, vacc)));
    }
    int k = snprintf(out + used, cap - used, "%lld,%.17g,%.17g,%s,%s\n", (long long)m->step,
                     json_number_value(json_object_get(m->data, "train/loss")),
                     json_number_value(json_object_get(m->data, acc)), vl, va);
    if (k < 0 || (size_t)k >= cap - used) break; /* cannot happen: the cells are bounded */
    used += (size_t)k;
  }
  store_metric_list_deinit(&l);
  if (csv) *csv = out;
  return 0;
}

/* The result file of a succeeded supervised or DPO job: "file-<the job's uuid>", made the first
 * time the job is rendered after success (a second rendering, or a racing one, finds it). Its id
 * into id, or "" when it cannot be made (logged). */
static void sft_result_file(struct api_req *r, const struct store_job *j, char *csv,
                            char id[STORE_ID_MAX]) {
  struct store_file f = {0};
  struct dapo_err e = {0};
  snprintf(id, STORE_ID_MAX, "file-%.36s", strchr(j->id, '-') ? strchr(j->id, '-') + 1 : j->id);
  if (!store_file_get(r->srv->store, id, NULL, &f, &e)) {
    store_file_deinit(&f);
    return;
  }
  char path[4096], tmp[4112];
  snprintf(path, sizeof path, "%s/%s.csv", r->srv->files_dir, id);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  size_t n = strlen(csv);
  FILE *fp = fopen(tmp, "wb");
  int ok = fp && fwrite(csv, 1, n, fp) == n;
  if (fp && fclose(fp)) ok = 0;
  if (!ok || rename(tmp, path)) {
    LOG(ERROR, "writing %s: %s", path, strerror(errno));
    unlink(tmp);
    id[0] = '\0';
    return;
  }
  struct dapo_sha256 sha;
  dapo_sha256_begin(&sha);
  dapo_sha256_feed(&sha, csv, n);
  dapo_sha256_end_hex(&sha, f.sha256);
  char filename[96];
  snprintf(filename, sizeof filename, "%s_results.csv", j->id);
  f.owner = j->owner ? j->owner : "";
  f.filename = filename;
  f.purpose = "fine-tune-results";
  f.bytes = (int64_t)n;
  f.valid = 1;
  f.path = path;
  snprintf(f.id, sizeof f.id, "%s", id);
  int rc = store_file_insert(r->srv->store, &f, &e);
  if (rc && rc != STORE_EEXISTS) {
    LOG(ERROR, "the result file of %s: %s", j->id, e.msg);
    id[0] = '\0';
  }
}

static json_t *ft_job_json(struct api_req *r, const struct store_job *j) {
  const json_t *res = j->resolved ? j->resolved : j->spec;
  const char *model;
  char base[256];
  job_models(j, &model, base, sizeof base);
  const json_t *judge = json_object_get(res, "judge");
  json_t *meta = j->metadata ? json_deep_copy(j->metadata) : json_object();
  /* what create echoed (the RFT hyperparameters as given), kept under a reserved key */
  const char *echo_text = json_string_value(json_object_get(meta, "dapod_rft"));
  json_t *echo = echo_text ? json_loads(echo_text, 0, NULL) : NULL;
  json_object_del(meta, "dapod_rft");
  json_object_del(meta, "dapod_model");
  char name[512];
  int64_t last = j->n_ckpt ? j->ckpt_steps[j->n_ckpt - 1] : -1;
  api_oai_model_name(base, j->suffix, j->id, -1, name, sizeof name);
  json_t *err = json_null();
  if (j->error)
    err = json_pack("{s:O, s:O, s:O}", "code", json_object_get(j->error, "code"), "message",
                    json_object_get(j->error, "message"), "param",
                    json_object_get(j->error, "param") ? json_object_get(j->error, "param")
                                                       : json_null());
  const char *mname = json_string_value(json_object_get(res, "method"));
  int dpo = mname && !strcmp(mname, "dpo");
  int sft = dpo || (mname && !strcmp(mname, "supervised")); /* both: one shape, their names */
  const json_t *nhp = json_object_get(res, "hyperparameters");
  json_t *trained = json_null(), *files = json_array();
  if (sft && j->step > 0) { /* trained_tokens, and the result file once the job succeeded */
    char *csv = NULL, fid[STORE_ID_MAX] = "";
    int64_t tokens = 0;
    int done = j->status == STORE_JOB_SUCCEEDED;
    if (!sft_results(r->srv->store, j->id, dpo, done ? &csv : NULL, &tokens)) {
      trained = json_integer((json_int_t)tokens);
      if (csv) sft_result_file(r, j, csv, fid);
      if (fid[0]) json_array_append_new(files, json_string(fid));
    }
    free(csv);
  }
  json_t *method =
      sft ? json_pack("{s:s, s:{s:o}}", "type", mname, mname, "hyperparameters", sft_hparams(nhp))
          : json_pack(
                "{s:s, s:{s:O, s:o, s:O}}", "type", "reinforcement", "reinforcement", "grader",
                json_object_get(judge, "grader") ? json_object_get(judge, "grader") : json_null(),
                "hyperparameters", rft_hparams(json_object_get(res, "hyperparameters"), echo),
                "response_format",
                json_object_get(res, "response_format") ? json_object_get(res, "response_format")
                : json_object_get(judge, "response_format")
                    ? json_object_get(judge, "response_format")
                    : json_null());
  /* dapod's extension, resolved (every field), when the job has one */
  const json_t *episode = json_object_get(res, "episode");
  if (!sft && method && episode && !json_is_null(episode))
    json_object_set(json_object_get(method, "reinforcement"), "episode", (json_t *)episode);
  json_t *o = json_pack(
      "{s:s, s:s, s:I, s:s, s:s, s:s, s:o, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, "
      "s:o, s:o, s:o, s:I, s:I, s:o}",
      "id", j->id, "object", "fine_tuning.job", "created_at", (json_int_t)j->created_at, "model",
      model ? model : "", "organization_id", "org-dapod", "training_file", j->training_file,
      "validation_file", j->validation_file ? json_string(j->validation_file) : json_null(),
      "status", oai_status(j->status), "error", err ? err : json_null(), "fine_tuned_model",
      j->status == STORE_JOB_SUCCEEDED && last >= 0 ? json_string(name) : json_null(),
      "finished_at", j->finished_at ? json_integer(j->finished_at) : json_null(), "trained_tokens",
      trained, "result_files", files, "seed", or_null(json_object_get(res, "seed")),
      "hyperparameters", sft ? sft_hparams(nhp) : rft_hparams(nhp, echo), "method",
      method ? method : json_null(), "metadata", meta ? meta : json_null(), "estimated_finish",
      json_null(), "integrations", json_array(), "user_provided_suffix",
      j->suffix ? json_string(j->suffix) : json_null(), "step", (json_int_t)j->step, "total_steps",
      (json_int_t)j->total_steps, "dapod_status", json_string(store_job_status_name(j->status)));
  json_decref(echo);
  return o;
}

static int reply_ft_job(struct api_req *r, int status, const struct store_job *j) {
  return api_reply_json_steal(r, status, ft_job_json(r, j));
}

static int load_job(struct api_req *r, struct store_job *job) {
  struct dapo_err e = {0};
  int rc = store_job_get(r->srv->store, r->params[0], r->owner, job, &e);
  if (rc == STORE_ENOTFOUND)
    api_oai_error(r, 404, NULL, "fine_tuning_job_id", "not_found", "No such job: %.64s",
                  r->params[0]);
  else if (rc)
    api_oai_error(r, rc == DAPO_ENOMEM ? 503 : 500, NULL, NULL, NULL, "%s", e.msg);
  return rc;
}

/* ---- create: the RFT body as a native one ---- */

#define NUM_INT 1     /* auto_or_num: an integer */
#define NUM_OPEN_LO 2 /* auto_or_num: lo itself refused */
#define RFT_HP "method.reinforcement.hyperparameters"

/* "auto" (0 returned, *out untouched) or a number in [lo, hi] (1); -1 after adding an error
 * named prefix.key. flags: NUM_INT, NUM_OPEN_LO. */
static int auto_or_num(const json_t *hp, const char *prefix, const char *key, double lo, double hi,
                       int flags, double *out, json_t *errors) {
  const json_t *v = json_object_get(hp, key);
  if (!v || json_is_null(v) || (json_is_string(v) && !strcmp(json_string_value(v), "auto")))
    return 0;
  double x = json_number_value(v);
  int integer = flags & NUM_INT;
  if (!json_is_number(v) || (integer && !json_is_integer(v)) || x < lo || x > hi ||
      ((flags & NUM_OPEN_LO) && x <= lo)) {
    char field[128], msg[128];
    snprintf(field, sizeof field, "%s.%s", prefix, key);
    snprintf(msg, sizeof msg, "expected \"auto\" or %s in %c%g, %g]",
             integer ? "an integer" : "a number", flags & NUM_OPEN_LO ? '(' : '[', lo, hi);
    dapo_errors_add(errors, field, msg);
    return -1;
  }
  *out = x;
  return 1;
}

/* Training items of the caller's file id (0 when unknown): what n_epochs turns into steps.
 * lines (or NULL): its lines, for a file that is no valid DAPO file (a supervised one). */
static int64_t file_items(struct api_req *r, const char *id, int64_t *lines) {
  struct store_file f;
  struct dapo_err e = {0};
  int64_t n = 0;
  if (lines) *lines = 0;
  if (id && !store_file_get(r->srv->store, id, r->owner, &f, &e)) {
    n = f.n_items;
    if (lines) *lines = f.n_lines;
    store_file_deinit(&f);
  }
  return n;
}

/* What every method's native body shares: seed, suffix, the model (an ft: name as its
 * checkpoint's native id), and the chat template: a checkpoint's job's, or the default on models
 * without one (the presets render messages with it). Takes nb (NULL passes through). */
static json_t *finish_body(struct api_req *r, const json_t *b, json_t *nb, json_t *errors) {
  if (!nb) return NULL;
  const json_t *seed = json_object_get(b, "seed"), *suffix = json_object_get(b, "suffix");
  if (seed && !json_is_null(seed)) json_object_set(nb, "seed", (json_t *)seed);
  if (suffix && !json_is_null(suffix)) json_object_set(nb, "suffix", (json_t *)suffix);
  json_t *meta = json_object_get(b, "metadata");
  if (meta && !json_is_null(meta) && !json_is_object(meta))
    dapo_errors_add(errors, "metadata", "expected an object of strings");
  if (!json_object_get(nb, "metadata"))
    json_object_set_new(nb, "metadata",
                        json_is_object(meta) ? json_deep_copy(meta) : json_object());
  const char *model = json_string_value(json_object_get(b, "model"));
  char native[STORE_ID_MAX + 32], job_id[STORE_ID_MAX] = "";
  if (model && api_oai_model_native(r, model, native, sizeof native, job_id, sizeof job_id)) {
    /* a fine-tuned model (OpenAI's way to train on from a job's result) is its checkpoint; the
       job shows the name as given */
    json_object_set_new(nb, "model", json_string(native));
    json_object_set_new(json_object_get(nb, "metadata"), "dapod_model", json_string(model));
  } else if (model && strstr(model, ":step-")) {
    snprintf(job_id, sizeof job_id, "%.*s", (int)(strstr(model, ":step-") - model), model);
  }
  if (job_id[0]) { /* a checkpoint trains on in the chat template its job taught it */
    struct store_job sj;
    struct dapo_err e = {0};
    if (!store_job_get(r->srv->store, job_id, r->owner, &sj, &e)) {
      const json_t *t = json_object_get(sj.spec, "chat_template");
      if (t && !json_object_get(nb, "chat_template"))
        json_object_set(nb, "chat_template", (json_t *)t);
      store_job_deinit(&sj);
    }
    return nb;
  }
  struct registry_entry ent;
  if (model && registry_find(r->srv, model, r->owner, &ent) == 0 && ent.kind == REGISTRY_PRESET)
    json_object_set_new(
        nb, "chat_template",
        json_loads(json_object_get(nb, "judge") ? DEFAULT_TEMPLATE : SFT_TEMPLATE, 0, NULL));
  return nb;
}

/* The native body of method.supervised or method.dpo (kind: "supervised", "dpo"; a supervised
 * job also takes the deprecated top-level hyperparameters when method.supervised has none):
 * batch_size 1..256 (auto SFT_AUTO_BATCH), n_epochs 1..50 (auto SFT_AUTO_EPOCHS),
 * learning_rate_multiplier in (0, SFT_MAX_LRM] of BASE_LR (or of a native learning_rate), and
 * for dpo beta in (0, 2] (auto DPO_AUTO_BETA); any other member is a native knob of the method. */
static json_t *sft_body(struct api_req *r, const json_t *b, const json_t *method, const char *kind,
                        json_t *errors) {
  const json_t *sup = json_object_get(method, kind);
  const char *key;
  json_t *v;
  int dpo = !strcmp(kind, "dpo");
  char prefix[64], field[160];
  snprintf(prefix, sizeof prefix, "method.%s", kind);
  if (sup && !json_is_null(sup) && !json_is_object(sup)) {
    dapo_errors_add(errors, prefix, "expected an object");
    return NULL;
  }
  json_object_foreach((json_t *)sup, key, v) {
    if (strcmp(key, "hyperparameters")) {
      snprintf(field, sizeof field, "%s.%.64s", prefix, key);
      dapo_errors_add(errors, field, "unknown field");
    }
  }
  json_object_foreach((json_t *)method, key, v) {
    if (strcmp(key, "type") && strcmp(key, kind)) {
      char msg[64];
      snprintf(field, sizeof field, "method.%.64s", key);
      snprintf(msg, sizeof msg, "not a member of a %s method", kind);
      dapo_errors_add(errors, field, msg);
    }
  }
  snprintf(prefix, sizeof prefix, "method.%s.hyperparameters", kind);
  const json_t *hp = json_object_get(sup, "hyperparameters");
  const json_t *top = json_object_get(b, "hyperparameters");
  if (top && !json_is_null(top) && json_object_size(top) && dpo)
    dapo_errors_add(errors, "hyperparameters",
                    "the top-level hyperparameters are supervised fine-tuning's; give them as "
                    "method.dpo.hyperparameters");
  else if (hp && !json_is_null(hp) && top && !json_is_null(top) && json_object_size(top))
    dapo_errors_add(errors, "hyperparameters",
                    "give the hyperparameters once, in method.supervised.hyperparameters (the "
                    "top-level ones are deprecated)");
  else if ((!hp || json_is_null(hp)) && top && !json_is_null(top)) {
    hp = top; /* OpenAI's deprecated place, still accepted for supervised jobs */
    snprintf(prefix, sizeof prefix, "hyperparameters");
  }
  if (hp && !json_is_null(hp) && !json_is_object(hp)) {
    dapo_errors_add(errors, prefix, "expected an object");
    return NULL;
  }
  json_t *nhp = json_object();
  json_object_foreach((json_t *)hp, key, v) {
    if (strcmp(key, "n_epochs") && strcmp(key, "learning_rate_multiplier") && strcmp(key, "beta"))
      json_object_set(nhp, key, v); /* batch_size is the native name too */
  }
  double epochs = SFT_AUTO_EPOCHS, batch = SFT_AUTO_BATCH, lrm = 1, beta = DPO_AUTO_BETA;
  if (dpo && auto_or_num(hp, prefix, "beta", 0, 2, NUM_OPEN_LO, &beta, errors) >= 0)
    json_object_set_new(nhp, "beta", json_real(beta));
  else if (!dpo && json_object_get(hp, "beta")) /* refused by the native check, named */
    json_object_set(nhp, "beta", json_object_get(hp, "beta"));
  if (auto_or_num(hp, prefix, "batch_size", 1, 256, NUM_INT, &batch, errors) >= 0)
    json_object_set_new(nhp, "batch_size", json_integer((json_int_t)batch));
  auto_or_num(hp, prefix, "n_epochs", 1, 50, NUM_INT, &epochs, errors);
  auto_or_num(hp, prefix, "learning_rate_multiplier", 0, SFT_MAX_LRM, NUM_OPEN_LO, &lrm, errors);
  if (!json_object_get(nhp, "epochs"))
    json_object_set_new(nhp, "epochs", json_integer((json_int_t)epochs));
  const json_t *lr = json_object_get(nhp, "learning_rate"); /* not a number: the service says */
  if (!lr || json_is_number(lr))
    json_object_set_new(nhp, "learning_rate",
                        json_real((lr ? json_number_value(lr) : BASE_LR) * lrm));
  if (json_is_integer(json_object_get(nhp, "epochs")))
    epochs = (double)json_integer_value(json_object_get(nhp, "epochs"));
  /* with a validation file, an evaluation and a checkpoint every quarter, as RFT jobs */
  int64_t lines = 0,
          n = file_items(r, json_string_value(json_object_get(b, "training_file")), &lines);
  n = n > 0 ? n : lines; /* prompt/completion lines are no DAPO items */
  if (json_is_string(json_object_get(b, "validation_file")) && n > 0 &&
      !json_object_get(nhp, "eval_every")) {
    int64_t per = (n + (int64_t)batch - 1) / (int64_t)batch, total = per * (int64_t)epochs;
    total = total < 1 ? 1 : total;
    json_object_set_new(nhp, "eval_every", json_integer(total > 4 ? total / 4 : 1));
  }
  if (!json_object_get(nhp, "checkpoint_every") && json_object_get(nhp, "eval_every"))
    json_object_set(nhp, "checkpoint_every", json_object_get(nhp, "eval_every"));
  return json_pack("{s:s, s:O?, s:O?, s:O?, s:o}", "method", kind, "model",
                   json_object_get(b, "model"), "training_file",
                   json_object_get(b, "training_file"), "validation_file",
                   json_object_get(b, "validation_file"), "hyperparameters", nhp);
}

/* The native job body of an RFT create body; problems go to errors with OpenAI's field names. */
static json_t *native_body(struct api_req *r, const json_t *b, json_t *errors) {
  static const char *const known[] = {"model",  "training_file", "validation_file",
                                      "suffix", "seed",          "metadata",
                                      "method", "integrations",  "hyperparameters"};
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)b, key, v) {
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok |= !strcmp(key, known[i]);
    if (!ok) dapo_errors_add(errors, key, "unknown field");
  }
  const json_t *method = json_object_get(b, "method");
  const char *mtype = json_string_value(json_object_get(method, "type"));
  if (!mtype) {
    dapo_errors_add(errors, "method.type",
                    "required: \"supervised\", \"dpo\" or \"reinforcement\"");
    return NULL;
  }
  if (!strcmp(mtype, "supervised") || !strcmp(mtype, "dpo"))
    return finish_body(r, b, sft_body(r, b, method, mtype, errors), errors);
  if (strcmp(mtype, "reinforcement")) {
    char msg[200];
    snprintf(msg, sizeof msg,
             "'%.32s' is not supported: dapod fine-tunes with \"supervised\", \"dpo\" or "
             "\"reinforcement\" (with a grader)",
             mtype);
    dapo_errors_add(errors, "method.type", msg);
    return NULL;
  }
  const json_t *top_hp = json_object_get(b, "hyperparameters");
  if (top_hp && !json_is_null(top_hp) && json_object_size(top_hp))
    dapo_errors_add(errors, "hyperparameters",
                    "the top-level hyperparameters are supervised fine-tuning's; give them as "
                    "method.reinforcement.hyperparameters");
  const json_t *rl = json_object_get(method, "reinforcement");
  const json_t *grader = json_object_get(rl, "grader");
  if (!json_is_object(rl) || !grader) {
    dapo_errors_add(errors, "method.reinforcement.grader", "required: the grader that scores");
    return NULL;
  }
  json_object_foreach((json_t *)rl, key, v) {
    if (strcmp(key, "grader") && strcmp(key, "hyperparameters") && strcmp(key, "response_format") &&
        strcmp(key, "episode")) {
      char field[128];
      snprintf(field, sizeof field, "method.reinforcement.%.64s", key);
      dapo_errors_add(errors, field, "unknown field");
    }
  }
  const json_t *hp = json_object_get(rl, "hyperparameters");
  if (hp && !json_is_null(hp) && !json_is_object(hp)) {
    dapo_errors_add(errors, "method.reinforcement.hyperparameters", "expected an object");
    hp = NULL;
  }
  /* the training file's size decides the steps of n_epochs */
  int64_t n_items = file_items(r, json_string_value(json_object_get(b, "training_file")), NULL);
  json_t *nhp = json_object(); /* native knobs */
  json_t *echo = json_object();
  const char *rft_keys[] = {"n_epochs",        "batch_size",   "learning_rate_multiplier",
                            "eval_interval",   "eval_samples", "compute_multiplier",
                            "reasoning_effort"};
  json_object_foreach((json_t *)hp, key, v) {
    int rft = 0;
    for (size_t i = 0; i < sizeof rft_keys / sizeof rft_keys[0]; i++)
      rft |= !strcmp(key, rft_keys[i]);
    if (rft)
      json_object_set(echo, key, v);
    else /* DAPO's own knobs, by their native names: checked by the job service */
      json_object_set(nhp, key, v);
  }
  double epochs = 1, batch = AUTO_BATCH, lrm = 1, eval_int = 0, eval_samples = 0, cm = 1;
  int has_batch = auto_or_num(hp, RFT_HP, "batch_size", 1, 65536, NUM_INT, &batch, errors);
  auto_or_num(hp, RFT_HP, "n_epochs", 1, 1000, NUM_INT, &epochs, errors);
  int has_lrm = auto_or_num(hp, RFT_HP, "learning_rate_multiplier", 1e-6, 1e6, 0, &lrm, errors);
  int has_eval = auto_or_num(hp, RFT_HP, "eval_interval", 1, 1 << 24, NUM_INT, &eval_int, errors);
  int has_es = auto_or_num(hp, RFT_HP, "eval_samples", 1, 1024, NUM_INT, &eval_samples, errors);
  int has_cm = auto_or_num(hp, RFT_HP, "compute_multiplier", 0.01, 64, 0, &cm, errors);
  const json_t *re = json_object_get(hp, "reasoning_effort");
  if (re && !json_is_null(re)) {
    const char *s = json_string_value(re);
    if (!s ||
        (strcmp(s, "default") && strcmp(s, "low") && strcmp(s, "medium") && strcmp(s, "high")))
      dapo_errors_add(errors, "method.reinforcement.hyperparameters.reasoning_effort",
                      "expected default, low, medium or high");
  }
  if (!json_object_get(nhp, "prompt_batch_size") && has_batch >= 0)
    json_object_set_new(nhp, "prompt_batch_size", json_integer((json_int_t)batch));
  if (json_is_integer(json_object_get(nhp, "prompt_batch_size")))
    batch = (double)json_integer_value(json_object_get(nhp, "prompt_batch_size"));
  if (!json_object_get(nhp, "total_steps") && n_items > 0) {
    double steps = ceil(epochs * (double)n_items / (batch > 0 ? batch : 1));
    json_object_set_new(nhp, "total_steps", json_integer((json_int_t)(steps < 1 ? 1 : steps)));
  }
  if (has_lrm > 0 || !json_object_get(nhp, "learning_rate")) {
    double base = json_is_number(json_object_get(nhp, "learning_rate"))
                      ? json_number_value(json_object_get(nhp, "learning_rate"))
                      : BASE_LR;
    json_object_set_new(nhp, "learning_rate", json_real(base * lrm));
  }
  const json_t *vf = json_object_get(b, "validation_file");
  int has_vf = json_is_string(vf);
  if (has_eval > 0 && !json_object_get(nhp, "eval_every"))
    json_object_set_new(nhp, "eval_every", json_integer((json_int_t)eval_int));
  else if (has_eval == 0 && has_vf && !json_object_get(nhp, "eval_every")) {
    int64_t total = json_integer_value(json_object_get(nhp, "total_steps"));
    json_object_set_new(nhp, "eval_every", json_integer(total > 4 ? total / 4 : 1));
  }
  if (has_es > 0 && !json_object_get(nhp, "eval_samples"))
    json_object_set_new(nhp, "eval_samples", json_integer((json_int_t)eval_samples));
  if (has_cm > 0 && !json_object_get(nhp, "group_size")) {
    long g = lround(BASE_GROUP * cm);
    json_object_set_new(nhp, "group_size", json_integer(g < 2 ? 2 : g > 64 ? 64 : g));
  }
  /* a checkpoint at each evaluation, as OpenAI makes one at each validation step */
  if (!json_object_get(nhp, "checkpoint_every") && json_object_get(nhp, "eval_every"))
    json_object_set(nhp, "checkpoint_every", json_object_get(nhp, "eval_every"));

  json_t *judge = json_pack("{s:s, s:O}", "type", "grader", "grader", grader);
  json_t *meta = json_object_get(b, "metadata");
  json_t *nmeta = json_is_object(meta) ? json_deep_copy(meta) : json_object();
  char *echo_text = json_dumps(echo, JSON_COMPACT | JSON_SORT_KEYS);
  if (echo_text) json_object_set_new(nmeta, "dapod_rft", json_string(echo_text));
  free(echo_text);
  json_t *nb = json_pack("{s:O?, s:O?, s:O?, s:o, s:o, s:o}", "model", json_object_get(b, "model"),
                         "training_file", json_object_get(b, "training_file"), "validation_file",
                         json_object_get(b, "validation_file"), "judge", judge, "hyperparameters",
                         nhp, "metadata", nmeta);
  json_decref(echo);
  if (!nb) return NULL;
  /* dapod's extension: the native `episode` (tools with URLs, the python tool), checked by the
   * job service, its errors named method.reinforcement.episode.* */
  const json_t *episode = json_object_get(rl, "episode");
  if (episode && !json_is_null(episode)) json_object_set(nb, "episode", (json_t *)episode);
  /* the job's response_format: it constrains the sampling, and the grader's
   * {{sample.output_json}} parses by it (jobspec.c gives the judge a copy) */
  const json_t *rf = json_object_get(rl, "response_format");
  if (rf && !json_is_null(rf)) json_object_set(nb, "response_format", (json_t *)rf);
  return finish_body(r, b, nb, errors);
}

/* A native field name in OpenAI's words; hp: where the body gave the hyperparameters
 * ("method.reinforcement.", "method.supervised.", "method.dpo." or "" for the top-level
 * ones). */
static void oai_field(const char *f, const char *hp, char *out, size_t cap) {
  if (!strncmp(f, "judge.grader", 12))
    snprintf(out, cap, "method.reinforcement.grader%s", f + 12);
  else if (!strncmp(f, "judge.", 6))
    snprintf(out, cap, "method.reinforcement.%s", f + 6);
  else if (!strncmp(f, "hyperparameters", 15))
    snprintf(out, cap, "%s%s", hp, f);
  else if (!strncmp(f, "episode", 7) || !strncmp(f, "response_format", 15))
    snprintf(out, cap, "method.reinforcement.%s", f);
  else
    snprintf(out, cap, "%s", f);
}

/* Where body b gives its hyperparameters, as oai_field's hp. */
static const char *hp_place(const json_t *b) {
  const json_t *m = json_object_get(b, "method");
  const char *type = json_string_value(json_object_get(m, "type"));
  if (type && !strcmp(type, "dpo")) /* the top-level ones are refused by their own name */
    return json_object_size(json_object_get(b, "hyperparameters")) ? "" : "method.dpo.";
  if (!type || strcmp(type, "supervised")) return "method.reinforcement.";
  const json_t *hp = json_object_get(json_object_get(m, "supervised"), "hyperparameters");
  const json_t *top = json_object_get(b, "hyperparameters");
  return ((!hp || json_is_null(hp)) && json_is_object(top)) || json_object_size(top)
             ? ""
             : "method.supervised.";
}

static int reply_errors(struct api_req *r, const json_t *errors) {
  char msg[1024] = "", first[192] = "";
  size_t used = 0, i;
  const json_t *it;
  json_array_foreach((json_t *)errors, i, it) {
    const char *f = json_string_value(json_object_get(it, "field"));
    const char *m = json_string_value(json_object_get(it, "message"));
    char field[192];
    if (!f) f = json_is_integer(json_object_get(it, "line")) ? "training_file" : "";
    oai_field(f, hp_place(r->json), field, sizeof field);
    if (i == 0) snprintf(first, sizeof first, "%s", field);
    int k = snprintf(msg + used, sizeof msg - used, "%s%s%s%s", i ? "; " : "", field,
                     *field ? ": " : "", m ? m : "invalid");
    if (k < 0 || (size_t)k >= sizeof msg - used) break;
    used += (size_t)k;
  }
  return api_oai_error(r, 400, NULL, *first ? first : NULL, "invalid_value", "%s", msg);
}

/* An SDK retry (X-Stainless-Retry-Count > 0) of a creation that may have succeeded: the job of
 * this owner created from the same body within RETRY_WINDOW_S, if any (0 and *out). */
static int find_retried(struct api_req *r, const json_t *nb, struct store_job *out) {
  const char *rc = api_header(r, "X-Stainless-Retry-Count");
  if (!rc || !strcmp(rc, "0")) return -1;
  char hash[65];
  struct dapo_err e = {0};
  if (store_body_hash(nb, hash, &e)) return -1;
  struct store_job_list l = {0};
  if (store_job_list(r->srv->store, r->owner, NULL, 20, NULL, &l, &e)) return -1;
  int found = -1;
  int64_t now = (int64_t)time(NULL);
  for (size_t i = 0; i < l.n && found < 0; i++) {
    if (!strcmp(l.v[i].body_hash, hash) && now - l.v[i].created_at <= RETRY_WINDOW_S) {
      *out = l.v[i];
      memset(&l.v[i], 0, sizeof l.v[i]);
      found = 0;
    }
  }
  store_job_list_deinit(&l);
  return found;
}

int api_ft_jobs_create(struct api_req *r) {
  if (!json_is_object(r->json))
    return api_oai_error(r, 400, NULL, NULL, "invalid_value", "the body must be a JSON object");
  json_t *errors = json_array();
  if (!errors) return api_oai_error(r, 503, NULL, NULL, NULL, "out of memory");
  json_t *nb = native_body(r, r->json, errors);
  if (json_array_size(errors) || !nb) {
    json_decref(nb);
    int rc = json_array_size(errors) ? reply_errors(r, errors)
                                     : api_oai_error(r, 503, NULL, NULL, NULL, "out of memory");
    json_decref(errors);
    return rc;
  }
  struct store_job job;
  if (find_retried(r, nb, &job) == 0) {
    json_decref(nb);
    json_decref(errors);
    int rc = reply_ft_job(r, 200, &job);
    store_job_deinit(&job);
    return rc;
  }
  struct jobs_new req = {.body = nb, .owner = r->owner};
  struct dapo_err e = {0};
  int existed = 0;
  int rc = jobs_create(r->srv, &req, &job, &existed, errors, NULL, &e);
  json_decref(nb);
  if (rc == DAPO_EINVAL) {
    rc = reply_errors(r, errors);
    json_decref(errors);
    return rc;
  }
  json_decref(errors);
  if (rc == STORE_EFULL) {
    rc = api_oai_error(r, 429, "rate_limit_error", NULL, "rate_limit_exceeded", "%s", e.msg);
    if (!rc) api_reply_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "30");
    return rc;
  }
  if (rc) return api_oai_error(r, rc == DAPO_ENOMEM ? 503 : 500, NULL, NULL, NULL, "%s", e.msg);
  rc = reply_ft_job(r, 200, &job);
  store_job_deinit(&job);
  return rc;
}

/* ---- read and lifecycle ---- */

/* 1 when job's metadata has every metadata[k]=v of the query. */
struct meta_filter {
  const json_t *meta;
  int ok;
};

static enum MHD_Result meta_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value) {
  (void)kind;
  struct meta_filter *f = cls;
  size_t n = strlen(key);
  if (n < 10 || strncmp(key, "metadata[", 9) || key[n - 1] != ']') return MHD_YES;
  char k[128];
  if (n - 10 >= sizeof k) {
    f->ok = 0;
    return MHD_YES;
  }
  memcpy(k, key + 9, n - 10);
  k[n - 10] = '\0';
  const char *have = json_string_value(json_object_get(f->meta, k));
  if (!have || !value || strcmp(have, value)) f->ok = 0;
  return MHD_YES;
}

static int page_params(struct api_req *r, int def, int *limit, const char **after) {
  const char *l = api_query(r, "limit");
  *after = api_query(r, "after");
  *limit = def;
  if (l) {
    char *end;
    long v = strtol(l, &end, 10);
    if (*end || v < 1 || v > FT_LIST_MAX) {
      api_oai_error(r, 400, NULL, "limit", "invalid_value", "limit: expected 1..%d", FT_LIST_MAX);
      return -1;
    }
    *limit = (int)v;
  }
  return 0;
}

int api_ft_jobs_list(struct api_req *r) {
  int limit;
  const char *after;
  if (page_params(r, 20, &limit, &after)) return 0;
  json_t *data = json_array();
  char cursor[STORE_ID_MAX] = "";
  if (after) snprintf(cursor, sizeof cursor, "%s", after);
  int has_more = 0;
  for (int round = 0; data && round < 100; round++) {
    struct store_job_list l = {0};
    struct dapo_err e = {0};
    int rc =
        store_job_list(r->srv->store, r->owner, NULL, FT_LIST_MAX, *cursor ? cursor : NULL, &l, &e);
    if (rc == STORE_ENOTFOUND) {
      json_decref(data);
      return api_oai_error(r, 400, NULL, "after", "invalid_value", "after: no such job '%.64s'",
                           after);
    }
    if (rc) {
      json_decref(data);
      return api_oai_error(r, 500, NULL, NULL, NULL, "%s", e.msg);
    }
    size_t i;
    for (i = 0; i < l.n; i++) {
      struct meta_filter f = {l.v[i].metadata, 1};
      MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, meta_arg, &f);
      if (!f.ok) continue;
      if ((int)json_array_size(data) == limit) {
        has_more = 1;
        break;
      }
      json_array_append_new(data, ft_job_json(r, &l.v[i]));
    }
    int more = l.has_more && !has_more;
    if (l.n) snprintf(cursor, sizeof cursor, "%s", l.v[l.n - 1].id);
    store_job_list_deinit(&l);
    if (!more) break;
  }
  if (!data) return api_oai_error(r, 503, NULL, NULL, NULL, "out of memory");
  return api_reply_json_steal(
      r, 200, json_pack("{s:s, s:o, s:b}", "object", "list", "data", data, "has_more", has_more));
}

int api_ft_jobs_get(struct api_req *r) {
  struct store_job job;
  if (load_job(r, &job)) return 0;
  int rc = reply_ft_job(r, 200, &job);
  store_job_deinit(&job);
  return rc;
}

static int ft_lifecycle(struct api_req *r, int act) {
  struct store_job job;
  struct dapo_err e = {0};
  int rc = api_job_request(r, act, &job, &e);
  if (rc == STORE_ENOTFOUND)
    return api_oai_error(r, 404, NULL, "fine_tuning_job_id", "not_found", "No such job: %.64s",
                         r->params[0]);
  if (rc == STORE_ETRANSITION)
    return api_oai_error(r, 409, NULL, "fine_tuning_job_id", "invalid_state", "%s", e.msg);
  if (rc) return api_oai_error(r, 500, NULL, NULL, NULL, "%s", e.msg);
  rc = reply_ft_job(r, 200, &job);
  store_job_deinit(&job);
  return rc;
}

int api_ft_jobs_cancel(struct api_req *r) {
  return ft_lifecycle(r, API_JOB_CANCEL);
}
int api_ft_jobs_pause(struct api_req *r) {
  return ft_lifecycle(r, API_JOB_PAUSE);
}
int api_ft_jobs_resume(struct api_req *r) {
  return ft_lifecycle(r, API_JOB_RESUME);
}

/* ---- events ---- */

static double num(const json_t *o, const char *k) {
  return json_number_value(json_object_get(o, k));
}

/* A supervised or DPO step's native metrics d in OpenAI's names, into out: train/loss as
 * train_loss, train/mean_token_accuracy as train_mean_token_accuracy, valid/... as valid_...,
 * an epoch end's full_valid/... as full_valid_...;
 * a DPO step's loss likewise and its rewards/x as train_rewards_x, valid/rewards/x as
 * valid_rewards_x (OpenAI's metrics objects name no DPO reward: dapod's names, in its
 * pattern). */
static void sft_metrics(const json_t *d, json_t *out) {
  static const char *const names[][2] = {
      {"train/loss", "train_loss"},
      {"train/mean_token_accuracy", "train_mean_token_accuracy"},
      {"valid/loss", "valid_loss"},
      {"valid/mean_token_accuracy", "valid_mean_token_accuracy"},
      {"rewards/accuracy", "train_rewards_accuracy"},
      {"rewards/margin", "train_rewards_margin"},
      {"rewards/chosen", "train_rewards_chosen"},
      {"rewards/rejected", "train_rewards_rejected"},
      {"valid/rewards/accuracy", "valid_rewards_accuracy"},
      {"valid/rewards/margin", "valid_rewards_margin"},
      {"valid/rewards/chosen", "valid_rewards_chosen"},
      {"valid/rewards/rejected", "valid_rewards_rejected"},
      {"full_valid/loss", "full_valid_loss"},
      {"full_valid/mean_token_accuracy", "full_valid_mean_token_accuracy"},
      {"full_valid/rewards/accuracy", "full_valid_rewards_accuracy"},
      {"full_valid/rewards/margin", "full_valid_rewards_margin"},
      {"full_valid/rewards/chosen", "full_valid_rewards_chosen"},
      {"full_valid/rewards/rejected", "full_valid_rewards_rejected"}};
  for (size_t i = 0; d && i < sizeof names / sizeof names[0]; i++)
    if (json_is_number(json_object_get(d, names[i][0])))
      json_object_set_new(out, names[i][1], json_real(num(d, names[i][0])));
}

/* RFT's errors.graders of a step's native metrics d: one entry with the count of the step's
 * samples that hit each error of the grader taxonomy (judge/errors/<kind>, core/reward/grader.h);
 * an empty list when the job's judge is not a grader. */
static json_t *grader_errors(const json_t *d) {
  json_t *g = json_object(), *list = json_array();
  int any = 0;
  for (int k = 0; g && k < GE_COUNT; k++) {
    char key[64], out[80];
    snprintf(key, sizeof key, "judge/errors/%s", grader_err_name(k));
    json_t *v = json_object_get(d, key);
    if (!json_is_integer(v)) continue;
    snprintf(out, sizeof out, "train_%s_count", grader_err_name(k));
    json_object_set(g, out, v);
    any = 1;
  }
  if (any) json_array_append(list, g);
  json_decref(g);
  return json_pack("{s:o}", "graders", list);
}

/* A stored event as a FineTuningJobEvent; NULL for events OpenAI's list does not show. */
static json_t *ft_event_json(const char *job_id, const struct store_event *ev, int64_t total) {
  char id[STORE_ID_MAX + 32], msg[512];
  snprintf(id, sizeof id, "ftevent-%s-%lld", job_id, (long long)ev->id);
  const json_t *d = ev->data;
  const char *level = "info", *type = "message";
  json_t *data = json_null();
  if (!strcmp(ev->type, "status")) {
    snprintf(msg, sizeof msg, "Job status: %s", json_string_value(json_object_get(d, "status")));
  } else if (!strcmp(ev->type, "end")) {
    snprintf(msg, sizeof msg, "The job has %s",
             json_string_value(json_object_get(d, "status")) ?: "ended");
  } else if (!strcmp(ev->type, "log")) {
    const char *l = json_string_value(json_object_get(d, "level"));
    level = l && !strcmp(l, "error") ? "error" : l && !strncmp(l, "warn", 4) ? "warn" : "info";
    snprintf(msg, sizeof msg, "%s", json_string_value(json_object_get(d, "message")) ?: "");
  } else if (!strcmp(ev->type, "checkpoint")) {
    snprintf(msg, sizeof msg, "Checkpoint created at step %lld",
             (long long)json_integer_value(json_object_get(d, "step")));
  } else if (!strcmp(ev->type, "metrics")) {
    long long step = (long long)json_integer_value(json_object_get(d, "step"));
    type = "metrics";
    if (json_object_get(d, "train/loss") || json_object_get(d, "valid/loss")) {
      data = json_pack("{s:I, s:I}", "step", (json_int_t)step, "total_steps", (json_int_t)total);
      sft_metrics(d, data);
      json_object_set(data, "dapod", (json_t *)d);
      if (json_object_get(d, "rewards/accuracy"))
        snprintf(msg, sizeof msg,
                 "Step %lld/%lld: training loss=%.4f, rewards accuracy=%.4f, margin=%.4f", step,
                 (long long)total, num(d, "train/loss"), num(d, "rewards/accuracy"),
                 num(d, "rewards/margin"));
      else if (json_object_get(d, "valid/rewards/accuracy"))
        snprintf(msg, sizeof msg,
                 "Step %lld/%lld: validation loss=%.4f, rewards accuracy=%.4f, margin=%.4f", step,
                 (long long)total, num(d, "valid/loss"), num(d, "valid/rewards/accuracy"),
                 num(d, "valid/rewards/margin"));
      else if (json_object_get(d, "train/loss"))
        snprintf(msg, sizeof msg, "Step %lld/%lld: training loss=%.4f, token accuracy=%.4f", step,
                 (long long)total, num(d, "train/loss"), num(d, "train/mean_token_accuracy"));
      else
        snprintf(msg, sizeof msg, "Step %lld/%lld: validation loss=%.4f, token accuracy=%.4f", step,
                 (long long)total, num(d, "valid/loss"), num(d, "valid/mean_token_accuracy"));
    } else if (json_object_get(d, "eval/accuracy")) {
      double v = num(d, "eval/accuracy");
      snprintf(msg, sizeof msg, "Step %lld/%lld, full validation mean reward=%.4f", step,
               (long long)total, v);
      data =
          json_pack("{s:I, s:I, s:f, s:f, s:{s:f}, s:O}", "step", (json_int_t)step, "total_steps",
                    (json_int_t)total, "full_valid_mean_reward", v, "full_valid_mean_parse_error",
                    0.0, "scores", "valid_reward_mean", v, "dapod", d);
    } else {
      double v = num(d, "reward/mean");
      snprintf(msg, sizeof msg, "Step %lld/%lld, train mean reward=%.4f", step, (long long)total,
               v);
      data = json_pack("{s:I, s:I, s:f, s:f, s:{s:f}, s:o, s:O}", "step", (json_int_t)step,
                       "total_steps", (json_int_t)total, "train_mean_reward", v,
                       "completion_tokens_mean", num(d, "response_length/mean"), "scores",
                       "train_reward_mean", v, "errors", grader_errors(d), "dapod", d);
    }
  } else {
    return NULL;
  }
  return json_pack("{s:s, s:s, s:I, s:s, s:o, s:s, s:o}", "id", id, "object",
                   "fine_tuning.job.event", "created_at", (json_int_t)ev->created_at, "level",
                   level, "message", dapo_json_text(msg), "type", type, "data",
                   data ? data : json_null());
}

/* The number at the end of an id "prefix...-N" / "..._N", or -1. */
static long long id_tail(const char *id, const char *prefix, const char *job_id, char sep) {
  size_t p = strlen(prefix), j = strlen(job_id);
  if (strncmp(id, prefix, p) || strncmp(id + p, job_id, j) || id[p + j] != sep) return -1;
  char *end;
  long long v = strtoll(id + p + j + 1, &end, 10);
  return *end || v < 0 ? -1 : v;
}

int api_ft_events_list(struct api_req *r) {
  int limit;
  const char *after;
  if (page_params(r, 20, &limit, &after)) return 0;
  struct store_job job;
  if (load_job(r, &job)) return 0;
  struct dapo_err e = {0};
  int64_t last = 0;
  int rc = store_event_last_id(r->srv->store, job.id, &last, &e);
  int64_t top = last; /* newest first: events top, top-1, ... */
  if (!rc && after) {
    long long a = id_tail(after, "ftevent-", job.id, '-');
    if (a < 0) {
      store_job_deinit(&job);
      return api_oai_error(r, 400, NULL, "after", "invalid_value", "after: not an event of %.64s",
                           r->params[0]);
    }
    top = a - 1 < last ? a - 1 : last;
  }
  json_t *data = json_array();
  int64_t lowest = top + 1;
  /* read backwards in windows until limit shown events (some types are not shown) */
  while (!rc && data && (int)json_array_size(data) < limit && lowest > 1) {
    int64_t from = lowest - limit > 0 ? lowest - limit : 0; /* ids from+1 .. lowest-1 */
    struct store_event_list l = {0};
    rc = store_event_list(r->srv->store, job.id, from, (int)(lowest - 1 - from), &l, &e);
    for (size_t i = l.n; !rc && i-- > 0 && (int)json_array_size(data) < limit;) {
      json_t *o = ft_event_json(job.id, &l.v[i], job.total_steps);
      if (o) json_array_append_new(data, o);
      lowest = l.v[i].id;
    }
    if (!rc && (l.n == 0 || from == 0)) lowest = (int)json_array_size(data) < limit ? 1 : lowest;
    store_event_list_deinit(&l);
  }
  store_job_deinit(&job);
  if (rc) {
    json_decref(data);
    return api_oai_error(r, 500, NULL, NULL, NULL, "%s", e.msg);
  }
  return api_reply_json_steal(
      r, 200, json_pack("{s:s, s:o, s:b}", "object", "list", "data", data, "has_more", lowest > 1));
}

/* ---- checkpoints ---- */

int api_ft_checkpoints_list(struct api_req *r) {
  int limit;
  const char *after;
  if (page_params(r, 10, &limit, &after)) return 0;
  struct store_job job;
  if (load_job(r, &job)) return 0;
  long long below = -1;
  if (after && (below = id_tail(after, "ftckpt_", job.id, '_')) < 0) {
    store_job_deinit(&job);
    return api_oai_error(r, 400, NULL, "after", "invalid_value", "after: not a checkpoint of %.64s",
                         r->params[0]);
  }
  struct store_ckpt_list l = {0};
  struct dapo_err e = {0};
  int rc = store_ckpt_list(r->srv->store, job.id, &l, &e);
  json_t *data = json_array();
  int has_more = 0;
  const char *model;
  char base[256];
  job_models(&job, &model, base, sizeof base);
  for (size_t k = l.n; !rc && data && k-- > 0;) {
    const struct store_ckpt *c = &l.v[k];
    if (after && c->step >= below) continue;
    if ((int)json_array_size(data) == limit) {
      has_more = 1;
      break;
    }
    char id[STORE_ID_MAX + 32], name[512];
    snprintf(id, sizeof id, "ftckpt_%s_%lld", job.id, (long long)c->step);
    api_oai_model_name(base, job.suffix, job.id, (long long)c->step, name, sizeof name);
    json_t *m = json_pack("{s:I}", "step", (json_int_t)c->step);
    sft_metrics(c->metrics, m);
    if (c->metrics && json_object_get(c->metrics, "reward/mean"))
      json_object_set_new(m, "train_reward_mean", json_real(num(c->metrics, "reward/mean")));
    if (c->metrics && json_object_get(c->metrics, "eval/accuracy"))
      json_object_set_new(m, "valid_reward_mean", json_real(num(c->metrics, "eval/accuracy")));
    json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s, s:I, s:o}", "id", id, "object",
                                          "fine_tuning.job.checkpoint", "created_at",
                                          (json_int_t)c->created_at, "fine_tuned_model_checkpoint",
                                          name, "fine_tuning_job_id", job.id, "step_number",
                                          (json_int_t)c->step, "metrics", m));
  }
  store_ckpt_list_deinit(&l);
  store_job_deinit(&job);
  if (rc || !data) {
    json_decref(data);
    return api_oai_error(r, 500, NULL, NULL, NULL, "%s", rc ? e.msg : "out of memory");
  }
  size_t n = json_array_size(data);
  json_t *first = n ? json_incref(json_object_get(json_array_get(data, 0), "id")) : json_null();
  json_t *lastid =
      n ? json_incref(json_object_get(json_array_get(data, n - 1), "id")) : json_null();
  return api_reply_json_steal(r, 200,
                              json_pack("{s:s, s:o, s:o, s:o, s:b}", "object", "list", "data", data,
                                        "first_id", first, "last_id", lastid, "has_more",
                                        has_more));
}

/* ---- graders ---- */

static struct grader *grader_of(struct api_req *r, const json_t *b) {
  const json_t *g = json_object_get(b, "grader");
  struct dapo_err e = {0};
  if (!g) {
    api_oai_error(r, 400, NULL, "grader", "invalid_value", "grader: required");
    return NULL;
  }
  struct judge_policy pol;
  server_judge_policy(r->srv, &pol);
  struct grader *gr = grader_new(g, "grader", &pol, &e);
  if (!gr) {
    char param[128] = "grader";
    const char *colon = strstr(e.msg, ": ");
    if (colon && (size_t)(colon - e.msg) < sizeof param) {
      memcpy(param, e.msg, (size_t)(colon - e.msg));
      param[colon - e.msg] = '\0';
    }
    api_oai_error(r, 400, NULL, param, "invalid_value", "%s", e.msg);
  }
  return gr;
}

int api_ft_graders_validate(struct api_req *r) {
  if (!json_is_object(r->json))
    return api_oai_error(r, 400, NULL, NULL, "invalid_value", "the body must be a JSON object");
  struct grader *g = grader_of(r, r->json);
  if (!g) return 0;
  grader_free(g);
  return api_reply_json_steal(r, 200,
                              json_pack("{s:O}", "grader", json_object_get(r->json, "grader")));
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int api_ft_graders_run(struct api_req *r) {
  if (!json_is_object(r->json))
    return api_oai_error(r, 400, NULL, NULL, "invalid_value", "the body must be a JSON object");
  const json_t *ms = json_object_get(r->json, "model_sample");
  if (!json_is_string(ms))
    return api_oai_error(r, 400, NULL, "model_sample", "invalid_value",
                         "model_sample: required, the model's output as a string");
  const json_t *item = json_object_get(r->json, "item");
  if (item && !json_is_null(item) && !json_is_object(item))
    return api_oai_error(r, 400, NULL, "item", "invalid_value", "item: expected an object");
  struct grader *g = grader_of(r, r->json);
  if (!g) return 0;
  double t0 = now_s();
  json_t *oj = json_loads(json_string_value(ms), JSON_DECODE_ANY, NULL);
  struct grader_sample s = {.output_text = json_string_value(ms),
                            .output_json = oj,
                            .item = json_is_object(item) ? item : NULL};
  double score = 0;
  json_t *sub = NULL;
  struct grader_errs er;
  int rc = grader_grade(g, &s, 1, &score, &sub, &er);
  json_decref(oj);
  if (rc) {
    grader_free(g);
    return api_oai_error(r, 503, NULL, NULL, NULL, "out of memory");
  }
  json_t *errs = json_object();
  for (int k = 0; k < GE_COUNT; k++)
    if (k != GE_PYTHON_RUNTIME && k != GE_PYTHON_SERVER)
      json_object_set_new(errs, grader_err_name(k), json_boolean(er.n[k] > 0));
  json_object_set_new(errs, "truncated_observation_error", json_false());
  json_object_set_new(errs, "unresponsive_reward_error", json_false());
  json_object_set_new(errs, "python_grader_server_error", json_boolean(er.n[GE_PYTHON_SERVER]));
  json_object_set_new(errs, "python_grader_server_error_type",
                      er.n[GE_PYTHON_SERVER] ? json_string("sandbox") : json_null());
  json_object_set_new(errs, "python_grader_runtime_error", json_boolean(er.n[GE_PYTHON_RUNTIME]));
  json_object_set_new(errs, "python_grader_runtime_error_details",
                      er.detail[0] ? dapo_json_text(er.detail) : json_null());
  json_object_set_new(errs, "model_grader_server_error_details",
                      er.model_detail[0] ? dapo_json_text(er.model_detail) : json_null());
  /* the judge models' tokens: metadata.token_usage is their total (the SDK's integer), and
     model_grader_token_usage_per_model each one's prompt, completion and total tokens */
  json_t *per_model = json_object();
  long total = 0;
  for (int k = 0; per_model && k < er.n_usage; k++) {
    const struct grader_usage *u = &er.usage[k];
    total += u->prompt_tokens + u->completion_tokens;
    json_object_set_new(per_model, u->model,
                        json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)u->prompt_tokens,
                                  "completion_tokens", (json_int_t)u->completion_tokens,
                                  "total_tokens",
                                  (json_int_t)(u->prompt_tokens + u->completion_tokens)));
  }
  json_t *o = json_pack(
      "{s:f, s:{s:s, s:s, s:o, s:f, s:O, s:o, s:o}, s:o, s:o}", "reward", score, "metadata", "name",
      grader_name(g), "type", grader_type(g), "errors", errs, "execution_time", now_s() - t0,
      "scores", sub, "token_usage", er.n_usage ? json_integer((json_int_t)total) : json_null(),
      "sampled_model_name", er.n_usage ? json_string(er.usage[0].model) : json_null(),
      "sub_rewards", sub, "model_grader_token_usage_per_model", per_model);
  grader_free(g);
  return api_reply_json_steal(r, 200, o);
}
