/* bpe: BPE tokenizers read from a Hugging Face tokenizer.json (byte-level: GPT-2, Llama 3,
 * Qwen2/2.5/3, SmolLM2; SentencePiece-style with byte fallback: Llama 2, TinyLlama, Mistral v0.1;
 * character BPE with an unk token), encoding and decoding exactly as the reference `tokenizers`
 * library does. The supported components and the decisions behind them are in docs/TOKENIZERS.md.
 * Used through the facade (tokenizer.h); a struct bpe never changes after it is built (its
 * pre-token cache is locked), so every function below may be called from several threads at once.
 */
#ifndef DAPO_BPE_H
#define DAPO_BPE_H

#include <stddef.h>

#include <jansson.h>

#include "error.h"

/* Bounds on what a tokenizer.json may hold (the loader is fed untrusted files). */
enum {
  BPE_MAX_IDS = 1 << 21,      /* token ids are in [0, BPE_MAX_IDS) */
  BPE_MAX_MERGES = 1 << 23,   /* merges */
  BPE_MAX_TOKEN_BYTES = 4096, /* bytes of one vocabulary or added token */
  BPE_MAX_ADDED = 1 << 16,    /* added tokens */
  BPE_MAX_PATTERN = 1 << 16,  /* bytes of one Split pattern */
  BPE_MAX_COMPONENTS = 32,    /* normalizers, pre-tokenizers, template items, ... */
  BPE_MAX_NESTING = 4,        /* Sequence in Sequence depth */
  BPE_CACHE_WORD_BYTES = 64,  /* longest pre-token kept in the cache */
  BPE_CACHE_SLOTS = 1 << 15,  /* direct-mapped cache entries */
};

struct bpe;

/* Builds a tokenizer from a parsed tokenizer.json (borrowed; a reference is kept for bpe_json).
 * Anything outside the supported set is refused: DAPO_EUNSUPPORTED with the component and its
 * JSON path (`normalizer.type "Precompiled" is not supported`), DAPO_EFORMAT for malformed
 * shapes (naming the path), DAPO_ERANGE for sizes beyond the bounds above. Owned by the caller. */
struct bpe *bpe_from_json(const json_t *j, struct dapo_err *e);
void bpe_free(struct bpe *b);

/* The tokenizer.json it was built from (borrowed, lives with b). */
json_t *bpe_json(const struct bpe *b);

/* 1 + the largest id of the vocabulary and the added tokens. */
int bpe_vocab_size(const struct bpe *b);

/* Encodes len bytes of UTF-8 as the reference `encode(text, add_special_tokens)`: added tokens
 * matched first, then normalizer, pre-tokenizer and BPE; with add_special the post-processor's
 * special tokens (TemplateProcessing) around the text. At most cap ids into ids, the count into
 * *n_out; DAPO_ERANGE when more would be needed (*n_out the count), DAPO_EINVAL (naming the byte
 * offset) on invalid UTF-8. ids NULL and cap 0 only counts. */
int bpe_encode(const struct bpe *b, const char *text, size_t len, int add_special, int *ids,
               int cap, int *n_out, struct dapo_err *e);

/* Decodes n ids as the reference `decode(ids, skip_special_tokens)`: into a new malloc'd
 * NUL-terminated string (*len_out its length, free()), invalid UTF-8 replaced by U+FFFD as Rust's
 * from_utf8_lossy does. DAPO_EINVAL (naming the position) for an id without a token. */
char *bpe_decode(const struct bpe *b, const int *ids, int n, int skip_special, size_t *len_out,
                 struct dapo_err *e);

/* The bytes the decoder makes of one id before the UTF-8 repair (borrowed, lives with b; not
 * NUL-terminated; may be a part of a character); NULL for an id without a token. */
const char *bpe_token_bytes(const struct bpe *b, int id, size_t *len);
/* 1 when the decoder joins tokens with a space (no decoder in the file), 0 for ByteLevel. */
int bpe_joins_with_space(const struct bpe *b);

/* 1 when the decoder is a chain of Replace, ByteFallback, Fuse, Strip and Metaspace: its text
 * comes from a bpe_dstream, not from bpe_token_bytes (which then gives the token's text). */
int bpe_decodes_by_chain(const struct bpe *b);
/* Streaming decode through the chain, as the reference's decode of all the ids pushed: push
 * returns the new text (valid UTF-8, borrowed until the next call; some may be held back, as a
 * run of byte tokens is), finish the rest. Special tokens are the caller's to skip. NULL with
 * DAPO_EINVAL for an id without a token, DAPO_ENOMEM. One stream belongs to one thread. */
struct bpe_dstream;
struct bpe_dstream *bpe_dstream_new(const struct bpe *b);
const char *bpe_dstream_push(struct bpe_dstream *s, int id, size_t *len, struct dapo_err *e);
const char *bpe_dstream_finish(struct bpe_dstream *s, size_t *len, struct dapo_err *e);
void bpe_dstream_free(struct bpe_dstream *s);

/* Added tokens first, then the model's vocabulary, as the reference token_to_id: -1 if absent. */
int bpe_token_to_id(const struct bpe *b, const char *token);
/* The text of an id (added token content or vocabulary string, byte-level form; borrowed, NUL
 * terminated, lives with b); NULL when the id has no token. */
const char *bpe_id_to_token(const struct bpe *b, int id);
/* 1 for an added token marked special. */
int bpe_is_special(const struct bpe *b, int id);
/* The first special token the TemplateProcessing post-processor puts before the text; -1. */
int bpe_bos_id(const struct bpe *b);

/* UTF-8 scanning as Rust's from_utf8_lossy: at s[0..n) (n >= 1) returns 1 for a valid character
 * of *adv bytes; 0 for an invalid maximal subpart of *adv bytes (one U+FFFD); -1 when the bytes
 * are a valid but unfinished prefix of a character (*adv = n). */
int bpe_utf8_next(const unsigned char *s, size_t n, size_t *adv);

#endif
