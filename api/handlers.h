/* Every route handler, one file per resource: health.c, files.c, models.c, judges.c. Internal to
 * api/: the route table in http.c is the only caller. Each returns 0 after replying through
 * api_reply_* (http.h), or -1 when not even a reply could be built. */
#ifndef DAPOD_API_HANDLERS_H
#define DAPOD_API_HANDLERS_H

#include <jansson.h>

#include <stddef.h>
#include <stdint.h>

struct api_req;

/* What the HTTP layer keeps between requests, owned by struct api_http (created with it, freed
 * when it stops) and reached by every request (api_req.caches): no process-wide state, so that
 * two HTTP layers in one process (tests) never share it. */
struct api_caches {
  struct api_frames *frames;         /* events.c */
  struct api_metrics_cache *metrics; /* jobs.c */
};

/* health.c: GET /healthz, GET /readyz, GET /metrics */
int api_health_live(struct api_req *r);
int api_health_ready(struct api_req *r);
int api_health_metrics(struct api_req *r);

/* files.c: POST /v1/files (streamed), POST /v1/files/validate (streamed), GET /v1/files,
 * GET /v1/files/{id}, GET /v1/files/{id}/content, DELETE /v1/files/{id} */
int api_files_upload_begin(struct api_req *r);
int api_files_validate_begin(struct api_req *r);
int api_files_upload_chunk(struct api_req *r, const char *data, size_t n);
int api_files_upload_end(struct api_req *r);
int api_files_validate_end(struct api_req *r);
int api_files_list(struct api_req *r);
int api_files_get(struct api_req *r);
int api_files_content(struct api_req *r);
int api_files_delete(struct api_req *r);

/* models.c: GET /v1/models, GET /v1/models/{id} */
int api_models_list(struct api_req *r);
int api_models_get(struct api_req *r);

/* judges.c: POST /v1/judges/test */
int api_judges_test(struct api_req *r);

/* jobs.c: POST /v1/jobs, GET /v1/jobs, GET /v1/jobs/{id} (?wait=N), DELETE /v1/jobs/{id},
 * POST /v1/jobs/{id}/cancel|pause|resume, GET /v1/jobs/{id}/metrics */
int api_jobs_create(struct api_req *r);
int api_jobs_list(struct api_req *r);
int api_jobs_get(struct api_req *r);
int api_jobs_delete(struct api_req *r);
int api_jobs_cancel(struct api_req *r);
int api_jobs_pause(struct api_req *r);
int api_jobs_resume(struct api_req *r);
int api_jobs_metrics(struct api_req *r);
/* The rendered metrics lists kept per job (jobs.c), owned by the HTTP layer (api_caches). */
struct api_metrics_cache;
struct api_metrics_cache *api_metrics_cache_new(void);
void api_metrics_cache_free(struct api_metrics_cache *c);
/* How many times GET /v1/jobs/{id}/metrics read and rendered a JSON list (misses of the kept
 * list), for /metrics. */
uint64_t api_jobs_metrics_renders(const struct api_metrics_cache *c);

/* events.c: GET /v1/jobs/{id}/events, GET /v1/jobs/{id}/events/stream (SSE) */
/* The framed events shared by the streams of a job (events.c), owned by the HTTP layer. */
struct api_frames;
struct api_frames *api_frames_new(void);
void api_frames_free(struct api_frames *f);
int api_events_list(struct api_req *r);
int api_events_stream(struct api_req *r);

/* checkpoints.c: GET /v1/jobs/{id}/checkpoints, GET /v1/jobs/{id}/checkpoints/{step}/{file} */
int api_checkpoints_list(struct api_req *r);
int api_checkpoints_file(struct api_req *r);

/* rollouts.c: GET /v1/jobs/{id}/rollouts?step=N */
int api_rollouts_get(struct api_req *r);

/* completions.c: POST /v1/completions */
int api_completions_create(struct api_req *r);

/* static.c: GET / and GET /ui (redirect to /ui/), GET /ui/ and GET /ui/{file} (the web
 * dashboard's files from web_dir; no API key needed) */
int api_static_root(struct api_req *r);
int api_static_file(struct api_req *r);

/* jobs.c, shared: reads job id visible to r->owner into out, or replies (404 ...) and returns
 * -1 (the handler then returns 0). */
struct store_job;
int api_job_load(struct api_req *r, const char *id, struct store_job *out);

/* jobs.c, shared: asks the status machine to cancel, pause or resume job r->params[0] (visible to
 * r->owner), then tells the workers and wakes waiters as every surface must. Returns 0 with the
 * job after in *out (owned: store_job_deinit), or the store's code (STORE_ENOTFOUND,
 * STORE_ETRANSITION, ...) with e set; nothing is replied. */
enum { API_JOB_CANCEL, API_JOB_PAUSE, API_JOB_RESUME };
struct dapo_err;
int api_job_request(struct api_req *r, int act, struct store_job *out, struct dapo_err *e);

/* fine_tuning.c: OpenAI's fine-tuning surface (OPENAI_COMPAT.md, docs/OPENAI.md):
 * POST/GET /v1/fine_tuning/jobs, GET /v1/fine_tuning/jobs/{id},
 * POST /v1/fine_tuning/jobs/{id}/cancel|pause|resume, GET /v1/fine_tuning/jobs/{id}/events,
 * GET /v1/fine_tuning/jobs/{id}/checkpoints, POST /v1/fine_tuning/alpha/graders/run|validate */
int api_ft_jobs_create(struct api_req *r);
int api_ft_jobs_list(struct api_req *r);
int api_ft_jobs_get(struct api_req *r);
int api_ft_jobs_cancel(struct api_req *r);
int api_ft_jobs_pause(struct api_req *r);
int api_ft_jobs_resume(struct api_req *r);
int api_ft_events_list(struct api_req *r);
int api_ft_checkpoints_list(struct api_req *r);
int api_ft_graders_run(struct api_req *r);
int api_ft_graders_validate(struct api_req *r);

/* completions.c, shared: queues req on the completion service and answers when it is done (or,
 * streamed, once it starts), the request suspended meanwhile (busy and failures as
 * POST /v1/completions answers them). render
 * (NULL: the text_completion object) replies a finished completion; arg is its (freed with
 * arg_free, may be NULL, also when the submission fails). */
struct completion;
struct completion_req;
struct completion_result;
struct completion_token;
typedef int (*api_completion_render)(struct api_req *r, void *arg,
                                     const struct completion_result *res);
/* A streamed reply (req->stream): once sampling starts, `data: {chunk}` server-sent events as
 * tokens come, in a fixed order (open's chunks; then round by round, choice by choice, each
 * token's chunks; close's; `data: [DONE]`), or `data: {"error": {...}}` when sampling fails. Each
 * callback appends chunk objects to frames (a JSON array) with arg; returns 0 or -1 (out of
 * memory). open (may be NULL) gets the number of choices; token gets choice i's token k (its
 * finish >= 0 on the choice's last), t to read more of it (completion_prompt_ids); close the
 * finished completion. */
struct api_completion_stream {
  int (*open)(void *arg, int n, json_t *frames);
  int (*token)(void *arg, int i, int k, const struct completion_token *tk, struct completion *t,
               json_t *frames);
  int (*close)(void *arg, const struct completion_result *res, json_t *frames);
};
/* stream: NULL, or req->stream is set and the reply streams (render then unused). */
int api_completion_submit(struct api_req *r, const struct completion_req *req,
                          api_completion_render render, void *arg, void (*arg_free)(void *),
                          const struct api_completion_stream *stream);
/* {prompt_tokens, completion_tokens, total_tokens} of a finished completion: the tokens of each
 * choice up to the one that ended it (as its logprobs list them). */
json_t *api_completion_usage(const struct completion_result *res);
/* The handler's next call after a submission (r->ctx set): answers or waits on. */
int api_completion_resume(struct api_req *r);
/* A request's response_format (borrowed; absent, null or {"type": "text"}: *out NULL), checked
 * by compiling it (core/text/jsongrammar.h): 0 with *out the object to pass on
 * (completion_req.response_format), or 1 with the member at fault in field ("response_format",
 * "response_format.json_schema.schema.properties.x.foo") and why in msg. */
int api_response_format(const json_t *body, const json_t **out, char *field, size_t field_cap,
                        char *msg, size_t msg_cap);

/* chat.c: POST /v1/chat/completions (OpenAI's shape, stream: true as server-sent events) */
int api_chat_completions(struct api_req *r);

#endif
