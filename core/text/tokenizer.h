/* The tokenizer facade the rest of the code uses: built from a Hugging Face tokenizer.json and
 * dispatching to the implementation that understands it: the character-level tokenizer of the
 * presets (chartok.h; a file with a "Fuse" decoder) or byte-level BPE (bpe.h; everything else,
 * GPT-2 / Llama 3 / Qwen2 / Qwen3 / SmolLM2 files, docs/TOKENIZERS.md). A tokenizer never changes
 * after it is built: all calls are thread-safe (a tok_stream belongs to one thread). */
#ifndef DAPO_TOKENIZER_H
#define DAPO_TOKENIZER_H

#include <stddef.h>

#include <jansson.h>

#include "error.h"

struct tokenizer;

/* Builds a tokenizer from a parsed tokenizer.json (borrowed). Unsupported files are refused with
 * a message naming the component. Owned by the caller (tok_free). */
struct tokenizer *tok_from_json(const json_t *j, struct dapo_err *e);
/* Same from the text of tokenizer.json. */
struct tokenizer *tok_from_text(const char *text, struct dapo_err *e);
/* Same from a tokenizer.json file (a model folder's); errors name the path and the JSON line. */
struct tokenizer *tok_from_file(const char *path, struct dapo_err *e);
void tok_free(struct tokenizer *t);

int tok_vocab_size(const struct tokenizer *t);
/* A new reference to the tokenizer.json object (for saving checkpoints). */
json_t *tok_to_json(const struct tokenizer *t);

/* Encodes len bytes of UTF-8 into at most cap ids (*n_out ids written); DAPO_ERANGE when more
 * would be needed (*n_out then holds the count). ids NULL and cap 0 only counts. Special-token
 * text in the input ("<|im_start|>") becomes its id, but no BOS/EOS is added: this is the
 * reference's encode(text, add_special_tokens=False). DAPO_EINVAL on invalid UTF-8. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, int *ids, int cap,
               int *n_out, struct dapo_err *e);
/* Same with the choice: add_special 1 adds what the file's post-processor adds (Llama 3's
 * TemplateProcessing puts <|begin_of_text|> first; GPT-2 and Qwen add nothing), as the
 * reference's encode(text, add_special_tokens=True). chartok adds nothing either way. */
int tok_encode_special(const struct tokenizer *t, const char *text, size_t len, int add_special,
                       int *ids, int cap, int *n_out, struct dapo_err *e);

/* The id of a token given by its text (added/special tokens first, then the vocabulary, in the
 * vocabulary's own form: byte-level "Ġthe"); -1 when absent. For "<|im_end|>", "</s>", ... */
int tok_token_to_id(const struct tokenizer *t, const char *token);
/* The text of an id as tok_token_to_id takes it (borrowed, NUL-terminated, lives with t); NULL
 * for an id without a token. */
const char *tok_id_to_token(const struct tokenizer *t, int id);
/* The raw bytes id stands for, as a decode of it alone gives them before invalid UTF-8 becomes
 * U+FFFD: a byte-level token's bytes (a piece of a character included), a ByteFallback token's
 * (<0xNN>) byte, else the token decoded alone (special tokens kept). Into *out (owned: free();
 * NUL-terminated beyond its *len bytes); DAPO_EINVAL for an id without a token, DAPO_ENOMEM. */
int tok_token_bytes(const struct tokenizer *t, int id, char **out, size_t *len, struct dapo_err *e);
/* 1 when id is a special token (dropped by skip_special decoding). */
int tok_is_special(const struct tokenizer *t, int id);
/* BOS: chartok's <s>; for BPE the first special token the post-processor puts before the text
 * (Llama 3's <|begin_of_text|>), -1 when it adds none. EOS: chartok's </s>; -1 for BPE, whose
 * tokenizer.json does not say it (read eos_token from tokenizer_config.json, tok_token_to_id). */
int tok_bos_id(const struct tokenizer *t);
int tok_eos_id(const struct tokenizer *t);
/* Decodes into buf (cap bytes, NUL-terminated), *len_out the text length; DAPO_ERANGE when it does
 * not fit (*len_out = length needed). skip_special leaves special tokens out. */
int tok_decode(const struct tokenizer *t, const int *ids, int n, char *buf, size_t cap,
               size_t *len_out, int skip_special, struct dapo_err *e);
/* Decodes into a new malloc'd NUL-terminated string (free()); NULL with e set on failure. */
char *tok_decode_alloc(const struct tokenizer *t, const int *ids, int n, int skip_special,
                       struct dapo_err *e);

/* Streaming decode for generated tokens: each push returns the text that is complete so far
 * (only whole UTF-8 characters; the bytes of a character split across tokens wait for the next
 * push); finish returns the rest, an unfinished character as U+FFFD. The concatenation of every
 * push and finish equals tok_decode of all ids. Owned by the caller (tok_stream_free); the
 * tokenizer must outlive it; one thread at a time. */
struct tok_stream;
struct tok_stream *tok_stream_new(const struct tokenizer *t, int skip_special);
void tok_stream_free(struct tok_stream *s);
/* The new text (borrowed, NUL-terminated, valid until the next call on s), *len its length;
 * NULL with e set for an id without a token (the stream stays usable) or out of memory. */
const char *tok_stream_push(struct tok_stream *s, int id, size_t *len, struct dapo_err *e);
const char *tok_stream_finish(struct tok_stream *s, size_t *len, struct dapo_err *e);

#endif
