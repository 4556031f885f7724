/* DPO data (issue 27): the lines of a DPO job's training and validation files, each a prompt
 * with a preferred and a non-preferred response, checked one by one (every problem naming the
 * line and the field) and encoded into tokens (docs/TRAINING.md#dpo). Two shapes:
 *   OpenAI's {"input": {"messages": [...], "tools"?, "parallel_tool_calls"?},
 *             "preferred_output": [one assistant message],
 *             "non_preferred_output": [one assistant message]}
 *     (the older names preferred_completion / non_preferred_completion accepted);
 *   TRL's {"prompt": "..." | "messages": [...] (or "prompt": [...]),
 *          "chosen": "..." | [one assistant message], "rejected": the same}
 *     (a text prompt takes text responses; a conversation takes either);
 * with optional "id" and "metadata". Thread-safe (no state). */
#ifndef DAPO_DPO_H
#define DAPO_DPO_H

#include <jansson.h>

#include "error.h"

/* Checks one parsed line (borrowed), lineno its 1-based number: 0, or DAPO_EFORMAT with e->msg
 * "line N: field 'F': what is wrong" (F as the line writes it: 'preferred_output',
 * 'input.messages[1].role'). */
int dpo_check_line(const json_t *line, int lineno, struct dapo_err *e);

struct lm;
struct chat_template;

/* One pair as the step trains it: the prompt's tokens once (context), then each response's
 * tokens, [0] the chosen (preferred) one and [1] the rejected one, every one trained (the
 * response and its end token). Arrays owned (dpo_pair_deinit). */
struct dpo_pair {
  int *prompt, n_prompt;
  int *resp[2], n_resp[2];
  int cut[2]; /* tokens dropped from a response's end by truncate */
};

/* Encodes a line that passed dpo_check_line by the supervised rules (sft_encode), each response
 * as the one trained completion of its prompt:
 *   a text prompt: lm_encode_prompt(prompt) as context, the response's own tokens and end_id;
 *   a conversation: the messages rendered by chat up to its generation prompt as context (their
 *     assistant messages context too), the response's content tokenized alone and the
 *     template's end-of-turn token.
 * Each sequence (prompt and response) holds at most max_tokens: longer is refused (DAPO_ERANGE,
 * naming the line and the response's field) or, with truncate, its response's end is cut
 * (refused when nothing of a response remains). Errors name the line (and field); DAPO_ENOMEM. */
int dpo_encode(const struct lm *lm, const struct chat_template *chat, int end_id,
               const json_t *line, int lineno, int max_tokens, int truncate, struct dpo_pair *out,
               struct dapo_err *e);
void dpo_pair_deinit(struct dpo_pair *p);

/* Reads the DPO file at path: each non-blank line checked (dpo_check_line) and encoded
 * (dpo_encode) into (*out)[0 .. *n) (owned: dpo_pairs_free), at most DS_DEFAULT_MAX_ITEMS
 * pairs, at least one. 0, or the first line's error (e names the line and field). */
int dpo_load_file(const char *path, const struct lm *lm, const struct chat_template *chat,
                  int end_id, int max_tokens, int truncate, struct dpo_pair **out, int *n,
                  struct dapo_err *e);
void dpo_pairs_free(struct dpo_pair *p, int n);

#endif
