/* Multi-turn episodes (docs/AGENTS.md): the job body's `episode`. The model speaks, a tool
 * answers, the model speaks again, and the reward judges the episode; DAPO is unchanged above it
 * (a group is the G episodes of one prompt) and the loss covers exactly the tokens the model
 * sampled. An episode with max_turns 1 and no tools is today's sample, bit for bit: the runner
 * then takes the single-turn path.
 *
 *   "episode": {"max_turns": 4, "max_new_tokens_per_turn": 16, "max_episode_tokens": 512,
 *               "max_answer_tokens": 256, "tools": [...] or "environment": {...},
 *               "reward": "judge", "on_env_error": "fail", "tool_format": "auto"}
 *
 * hyperparameters.max_new_tokens bounds the model's tokens of an episode (overlong shaping
 * applies to them); max_episode_tokens every token after the prompt, the model's and the
 * world's; max_answer_tokens the tokens of one answer (or observation message) the model reads.
 * reward: the judge's score of the final answer, the sum of the environment's rewards, or
 * both added. */
#ifndef DAPO_EPISODE_H
#define DAPO_EPISODE_H

#include <jansson.h>

#include "hparams.h"
#include "judge.h"

enum ep_reward { EP_REWARD_JUDGE = 0, EP_REWARD_ENVIRONMENT, EP_REWARD_SUM };
/* What an environment's failure does once its retries are spent: the job fails quoting it, or
 * the episode's group leaves the step (with a warning). */
enum ep_env_error { EP_ENV_FAIL = 0, EP_ENV_DROP };

#define EPISODE_MAX_TURNS 64

struct episode_spec {
  int on;                      /* the body has an `episode` (the resolved spec shows it) */
  int max_turns;               /* model turns, 1 .. EPISODE_MAX_TURNS */
  int max_new_tokens_per_turn; /* 1 .. max_new_tokens */
  int max_episode_tokens;      /* tokens after the prompt, the model's and the world's */
  int max_answer_tokens;       /* of one answer the model reads */
  json_t *tools;               /* the tools' specs (owned), or NULL */
  json_t *environment;         /* the environment's spec (owned), or NULL; never with tools */
  enum ep_reward reward;
  enum ep_env_error on_env_error;
  int tool_format; /* enum tc_format, or -1: auto (the model's family's; dapod for presets and
                      custom templates) */
};

/* Parses the body's `episode` (borrowed; NULL or null: none) against the resolved
 * hyperparameters, the tools under pol. Problems go to errors as {field, message}; returns
 * their count. episode_deinit in any case. */
int episode_parse(const json_t *v, const struct hparams *hp, const struct judge_policy *pol,
                  struct episode_spec *ep, json_t *errors);
/* The resolved episode (every field), a new reference; NULL when the body had none. */
json_t *episode_to_json(const struct episode_spec *ep);
void episode_deinit(struct episode_spec *ep);

/* Whether the job runs multi-turn episodes (more than one turn, tools or an environment): else
 * single turns. */
int episode_multi(const struct episode_spec *ep);
/* The tokens a sequence may hold after its prompt: max_episode_tokens for multi-turn episodes,
 * else max_new_tokens. ep may be NULL. */
int episode_after_prompt(const struct episode_spec *ep, const struct hparams *hp);

#endif
