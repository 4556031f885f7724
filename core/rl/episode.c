/* The job body's `episode` (episode.h): parsed, checked field by field, resolved and shown. */
#include "episode.h"

#include <stdio.h>
#include <string.h>

#include "toolcall.h"
#include "tools.h"

#define ANSWER_TOKENS_DEFAULT 64

static const char *const REWARDS[] = {"judge", "environment", "sum"};
static const char *const ENV_ERRORS[] = {"fail", "drop"};

/* An integer field in [lo, hi], or def when absent; 0 when it is fine. */
static int get_int(const json_t *o, const char *key, int def, int lo, int hi, int *out,
                   json_t *errors) {
  const json_t *v = json_object_get(o, key);
  *out = def;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    char f[64], m[96];
    snprintf(f, sizeof f, "episode.%s", key);
    snprintf(m, sizeof m, "expected an integer from %d to %d", lo, hi);
    dapo_errors_add(errors, f, m);
    return 1;
  }
  *out = (int)json_integer_value(v);
  return 0;
}

/* The index in names[0 .. n) of the string o[key], 0 when absent or null; a problem (why) and 0
 * when it is another value. */
static int get_name(const json_t *o, const char *key, const char *const *names, int n,
                    const char *why, json_t *errors) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  for (int i = 0; i < n && json_is_string(v); i++)
    if (!strcmp(json_string_value(v), names[i])) return i;
  char f[64];
  snprintf(f, sizeof f, "episode.%s", key);
  dapo_errors_add(errors, f, why);
  return 0;
}

/* A message that names its field ("episode.tools[0].url: ...") split into {field, message};
 * what is the field when the message names none. */
static void named_err(json_t *errors, const char *what, const char *text) {
  const char *colon = strstr(text, ": ");
  char field[160];
  snprintf(field, sizeof field, "%s", what);
  if (colon && !strncmp(text, what, strlen(what)) && colon - text < (long)sizeof field) {
    memcpy(field, text, (size_t)(colon - text));
    field[colon - text] = '\0';
    text = colon + 2;
  }
  dapo_errors_add(errors, field, text);
}

int episode_parse(const json_t *v, const struct hparams *hp, const struct judge_policy *pol,
                  struct episode_spec *ep, json_t *errors) {
  size_t before = json_array_size(errors);
  memset(ep, 0, sizeof *ep);
  ep->max_turns = 1;
  ep->max_new_tokens_per_turn = hp->max_new_tokens;
  ep->max_episode_tokens = hp->max_new_tokens;
  ep->max_answer_tokens = ANSWER_TOKENS_DEFAULT;
  ep->tool_format = -1;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_object(v)) {
    dapo_errors_add(errors, "episode",
                    "expected an object such as {\"max_turns\": 4, \"tools\": "
                    "[...]}");
    return 1;
  }
  ep->on = 1;
  static const char *const known[] = {"max_turns",
                                      "max_new_tokens_per_turn",
                                      "max_episode_tokens",
                                      "max_answer_tokens",
                                      "tools",
                                      "environment",
                                      "reward",
                                      "on_env_error",
                                      "tool_format"};
  const char *key;
  json_t *x;
  json_object_foreach((json_t *)v, key, x) {
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok |= !strcmp(key, known[i]);
    if (!ok) {
      char f[160];
      snprintf(f, sizeof f, "episode.%.100s", key);
      dapo_errors_add(errors, f, "unknown field");
    }
  }
  get_int(v, "max_turns", 1, 1, EPISODE_MAX_TURNS, &ep->max_turns, errors);
  get_int(v, "max_new_tokens_per_turn", hp->max_new_tokens, 1, hp->max_new_tokens,
          &ep->max_new_tokens_per_turn, errors);
  get_int(v, "max_answer_tokens", ANSWER_TOKENS_DEFAULT, 1, 65536, &ep->max_answer_tokens, errors);
  const json_t *env = json_object_get(v, "environment");
  int has_env = env && !json_is_null(env);
  /* the world speaks between turns; an environment also before the first and after the last */
  long budget = hp->max_new_tokens +
                (long)(has_env ? ep->max_turns + 1 : ep->max_turns - 1) * ep->max_answer_tokens;
  get_int(v, "max_episode_tokens", budget > 1 << 20 ? 1 << 20 : (int)budget, hp->max_new_tokens,
          1 << 20, &ep->max_episode_tokens, errors);
  ep->reward = (enum ep_reward)get_name(v, "reward", REWARDS, 3,
                                        "expected \"judge\", "
                                        "\"environment\" or \"sum\"",
                                        errors);
  if (ep->reward != EP_REWARD_JUDGE && !has_env)
    dapo_errors_add(errors, "episode.reward",
                    "\"environment\" and \"sum\" need an episode.environment");
  ep->on_env_error = (enum ep_env_error)get_name(v, "on_env_error", ENV_ERRORS, 2,
                                                 "expected \"fail\" or \"drop\"", errors);
  const json_t *tf = json_object_get(v, "tool_format");
  if (tf && !json_is_null(tf)) {
    const char *name = json_string_value(tf);
    if (name && !strcmp(name, "auto"))
      ep->tool_format = -1;
    else if (name && !strcmp(name, "dapod"))
      ep->tool_format = TC_DAPOD;
    else
      dapo_errors_add(errors, "episode.tool_format", "expected \"auto\" or \"dapod\"");
  }
  const json_t *tools = json_object_get(v, "tools");
  int has_tools = tools && !json_is_null(tools);
  if (ep->max_turns > 1 && !has_tools && !has_env)
    dapo_errors_add(errors, "episode.max_turns",
                    "more than one turn needs someone to answer the model: give tools or an "
                    "environment");
  if (has_tools && has_env)
    dapo_errors_add(errors, "episode.environment",
                    "give tools or an environment, not both (an environment runs its own tools)");
  /* the specs are checked by building them (their threads start and stop at once) */
  if (has_tools) {
    ep->tools = json_incref((json_t *)tools);
    struct dapo_err e = {0};
    struct toolbox *tb = toolbox_new(tools, pol, "episode.tools", &e);
    if (!tb) named_err(errors, "episode.tools", e.msg);
    toolbox_free(tb);
  }
  if (has_env) {
    ep->environment = json_incref((json_t *)env);
    struct dapo_err e = {0};
    struct toolbox *tb = toolbox_new_env(env, pol, "episode.environment", &e);
    if (!tb) named_err(errors, "episode.environment", e.msg);
    toolbox_free(tb);
  }
  return (int)(json_array_size(errors) - before);
}

json_t *episode_to_json(const struct episode_spec *ep) {
  if (!ep->on) return NULL;
  json_t *j = json_pack(
      "{s:i, s:i, s:i, s:i, s:O?, s:s, s:s}", "max_turns", ep->max_turns, "max_new_tokens_per_turn",
      ep->max_new_tokens_per_turn, "max_episode_tokens", ep->max_episode_tokens,
      "max_answer_tokens", ep->max_answer_tokens, "tools", ep->tools, "reward", REWARDS[ep->reward],
      "tool_format", ep->tool_format < 0 ? "auto" : tc_format_name(ep->tool_format));
  if (j && ep->environment) {
    json_object_set(j, "environment", ep->environment);
    json_object_set_new(j, "on_env_error", json_string(ENV_ERRORS[ep->on_env_error]));
  }
  return j;
}

void episode_deinit(struct episode_spec *ep) {
  json_decref(ep->tools);
  json_decref(ep->environment);
  memset(ep, 0, sizeof *ep);
}

int episode_multi(const struct episode_spec *ep) {
  return ep && ep->on && (ep->max_turns > 1 || ep->tools || ep->environment);
}

int episode_after_prompt(const struct episode_spec *ep, const struct hparams *hp) {
  return episode_multi(ep) ? ep->max_episode_tokens : hp->max_new_tokens;
}
