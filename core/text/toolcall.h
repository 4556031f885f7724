/* Tool-call formats: how a model's turn calls a tool, and how the answers are written back into
 * its sequence (token in, token out: the caller tokenizes the text rendered here and appends it
 * after the model's turn, never re-rendering what came before). docs/AGENTS.md has each format.
 *   dapod   the default of the presets and of custom chat templates, made to be learnable from
 *           random weights by a character model: a turn that starts with '@' is a call,
 *           "@name {json arguments}", "@name" (no arguments), or a bare "@" when the job has one
 *           tool; the answer is written back as "=" content, an environment's observation
 *           as ">" content, "\n" between two of them, and the model's next turn follows the
 *           last character at once (what it reads last is what it most often copies).
 *   qwen    Qwen2.5's and Qwen3's (Hermes-style): calls after the turn's text, each
 *           "<tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call>"
 *   llama3_json  Llama 3.1's and 3.2's: the whole turn is one {"name": ..., "parameters": {...}}
 * The answers of the chat families are written as their templates write them
 * (chat_render_after_turn, chat.h); tc_render_answers writes the dapod format's.
 * A format never changes; these functions are pure and thread-safe. */
#ifndef DAPO_TOOLCALL_H
#define DAPO_TOOLCALL_H

#include <jansson.h>
#include <stddef.h>

enum tc_format { TC_DAPOD = 0, TC_QWEN, TC_LLAMA3_JSON, TC_COUNT };

/* The format named name ("dapod", "qwen", "llama3_json"); -1 when there is none. */
int tc_format_find(const char *name);
const char *tc_format_name(enum tc_format f);

#define TC_MAX_CALLS 8 /* calls one turn may make (the rest is malformed) */
#define TC_NAME_MAX 64 /* bytes of a tool's name */
#define TC_NAME_RULE "1 to 64 of a-z, A-Z, 0-9, _ and -" /* for messages */

/* Whether the NUL-terminated s (NULL: no) is a tool's name: TC_NAME_RULE, OpenAI's rule for
 * function names. Every part that takes a tool's name checks it here (the toolbox, a line's
 * tools, a chat request's), and the dapod format reads a name of the same characters. */
int tc_valid_name(const char *s);

struct tc_call {
  char name[TC_NAME_MAX + 1];
  json_t *arguments; /* owned: a JSON object */
};

/* What one model turn says: calls (n_calls of them), or a final answer (no call). A turn that
 * tries to call but does not do it well (a name that is no tool's, arguments that are not a JSON
 * object, a bare '@' with several tools, a <tool_call> that is not closed or holds no call) is
 * malformed: why says what, as the model is told. */
struct tc_turn {
  int n_calls;
  struct tc_call calls[TC_MAX_CALLS];
  int malformed;
  char why[256];
};

/* Reads one model turn's text (len bytes; its end-of-turn text already removed) in format f; tools
 * (n_tools names, borrowed) are the job's. Returns 0, or DAPO_ENOMEM. tc_turn_free after. */
int tc_read_turn(enum tc_format f, const char *text, size_t len, const char *const *tools,
                 int n_tools, struct tc_turn *out);
void tc_turn_free(struct tc_turn *t);

/* One message of the world after a model's turn: an answer to a call (its tool's name and the
 * content the model reads: a tool's result, or what was wrong), or an environment's observation
 * (role "user" or "system"). role NULL is "tool". */
struct tc_answer {
  const char *name;
  const char *content;
  const char *role;
};

/* The text that follows a model's turn when the world said these n >= 0 messages, ending where
 * the model's next turn starts, into *out (malloc'd, NUL-terminated). dapod writes a tool's
 * answer "=" content and a user's or system's message ">" content, "\n" between two of them
 * and nothing after the last. Returns 0 or DAPO_ENOMEM. */
int tc_render_answers(enum tc_format f, const struct tc_answer *a, int n, char **out);

#endif
