/* Model lookup shared by GET /v1/models and, later, the jobs and completions handlers: a model
 * id names a preset or a sub-folder of models_dir (TODO(jobs): or a checkpoint). */
#ifndef DAPOD_API_MODELS_H
#define DAPOD_API_MODELS_H

#include <jansson.h>

struct server;

/* The model object of id into *obj_out (new reference, owned by the caller): a preset, or the
 * folder models_dir/<id> (status "ready", or "invalid" with an "error"). Returns 0; 1 when no
 * preset or folder has that id (*obj_out NULL); -1 when out of memory. Thread-safe. */
int api_model_find(const struct server *s, const char *id, json_t **obj_out);

#endif
