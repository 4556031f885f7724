/* Supervised fine-tuning data (issue 27): the lines of a supervised job's training and
 * validation files checked one by one, every problem naming the line and the field, before a
 * job is queued. Two shapes (docs/TRAINING.md#supervised-fine-tuning):
 *   {"prompt": "...", "completion": "..."}        the completion is trained, the prompt context
 *   {"messages": [{"role", "content", "weight"?}]}  assistant messages with weight 1 (the
 *                                                  default) are trained, the rest context
 * with optional "id" and "metadata" as in DAPO files. Thread-safe (no state). */
#ifndef DAPO_SFT_H
#define DAPO_SFT_H

#include <jansson.h>

#include "error.h"

/* The roles a message may have, as the errors list them. */
#define SFT_ROLES "system, user, assistant, tool"

/* Checks one parsed line (borrowed) of a supervised file, lineno its 1-based number. Returns 0,
 * or DAPO_EFORMAT with e->msg "line N: field 'F': what is wrong" (F as the line writes it:
 * 'messages[2].weight'). The rules: a JSON object with exactly one of `prompt` (then a string
 * `completion` too) or `messages`; `messages` a non-empty array of objects with a known role
 * (SFT_ROLES) and string content (an assistant's may be null when it has tool_calls); `weight`
 * only on assistant messages, 0 or 1; at least one assistant message with weight 1; no other
 * field than prompt, completion, messages, tools, id, metadata. */
int sft_check_line(const json_t *line, int lineno, struct dapo_err *e);

/* One message of a line's conversation, field[i] (field as the line writes it: "messages",
 * "input.messages"), by sft_check_line's rules; *trained |= 1 when it is an assistant's of
 * weight 1. 0 or DAPO_EFORMAT naming the line and field (DPO lines check theirs with it). */
int sft_check_message(const json_t *m, const char *field, size_t i, int lineno, int *trained,
                      struct dapo_err *e);

/* "a string", "an integer", ... for messages about a value of the wrong kind. */
const char *sft_kind_of(const json_t *v);

struct lm;
struct chat_template;

/* One example as the step trains it: tokens[n], and trained[n] 1 on the tokens whose
 * prediction is trained (the completion or the weight-1 assistant messages, each with its end
 * token), 0 on the context. Arrays owned (sft_example_deinit). */
struct sft_example {
  int *tokens;
  unsigned char *trained;
  int n, n_trained;
  int cut; /* tokens dropped from its end by truncate */
};

/* Encodes a line that passed sft_check_line, token in, token out:
 *   prompt/completion: lm_encode_prompt(prompt) (what the model's encoding of a plain prompt
 *     adds, BOS alone for an empty prompt) as context, then the completion's own tokens and
 *     end_id, trained;
 *   messages: up to each assistant message, the conversation rendered by chat (its generation
 *     prompt included) as context; the message's content tokenized alone and the template's
 *     end-of-turn token (chat_stop_text, one token), trained when its weight is 1; the text the
 *     template writes between it and the next assistant message as context, taken as the suffix
 *     that rendering the longer conversation adds (a template that renders an earlier turn
 *     otherwise, as qwen3 drops <think>, is refused). Messages after the last assistant one are
 *     not encoded (nothing after them is trained). An assistant message with tool_calls is
 *     trained as the template renders its turn (content and calls, chat_render_tools with the
 *     line's tools) up to its end of turn, taken as what rendering the conversation through it
 *     adds after its generation prompt; refused by field for a template that renders no tools.
 * end_id: the id that ends a completion (the model's EOS); chat: NULL refuses `messages` lines.
 * Longer than max_tokens: refused (DAPO_ERANGE) or, with truncate, cut at max_tokens (refused
 * when nothing trained remains). Errors name the line (and field); DAPO_ENOMEM. */
int sft_encode(const struct lm *lm, const struct chat_template *chat, int end_id,
               const json_t *line, int lineno, int max_tokens, int truncate,
               struct sft_example *out, struct dapo_err *e);
void sft_example_deinit(struct sft_example *x);

/* Reads the supervised file at path: each non-blank line parsed, checked (sft_check_line) and
 * encoded (sft_encode) into (*out)[0 .. *n) (owned: sft_examples_free), lines of at most
 * DS_DEFAULT_MAX_LINE_BYTES, at most DS_DEFAULT_MAX_ITEMS examples, at least one. Returns 0 or
 * the first line's error (e names the line and field; DAPO_EIO for the file itself). */
int sft_load_file(const char *path, const struct lm *lm, const struct chat_template *chat,
                  int end_id, int max_tokens, int truncate, struct sft_example **out, int *n,
                  struct dapo_err *e);
void sft_examples_free(struct sft_example *x, int n);

/* Calls fn(ctx, line, lineno, e) on each non-blank line of the file at path, parsed (lines of at
 * most DS_DEFAULT_MAX_LINE_BYTES; duplicate keys refused), until fn returns non-zero. Returns 0,
 * fn's code, or a line's own error (e names the line; DAPO_EIO for the file). */
int sft_each_line(const char *path,
                  int (*fn)(void *ctx, const json_t *line, int lineno, struct dapo_err *e),
                  void *ctx, struct dapo_err *e);

/* Reads the file at path into *out (a new array of *n items of `size` bytes, owned: free it
 * after deinit of each item): each non-blank line (sft_each_line) made into the next item by
 * one(ctx, line, lineno, item, e), at most DS_DEFAULT_MAX_ITEMS, at least one ("no <what>").
 * 0, or the first line's error, the items made so far released by deinit (*out NULL). */
int sft_load_items(const char *path, size_t size,
                   int (*one)(void *ctx, const json_t *line, int lineno, void *item,
                              struct dapo_err *e),
                   void (*deinit)(void *item), void *ctx, const char *what, void **out, int *n,
                   struct dapo_err *e);

#endif
