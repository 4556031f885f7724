/* What api/'s OpenAI-compatible handlers (fine_tuning.c, chat.c) share: OpenAI's error shape
 * {"error": {message, type, param, code}} (the SDK maps the status to its error classes and reads
 * these members) and the "ft:" model names of fine-tuned checkpoints. */
#ifndef DAPOD_API_OPENAI_H
#define DAPOD_API_OPENAI_H

#include <stddef.h>

#include <jansson.h>

struct api_req;

/* 1 when path is one of the OpenAI-compatible routes (/v1/fine_tuning/..., /v1/chat/...):
 * every error there, also those the HTTP layer raises before the handler runs (401, 404, 405,
 * 413, 415, invalid JSON) and the completion service's 422/503, takes OpenAI's shape. */
int api_oai_path(const char *path);

/* {"error": {message, type, param, code}} (new reference; NULL without memory). type NULL: by
 * status ("invalid_request_error", 401 "authentication_error", 403 "permission_error", 429
 * "rate_limit_error", >= 500 "server_error"); param and code may be NULL (null). */
json_t *api_oai_error_body(int status, const char *type, const char *param, const char *code,
                           const char *message);

/* Replies status with {"error": {message, type, param, code}} as application/json. type is
 * "invalid_request_error" for 4xx unless given; param and code may be NULL (null). A 4xx other
 * than 408/429 also says `x-should-retry: false`: the SDK would otherwise retry a 409 that a
 * retry cannot fix. */
int api_oai_error(struct api_req *r, int status, const char *type, const char *param,
                  const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* "ft:{base}:dapod:{suffix}:{job_id}" (suffix may be NULL: empty), with ":ckpt-step-{N}"
 * when step >= 0, into buf (cap bytes). */
void api_oai_model_name(const char *base, const char *suffix, const char *job_id, long long step,
                        char *buf, size_t cap);

/* The native model id of an "ft:" name ("{job_id}:step-{N}"; step -1: the job's final
 * checkpoint, which the caller looks up) into job_id (cap bytes); returns 1 for an ft: name,
 * 0 for any other id (left as it is). */
int api_oai_model_parse(const char *name, char *job_id, size_t cap, long long *step);

/* The native model id of model for r's caller into native (cap bytes): an "ft:" name's checkpoint
 * ("{job_id}:step-{N}", the job's last checkpoint when the name has no ckpt-step), its job into
 * job_id (jcap bytes). Returns 1 for an ft: name, 0 for another id (nothing written). */
int api_oai_model_native(struct api_req *r, const char *model, char *native, size_t cap,
                         char *job_id, size_t jcap);

#endif
