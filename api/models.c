/* Handlers: GET /v1/models, GET /v1/models/{id}. Base models are the presets (core/preset.h)
 * and every sub-folder of models_dir in the Hugging Face layout; a folder that is not a usable
 * model is listed with status "invalid" and an error naming the file and key at fault, so that a
 * user sees why it is not offered. Folders are inspected without loading weights: config.json is
 * parsed (model_config_from_json) and the weight and tokenizer files must exist; the weights
 * themselves are checked when a job or a completion opens the model. Fine-tuned checkpoints are
 * models too: "{job_id}:step-{n}", kind "checkpoint", listed after the base models (jobs oldest
 * first, steps in order). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "handlers.h"
#include "http.h"
#include "log.h"
#include "model.h"
#include "models.h"
#include "parse.h"
#include "preset.h"
#include "runner.h"
#include "server.h"
#include "store.h"
#include "workers.h"

#define MAX_FOLDERS 1000                  /* sub-folders inspected per listing */
#define CONFIG_JSON_MAX ((size_t)1 << 20) /* config.json is small */
#define MAX_CKPT_MODELS 10000             /* checkpoints considered per listing */

static const char *arch_name(enum model_arch a) {
  return a == ARCH_QWEN2 ? "qwen2" : "llama";
}

static json_t *config_summary(const struct model_config *c) {
  return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:i, s:i}",
                   "architecture", arch_name(c->arch), "vocab_size", c->vocab_size, "hidden_size",
                   c->hidden_size, "intermediate_size", c->intermediate_size, "num_hidden_layers",
                   c->num_layers, "num_attention_heads", c->num_heads, "num_key_value_heads",
                   c->num_kv_heads, "head_dim", c->head_dim, "max_position_embeddings",
                   c->max_position_embeddings, "tie_word_embeddings", c->tie_word_embeddings,
                   "qkv_bias", c->qkv_bias, "bos_token_id", c->bos_token_id, "eos_token_id",
                   c->eos_token_id);
}

static json_t *preset_json(const struct preset *p) {
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:n, s:s, s:I}", "id", p->name, "object",
                        "model", "kind", "preset", "owned_by", "dapod", "status", "ready",
                        "created_at", "description", p->description, "parameters",
                        (json_int_t)model_param_count(&p->cfg));
  if (o) json_object_set_new(o, "config", config_summary(&p->cfg));
  return o;
}

/* 1 when dir/name is a regular file; its size into *bytes (may be NULL). */
static int is_file(const char *dir, const char *name, int64_t *bytes) {
  char p[4096];
  struct stat st;
  if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, name) >= sizeof p) return 0;
  if (stat(p, &st) || !S_ISREG(st.st_mode)) return 0;
  if (bytes) *bytes = st.st_size;
  return 1;
}

/* Reads and parses dir/config.json into c; on failure a message naming the problem. */
static int read_config(const char *dir, struct model_config *c, int64_t *mtime,
                       struct dapo_err *e) {
  char p[4096];
  if ((size_t)snprintf(p, sizeof p, "%s/config.json", dir) >= sizeof p)
    return dapo_errf(e, DAPO_EINVAL, "path too long");
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    int err = errno;
    if (fd >= 0) close(fd);
    return dapo_errf(e, DAPO_EIO, "config.json: %s", strerror(err));
  }
  *mtime = st.st_mtime;
  if (!S_ISREG(st.st_mode) || (size_t)st.st_size > CONFIG_JSON_MAX) {
    close(fd);
    return dapo_errf(e, DAPO_EFORMAT, "config.json: not a regular file of at most 1 MiB");
  }
  json_error_t je;
  json_t *j = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
  close(fd);
  if (!j)
    return dapo_errf(e, DAPO_EFORMAT, "config.json: line %d, column %d: %s", je.line, je.column,
                     je.text);
  int rc = model_config_from_json(c, j, e);
  json_decref(j);
  if (!rc) rc = model_config_validate(c, e);
  return rc;
}

/* The model object of folder models_dir/name. Never NULL except out of memory: a folder that is
 * not a usable model gets status "invalid" and an "error". */
static json_t *folder_json(const char *models_dir, const char *name) {
  char dir[4096];
  struct dapo_err e = {0};
  struct model_config c;
  int64_t mtime = 0, wbytes = 0, tbytes = 0;
  int rc = 0;
  const char *weights = NULL;
  if ((size_t)snprintf(dir, sizeof dir, "%s/%s", models_dir, name) >= sizeof dir)
    rc = dapo_errf(&e, DAPO_EINVAL, "path too long");
  if (!rc && preset_find(name))
    rc = dapo_errf(&e, DAPO_EINVAL, "the folder's name is taken by the preset '%s'", name);
  if (!rc) rc = read_config(dir, &c, &mtime, &e);
  if (!rc) {
    if (is_file(dir, "model.safetensors", &wbytes))
      weights = "model.safetensors";
    else if (is_file(dir, "model.safetensors.index.json", &wbytes))
      weights = "model.safetensors.index.json";
    else
      rc = dapo_errf(&e, DAPO_EFORMAT,
                     "no weights: model.safetensors or model.safetensors.index.json is missing");
  }
  if (!rc && !is_file(dir, "tokenizer.json", &tbytes))
    rc = dapo_errf(&e, DAPO_EFORMAT, "tokenizer.json is missing");
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s}", "id", name, "object", "model", "kind",
                        "folder", "owned_by", "dapod", "status", rc ? "invalid" : "ready");
  if (!o) return NULL;
  json_object_set_new(o, "created_at", mtime ? json_integer(mtime) : json_null());
  if (rc) {
    json_object_set_new(o, "error", api_json_text(e.msg));
    return o;
  }
  json_object_set_new(o, "parameters", json_integer(model_param_count(&c)));
  json_object_set_new(o, "weights", json_string(weights));
  json_object_set_new(o, "config", config_summary(&c));
  return o;
}

/* A folder name offered as a model id: UTF-8 (ids are JSON strings), not hidden, not a
 * checkpoint being written. */
static int folder_name_ok(const char *name) {
  if (!name[0] || name[0] == '.' || strstr(name, ".tmp-")) return 0;
  json_t *probe = json_string(name);
  json_decref(probe);
  return probe != NULL;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the sub-folders of dir (owned, free each and the array); a missing folder
 * gives none. Returns 0 or -1 (out of memory). */
static int list_folders(const char *dir, char ***out, int *n_out) {
  *out = NULL;
  *n_out = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  char **v = NULL;
  int n = 0, cap = 0, rc = 0;
  struct dirent *de;
  while ((de = readdir(d)) && n < MAX_FOLDERS) {
    if (!folder_name_ok(de->d_name)) {
      if (de->d_name[0] != '.') LOG(DEBUG, "models: folder name skipped: not UTF-8 or temporary");
      continue;
    }
    char p[4096];
    struct stat st;
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= sizeof p) continue;
    if (stat(p, &st) || !S_ISDIR(st.st_mode)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      char **nv = realloc(v, sizeof *v * (size_t)cap);
      if (!nv) {
        rc = -1;
        break;
      }
      v = nv;
    }
    if (!(v[n] = strdup(de->d_name))) {
      rc = -1;
      break;
    }
    n++;
  }
  closedir(d);
  if (rc) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
    return -1;
  }
  if (n) qsort(v, (size_t)n, sizeof *v, cmp_str);
  *out = v;
  *n_out = n;
  return 0;
}

/* ---- checkpoints as models ---- */

void api_model_ckpt_id(const char *job_id, long long step, char *buf, size_t cap) {
  snprintf(buf, cap, "%s:step-%lld", job_id, step);
}

/* Splits "{job_id}:step-{n}" into job (cap bytes) and *step. 0 when id has that shape. */
static int parse_ckpt_id(const char *id, char *job, size_t cap, int64_t *step) {
  const char *colon = strchr(id, ':');
  if (!colon || (size_t)(colon - id) >= cap || colon == id || strncmp(colon + 1, "step-", 5))
    return -1;
  const char *n = colon + 6;
  if (*n < '0' || *n > '9' || parse_i64(n, 0, INT64_MAX, step, "step", NULL)) return -1;
  memcpy(job, id, (size_t)(colon - id));
  job[colon - id] = '\0';
  return 0;
}

/* The model object of checkpoint c of job_id (never NULL except out of memory). */
static json_t *ckpt_json(const char *job_id, const struct store_ckpt *c) {
  char id[STORE_ID_MAX + 32];
  struct dapo_err e = {0};
  struct model_config mc;
  int64_t mtime = 0;
  api_model_ckpt_id(job_id, (long long)c->step, id, sizeof id);
  int rc = read_config(c->path, &mc, &mtime, &e);
  json_t *o =
      json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:I}", "id", id, "object", "model", "kind",
                "checkpoint", "owned_by", "dapod", "status", rc ? "invalid" : "ready", "created_at",
                (json_int_t)c->created_at, "job_id", job_id, "step", (json_int_t)c->step);
  if (!o) return NULL;
  if (rc) {
    json_object_set_new(o, "error", api_json_text(e.msg));
    return o;
  }
  json_object_set_new(o, "parameters", json_integer(model_param_count(&mc)));
  json_object_set_new(o, "weights", json_string("model.safetensors"));
  json_object_set_new(o, "config", config_summary(&mc));
  return o;
}

/* The checkpoint row of model id "{job_id}:step-{n}" visible to owner. 0, 1 (none), -1 (OOM). */
static int ckpt_lookup(const struct server *s, const char *id, const char *owner, char *job,
                       size_t cap, struct store_ckpt *out) {
  int64_t step;
  struct dapo_err e = {0};
  memset(out, 0, sizeof *out);
  if (!s->store || parse_ckpt_id(id, job, cap, &step)) return 1;
  struct store_job j;
  int rc = store_job_get(s->store, job, owner, &j, &e);
  store_job_deinit(&j);
  if (!rc) rc = store_ckpt_get(s->store, job, step, out, &e);
  if (rc == DAPO_ENOMEM) return -1;
  return rc ? 1 : 0;
}

int api_model_find_owned(const struct server *s, const char *id, const char *owner,
                         json_t **obj_out) {
  *obj_out = NULL;
  const struct preset *p = preset_find(id);
  if (p) return (*obj_out = preset_json(p)) ? 0 : -1;
  if (strchr(id, ':')) {
    char job[STORE_ID_MAX];
    struct store_ckpt c;
    int rc = ckpt_lookup(s, id, owner, job, sizeof job, &c);
    if (rc) return rc;
    *obj_out = ckpt_json(job, &c);
    store_ckpt_deinit(&c);
    return *obj_out ? 0 : -1;
  }
  if (!folder_name_ok(id) || strchr(id, '/')) return 1;
  char dir[4096];
  struct stat st;
  if ((size_t)snprintf(dir, sizeof dir, "%s/%s", s->cfg.models_dir, id) >= sizeof dir ||
      stat(dir, &st) || !S_ISDIR(st.st_mode))
    return 1;
  return (*obj_out = folder_json(s->cfg.models_dir, id)) ? 0 : -1;
}

int api_model_find(const struct server *s, const char *id, json_t **obj_out) {
  return api_model_find_owned(s, id, NULL, obj_out);
}

int api_model_resolve(const struct server *s, const char *id, const char *owner, char **spec_out,
                      char *msg, size_t cap) {
  *spec_out = NULL;
  if (preset_find(id)) return (*spec_out = strdup(id)) ? 0 : -1;
  if (strchr(id, ':')) {
    char job[STORE_ID_MAX];
    struct store_ckpt c;
    int rc = ckpt_lookup(s, id, owner, job, sizeof job, &c);
    if (rc > 0)
      snprintf(msg, cap, "no such model: '%.128s' is not a checkpoint of a job of yours", id);
    if (rc) return rc;
    *spec_out = strdup(c.path);
    store_ckpt_deinit(&c);
    return *spec_out ? 0 : -1;
  }
  json_t *o = NULL;
  int rc = api_model_find_owned(s, id, owner, &o);
  if (rc > 0)
    snprintf(msg, cap,
             "no such model: '%.128s' is neither a preset, a folder in the models directory nor "
             "a checkpoint",
             id);
  if (rc) return rc;
  const char *status = json_string_value(json_object_get(o, "status"));
  if (!status || strcmp(status, "ready")) {
    snprintf(msg, cap, "model '%.128s' is not usable: %.300s", id,
             json_string_value(json_object_get(o, "error"))
                 ? json_string_value(json_object_get(o, "error"))
                 : "invalid");
    json_decref(o);
    return 1;
  }
  json_decref(o);
  size_t n = strlen(s->cfg.models_dir) + strlen(id) + 2;
  if (!(*spec_out = malloc(n))) return -1;
  snprintf(*spec_out, n, "%s/%s", s->cfg.models_dir, id);
  return 0;
}

/* One checkpoint model of the listing. */
struct ckpt_ref {
  char job[STORE_ID_MAX];
  char id[STORE_ID_MAX + 32];
  struct store_ckpt c;
};

static void ckpt_refs_free(struct ckpt_ref *v, int n) {
  for (int i = 0; i < n; i++) store_ckpt_deinit(&v[i].c);
  free(v);
}

/* Every checkpoint visible to owner, jobs oldest first, steps in order (at most
 * MAX_CKPT_MODELS). Returns 0 or -1 (out of memory or a store error, logged). */
static int list_ckpts(const struct server *s, const char *owner, struct ckpt_ref **out,
                      int *n_out) {
  struct store_job_list all = {0};
  struct dapo_err e = {0};
  char after[STORE_ID_MAX] = "";
  char(*ids)[STORE_ID_MAX] = NULL;
  size_t n_ids = 0, cap_ids = 0;
  int rc = 0, n = 0, cap = 0;
  struct ckpt_ref *v = NULL;
  *out = NULL;
  *n_out = 0;
  for (;;) { /* job ids, newest first */
    rc = store_job_list(s->store, owner, NULL, STORE_PAGE_MAX, after[0] ? after : NULL, &all, &e);
    if (rc) break;
    for (size_t i = 0; i < all.n && !rc; i++) {
      if (n_ids == cap_ids) {
        cap_ids = cap_ids ? cap_ids * 2 : 64;
        void *nv = realloc(ids, cap_ids * sizeof *ids);
        if (!nv) {
          rc = -1;
          break;
        }
        ids = nv;
      }
      memcpy(ids[n_ids++], all.v[i].id, STORE_ID_MAX);
    }
    int more = !rc && all.has_more && all.n && n_ids < MAX_CKPT_MODELS;
    if (more) snprintf(after, sizeof after, "%s", all.v[all.n - 1].id);
    store_job_list_deinit(&all);
    if (!more) break;
  }
  for (size_t k = n_ids; !rc && k-- > 0 && n < MAX_CKPT_MODELS;) { /* oldest job first */
    struct store_ckpt_list cl = {0};
    if ((rc = store_ckpt_list(s->store, ids[k], &cl, &e))) break;
    for (size_t i = 0; i < cl.n && n < MAX_CKPT_MODELS; i++) {
      if (n == cap) {
        cap = cap ? cap * 2 : 64;
        void *nv = realloc(v, (size_t)cap * sizeof *v);
        if (!nv) {
          rc = -1;
          break;
        }
        v = nv;
      }
      memset(&v[n], 0, sizeof v[n]);
      memcpy(v[n].job, ids[k], STORE_ID_MAX);
      api_model_ckpt_id(ids[k], (long long)cl.v[i].step, v[n].id, sizeof v[n].id);
      v[n].c = cl.v[i]; /* moved */
      memset(&cl.v[i], 0, sizeof cl.v[i]);
      n++;
    }
    store_ckpt_list_deinit(&cl);
  }
  free(ids);
  if (rc) {
    if (rc != -1) LOG(ERROR, "models: listing checkpoints: %s", e.msg);
    ckpt_refs_free(v, n);
    return -1;
  }
  *out = v;
  *n_out = n;
  return 0;
}

int api_models_list(struct api_req *r) {
  int limit;
  const char *after;
  if (api_page_params(r, &limit, &after)) return 0;
  char **names = NULL;
  int n_names = 0, n_ckpts = 0;
  struct ckpt_ref *ckpts = NULL;
  if (list_folders(r->srv->cfg.models_dir, &names, &n_names))
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory listing models", NULL);
  if (list_ckpts(r->srv, r->owner, &ckpts, &n_ckpts)) {
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
    return api_reply_error(r, API_ERR_INTERNAL, "listing the checkpoints failed", NULL);
  }
  /* One ordered sequence: presets in table order, folders by name, then checkpoints. */
  int np = preset_count(), total = np + n_names + n_ckpts, start = 0;
  if (after) {
    start = -1;
    for (int i = 0; i < total && start < 0; i++) {
      const char *id = i < np             ? preset_get(i)->name
                       : i < np + n_names ? names[i - np]
                                          : ckpts[i - np - n_names].id;
      if (!strcmp(id, after)) start = i + 1;
    }
  }
  json_t *data = json_array(), *o = NULL;
  int end = start < 0 ? 0 : (start + limit < total ? start + limit : total);
  for (int i = start < 0 ? 0 : start; data && i < end; i++) {
    json_t *m = i < np ? preset_json(preset_get(i))
                : i < np + n_names
                    ? folder_json(r->srv->cfg.models_dir, names[i - np])
                    : ckpt_json(ckpts[i - np - n_names].job, &ckpts[i - np - n_names].c);
    if (json_array_append_new(data, m)) {
      json_decref(data);
      data = NULL;
    }
  }
  for (int i = 0; i < n_names; i++) free(names[i]);
  free(names);
  ckpt_refs_free(ckpts, n_ckpts);
  if (start < 0) {
    json_decref(data);
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST, "after: no such model '%.128s'", after);
  }
  size_t n = json_array_size(data);
  o = api_list_json(data, end < total,
                    n ? json_copy(json_object_get(json_array_get(data, n - 1), "id")) : NULL);
  return api_reply_json_steal(r, 200, o);
}

json_t *api_mem_plan_json(const struct mem_plan *p) {
  return json_pack(
      "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:i, s:i, s:i}}", "parameters",
      (json_int_t)p->parameters, "weights_bytes", (json_int_t)p->weights, "gradients_bytes",
      (json_int_t)p->gradients, "optimizer_bytes", (json_int_t)p->optimizer,
      "reference_model_bytes", (json_int_t)p->reference, "activations_bytes",
      (json_int_t)p->activations, "generation_bytes", (json_int_t)p->generation, "buffers_bytes",
      (json_int_t)p->buffers, "total_bytes", (json_int_t)p->total, "for", "max_sequence_tokens",
      p->cap_seq_len, "micro_batch_tokens", p->cap_tokens, "generation_batch", p->gen_batch);
}

#define DEFAULT_PLAN_PROMPT_TOKENS 256 /* the prompt length GET /v1/models/{id} plans for */

/* The model's config: a preset's, or config.json of the folder or checkpoint that id resolves
 * to. 0, or 1 when it cannot be read. */
static int model_cfg(const struct server *s, const char *id, const char *owner,
                     struct model_config *c) {
  char *spec = NULL, msg[256];
  if (api_model_resolve(s, id, owner, &spec, msg, sizeof msg)) return 1;
  const struct preset *p = preset_find(spec);
  int rc = 0;
  if (p) {
    *c = p->cfg;
  } else {
    int64_t mtime;
    struct dapo_err e = {0};
    rc = read_config(spec, c, &mtime, &e) ? 1 : 0;
  }
  free(spec);
  return rc;
}

int api_models_get(struct api_req *r) {
  const char *mp = api_query(r, "max_prompt_tokens");
  int64_t prompt = DEFAULT_PLAN_PROMPT_TOKENS;
  if (mp && parse_i64(mp, 1, 1 << 24, &prompt, "max_prompt_tokens", NULL))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                            "max_prompt_tokens: expected an integer in [1, 16777216], got '%.32s'",
                            mp);
  json_t *o = NULL;
  int rc = api_model_find_owned(r->srv, r->params[0], r->owner, &o);
  if (rc < 0) return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  if (rc > 0)
    return api_reply_errorf(r, API_ERR_NOT_FOUND,
                            "no such model: '%.128s' is neither a preset, a folder in the "
                            "models directory nor a checkpoint",
                            r->params[0]);
  struct model_config c;
  if (!strcmp(json_string_value(json_object_get(o, "status"))
                  ? json_string_value(json_object_get(o, "status"))
                  : "",
              "ready") &&
      !model_cfg(r->srv, r->params[0], r->owner, &c)) {
    /* what a job with the default hyperparameters needs, for prompts of `prompt` tokens */
    struct hparams hp;
    json_t *none = json_array();
    hparams_parse(&hp, NULL, none);
    json_decref(none);
    struct mem_plan plan;
    runner_memory_plan(&c, &hp, (int)prompt, 0, &plan);
    json_t *m = api_mem_plan_json(&plan);
    if (m) {
      json_object_set_new(m, "limit_bytes", json_integer((json_int_t)workers_memory_limit(r->srv)));
      json_object_set_new(m, "fits", json_boolean(plan.total <= workers_memory_limit(r->srv)));
      json_object_set_new(
          m, "assumes",
          json_pack("{s:s, s:i}", "hyperparameters", "defaults", "max_prompt_tokens", (int)prompt));
      json_object_set_new(o, "memory", m);
    }
  }
  return api_reply_json_steal(r, 200, o);
}
