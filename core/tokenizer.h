/* The tokenizer facade the rest of the code uses: built from a Hugging Face tokenizer.json and
 * dispatching to the implementation that understands it. Today that is the character-level
 * tokenizer of the presets (chartok.h); byte-level BPE joins behind the same calls (issue 5).
 * A tokenizer never changes after it is built: all calls are thread-safe. */
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
void tok_free(struct tokenizer *t);

int tok_vocab_size(const struct tokenizer *t);
/* A new reference to the tokenizer.json object (for saving checkpoints). */
json_t *tok_to_json(const struct tokenizer *t);

/* Encodes len bytes of UTF-8 into at most cap ids (*n_out ids written); DAPO_ERANGE when more
 * would be needed (*n_out then holds the count). ids NULL and cap 0 only counts. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, int *ids, int cap,
               int *n_out, struct dapo_err *e);
/* Decodes into buf (cap bytes, NUL-terminated), *len_out the text length; DAPO_ERANGE when it does
 * not fit (*len_out = length needed). skip_special leaves special tokens out. */
int tok_decode(const struct tokenizer *t, const int *ids, int n, char *buf, size_t cap,
               size_t *len_out, int skip_special, struct dapo_err *e);
/* Decodes into a new malloc'd NUL-terminated string (free()); NULL with e set on failure. */
char *tok_decode_alloc(const struct tokenizer *t, const int *ids, int n, int skip_special,
                       struct dapo_err *e);

#endif
