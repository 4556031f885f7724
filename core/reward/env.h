/* What an environment says (docs/AGENTS.md "Environments"): its reply to /reset or /step,
 *   {"observation": OBS, "reward": number | null, "done": bool, "info": {...}}
 * where OBS is a string (one user message), {"messages": [{"role": "user" | "tool" | "system",
 * "content": "...", "name": "..."}]} (appended to the conversation in order), or null (nothing
 * to read). reward and done may be absent (null, false); other fields are ignored, so that a
 * reply may carry more than dapod reads. The environment's client is the toolbox's (tools.h:
 * toolbox_new_env); this is its reply, read, and an OpenEnv server's (env_openenv_reply_parse).
 * Pure and thread-safe. */
#ifndef DAPO_ENV_H
#define DAPO_ENV_H

#include <jansson.h>
#include <stddef.h>

#define ENV_MESSAGES_MAX 64 /* messages of one observation */

struct env_reply {
  json_t *messages; /* owned: [{"role", "content"[, "name"]}], possibly empty */
  double reward;    /* when has_reward */
  int has_reward, done;
  json_t *info; /* owned: the reply's info object, or NULL */
};

/* Reads a reply (text, n bytes) into out. 0, or -1 with why (cap bytes) naming the field at
 * fault ("observation.messages[2].role: expected \"user\", \"tool\" or \"system\""); out is
 * empty then. env_reply_clear after a success. */
int env_reply_parse(const char *text, size_t n, struct env_reply *out, char *why, size_t cap);
/* Reads an OpenEnv server's reply on its WebSocket session (text, n bytes) into out:
 *   {"type": "observation", "data": {"observation": {fields}, "reward": number | null,
 *    "done": bool}}
 * gives one user message: the observation's field observation_field (a string as it is, another
 * JSON value as compact JSON text; null: no message; missing: an error), or the whole
 * observation as compact JSON text when observation_field is NULL. 0 then.
 * {"type": "error", "data": {"message", "code"}} is the environment's refusal: 1, with why
 * quoting it. Anything else: -1, with why naming the field at fault ("type: ...",
 * "data.observation.board: missing"). out is empty unless 0; env_reply_clear after 0. */
int env_openenv_reply_parse(const char *text, size_t n, const char *observation_field,
                            struct env_reply *out, char *why, size_t cap);
void env_reply_clear(struct env_reply *r);

#endif
