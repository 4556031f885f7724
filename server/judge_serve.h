/* The judge models dapod serves itself (the server config's judge_models.<name>.serve: a preset,
 * a folder of the models directory or a checkpoint id), answered in-process by the completion
 * service: reward/judge.h's struct judge_served, with the server as its ctx. A score_model,
 * label_model, model or model_rank grader's request (OpenAI's chat completion body: messages,
 * response_format, sampling fields) is rendered with the model's chat template, sampled under its
 * strict response_format (structured outputs: the JSON always follows the schema) and answered
 * in chat.completion's shape, exactly as POST /v1/chat/completions would answer it, in the same
 * queue, memory ledger and compute_cpus. Thread-safe. */
#ifndef DAPOD_JUDGE_SERVE_H
#define DAPOD_JUDGE_SERVE_H

#include <stddef.h>

#include <jansson.h>

/* The most new tokens a served judge samples (its request's max_completion_tokens, at most this;
 * the default when the request has none). */
#define JUDGE_SERVE_MAX_TOKENS 512

/* struct judge_served's chat: srv is the server (started: its completion service running). */
json_t *judge_serve_chat(void *srv, const char *serve, const json_t *body, int timeout_ms,
                         int *status, char *why, size_t cap);
/* struct judge_served's check: 0 when serve names a model the server can run. */
int judge_serve_check(void *srv, const char *serve, char *why, size_t cap);

#endif
