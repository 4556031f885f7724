/* Model lookup shared by GET /v1/models, the jobs and completions handlers and the workers: a
 * model id names a preset, a sub-folder of models_dir, or a fine-tuned checkpoint
 * ("{job_id}:step-{n}", a complete checkpoint in the store's index). */
#ifndef DAPOD_API_MODELS_H
#define DAPOD_API_MODELS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct server;

/* The model object of id into *obj_out (new reference, owned by the caller): a preset, the
 * folder models_dir/<id> (status "ready", or "invalid" with an "error"), or a checkpoint of any
 * owner. Returns 0; 1 when no model has that id (*obj_out NULL); -1 when out of memory.
 * Thread-safe. */
int api_model_find(const struct server *s, const char *id, json_t **obj_out);

/* As api_model_find, limited to the checkpoints of owner (NULL: any). */
int api_model_find_owned(const struct server *s, const char *id, const char *owner,
                         json_t **obj_out);

/* What lm_open takes for model id: a preset name, the folder's path or the checkpoint folder's
 * path, into *spec_out (owned, free()). Returns 0; 1 when id names no usable model (unknown, an
 * invalid folder, a checkpoint not visible to owner (NULL: any)), with msg (cap bytes) saying
 * why; -1 when out of memory. Thread-safe. */
int api_model_resolve(const struct server *s, const char *id, const char *owner, char **spec_out,
                      char *msg, size_t cap);

struct mem_plan;

/* A memory plan (core/runner.h) as the API shows it: bytes by part and the capacities. */
json_t *api_mem_plan_json(const struct mem_plan *p);

/* Writes the checkpoint model id "{job_id}:step-{n}" into buf (cap bytes). */
void api_model_ckpt_id(const char *job_id, long long step, char *buf, size_t cap);

#endif
