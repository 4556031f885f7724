/* Tokenizer facade (tokenizer.h): a tagged union over the implementations (chartok, bpe) and the
 * streaming decoder shared by both. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "chartok.h"

enum tok_kind { TOK_CHAR, TOK_BPE };

struct tokenizer {
  enum tok_kind kind;
  struct chartok *ct;
  struct bpe *bpe;
};

struct tokenizer *tok_from_json(const json_t *j, struct dapo_err *e) {
  struct tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return NULL;
  }
  /* chartok writes a Fuse decoder, which no byte-level file has; a Fuse file that is not
   * chartok's shape (unk_token null or not <unk>, merges, ...) is a character BPE for bpe */
  const char *dec = json_string_value(json_object_get(json_object_get(j, "decoder"), "type"));
  if (dec && strcmp(dec, "Fuse") == 0) {
    t->kind = TOK_CHAR;
    t->ct = chartok_from_json(j, e);
  }
  if (!t->ct && (!e || !dec || strcmp(dec, "Fuse") != 0 || e->code == DAPO_EUNSUPPORTED)) {
    if (e) *e = (struct dapo_err){0};
    t->kind = TOK_BPE;
    t->bpe = bpe_from_json(j, e);
  }
  if (!t->ct && !t->bpe) {
    free(t);
    dapo_err_prefix(e, "tokenizer.json: ");
    return NULL;
  }
  return t;
}

struct tokenizer *tok_from_text(const char *text, struct dapo_err *e) {
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  if (!j) {
    dapo_errf(e, DAPO_EFORMAT, "tokenizer.json: line %d: %s", je.line, je.text);
    return NULL;
  }
  struct tokenizer *t = tok_from_json(j, e);
  json_decref(j);
  return t;
}

struct tokenizer *tok_from_file(const char *path, struct dapo_err *e) {
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) {
    dapo_errf(e, je.line > 0 ? DAPO_EFORMAT : DAPO_EIO, "%s: line %d: %s", path, je.line, je.text);
    return NULL;
  }
  struct tokenizer *t = tok_from_json(j, e);
  json_decref(j);
  if (!t) dapo_err_prefix(e, "%s: ", path);
  return t;
}

void tok_free(struct tokenizer *t) {
  if (!t) return;
  chartok_free(t->ct);
  bpe_free(t->bpe);
  free(t);
}

int tok_vocab_size(const struct tokenizer *t) {
  return t->kind == TOK_CHAR ? chartok_vocab_size(t->ct) : bpe_vocab_size(t->bpe);
}

json_t *tok_to_json(const struct tokenizer *t) {
  return t->kind == TOK_CHAR ? chartok_to_json(t->ct) : json_incref(bpe_json(t->bpe));
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, int *ids, int cap,
               int *n_out, struct dapo_err *e) {
  return tok_encode_special(t, text, len, 0, ids, cap, n_out, e);
}

int tok_encode_special(const struct tokenizer *t, const char *text, size_t len, int add_special,
                       int *ids, int cap, int *n_out, struct dapo_err *e) {
  if (t->kind == TOK_CHAR) return chartok_encode(t->ct, text, len, ids, cap, n_out, e);
  return bpe_encode(t->bpe, text, len, add_special, ids, cap, n_out, e);
}

int tok_token_to_id(const struct tokenizer *t, const char *token) {
  if (t->kind == TOK_BPE) return bpe_token_to_id(t->bpe, token);
  for (int id = 0; id < chartok_vocab_size(t->ct); id++)
    if (strcmp(chartok_token_text(t->ct, id), token) == 0) return id;
  return -1;
}

const char *tok_id_to_token(const struct tokenizer *t, int id) {
  return t->kind == TOK_CHAR ? chartok_token_text(t->ct, id) : bpe_id_to_token(t->bpe, id);
}

int tok_is_special(const struct tokenizer *t, int id) {
  if (t->kind == TOK_CHAR) return id >= 0 && id < CHARTOK_N_SPECIAL;
  return bpe_is_special(t->bpe, id);
}

int tok_bos_id(const struct tokenizer *t) {
  return t->kind == TOK_CHAR ? CHARTOK_BOS : bpe_bos_id(t->bpe);
}

int tok_eos_id(const struct tokenizer *t) {
  return t->kind == TOK_CHAR ? CHARTOK_EOS : -1;
}

/* Copies text into buf as chartok_decode does: NUL-terminated, cut at a character boundary and
 * DAPO_ERANGE when it does not fit. */
static int copy_out(const char *text, size_t n, char *buf, size_t cap, size_t *len_out,
                    struct dapo_err *e) {
  *len_out = n;
  if (!buf && cap == 0) return 0;
  if (n + 1 <= cap) {
    memcpy(buf, text, n + 1);
    return 0;
  }
  if (cap > 0) {
    size_t k = cap - 1;
    while (k > 0 && ((unsigned char)text[k] & 0xC0) == 0x80) k--;
    memcpy(buf, text, k);
    buf[k] = 0;
  }
  return dapo_errf(e, DAPO_ERANGE, "decoded text of %zu bytes does not fit in %zu", n, cap);
}

int tok_decode(const struct tokenizer *t, const int *ids, int n, char *buf, size_t cap,
               size_t *len_out, int skip_special, struct dapo_err *e) {
  if (t->kind == TOK_CHAR) return chartok_decode(t->ct, ids, n, buf, cap, len_out, skip_special, e);
  size_t len;
  char *s = bpe_decode(t->bpe, ids, n, skip_special, &len, e);
  if (!s) return e ? e->code : DAPO_EINVAL;
  int rc = copy_out(s, len, buf, cap, len_out, e);
  free(s);
  return rc;
}

int tok_token_bytes(const struct tokenizer *t, int id, char **out, size_t *len,
                    struct dapo_err *e) {
  *out = NULL;
  *len = 0;
  size_t n = 0;
  const char *raw = NULL;
  char one[2] = "";
  if (t->kind == TOK_BPE && !bpe_decodes_by_chain(t->bpe)) {
    raw = bpe_token_bytes(t->bpe, id, &n);
  } else if (t->kind == TOK_BPE) { /* the token's text: a byte fallback is <0xNN> */
    const char *tx = bpe_token_bytes(t->bpe, id, &n);
    unsigned v = 0;
    int used = 0;
    if (tx && n == 6 && sscanf(tx, "<0x%2X>%n", &v, &used) == 1 && used == 6) {
      one[0] = (char)v;
      raw = one;
      n = 1;
    }
  }
  if (raw) {
    if (!(*out = malloc(n + 1))) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    memcpy(*out, raw, n);
    (*out)[n] = '\0';
    *len = n;
    return 0;
  }
  if (!(*out = tok_decode_alloc(t, &id, 1, 0, e))) return e ? e->code : DAPO_EINVAL;
  *len = strlen(*out);
  return 0;
}

char *tok_decode_alloc(const struct tokenizer *t, const int *ids, int n, int skip_special,
                       struct dapo_err *e) {
  if (t->kind == TOK_BPE) {
    size_t len;
    return bpe_decode(t->bpe, ids, n, skip_special, &len, e);
  }
  size_t need = 0;
  if (tok_decode(t, ids, n, NULL, 0, &need, skip_special, e)) return NULL;
  char *buf = malloc(need + 1);
  if (!buf) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory decoding %d tokens", n);
    return NULL;
  }
  if (tok_decode(t, ids, n, buf, need + 1, &need, skip_special, e)) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* ---- streaming ---- */

struct tok_stream {
  const struct tokenizer *t;
  struct bpe_dstream *ds; /* a BPE decoder chain (Llama 2's) decodes here */
  int skip_special;
  int started;           /* a token was emitted (the no-decoder join puts spaces between) */
  unsigned char pend[4]; /* the start of a character whose other bytes have not come yet */
  size_t npend;
  char *out; /* the text returned by the last call */
  size_t cap;
};

struct tok_stream *tok_stream_new(const struct tokenizer *t, int skip_special) {
  struct tok_stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->t = t;
  s->skip_special = skip_special;
  if (t->kind == TOK_BPE && bpe_decodes_by_chain(t->bpe) && !(s->ds = bpe_dstream_new(t->bpe))) {
    free(s);
    return NULL;
  }
  return s;
}

void tok_stream_free(struct tok_stream *s) {
  if (!s) return;
  bpe_dstream_free(s->ds);
  free(s->out);
  free(s);
}

static int stream_reserve(struct tok_stream *s, size_t n) {
  if (n <= s->cap) return 0;
  char *p = realloc(s->out, n);
  if (!p) return DAPO_ENOMEM;
  s->out = p;
  s->cap = n;
  return 0;
}

/* Emits the complete characters of pend + bytes, invalid subparts as U+FFFD, keeps an unfinished
 * tail in pend (or replaces it too when final). */
static const char *stream_emit(struct tok_stream *s, const char *bytes, size_t n, int final,
                               size_t *len, struct dapo_err *e) {
  size_t total = s->npend + n;
  /* worst case every byte becomes U+FFFD */
  if (stream_reserve(s, 3 * total + 1)) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory in the streaming decoder");
    return NULL;
  }
  unsigned char *in = malloc(total ? total : 1);
  if (!in) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory in the streaming decoder");
    return NULL;
  }
  memcpy(in, s->pend, s->npend);
  if (n) memcpy(in + s->npend, bytes, n);
  size_t i = 0, o = 0;
  s->npend = 0;
  while (i < total) {
    size_t adv;
    int r = bpe_utf8_next(in + i, total - i, &adv);
    if (r == 1) {
      memcpy(s->out + o, in + i, adv);
      o += adv;
    } else if (r == 0 || final) {
      memcpy(s->out + o, "\xEF\xBF\xBD", 3);
      o += 3;
    } else {
      memcpy(s->pend, in + i, adv); /* adv < 4: a valid prefix is at most 3 bytes */
      s->npend = adv;
    }
    i += adv;
  }
  free(in);
  s->out[o] = 0;
  *len = o;
  return s->out;
}

const char *tok_stream_push(struct tok_stream *s, int id, size_t *len, struct dapo_err *e) {
  const char *bytes;
  size_t n;
  *len = 0;
  if (s->t->kind == TOK_CHAR) {
    bytes = chartok_token_text(s->t->ct, id);
    n = bytes ? strlen(bytes) : 0;
  } else {
    bytes = bpe_token_bytes(s->t->bpe, id, &n);
  }
  if (!bytes) {
    dapo_errf(e, DAPO_EINVAL, "id %d is not a token id (vocabulary of %d)", id,
              tok_vocab_size(s->t));
    return NULL;
  }
  if (s->skip_special && tok_is_special(s->t, id)) return stream_emit(s, NULL, 0, 0, len, e);
  if (s->ds) {
    bytes = bpe_dstream_push(s->ds, id, &n, e); /* valid UTF-8: stream_emit copies it */
    return bytes ? stream_emit(s, bytes, n, 0, len, e) : NULL;
  }
  if (s->t->kind == TOK_BPE && bpe_joins_with_space(s->t->bpe) && s->started) {
    /* no decoder: tokens are whole strings joined by spaces */
    if (stream_reserve(s, n + 2)) {
      dapo_errf(e, DAPO_ENOMEM, "out of memory in the streaming decoder");
      return NULL;
    }
    s->out[0] = ' ';
    memcpy(s->out + 1, bytes, n);
    s->out[n + 1] = 0;
    *len = n + 1;
    return s->out;
  }
  s->started = 1;
  return stream_emit(s, bytes, n, 0, len, e);
}

const char *tok_stream_finish(struct tok_stream *s, size_t *len, struct dapo_err *e) {
  if (s->ds) {
    size_t n;
    const char *bytes = bpe_dstream_finish(s->ds, &n, e);
    return bytes ? stream_emit(s, bytes, n, 1, len, e) : NULL;
  }
  return stream_emit(s, NULL, 0, 1, len, e);
}
