/* Handlers: GET /v1/models, GET /v1/models/{id}: the model registry's entries
 * (server/registry.h: presets, folders of models_dir, checkpoints "{job_id}:step-{n}") rendered
 * as model objects. A folder that is not a usable model is listed with status "invalid" and an
 * error naming the file and key at fault, so that a user sees why it is not offered. One model
 * also carries the memory plan of a job on it, full or with the LoRA adapter the query asks for. */
#include <stdio.h>
#include <string.h>

#include "handlers.h"
#include "http.h"
#include "lora.h"
#include "model.h"
#include "parse.h"
#include "preset.h"
#include "registry.h"
#include "runner.h"
#include "server.h"
#include "workers.h"

static const char *arch_name(enum model_arch a) {
  static const char *const NAMES[] = {"llama", "qwen2", "qwen3"};
  return NAMES[a];
}

static const char *rope_name(int t) {
  static const char *const NAMES[] = {"default", "linear", "llama3", "yarn"};
  return NAMES[t];
}

static json_t *config_summary(const struct model_config *c) {
  return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:b, s:b, s:s, s:i, "
                   "s:i}",
                   "architecture", arch_name(c->arch), "vocab_size", c->vocab_size, "hidden_size",
                   c->hidden_size, "intermediate_size", c->intermediate_size, "num_hidden_layers",
                   c->num_layers, "num_attention_heads", c->num_heads, "num_key_value_heads",
                   c->num_kv_heads, "head_dim", c->head_dim, "max_position_embeddings",
                   c->max_position_embeddings, "tie_word_embeddings", c->tie_word_embeddings,
                   "qkv_bias", c->qkv_bias, "o_bias", c->o_bias, "qk_norm", c->qk_norm, "rope_type",
                   rope_name(c->rope.type), "bos_token_id", c->bos_token_id, "eos_token_id",
                   c->eos_token_id);
}

/* The model object of a registry entry (NULL out of memory). */
static json_t *model_json(const struct registry_entry *m) {
  static const char *const KINDS[] = {"preset", "folder", "checkpoint"};
  json_t *o =
      json_pack("{s:s, s:s, s:s, s:s, s:s}", "id", m->id, "object", "model", "kind", KINDS[m->kind],
                "owned_by", "dapod", "status", m->ready ? "ready" : "invalid");
  if (!o) return NULL;
  json_object_set_new(o, "created_at", m->created_at ? json_integer(m->created_at) : json_null());
  if (m->kind == REGISTRY_PRESET)
    json_object_set_new(o, "description", json_string(m->preset->description));
  if (m->kind == REGISTRY_CHECKPOINT) {
    json_object_set_new(o, "job_id", json_string(m->job_id));
    json_object_set_new(o, "step", json_integer(m->step));
  }
  if (!m->ready) {
    json_object_set_new(o, "error", dapo_json_text(m->error));
    return o;
  }
  json_object_set_new(o, "parameters", json_integer(model_param_count(&m->cfg)));
  if (m->weights) json_object_set_new(o, "weights", json_string(m->weights));
  json_object_set_new(o, "config", config_summary(&m->cfg));
  return o;
}

int api_models_list(struct api_req *r) {
  int limit;
  const char *after;
  if (api_page_params(r, &limit, &after)) return 0;
  struct registry_list l;
  if (registry_list(r->srv, r->owner, &l)) {
    registry_list_deinit(&l);
    return api_reply_error(r, API_ERR_INTERNAL, "listing the models failed", NULL);
  }
  int start = 0;
  if (after) {
    start = -1;
    for (int i = 0; i < l.n && start < 0; i++)
      if (!strcmp(l.v[i].id, after)) start = i + 1;
  }
  if (start < 0) {
    registry_list_deinit(&l);
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST, "after: no such model '%.128s'", after);
  }
  json_t *data = json_array();
  int end = start + limit < l.n ? start + limit : l.n;
  for (int i = start; data && i < end; i++) {
    struct registry_entry m;
    registry_list_entry(r->srv, &l.v[i], &m);
    if (json_array_append_new(data, model_json(&m))) {
      json_decref(data);
      data = NULL;
    }
  }
  int more = end < l.n;
  registry_list_deinit(&l);
  size_t n = json_array_size(data);
  json_t *o = api_list_json(
      data, more, n ? json_copy(json_object_get(json_array_get(data, n - 1), "id")) : NULL);
  return api_reply_json_steal(r, 200, o);
}

#define DEFAULT_PLAN_PROMPT_TOKENS 256 /* the prompt length GET /v1/models/{id} plans for */

/* The query parameters that stand for the keys of a job's adapter object (with adapter=lora). */
static const char *const ADAPTER_PARAMS[] = {"r", "alpha", "target_modules", "use_rslora", NULL};

/* A query value as a job body would carry it (new reference; NULL out of memory): a JSON number
 * or boolean when the text is one, target_modules' comma-separated names as an array (or
 * "all-linear"), else the text itself, which lora_config_parse then refuses by type as it
 * refuses it in a body. Text that is not UTF-8 becomes null (refused the same way). */
static json_t *adapter_value(const char *param, const char *v) {
  if (!strcmp(param, "target_modules") && strcmp(v, "all-linear")) {
    json_t *a = json_array();
    for (const char *p = v; a;) {
      const char *comma = strchr(p, ',');
      size_t n = comma ? (size_t)(comma - p) : strlen(p);
      json_t *name = json_stringn(p, n);
      if (json_array_append_new(a, name ? name : json_null())) json_decref(a), a = NULL;
      if (!comma) break;
      p = comma + 1;
    }
    return a;
  }
  json_t *j = json_loads(v, JSON_DECODE_ANY, NULL);
  if (j && (json_is_number(j) || json_is_boolean(j))) return j;
  json_decref(j);
  j = json_string(v);
  return j ? j : json_null();
}

/* The query parameter of an adapter problem's field ("adapter.r" -> "r",
 * "adapter.target_modules[2]" -> "target_modules") into out (cap bytes). */
static void adapter_param(const char *field, char *out, size_t cap) {
  const char *k = strncmp(field, "adapter.", 8) ? field : field + 8;
  snprintf(out, cap, "%.*s", (int)strcspn(k, "["), k);
}

/* Replies 400 for the adapter's problems (borrowed; lora_config_parse's or lora_config_check's
 * {"field": "adapter.<key>", "message"}), each named by its query parameter: all of them in
 * detail ("r: must be an integer in [1, 4096], got 'x'"; quoted is 1 for parse problems, whose
 * messages do not repeat the value) and in errors. */
static int reply_adapter_problems(struct api_req *r, const json_t *problems, int quoted) {
  char detail[1024] = "";
  size_t len = 0, i;
  json_t *x, *errors = json_array();
  json_array_foreach(problems, i, x) {
    char param[48];
    const char *msg = json_string_value(json_object_get(x, "message"));
    adapter_param(json_string_value(json_object_get(x, "field")), param, sizeof param);
    const char *v = quoted ? api_query(r, param) : NULL;
    int n = snprintf(detail + len, sizeof detail - len, "%s%s: %s%s%.64s%s", i ? "; " : "", param,
                     msg ? msg : "invalid", v ? ", got '" : "", v ? v : "", v ? "'" : "");
    len = n < 0 || (size_t)n >= sizeof detail - len ? sizeof detail - 1 : len + (size_t)n;
    json_array_append_new(errors,
                          json_pack("{s:s, s:s}", "field", param, "message", msg ? msg : ""));
  }
  return api_reply_error(r, API_ERR_INVALID_REQUEST, detail, errors);
}

/* The adapter GET /v1/models/{id} plans for, from the query: none without `adapter` (then none
 * of ADAPTER_PARAMS may be given); with adapter=lora, the object a job's body would carry made of
 * ADAPTER_PARAMS and parsed by lora_config_parse (its defaults, its checks). *has says whether
 * there is one. On a bad parameter replies 400 naming it and returns -1 (the handler then
 * returns 0), as api_page_params. */
static int adapter_query(struct api_req *r, struct lora_config *c, int *has) {
  const char *type = api_query(r, "adapter");
  *has = 0;
  if (!type) {
    for (int i = 0; ADAPTER_PARAMS[i]; i++)
      if (api_query(r, ADAPTER_PARAMS[i])) {
        api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                         "%s: an adapter's parameter, given without adapter=lora (the plan is "
                         "then a full fine-tune's, which has none)",
                         ADAPTER_PARAMS[i]);
        return -1;
      }
    return 0;
  }
  if (strcmp(type, "lora")) {
    api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                     "adapter: '%.32s' is not supported: the one adapter type is lora", type);
    return -1;
  }
  json_t *obj = json_pack("{s:s}", "type", "lora"), *problems = json_array();
  for (int i = 0; obj && ADAPTER_PARAMS[i]; i++) {
    const char *v = api_query(r, ADAPTER_PARAMS[i]);
    if (v && json_object_set_new(obj, ADAPTER_PARAMS[i], adapter_value(ADAPTER_PARAMS[i], v)))
      json_decref(obj), obj = NULL;
  }
  int rc = 0;
  if (!obj || !problems)
    rc = -1, api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  else if (lora_config_parse(c, obj, problems))
    rc = -1, reply_adapter_problems(r, problems, 1);
  json_decref(obj);
  json_decref(problems);
  *has = rc == 0;
  return rc;
}

int api_models_get(struct api_req *r) {
  const char *mp = api_query(r, "max_prompt_tokens");
  int64_t prompt = DEFAULT_PLAN_PROMPT_TOKENS;
  if (mp && parse_i64(mp, 1, 1 << 24, &prompt, "max_prompt_tokens", NULL))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                            "max_prompt_tokens: expected an integer in [1, 16777216], got '%.32s'",
                            mp);
  struct lora_config adapter;
  int has_adapter;
  if (adapter_query(r, &adapter, &has_adapter)) return 0;
  struct registry_entry m;
  int rc = registry_find(r->srv, r->params[0], r->owner, &m);
  json_t *o = rc ? NULL : model_json(&m);
  if (rc < 0 || (!rc && !o)) return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  if (rc > 0)
    return api_reply_errorf(r, API_ERR_NOT_FOUND,
                            "no such model: '%.128s' is neither a preset, a folder in the "
                            "models directory nor a checkpoint",
                            r->params[0]);
  if (!m.ready) return api_reply_json_steal(r, 200, o);
  /* what a job with the default hyperparameters needs, for prompts of `prompt` tokens, planned
   * as admission plans it (runner_plan_model: the config and tokenizer as the job's check reads
   * them, the adapter checked against the model) */
  struct hparams hp;
  json_t *none = json_array();
  hparams_parse(&hp, NULL, none);
  json_decref(none);
  struct mem_plan plan;
  struct dapo_err e = {0};
  json_t *problems = json_array();
  rc = problems ? runner_plan_model(m.path, has_adapter ? &adapter : NULL, &hp, (int)prompt, &plan,
                                    problems, &e)
                : DAPO_ENOMEM;
  if (rc > 0) {
    json_decref(o);
    rc = reply_adapter_problems(r, problems, 0);
    json_decref(problems);
    return rc;
  }
  json_decref(problems);
  if (rc == DAPO_ENOMEM) {
    json_decref(o);
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  }
  /* rc < 0: the model's config or tokenizer does not open (a job on it is refused with field
   * "model"): no plan to show */
  json_t *mem = rc ? NULL : mem_plan_to_json(&plan);
  if (mem) {
    uint64_t limit = server_memory_limit(r->srv);
    json_object_set_new(mem, "limit_bytes", json_integer((json_int_t)limit));
    json_object_set_new(mem, "fits", json_boolean(plan.total <= limit));
    json_object_set_new(mem, "assumes",
                        json_pack("{s:s, s:i, s:o}", "hyperparameters", "defaults",
                                  "max_prompt_tokens", (int)prompt, "adapter",
                                  has_adapter ? lora_config_to_json(&adapter) : json_null()));
    json_object_set_new(o, "memory", mem);
  }
  return api_reply_json_steal(r, 200, o);
}
