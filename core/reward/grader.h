/* OpenAI's graders as rewards (../shared/design/OPENAI_COMPAT.md section 4): string_check,
 * text_similarity, python (the user's grade(sample, item) in a bubblewrap sandbox), multi
 * (sub-graders combined by a calculate_output formula, formula.h), and score_model and
 * label_model, which ask a judge model of the server's `judge_models` (an OpenAI-compatible
 * upstream, grader_model.c). Inputs are templates: {{item.x}}, {{sample.output_text}},
 * {{sample.output_json.x}}, with dotted and [i] paths. A grader never changes after grader_new:
 * grader_grade may be called from several threads at once. */
#ifndef DAPO_GRADER_H
#define DAPO_GRADER_H

#include <jansson.h>

#include "error.h"

/* The error taxonomy of OpenAI's grader metadata: a sample that hits one scores 0 (for a multi
 * grader, the sub-grader scores 0) and is counted here. */
enum grader_err {
  GE_FORMULA_PARSE,    /* formula_parse_error: calculate_output gave no finite number */
  GE_SAMPLE_PARSE,     /* sample_parse_error: the output is not the JSON response_format asks */
  GE_INVALID_VARIABLE, /* invalid_variable_error: a template names what the sample lacks */
  GE_PYTHON_RUNTIME,   /* python_grader_runtime_error: grade raised, returned a non-number,
                          looped past the time limit or printed junk */
  GE_PYTHON_SERVER,    /* python_grader_server_error: the sandbox could not run at all */
  GE_MODEL_SERVER,     /* model_grader_server_error: the judge model's HTTP error, timeout or
                          connection failure after its retries */
  GE_MODEL_PARSE,      /* model_grader_parse_error: its content is not the JSON asked for */
  GE_MODEL_REFUSAL,    /* model_grader_refusal_error: its message.refusal is not null */
  GE_OTHER,            /* other_error */
  GE_COUNT
};
/* "formula_parse_error", ... (static). */
const char *grader_err_name(enum grader_err k);

/* Tokens one judge model spent on a sample (its replies' `usage`). */
#define GRADER_MAX_USAGE 4 /* judge models counted per sample; more are added to the last */
struct grader_usage {
  char model[96]; /* the upstream's model name (judge_models.<name>.model) */
  long prompt_tokens, completion_tokens;
};

struct grader_errs {
  int n[GE_COUNT];
  char detail[256];       /* the first python error's text ("ZeroDivisionError: ..."), or "" */
  char model_detail[256]; /* the first judge model server error ("HTTP 500 after 3 attempts") */
  int n_usage;
  struct grader_usage usage[GRADER_MAX_USAGE];
};

struct grader;

struct judge_policy;

/* Validates spec (borrowed) and builds the grader. Messages name the field under `field`
 * ("grader.operation: 'is' is not one of eq, ne, like, ilike", "grader.graders.b.type: ...",
 * "grader.model: 'gpt-4o' is not one of the server's judge_models (judge)"). A python grader
 * needs the sandbox (grader_python_available): without it, DAPO_EUNSUPPORTED naming
 * grader.type. pol (may be NULL: loopback hosts, no judge models) gives score_model and
 * label_model their judge_models and the host policy their URLs obey. Owned: grader_free. */
struct grader *grader_new(const json_t *spec, const char *field, const struct judge_policy *pol,
                          struct dapo_err *e);
void grader_free(struct grader *g);

/* The upstream model names of the judge models g's score_model and label_model graders call
 * (its own, or its sub-graders'), each once, appended to names[n .. cap) in the order of the
 * spec (borrowed, live as long as g); returns the new count. */
int grader_models(const struct grader *g, const char **names, int n, int cap);

/* type and name (name "" when the spec has none); borrowed, live as long as g. */
const char *grader_type(const struct grader *g);
const char *grader_name(const struct grader *g);

/* One sample to grade; pointers borrowed for the call. */
struct grader_sample {
  const char *output_text;    /* the model's answer; NULL reads as "" */
  const json_t *output_json;  /* the answer parsed as JSON, or NULL (then templates that read
                                 sample.output_json are invalid variables) */
  const json_t *item;         /* the dataset row (object) or NULL */
  const json_t *output_tools; /* the answer's calls in OpenAI's tool_calls shape [{"id", "type":
                                 "function", "function": {"name", "arguments": JSON text}}], or
                                 NULL: none. sample.output_tools, and the choice's message's
                                 tool_calls (finish_reason "tool_calls") when not empty */
};

/* Grades s[0..n) into scores[0..n) (python graders run once for the whole batch). sub (may be
 * NULL): sub[i] receives a new object {key: score} of a multi grader's sub-graders ({} for other
 * graders). errs (may be NULL): errs[i] is zeroed and then counts sample i's errors. Returns 0,
 * or DAPO_ENOMEM (scores are then 0). Thread-safe. */
int grader_grade(const struct grader *g, const struct grader_sample *s, int n, double *scores,
                 json_t **sub, struct grader_errs *errs);

/* Renders a template against root {"item": ..., "sample": ...} (borrowed) into a new string
 * (*out, free()). Returns 0; 1 when a variable does not resolve (*out NULL; bad names the first
 * variable, cut to cap bytes); DAPO_ENOMEM. Exposed for tests. */
int grader_render(const char *tmpl, const json_t *root, char **out, char *bad, size_t cap);

/* ---- judge models (grader_model.c) ---- */

/* Checks the server config's judge_models (an object name -> {"url", "model", "api_key_file",
 * "timeout_ms", "concurrency", "max_retries"}; borrowed) under pol's host policy: messages name
 * the key under field ("judge_models.judge.url: host 'x' is not in the judge host allowlist",
 * "judge_models.judge.api_key_file: cannot read '/k': No such file or directory",
 * "judge_models.local.serve: not supported yet ..."). Reads no key into memory it keeps. */
int grader_models_check(const json_t *models, const struct judge_policy *pol, const char *field,
                        struct dapo_err *e);

/* ---- the python sandbox (grader_python.c) ---- */

/* 1 when python graders can run: bubblewrap (bwrap) and /usr/bin/python3 are installed and a
 * trial grader runs in the sandbox; else 0 with why (cap bytes) saying what is missing. Checked
 * once per process. Thread-safe. */
int grader_python_available(char *why, size_t cap);

/* Runs source's grade(sample, item) over rows (an array of {"sample", "item"}; borrowed) in one
 * sandboxed python3: no network, a read-only /usr, its own /tmp, GRADER_PY_* limits. scores[i]
 * and kinds[i] (GE_COUNT: no error, else GE_PYTHON_RUNTIME or GE_PYTHON_SERVER) for each row;
 * detail receives the first error's text. Returns 0, or DAPO_ENOMEM. Thread-safe. */
#define GRADER_PY_WALL_S 60                      /* one batch, all rows */
#define GRADER_PY_MEMORY ((long)2 << 30)         /* address space of the sandbox */
#define GRADER_PY_OUTPUT_BYTES ((size_t)1 << 20) /* what the sandbox may write back */
#define GRADER_PY_SOURCE_BYTES (256 * 1024)
int grader_python_run(const char *source, const json_t *rows, double *scores, int *kinds,
                      char *detail, size_t cap);

#endif
