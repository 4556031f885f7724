/* Internal to the judge module (judge.c, judge_http.c): the http judge behind judge_new /
 * judge_run, and the JSON string of outside text they both write. Not part of libdapo's
 * interface. */
#ifndef DAPO_JUDGE_IMPL_H
#define DAPO_JUDGE_IMPL_H

#include <stddef.h>

#include "judge.h"

struct judge_http;

/* Validates the http fields of spec (type already checked) and the URL against pol. */
struct judge_http *judge_http_new(const json_t *spec, const struct judge_policy *pol,
                                  struct dapo_err *e);
void judge_http_free(struct judge_http *h);
/* judge_run for an http judge; res[] is already reset, ids[i] is item i's id (never NULL). */
int judge_http_run(const struct judge_http *h, const char *job_id, int64_t step,
                   const struct judge_item *items, const char *const *ids, int n,
                   struct judge_result *res, struct judge_stats *st, const volatile int *cancel,
                   struct dapo_err *e);

/* The http judge's reply parser on its own, for the fuzz target and tests: parses body[0..len) as
 * the reply to one request for the n >= 1 items with the unique ids ids[0..n), in the "dapod"
 * (openrlhf 0) or "openrlhf" (1) format, exactly as judge_http_run judges an attempt. Returns 0
 * when every item has a reward in range, 1 for a malformed reply, 2 when ids are unanswered, 3
 * when a reward is out of range, DAPO_EINVAL or DAPO_ENOMEM. rewards (may be NULL; n entries)
 * receives what was read (0 for unanswered items); what (may be NULL; cap bytes) the message the
 * run would report ("" on success). Thread-safe. */
int judge_http_parse_reply(const char *body, size_t len, int openrlhf, const char *const *ids,
                           int n, double *rewards, char *what, size_t cap);

/* A new JSON string of s; invalid UTF-8 bytes become U+FFFD (jansson refuses them). NULL on
 * OOM. */
json_t *judge_json_string(const char *s);

#endif
