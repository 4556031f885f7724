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

/* score_model and label_model graders (grader_model.c), built and graded for grader.c, and the
 * native model_rank judge's calls for judge.c. */
struct gmodel;
struct grader_errs;
enum gmodel_kind {
  GM_SCORE, /* score_model: {"result": number, "steps"} clamped to range */
  GM_LABEL, /* label_model: {"label": one of labels}, 1 when it passes */
  GM_RANK   /* model_rank: {"scores": [one number per response]} clamped to range */
};
/* Validates spec (type checked; fields of score_model, or of label_model for GM_LABEL) under
 * field; its model names one of pol's judge_models. NULL + e on failure. */
struct gmodel *gmodel_new(const json_t *spec, const char *field, enum gmodel_kind kind,
                          const struct judge_policy *pol, struct dapo_err *e);
/* The judge_models entry named name (borrowed from pol; NULL name: none given) into *entry, or
 * an error naming field.key and listing the judge models there are. */
int gmodel_judge_entry(const char *name, const struct judge_policy *pol, const char *field,
                       const char *key, const json_t **entry, struct dapo_err *e);
void gmodel_free(struct gmodel *m);
/* The upstream's model name (borrowed). */
const char *gmodel_model(const struct gmodel *m);
/* Grades roots[0..n) ({"item", "sample"}) into scores and errs (counts, token usage), up to the
 * judge model's concurrency at once. Returns 0 or DAPO_ENOMEM. Thread-safe. */
int gmodel_grade(const struct gmodel *m, json_t *const *roots, int n, double *scores,
                 struct grader_errs *errs);
/* Ranks groups (a GM_RANK gmodel): group g's root ({"item", "sample": {"responses", "count"}})
 * in one call asks for count[g] scores, written to scores[first[g] ..] (clamped to range; 0 when
 * the call failed) with errs[first[g] ..] zeroed by the caller, each counting the call's errors
 * (its token usage on the group's first sample only). Up to the judge model's concurrency calls
 * at once. Returns 0 or DAPO_ENOMEM. Thread-safe. */
int gmodel_rank(const struct gmodel *m, json_t *const *roots, const int *first, const int *count,
                int n_groups, double *scores, struct grader_errs *errs);
/* grader.c's template check: {{ }} balanced, naming item.* or sample.* (field.key in errors). */
int grader_check_template(const char *t, const char *field, const char *key, struct dapo_err *e);

/* A new JSON string of s; invalid UTF-8 bytes become U+FFFD (jansson refuses them). NULL on
 * OOM. */
json_t *judge_json_string(const char *s);

#endif
