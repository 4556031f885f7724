/* chartok: the character-level tokenizer of the presets. One token per Unicode code point of a
 * stated alphabet, after three specials: 0 "<unk>", 1 "<s>" (BOS), 2 "</s>" (EOS). It round-trips
 * through a Hugging Face tokenizer.json (a BPE model with single-character vocabulary and no
 * merges) that the reference `tokenizers` library tokenizes identically, so presets reload. */
#ifndef DAPO_CHARTOK_H
#define DAPO_CHARTOK_H

#include <stddef.h>

#include <jansson.h>

#include "error.h"

enum { CHARTOK_UNK = 0, CHARTOK_BOS = 1, CHARTOK_EOS = 2, CHARTOK_N_SPECIAL = 3 };

struct chartok;

/* A tokenizer over the code points of alphabet (UTF-8, NUL-terminated, borrowed): the k-th
 * character gets id 3 + k. Refuses (NULL, e filled, naming the byte offset) an empty alphabet,
 * invalid UTF-8 (overlong forms, surrogates, truncated sequences, > U+10FFFF) and duplicate
 * characters. The caller owns the result (chartok_free). A chartok is immutable: every function
 * below may be called from several threads at once. */
struct chartok *chartok_new(const char *alphabet, struct dapo_err *e);
void chartok_free(struct chartok *t);

/* 3 + the number of alphabet characters. */
int chartok_vocab_size(const struct chartok *t);

/* The alphabet as given to chartok_new (borrowed, lives with t). */
const char *chartok_alphabet(const struct chartok *t);

/* Tokenizes len bytes of UTF-8 text (no terminator needed) as the reference library does: the
 * literal texts "<unk>", "<s>", "</s>" become their special ids (like Hugging Face added
 * tokens), each other code point becomes its id or CHARTOK_UNK when not in the alphabet. No BOS
 * or EOS is added. Writes at most cap ids into ids and the count into *n_out. Returns 0;
 * DAPO_EINVAL (naming the byte offset) on invalid UTF-8; DAPO_ERANGE when more than cap ids
 * would be written (*n_out then holds the number needed). With ids NULL and cap 0 it only
 * counts, returning 0. */
int chartok_encode(const struct chartok *t, const char *text, size_t len, int *ids, int cap,
                   int *n_out, struct dapo_err *e);

/* Concatenates the texts of n ids into buf (cap bytes, always NUL-terminated when cap > 0) and
 * stores the length without the NUL in *len_out. With skip_special the three specials are
 * dropped (Hugging Face's skip_special_tokens); otherwise they appear as "<unk>", "<s>", "</s>".
 * Returns 0; DAPO_EINVAL (naming the position) for an id outside [0, vocab); DAPO_ERANGE when
 * the text and its NUL do not fit (buf then holds a prefix cut at a character boundary and
 * *len_out the length needed). With buf NULL and cap 0 it only measures, returning 0. */
int chartok_decode(const struct chartok *t, const int *ids, int n, char *buf, size_t cap,
                   size_t *len_out, int skip_special, struct dapo_err *e);

/* The text of one token, NUL-terminated UTF-8 (borrowed, lives with t); NULL when id is out of
 * range. */
const char *chartok_token_text(const struct chartok *t, int id);

/* A new Hugging Face tokenizer.json object (caller owns the reference; NULL on out of memory)
 * that tokenizes and decodes exactly as t: a BPE model over the single-character vocabulary with
 * no merges, the three specials as special added tokens, and a Fuse decoder. */
json_t *chartok_to_json(const struct chartok *t);

/* Rebuilds a chartok from a tokenizer.json object (borrowed) of the form chartok_to_json writes.
 * Anything else is refused with DAPO_EUNSUPPORTED (another model type, merges, a normalizer,
 * pre-tokenizer, post-processor or other decoder, extra added tokens) or DAPO_EFORMAT (a
 * malformed vocabulary), the message naming the component at fault. Caller owns the result. */
struct chartok *chartok_from_json(const json_t *tokenizer_json, struct dapo_err *e);

#endif
