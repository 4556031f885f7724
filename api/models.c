/* Handlers: GET /v1/models, GET /v1/models/{id}: the model registry's entries
 * (server/registry.h: presets, folders of models_dir, checkpoints "{job_id}:step-{n}") rendered
 * as model objects. A folder that is not a usable model is listed with status "invalid" and an
 * error naming the file and key at fault, so that a user sees why it is not offered. */
#include <stdio.h>
#include <string.h>

#include "handlers.h"
#include "http.h"
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

int api_models_get(struct api_req *r) {
  const char *mp = api_query(r, "max_prompt_tokens");
  int64_t prompt = DEFAULT_PLAN_PROMPT_TOKENS;
  if (mp && parse_i64(mp, 1, 1 << 24, &prompt, "max_prompt_tokens", NULL))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                            "max_prompt_tokens: expected an integer in [1, 16777216], got '%.32s'",
                            mp);
  struct registry_entry m;
  int rc = registry_find(r->srv, r->params[0], r->owner, &m);
  json_t *o = rc ? NULL : model_json(&m);
  if (rc < 0 || (!rc && !o)) return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  if (rc > 0)
    return api_reply_errorf(r, API_ERR_NOT_FOUND,
                            "no such model: '%.128s' is neither a preset, a folder in the "
                            "models directory nor a checkpoint",
                            r->params[0]);
  if (m.ready) {
    /* what a job with the default hyperparameters needs, for prompts of `prompt` tokens */
    struct hparams hp;
    json_t *none = json_array();
    hparams_parse(&hp, NULL, none);
    json_decref(none);
    struct mem_plan plan;
    runner_memory_plan(&m.cfg, NULL, &hp, (int)prompt, 0, &plan);
    json_t *mem = mem_plan_to_json(&plan);
    if (mem) {
      json_object_set_new(mem, "limit_bytes",
                          json_integer((json_int_t)server_memory_limit(r->srv)));
      json_object_set_new(mem, "fits", json_boolean(plan.total <= server_memory_limit(r->srv)));
      json_object_set_new(
          mem, "assumes",
          json_pack("{s:s, s:i}", "hyperparameters", "defaults", "max_prompt_tokens", (int)prompt));
      json_object_set_new(o, "memory", mem);
    }
  }
  return api_reply_json_steal(r, 200, o);
}
