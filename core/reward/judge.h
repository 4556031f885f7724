/* Judges: turn (prompt, response, answer) items into rewards. Built-ins run in-process
 * (`exact`, `math`, `regex`); `http` POSTs batches to a user's judge server (dapod or OpenRLHF
 * wire format, API.md "Judges") with bounded concurrency, timeouts, retries and a host allowlist.
 * A judge never changes after judge_new: judge_run may be called from several threads at once. */
#ifndef DAPO_JUDGE_H
#define DAPO_JUDGE_H

#include <stdint.h>

#include <jansson.h>

#include "error.h"
#include "grader.h"

/* One sample to judge. Every pointer is borrowed for the duration of judge_run. */
struct judge_item {
  const char *id;           /* unique within one judge_run call; NULL: the item's index ("17") */
  int group;                /* prompt group: items of one group always travel in one request */
  const char *prompt;       /* NULL reads as "" */
  const char *response;     /* NULL reads as "" */
  const char *answer;       /* reference answer; NULL reads as "" */
  const json_t *metadata;   /* the dataset line's metadata object, or NULL (sent as null) */
  int response_tokens;      /* |o|, EOS included */
  int truncated;            /* non-zero: stopped at max_new_tokens (finish_reason "length") */
  const json_t *tool_calls; /* the response's calls of its line's tools in OpenAI's tool_calls
                               shape (graders' sample.output_tools), or NULL: none */
};

/* Why an item has no verdict. JE_CONNECT (refused/failed connection, refused address) is counted
 * with the HTTP errors: its metric name is judge_http_error. */
enum judge_err_kind {
  JE_NONE = 0,
  JE_TIMEOUT,   /* judge_timeout: no complete reply within timeout_ms */
  JE_HTTP,      /* judge_http_error: a non-2xx status */
  JE_PARSE,     /* judge_parse_error: malformed reply, or this item's id missing from it */
  JE_RANGE,     /* reward_out_of_range: reward not finite or outside [-1e6, 1e6] */
  JE_CONNECT,   /* judge_http_error: connection refused/reset, DNS, TLS, address refused */
  JE_CANCELLED, /* the cancel flag was raised before this item was judged */
};

/* The metric name of a kind ("judge_timeout", "judge_http_error", "judge_parse_error",
 * "reward_out_of_range", "cancelled"; "none" for JE_NONE). Static string. */
const char *judge_err_name(enum judge_err_kind k);

struct judge_result {
  double reward; /* valid when err == JE_NONE; built-ins give +1 / -1 */
  int correct;   /* 1 or 0 when the judge said so (built-ins always do); -1 when not given */
  int mask;      /* 1: the judge could not decide; leave the sample out of the loss */
  json_t *info;  /* owned by the caller (judge_results_release), or NULL: the judge's "info"
                    object; for math/regex {"extracted": "..."} (the answer the judge read) */
  enum judge_err_kind err; /* JE_NONE: judged */
};

/* Counts for the step metrics. Failures count attempts (one per failed HTTP request attempt; a
 * range error once per item), so a judge that fails twice and then answers shows
 * n_http_error 2, n_retries 2. judge_run adds to these (the caller zeroes them). */
struct judge_stats {
  int n_timeout, n_http_error, n_parse_error, n_out_of_range;
  int n_retries;          /* attempts beyond the first, over all requests */
  int n_requests;         /* HTTP attempts made (0 for built-ins) */
  double seconds;         /* wall time spent in judge_run */
  int n_grader[GE_COUNT]; /* grader judges: samples that hit each error of OpenAI's taxonomy
                             (grader.h enum grader_err; each scored 0) */
  /* the tokens each judge model of the judge spent (its replies' usage), indexed as
     judge_models_used lists them */
  int64_t model_tokens[GRADER_MAX_USAGE][2]; /* [k][0] prompt, [k][1] completion */
};

/* Server configuration: which hosts an http judge may name. Borrowed during judge_new only
 * (judge_new copies what it keeps). */
struct judge_policy {
  const char *const *allowed_hosts; /* exact host names/addresses, compared case-insensitively;
                                       NULL or n_allowed 0: the loopback set "127.0.0.1",
                                       "localhost", "::1" */
  int n_allowed;
  /* Every address curl is about to connect to is checked (at connect time, so a name that is
   * rebound after validation is caught): a public address is fine; unspecified, multicast and
   * reserved ones never are; loopback, link-local and private ones only when the address is
   * written literally in allowed_hosts (or the URL's host is that literal, or "localhost" for a
   * loopback address), and private ones (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) also
   * for any allowed name when allow_private is set. See docs/RELIABILITY.md. */
  int allow_private;
  /* Tests only: "HOST:PORT:ADDRESS" entries handed to CURLOPT_RESOLVE, so that a name resolves
   * without DNS or /etc/hosts. NULL in the daemon. */
  const char *const *resolve;
  int n_resolve;
  /* The server config's judge_models (grader.h grader_models_check: already checked), the
   * judge models score_model and label_model graders may name; NULL: none. */
  const json_t *judge_models;
  /* Who answers the judge models dapod serves itself ({"serve": ...}); NULL: none can be
   * (grader_models_check refuses them). Borrowed: it outlives every judge built with pol. */
  const struct judge_served *served;
};

/* A judge model dapod serves itself (judge_models.<name>.serve), asked in-process by the
 * daemon's completion service: chat(ctx, serve, body, timeout_ms, status, why, cap) answers the
 * chat completion request body (borrowed: OpenAI's {model, messages, response_format, sampling
 * fields}) for the model serve names (a preset, a folder of the models directory or a
 * checkpoint id) as POST /v1/chat/completions would: the reply body (a new reference) with its
 * HTTP status in *status (200, or 4xx/5xx with OpenAI's error body), or NULL (out of memory, or
 * the daemon stopping) with why. It blocks until the answer (at most timeout_ms) and may be
 * called from several threads at once. check(ctx, serve, why, cap): 0 when serve names a
 * model the service can run, else 1 with why (for grader_models_check at start). */
struct judge_served {
  json_t *(*chat)(void *ctx, const char *serve, const json_t *body, int timeout_ms, int *status,
                  char *why, size_t cap);
  int (*check)(void *ctx, const char *serve, char *why, size_t cap);
  void *ctx;
};

struct judge;

/* Validates a judge spec (borrowed) and builds the judge; NULL with e set on failure. Messages
 * name the field: "judge.timeout_ms: 50 not in [100, 600000]", "judge.url: host 'example.com' is
 * not in the judge host allowlist", "judge.pattern: missing closing parenthesis at offset 3".
 * Unknown fields are refused ("judge.timeout: unknown field"). pol may be NULL (defaults).
 * Owned by the caller (judge_free). Thread-safe with respect to other judges. */
struct judge *judge_new(const json_t *spec, const struct judge_policy *pol, struct dapo_err *e);

/* Frees j (NULL is fine). No judge_run may be in flight on it. */
void judge_free(struct judge *j);

/* "exact", "math", "regex", "http", "grader", "model" or "model_rank". Static string. */
const char *judge_type(const struct judge *j);
/* 1 when j scores through graders ("grader", "model", "model_rank"): its samples' errors are
 * counted with OpenAI's grader taxonomy (judge_stats.n_grader), its infos carry "score",
 * "errors" and "token_usage". */
int judge_grades(const struct judge *j);
/* The upstream model names of the judge models j calls (its graders', or a model judge's), at
 * most GRADER_MAX_USAGE, in a fixed order (the spec's) that indexes judge_stats.model_tokens;
 * borrowed, live as long as j. Returns the count (0 for other judges). */
int judge_models_used(const struct judge *j, const char **names);

/* Judges items[0..n) into res[0..n) (caller-placed; every entry is overwritten first, so info
 * pointers from an earlier call must have been released). job_id (may be NULL) and step go into
 * the http request. Adds to *st (may be NULL). *cancel (may be NULL) is checked while waiting on
 * the judge server (every 50 ms at most).
 * Returns 0 when every item was judged. Otherwise res[] still holds every item that was judged
 * (err JE_NONE) and the others carry their err; the return value is DAPO_EIO (timeout, HTTP or
 * connection), DAPO_EFORMAT (malformed reply), DAPO_ERANGE (reward out of range),
 * DAPO_ECANCELLED or DAPO_EINVAL (duplicate item ids), and e's message describes the first
 * failed request, quoting the judge's status and the first 200 bytes of its reply:
 * "judge http://127.0.0.1:9000/score: HTTP 500 after 4 attempts: \"Internal error: ...\"".
 * Thread-safe: concurrent calls on one judge are fine (each call has its own HTTP state). */
int judge_run(struct judge *j, const char *job_id, int64_t step, const struct judge_item *items,
              int n, struct judge_result *res, struct judge_stats *st, const volatile int *cancel,
              struct dapo_err *e);

/* Releases the info objects of res[0..n) and sets them to NULL. */
void judge_results_release(struct judge_result *res, int n);

/* Once at process exit, after every judge is freed (releases libcurl's global state; needed for
 * leak checkers). Not thread-safe. */
void judge_global_cleanup(void);

/* ---- The math rules, exposed for tests and for POST /v1/judges/test. All are pure functions
 * of their inputs (thread-safe). Strings returned are malloc'd (free()); NULL on OOM. ---- */

/* The answer a response states: the content of the last balanced \boxed{...} or \fbox{...}; else
 * the text after the last "answer is" / "answer:" / "####" (case-insensitive) up to the end of
 * that sentence or line; else the text after the last "=" (same end); else the last number.
 * NULL when the response has none of these (or on OOM). */
char *judge_math_extract(const char *response);

/* The canonical form of an answer: delimiters ($, \( \), \[ \]), \text{}, \left/\right, spacing
 * macros, whitespace (ASCII, NBSP), trailing period, leading +, thousands separators, %, degrees,
 * "x =" prefixes and trailing unit words removed; \dfrac/\tfrac -> \frac, \frac12 -> \frac{1}{2};
 * U+2212 minus -> '-'. */
char *judge_math_normalize(const char *s);

/* 1 when two answers are the same: numerically when both are numbers (integers, decimals,
 * a/b, \frac{a}{b}, mixed numbers \frac after an integer; exact rational comparison, or a
 * relative tolerance of 1e-9 when a decimal is involved), element-wise for bracketed or bare
 * comma lists, else as canonical strings (case-insensitively for plain words). 0 otherwise,
 * -1 on OOM. A \boxed{} or "#### x" in an answer is read like in a response. */
int judge_math_equal(const char *a, const char *b);

#endif
