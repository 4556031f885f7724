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

#endif
