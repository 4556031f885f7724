/* Chat prompts: rendering a dataset line's `messages` (a list of {role, content}) into the prompt
 * text a model was tuned on, with the generation prompt appended, exactly as Hugging Face's
 * apply_chat_template(messages, add_generation_prompt=True, tokenize=False) renders it for the
 * families we understand. There is no Jinja engine here: a model's tokenizer_config.json
 * `chat_template` is recognised as one of these families, and anything else is refused with a
 * message that says what to do instead:
 *   chatml    <|im_start|>role\ncontent<|im_end|>\n, with the template's default system message
 *             when the conversation has none (Qwen2, Qwen2.5, SmolLM2 and other ChatML models)
 *   qwen3     ChatML without a default system message; earlier assistant turns lose their
 *             <think>...</think> reasoning as Qwen3's template does
 *   llama3    <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent|trim<|eot_id|>
 *             (Llama 3, 3.1 as shipped by the simple template)
 *   llama3.2  as llama3 with the dated system header ("Cutting Knowledge Date: December 2023",
 *             "Today Date: 26 Jul 2024" unless the job gives another date: rendering must not
 *             depend on the day a job runs)
 * A job may instead name one of these, or give its own template: an object of strings with
 * {content} and {role} placeholders (see chat_from_spec).
 * Tools, assistant tool calls and tool answers are rendered as their templates render them by
 * chatml (Qwen2.5's), qwen3 and llama3.2 (Llama 3.1's and 3.2's: the tools in the first user
 * message); llama3 and custom templates render none (chat_render_tools refuses them).
 * A template never changes after it is built; rendering is thread-safe. */
#ifndef DAPO_CHAT_H
#define DAPO_CHAT_H

#include <jansson.h>

#include "error.h"

struct chat_template;

/* Builds the template a job asks for. spec (borrowed) is NULL or "auto" (the model's own
 * template, from tokenizer_config (borrowed; NULL when the model has no tokenizer_config.json)),
 * a family name ("chatml", "qwen3", "llama3", "llama3.2"), or an object:
 *   {"system": "<s>{content}</s>", "user": "...", "assistant": "...",   (user required)
 *    "generation_prompt": "...", "prefix": "...", "default_system": "...", "stop": "...",
 *    "date_string": "..." (llama3.2 only, with "family")}
 * where {content} is the message text, {role} its role and {{ }} are literal braces; a family
 * may also be given as {"family": "llama3.2", "date_string": "1 Jan 2025"} or
 * {"family": "chatml", "default_system": "..."}. Errors name the field ("chat_template.user: ...")
 * or, for "auto", say why the model's template is not understood. */
struct chat_template *chat_from_spec(const json_t *spec, const json_t *tokenizer_config,
                                     struct dapo_err *e);
void chat_free(struct chat_template *t);

/* "chatml", "qwen3", "llama3", "llama3.2" or "custom". */
const char *chat_family(const struct chat_template *t);
/* The resolved template as a JSON object (every field; a new reference), for the job record. */
json_t *chat_to_json(const struct chat_template *t);
/* The text that ends an assistant turn ("<|im_end|>", "<|eot_id|>"), to stop generation at;
 * NULL when the template has none. */
const char *chat_stop_text(const struct chat_template *t);

/* Renders messages (borrowed; an array of {"role", "content"} objects as core/rl/dataset.c checks
 * them) into a new malloc'd NUL-terminated string (*out, free()). The result already holds the
 * template's special tokens (BOS included), so it is tokenized without adding special tokens.
 * The roles are system, user and assistant (and tool, where the family renders tools); the last
 * message is the user's (or a tool's). */
int chat_render(const struct chat_template *t, const json_t *messages, char **out,
                struct dapo_err *e);
/* chat_render with tools (borrowed: OpenAI's function tools [{"type": "function", "function":
 * {"name", "description", "parameters"}}], written as given; NULL or []: none). messages may
 * hold assistant messages with "tool_calls" ([{"type": "function", "function": {"name",
 * "arguments"}}] or Hugging Face's [{"name", "arguments"}]; arguments an object or the JSON text
 * of one, which is read and written as the object: what Hugging Face's templates expect; content
 * may be null then) and {"role": "tool", "content"} answers. Llama makes one call a turn. Without
 * add_generation_prompt the text ends after the last message (the world may speak first:
 * chat_render_after with CHAT_AFTER_PROMPT). */
int chat_render_tools(const struct chat_template *t, const json_t *messages, const json_t *tools,
                      int add_generation_prompt, char **out, struct dapo_err *e);
/* Whether t renders tools (chatml, qwen3, llama3.2). */
int chat_renders_tools(const struct chat_template *t);
/* Where the world's words go: after a model's turn that ended with the template's end-of-turn
 * text (chat_stop_text), after one that was cut before it (the text is written first), or after
 * a prompt rendered without its generation prompt. */
enum chat_after { CHAT_AFTER_STOP = 0, CHAT_AFTER_CUT, CHAT_AFTER_PROMPT };
/* What follows `after` when the world says world (borrowed: [{"role": "tool" | "user" |
 * "system", "content"}], possibly empty), up to where the model's next turn starts (the
 * generation prompt): for the families that render tools, exactly the text the template adds
 * there when it renders the whole conversation. A new malloc'd string in *out. Episodes append
 * it, tokenized, token in, token out. */
int chat_render_after(const struct chat_template *t, enum chat_after after, const json_t *world,
                      char **out, struct dapo_err *e);

#endif
