/* Tools an agent calls during its episodes (docs/AGENTS.md): HTTP function tools (OpenAI's
 * function shape plus the URL dapod POSTs the call to) and the built-in sandboxed `python` tool.
 * A toolbox holds a job's tools and runs their calls on its own threads, `concurrency` at a time
 * per tool, while the caller goes on (decoding other episodes): it submits calls and takes the
 * answers as they come. Every URL obeys the judges' host policy (checked when the toolbox is
 * built, and at connect time); replies are bounded.
 *
 * An HTTP tool receives {"job_id", "episode_id", "name", "arguments", "item": the dataset line}
 * and answers {"content": "..."} (what the model reads) or {"error": "..."} (told to the model as
 * the tool's answer, and counted). Timeouts, refused connections, 429/5xx and malformed replies
 * are retried with backoff (max_retries); when retries are spent the model is told the tool
 * failed, and the failure is counted by kind.
 *
 * A toolbox may instead hold one environment (toolbox_new_env): a program that keeps an
 * episode's state and answers each model turn, over HTTP (`http`: POST {url}/reset, /step and
 * /close) or an OpenEnv server's WebSocket session (`openenv`: one socket an episode, openenv.h)
 * (docs/AGENTS.md "Environments"), its calls run on `concurrency` threads as a tool's are, with
 * the same retries (an openenv step is never retried), error classes (counted as env_timeout,
 * env_http_error, env_parse_error) and host policy; its replies are read by env_reply_parse and
 * env_openenv_reply_parse (env.h). */
#ifndef DAPO_TOOLS_H
#define DAPO_TOOLS_H

#include <jansson.h>
#include <stdint.h>

#include "env.h"
#include "error.h"
#include "judge.h"

/* How a call went, as the step's metrics count it (tool/errors/<name>). */
enum tool_err {
  TOOL_OK = 0,
  TOOL_MALFORMED,     /* the model's call could not be read */
  TOOL_UNKNOWN,       /* it named no tool of the job */
  TOOL_BAD_ARGUMENTS, /* its arguments fail the tool's parameters */
  TOOL_ERROR,         /* the tool answered {"error"}, or the code raised */
  TOOL_TIMEOUT,       /* no answer within timeout_ms, retries spent */
  TOOL_HTTP_ERROR,    /* a refused connection or a non-2xx status, retries spent */
  TOOL_PARSE_ERROR,   /* a reply that is not {"content": string} or {"error": string} */
  TOOL_TRUNCATED,     /* the answer was cut at max_answer_bytes (the call counts as done) */
  TOOL_ERR_COUNT
};
/* "malformed", "unknown_tool", "bad_arguments", "tool_error", "timeout", "http_error",
 * "parse_error", "truncated". */
const char *tool_err_name(enum tool_err e);

#define TOOLS_MAX 64                   /* tools of one job */
#define TOOL_ANSWER_BYTES_DEFAULT 8192 /* what the model reads of an answer, by default */

struct toolbox;

/* Builds the tools of spec (borrowed; a JSON array) under pol; field names it in errors
 * ("episode.tools[1].function.name: ..."). The threads start here. NULL + e on failure. */
struct toolbox *toolbox_new(const json_t *spec, const struct judge_policy *pol, const char *field,
                            struct dapo_err *e);
/* Stops the threads (calls in flight are abandoned; a running sandbox is waited for) and frees. */
void toolbox_free(struct toolbox *tb);

int toolbox_count(const struct toolbox *tb);
/* The tools of spec (a JSON array of tool specs, already checked by toolbox_new) as a model's
 * prompt shows them: OpenAI's function shapes [{"type": "function", "function": {"name",
 * "description", "parameters"}}], dapod's own fields (url, headers, limits) left out, the python
 * tool's built in. A new reference; NULL out of memory. Needs no toolbox: a job's prompts are
 * rendered before its tools run. */
json_t *tools_prompt_functions(const json_t *spec);

/* Tool i's name (borrowed, lives with tb); its OpenAI function shape {"type": "function",
 * "function": {"name", "description", "parameters"}} for the prompt (borrowed). */
const char *toolbox_name(const struct toolbox *tb, int i);
const json_t *toolbox_function(const struct toolbox *tb, int i);
/* The tool named name, or -1. */
int toolbox_find(const struct toolbox *tb, const char *name);
/* 0 when args (borrowed) fit tool i's parameters; 1 with why (cap bytes) when not. */
int toolbox_check_args(const struct toolbox *tb, int i, const json_t *args, char *why, size_t cap);

/* Submits a call of tool i with arguments (stolen) for the episode episode_id of job_id, whose
 * dataset line is item (borrowed until the answer is taken; may be NULL). tag is the caller's,
 * given back with the answer. 0, or DAPO_ENOMEM (arguments released). Thread-safe. */
int toolbox_submit(struct toolbox *tb, int tag, int i, json_t *arguments, const json_t *item,
                   const char *job_id, const char *episode_id);

struct tool_answer {
  int tag;
  enum tool_err err; /* TOOL_OK, TOOL_TRUNCATED, or why the call failed */
  char *content;     /* owned (free()): what the model reads, NUL-terminated; NULL only when
                        out of memory. An environment's: NULL when it answered, else why not */
  double ms;         /* from submission to the answer */
  int attempts;
  struct env_reply env; /* an environment's reply (owned; env_reply_clear), when err is TOOL_OK */
};
/* Frees what an answer owns. */
void tool_answer_clear(struct tool_answer *a);

/* ---- environments ---- */

/* Builds a toolbox holding the environment spec (borrowed; {"type": "http", "url", "headers",
 * "timeout_ms", "concurrency", "max_retries", "max_answer_bytes"}, or {"type": "openenv", "url":
 * "ws://...", "action_field", "observation_field", and the same limits}) under pol; field names
 * it in errors. NULL + e on failure. */
struct toolbox *toolbox_new_env(const json_t *spec, const struct judge_policy *pol,
                                const char *field, struct dapo_err *e);
/* Whether tb holds an environment (else tools). */
int toolbox_is_env(const struct toolbox *tb);

enum env_op { ENV_RESET = 0, ENV_STEP, ENV_CLOSE };
/* Submits op with body (stolen: {"episode_id", ...}, docs/AGENTS.md; an openenv environment's
 * reset opens the episode's socket, a step reads body.action.content) to the environment. The
 * answer comes back with tag; ENV_CLOSE is best effort: no answer comes back, and closes still
 * queued when the toolbox is freed are not sent. 0, or DAPO_ENOMEM (body released).
 * Thread-safe. */
int toolbox_submit_env(struct toolbox *tb, int tag, enum env_op op, json_t *body);

/* Takes up to cap answers into out, waiting up to wait_ms (0: not at all, -1: until one comes or
 * *cancel is set, checked every 50 ms) for the first when none is ready. Returns how many. */
int toolbox_take(struct toolbox *tb, struct tool_answer *out, int cap, int wait_ms,
                 const volatile int *cancel);
/* Calls submitted and not yet taken. */
int toolbox_pending(const struct toolbox *tb);

#endif
