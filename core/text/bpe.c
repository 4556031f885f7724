/* BPE from tokenizer.json (bpe.h), byte-level or SentencePiece-style: loader with refusals naming
 * the JSON path, the encode pipeline (added tokens -> normalizer -> pre-tokenizer -> BPE with byte
 * fallback / unk -> post-processor), decode with Rust's lossy UTF-8 repair (ByteLevel) or the
 * Replace/ByteFallback/Fuse/Strip/Metaspace chain, batch and streaming alike. Regular expressions
 * are PCRE2 (UTF + UCP, JIT), normalization utf8proc. Shapes: V ids, M merges, A added tokens. */
#include "bpe.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

/* ---- small growable vectors (capped by the caller's input size) ---- */

struct ivec {
  int *v;
  size_t n, cap;
};

static int ivec_push(struct ivec *a, int x) {
  if (a->n == a->cap) {
    size_t c = a->cap ? 2 * a->cap : 64;
    int *p = realloc(a->v, c * sizeof *p);
    if (!p) return DAPO_ENOMEM;
    a->v = p;
    a->cap = c;
  }
  a->v[a->n++] = x;
  return 0;
}

struct bvec {
  char *v;
  size_t n, cap;
};

static int bvec_add(struct bvec *a, const void *s, size_t n) {
  if (a->n + n + 1 > a->cap) {
    size_t c = a->cap ? a->cap : 256;
    while (c < a->n + n + 1) c *= 2;
    char *p = realloc(a->v, c);
    if (!p) return DAPO_ENOMEM;
    a->v = p;
    a->cap = c;
  }
  if (n && s) memcpy(a->v + a->n, s, n);
  a->n += n;
  a->v[a->n] = 0;
  return 0;
}

struct piece {
  size_t off, len;
};

struct pvec {
  struct piece *v;
  size_t n, cap;
};

static int pvec_push(struct pvec *a, size_t off, size_t len) {
  if (a->n == a->cap) {
    size_t c = a->cap ? 2 * a->cap : 64;
    struct piece *p = realloc(a->v, c * sizeof *p);
    if (!p) return DAPO_ENOMEM;
    a->v = p;
    a->cap = c;
  }
  a->v[a->n].off = off;
  a->v[a->n].len = len;
  a->n++;
  return 0;
}

/* ---- hashing ---- */

static uint64_t hash_bytes(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

static size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c *= 2;
  return c;
}

/* ---- the byte-level alphabet (GPT-2's bytes_to_unicode) ---- */

static int byte_is_printable(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct bytemap {
  char utf8[256][3]; /* byte -> its character as UTF-8 */
  unsigned char n[256];
  short rev[324]; /* code point -> byte, -1 */
};

static void bytemap_init(struct bytemap *m) {
  int next = 0;
  for (int i = 0; i < 324; i++) m->rev[i] = -1;
  for (int b = 0; b < 256; b++) {
    int cp = byte_is_printable(b) ? b : 256 + next++;
    m->rev[cp] = (short)b;
    utf8proc_ssize_t k = utf8proc_encode_char(cp, (utf8proc_uint8_t *)m->utf8[b]);
    m->n[b] = (unsigned char)k;
  }
}

/* ---- UTF-8 ---- */

int bpe_utf8_next(const unsigned char *s, size_t n, size_t *adv) {
  unsigned b = s[0];
  size_t need;
  unsigned lo = 0x80, hi = 0xBF;
  if (b < 0x80) {
    *adv = 1;
    return 1;
  } else if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    *adv = 1;
    return 0;
  }
  for (size_t k = 1; k <= need; k++) {
    if (k >= n) {
      *adv = n;
      return -1;
    }
    unsigned c = s[k];
    if (c < lo || c > hi) {
      *adv = k;
      return 0;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  *adv = need + 1;
  return 1;
}

/* Offset of the first invalid byte, or len when s is valid UTF-8. */
static size_t utf8_check(const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < len) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    size_t adv;
    if (bpe_utf8_next(u + i, len - i, &adv) != 1) return i;
    i += adv;
  }
  return len;
}

/* Appends s with invalid sequences replaced by U+FFFD (from_utf8_lossy). */
static int utf8_lossy_add(struct bvec *out, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0, run = 0;
  while (i < n) {
    size_t adv;
    if (u[i] < 0x80 || bpe_utf8_next(u + i, n - i, &adv) == 1) {
      i += u[i] < 0x80 ? 1 : adv;
      continue;
    }
    if (bvec_add(out, s + run, i - run) || bvec_add(out, "\xEF\xBF\xBD", 3)) return DAPO_ENOMEM;
    i += adv;
    run = i;
  }
  return bvec_add(out, s + run, n - run);
}

static int32_t utf8_cp(const char *s, size_t n, size_t *adv) {
  int32_t cp;
  utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &cp);
  *adv = k > 0 ? (size_t)k : 1;
  return k > 0 ? cp : -1;
}

/* Rust's char::is_whitespace / regex \s: the White_Space property. */
static int is_white_space(int32_t c) {
  return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

/* regex \w (Unicode): letters, marks, decimal digits, connector punctuation, joiners. */
static int is_word_char(int32_t c) {
  if (c < 0) return 0;
  switch (utf8proc_category(c)) {
  case UTF8PROC_CATEGORY_LU:
  case UTF8PROC_CATEGORY_LL:
  case UTF8PROC_CATEGORY_LT:
  case UTF8PROC_CATEGORY_LM:
  case UTF8PROC_CATEGORY_LO:
  case UTF8PROC_CATEGORY_NL:
  case UTF8PROC_CATEGORY_MN:
  case UTF8PROC_CATEGORY_MC:
  case UTF8PROC_CATEGORY_ME:
  case UTF8PROC_CATEGORY_ND:
  case UTF8PROC_CATEGORY_PC: return 1;
  default: return c == 0x200C || c == 0x200D;
  }
}

/* ---- the tokenizer ---- */

enum step_kind { STEP_SPLIT, STEP_DIGITS, STEP_BYTELEVEL, STEP_METASPACE };
enum prepend_scheme { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
enum behavior { BEH_REMOVED, BEH_ISOLATED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS };

struct step {
  enum step_kind kind;
  pcre2_code *re; /* owned */
  enum behavior beh;
  int invert;
  int add_prefix_space; /* ByteLevel */
  char rep[8];          /* Metaspace: the replacement character, UTF-8 */
  size_t replen;
  enum prepend_scheme scheme;
  int split;
};

/* A normalizer: a Unicode normal form, Prepend or Replace. */
enum norm_kind { NORM_FORM, NORM_PREPEND, NORM_REPLACE };

struct nstep {
  enum norm_kind kind;
  int opt;        /* NORM_FORM: utf8proc options */
  char *s;        /* Prepend: the string; Replace: the content (owned) */
  size_t n;       /* its length */
  char *lit;      /* Replace with a non-empty String pattern: the literal (owned) */
  size_t litn;    /* its length */
  pcre2_code *re; /* Replace otherwise (owned) */
};

/* A decoder of the chain (everything but ByteLevel and no decoder). */
enum dec_kind { DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };

struct dstep {
  enum dec_kind kind;
  struct nstep rp; /* Replace: pattern and content, as the normalizer's */
  int32_t ch;      /* Strip: the content character; Metaspace: the replacement */
  int start, stop; /* Strip */
  int never;       /* Metaspace: prepend_scheme "never" */
};

struct added {
  int id;
  char *content; /* owned */
  size_t len;
  char *pat; /* what is matched: content, or its normalized form when normalized (owned) */
  size_t plen;
  int special, single_word, lstrip, rstrip, normalized;
};

/* Added tokens of one kind (normalized or not) indexed by first byte, longest first. */
struct trie {
  int *idx;       /* added indices, grouped by first byte */
  int start[257]; /* idx[start[b] .. start[b+1]) begin with byte b */
};

struct scratch;

struct cache_slot {
  uint64_t h;
  char *key; /* owned: key bytes then ids (ints) after an aligned gap; NULL when empty */
  size_t klen;
  int nids;
  int *ids;
};

struct bpe {
  json_t *json;
  int n_ids;   /* 1 + the largest id */
  int n_model; /* tokens in the model's vocabulary */
  /* model vocabulary: string per id, hash string -> id */
  char *varena;
  size_t *voff; /* [n_ids], SIZE_MAX when the model has no token at that id */
  uint32_t *vlen;
  int *vslots; /* id + 1, open addressing */
  size_t vmask;
  /* merges: (left, right) -> rank, new id */
  uint64_t *mkeys; /* (left << 32 | right) + 1, 0 empty */
  int *mrank, *mnew;
  size_t mmask;
  int ignore_merges;
  int byte_fallback; /* a character outside the vocabulary becomes <0xXX> tokens */
  int byte_id[256];  /* the id of <0xXX>, -1 */
  int unk_id;        /* -1: no unk_token; -2: named but not in the vocabulary */
  const char *unk_name;
  int fuse_unk;
  /* added tokens */
  struct added *added;
  int n_added;
  int *added_of_id; /* [n_ids]: index into added or -1 */
  int *aslots;      /* content -> added index + 1 */
  size_t amask;
  struct trie trie_raw, trie_norm;
  /* normalizers, applied in order */
  struct nstep norm[BPE_MAX_COMPONENTS];
  int n_norm;
  /* pre-tokenizer */
  struct step steps[BPE_MAX_COMPONENTS];
  int n_steps;
  int bytelevel; /* the last step maps bytes to characters */
  /* post-processor template */
  int pre_ids[BPE_MAX_COMPONENTS], n_pre, post_ids[BPE_MAX_COMPONENTS], n_post;
  /* decoder */
  int dec_join;                         /* 1: no decoder, tokens joined with a space */
  struct dstep dec[BPE_MAX_COMPONENTS]; /* the decoder chain (dec_chain) */
  int n_dec, dec_chain, dec_fuse;       /* dec_fuse: index of the first Fuse, or n_dec */
  char *darena;
  size_t *doff; /* [n_ids] */
  uint32_t *dlen;
  struct bytemap bm;
  /* cache of pre-token -> ids */
  pthread_mutex_t lock;
  struct cache_slot *cache;
  struct scratch *pool[8]; /* idle per-call work buffers, under the lock */
  int n_pool;
};

/* ---- JSON helpers that name the path ---- */

static const char *type_of(const json_t *o) {
  const char *s = json_string_value(json_object_get(o, "type"));
  return s ? s : "";
}

/* A boolean member; absent or null gives dflt. */
static int get_bool(const json_t *o, const char *key, int dflt, const char *path, int *out,
                    struct dapo_err *e) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    *out = dflt;
    return 0;
  }
  if (!json_is_boolean(v)) return dapo_errf(e, DAPO_EFORMAT, "%s.%s must be a boolean", path, key);
  *out = json_is_true(v);
  return 0;
}

static int vocab_find(const struct bpe *b, const char *s, size_t n) {
  size_t i = hash_bytes(s, n) & b->vmask;
  for (;;) {
    int id = b->vslots[i] - 1;
    if (id < 0) return -1;
    if (b->vlen[id] == n && memcmp(b->varena + b->voff[id], s, n) == 0) return id;
    i = (i + 1) & b->vmask;
  }
}

static int added_find(const struct bpe *b, const char *s, size_t n) {
  if (!b->aslots) return -1;
  size_t i = hash_bytes(s, n) & b->amask;
  for (;;) {
    int a = b->aslots[i] - 1;
    if (a < 0) return -1;
    if (b->added[a].len == n && memcmp(b->added[a].content, s, n) == 0) return a;
    i = (i + 1) & b->amask;
  }
}

static int merge_find(const struct bpe *b, int l, int r, int *rank, int *nid) {
  uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
  size_t i = hash_u64(key) & b->mmask;
  for (;;) {
    uint64_t k = b->mkeys[i];
    if (!k) return 0;
    if (k == key) {
      *rank = b->mrank[i];
      *nid = b->mnew[i];
      return 1;
    }
    i = (i + 1) & b->mmask;
  }
}

/* ---- loading ---- */

static int load_vocab(struct bpe *b, const json_t *vocab, struct dapo_err *e) {
  if (!json_is_object(vocab)) return dapo_errf(e, DAPO_EFORMAT, "model.vocab must be an object");
  size_t nv = json_object_size(vocab);
  if (nv == 0) return dapo_errf(e, DAPO_EFORMAT, "model.vocab is empty");
  if (nv > BPE_MAX_IDS)
    return dapo_errf(e, DAPO_ERANGE, "model.vocab has %zu tokens (at most %d)", nv, BPE_MAX_IDS);
  int maxid = -1;
  size_t total = 0;
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)vocab, k, v) {
    json_int_t id = json_integer_value(v);
    if (!json_is_integer(v) || id < 0 || id >= BPE_MAX_IDS)
      return dapo_errf(e, DAPO_EFORMAT, "model.vocab[\"%.64s\"]: id must be an integer in [0, %d)",
                       k, BPE_MAX_IDS);
    size_t n = strlen(k);
    if (n == 0 || n > BPE_MAX_TOKEN_BYTES)
      return dapo_errf(e, DAPO_EFORMAT, "model.vocab: token of %zu bytes (1..%d)", n,
                       BPE_MAX_TOKEN_BYTES);
    total += n + 1;
    if (id > maxid) maxid = (int)id;
  }
  b->n_model = (int)nv;
  b->n_ids = maxid + 1; /* load_added may grow it */
  size_t nid = b->n_ids > 0 ? (size_t)b->n_ids : 1;
  b->varena = malloc(total + 1);
  b->voff = malloc(nid * sizeof *b->voff);
  b->vlen = calloc(nid, sizeof *b->vlen);
  size_t slots = pow2_at_least(2 * nv + 2);
  b->vslots = calloc(slots, sizeof *b->vslots);
  if (!b->varena || !b->voff || !b->vlen || !b->vslots)
    return dapo_errf(e, DAPO_ENOMEM, "out of memory loading model.vocab");
  b->vmask = slots - 1;
  for (size_t i = 0; i < nid; i++) b->voff[i] = SIZE_MAX;
  size_t at = 0;
  json_object_foreach((json_t *)vocab, k, v) {
    int id = (int)json_integer_value(v);
    size_t n = strlen(k);
    if (b->voff[id] != SIZE_MAX)
      return dapo_errf(e, DAPO_EFORMAT, "model.vocab: id %d is given to two tokens", id);
    memcpy(b->varena + at, k, n + 1); /* NUL-terminated for bpe_id_to_token */
    b->voff[id] = at;
    b->vlen[id] = (uint32_t)n;
    at += n + 1;
    size_t s = hash_bytes(k, n) & b->vmask;
    while (b->vslots[s]) s = (s + 1) & b->vmask;
    b->vslots[s] = id + 1;
  }
  return 0;
}

static int load_merges(struct bpe *b, const json_t *merges, struct dapo_err *e) {
  if (!merges || json_is_null(merges))
    merges = NULL;
  else if (!json_is_array(merges))
    return dapo_errf(e, DAPO_EFORMAT, "model.merges must be an array");
  size_t nm = json_array_size(merges);
  if (nm > BPE_MAX_MERGES)
    return dapo_errf(e, DAPO_ERANGE, "model.merges has %zu entries (at most %d)", nm,
                     BPE_MAX_MERGES);
  size_t slots = pow2_at_least(2 * nm + 2);
  b->mkeys = calloc(slots, sizeof *b->mkeys);
  b->mrank = malloc(slots * sizeof *b->mrank);
  b->mnew = malloc(slots * sizeof *b->mnew);
  if (!b->mkeys || !b->mrank || !b->mnew)
    return dapo_errf(e, DAPO_ENOMEM, "out of memory loading model.merges");
  b->mmask = slots - 1;
  char buf[2 * BPE_MAX_TOKEN_BYTES + 2];
  for (size_t i = 0; i < nm; i++) {
    const json_t *m = json_array_get(merges, i);
    const char *l, *r;
    size_t ln, rn;
    if (json_is_string(m)) {
      const char *s = json_string_value(m);
      const char *sp = strchr(s, ' ');
      if (!sp || strchr(sp + 1, ' '))
        return dapo_errf(e, DAPO_EFORMAT,
                         "model.merges[%zu]: \"%.64s\" is not two tokens separated by one space", i,
                         s);
      l = s;
      ln = (size_t)(sp - s);
      r = sp + 1;
      rn = strlen(r);
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
      l = json_string_value(json_array_get(m, 0));
      ln = json_string_length(json_array_get(m, 0));
      r = json_string_value(json_array_get(m, 1));
      rn = json_string_length(json_array_get(m, 1));
    } else {
      return dapo_errf(e, DAPO_EFORMAT,
                       "model.merges[%zu] must be a string \"a b\" or a pair [\"a\", \"b\"]", i);
    }
    if (ln > BPE_MAX_TOKEN_BYTES || rn > BPE_MAX_TOKEN_BYTES)
      return dapo_errf(e, DAPO_EFORMAT, "model.merges[%zu]: token too long", i);
    int li = vocab_find(b, l, ln), ri = vocab_find(b, r, rn);
    if (li < 0 || ri < 0)
      return dapo_errf(e, DAPO_EFORMAT, "model.merges[%zu]: token \"%.*s\" is not in model.vocab",
                       i, (int)(li < 0 ? (ln > 64 ? 64 : ln) : (rn > 64 ? 64 : rn)),
                       li < 0 ? l : r);
    memcpy(buf, l, ln);
    memcpy(buf + ln, r, rn);
    int ni = vocab_find(b, buf, ln + rn);
    if (ni < 0)
      return dapo_errf(e, DAPO_EFORMAT,
                       "model.merges[%zu]: merged token \"%.*s\" is not in "
                       "model.vocab",
                       i, (int)(ln + rn > 64 ? 64 : ln + rn), buf);
    uint64_t key = (((uint64_t)(uint32_t)li << 32) | (uint32_t)ri) + 1;
    size_t s = hash_u64(key) & b->mmask;
    while (b->mkeys[s] && b->mkeys[s] != key) s = (s + 1) & b->mmask;
    if (b->mkeys[s]) continue; /* a repeated merge keeps its first (lowest) rank */
    b->mkeys[s] = key;
    b->mrank[s] = (int)i;
    b->mnew[s] = ni;
  }
  return 0;
}

static int load_model(struct bpe *b, const json_t *m, struct dapo_err *e) {
  if (!json_is_object(m)) return dapo_errf(e, DAPO_EFORMAT, "model must be an object");
  const char *type = type_of(m);
  if (strcmp(type, "BPE") != 0)
    return dapo_errf(e, DAPO_EUNSUPPORTED, "model.type \"%.64s\" is not supported (only BPE)",
                     type);
  const json_t *v;
  v = json_object_get(m, "dropout");
  if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0.0))
    return dapo_errf(e, DAPO_EUNSUPPORTED, "model.dropout is not supported (must be null)");
  static const char *const empty_strings[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    v = json_object_get(m, empty_strings[i]);
    if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
      return dapo_errf(e, DAPO_EUNSUPPORTED, "model.%s is not supported (must be null or \"\")",
                       empty_strings[i]);
  }
  if (get_bool(m, "byte_fallback", 0, "model", &b->byte_fallback, e) ||
      get_bool(m, "fuse_unk", 0, "model", &b->fuse_unk, e) ||
      get_bool(m, "ignore_merges", 0, "model", &b->ignore_merges, e))
    return e ? e->code : DAPO_EFORMAT;
  v = json_object_get(m, "unk_token");
  if (v && !json_is_null(v) && !json_is_string(v))
    return dapo_errf(e, DAPO_EFORMAT, "model.unk_token must be a string or null");
  int rc = load_vocab(b, json_object_get(m, "vocab"), e);
  if (!rc) rc = load_merges(b, json_object_get(m, "merges"), e);
  if (rc) return rc;
  /* The reference looks unk_token up in the vocabulary only when a character needs it, and fails
   * that encode when it is missing; so do we (-2), rather than refuse a file it loads. */
  b->unk_id = -1;
  if (json_is_string(v)) {
    b->unk_name = json_string_value(v);
    b->unk_id = vocab_find(b, b->unk_name, json_string_length(v));
    if (b->unk_id < 0) b->unk_id = -2;
  }
  for (int c = 0; c < 256; c++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", c);
    b->byte_id[c] = b->byte_fallback ? vocab_find(b, name, 6) : -1;
  }
  return 0;
}

static int cmp_added_len(const void *pa, const void *pb, void *ctx) {
  const struct bpe *b = ctx;
  size_t la = b->added[*(const int *)pa].plen, lb = b->added[*(const int *)pb].plen;
  if (la != lb) return la > lb ? -1 : 1;
  return *(const int *)pa - *(const int *)pb;
}

static int trie_build(struct bpe *b, struct trie *t, int normalized) {
  int cnt[257] = {0};
  for (int i = 0; i < b->n_added; i++)
    if (b->added[i].normalized == normalized && b->added[i].plen)
      cnt[(unsigned char)b->added[i].pat[0]]++;
  t->start[0] = 0;
  for (int c = 0; c < 256; c++) t->start[c + 1] = t->start[c] + cnt[c];
  t->idx = malloc((size_t)(t->start[256] + 1) * sizeof *t->idx);
  if (!t->idx) return DAPO_ENOMEM;
  int fill[256];
  for (int c = 0; c < 256; c++) fill[c] = t->start[c];
  for (int i = 0; i < b->n_added; i++)
    if (b->added[i].normalized == normalized && b->added[i].plen)
      t->idx[fill[(unsigned char)b->added[i].pat[0]]++] = i;
  for (int c = 0; c < 256; c++)
    qsort_r(t->idx + t->start[c], (size_t)cnt[c], sizeof(int), cmp_added_len, b);
  return 0;
}

static int normalize(const struct bpe *b, const char *s, size_t n, char **res, size_t *rn);

/* Added tokens get their ids as the reference's AddedVocabulary::add_tokens gives them, in file
 * order: the model's id when the content is in its vocabulary, else the next id after the
 * vocabulary and the tokens added so far. The file's "id" is only checked for shape: the real
 * files agree with this, and the reference ignores it too. Tokens are matched specials first,
 * then the others, in file order; a repeated content keeps its first entry. */
static int load_added(struct bpe *b, const json_t *added, struct dapo_err *e) {
  if (added && !json_is_null(added) && !json_is_array(added))
    return dapo_errf(e, DAPO_EFORMAT, "added_tokens must be an array");
  size_t na = json_array_size(added);
  if (na > BPE_MAX_ADDED)
    return dapo_errf(e, DAPO_ERANGE, "added_tokens has %zu entries (at most %d)", na,
                     BPE_MAX_ADDED);
  b->added = calloc(na + 1, sizeof *b->added);
  size_t slots = pow2_at_least(2 * na + 2);
  b->aslots = calloc(slots, sizeof *b->aslots);
  if (!b->added || !b->aslots)
    return dapo_errf(e, DAPO_ENOMEM, "out of memory loading added_tokens");
  b->amask = slots - 1;
  for (int pass = 0; pass < 2; pass++) { /* specials, then the others */
    for (size_t i = 0; i < na; i++) {
      const json_t *a = json_array_get(added, i);
      char path[48];
      snprintf(path, sizeof path, "added_tokens[%zu]", i);
      if (!json_is_object(a)) return dapo_errf(e, DAPO_EFORMAT, "%s must be an object", path);
      const json_t *id = json_object_get(a, "id"), *c = json_object_get(a, "content");
      if (!json_is_integer(id) || json_integer_value(id) < 0 ||
          json_integer_value(id) >= BPE_MAX_IDS)
        return dapo_errf(e, DAPO_EFORMAT, "%s.id must be an integer in [0, %d)", path, BPE_MAX_IDS);
      if (!json_is_string(c) || json_string_length(c) == 0 ||
          json_string_length(c) > BPE_MAX_TOKEN_BYTES)
        return dapo_errf(e, DAPO_EFORMAT, "%s.content must be a string of 1..%d bytes", path,
                         BPE_MAX_TOKEN_BYTES);
      struct added t = {0};
      t.len = json_string_length(c);
      if (get_bool(a, "special", 0, path, &t.special, e) ||
          get_bool(a, "single_word", 0, path, &t.single_word, e) ||
          get_bool(a, "lstrip", 0, path, &t.lstrip, e) ||
          get_bool(a, "rstrip", 0, path, &t.rstrip, e) ||
          get_bool(a, "normalized", !t.special, path, &t.normalized, e))
        return e ? e->code : DAPO_EFORMAT;
      if (t.special != (pass == 0)) continue;
      if (utf8_check(json_string_value(c), t.len) != t.len)
        return dapo_errf(e, DAPO_EFORMAT, "%s.content is not valid UTF-8", path);
      if (added_find(b, json_string_value(c), t.len) >= 0) continue;
      t.content = malloc(t.len + 1);
      if (!t.content) return dapo_errf(e, DAPO_ENOMEM, "out of memory loading added_tokens");
      memcpy(t.content, json_string_value(c), t.len + 1);
      t.pat = t.content;
      t.plen = t.len;
      t.id = -1;
      b->added[b->n_added] = t;
      size_t s = hash_bytes(t.content, t.len) & b->amask;
      while (b->aslots[s]) s = (s + 1) & b->amask;
      b->aslots[s] = b->n_added + 1;
      b->n_added++;
      if (t.normalized) {
        char *np;
        size_t nn;
        if (normalize(b, t.content, t.len, &np, &nn))
          return dapo_errf(e, DAPO_ENOMEM, "out of memory loading added_tokens");
        if (np) {
          b->added[b->n_added - 1].pat = np;
          b->added[b->n_added - 1].plen = nn;
        }
      }
    }
  }
  /* ids in file order */
  int max_added = -1;
  for (size_t i = 0; i < na; i++) {
    const json_t *c = json_object_get(json_array_get(added, i), "content");
    int k = added_find(b, json_string_value(c), json_string_length(c));
    if (k < 0 || b->added[k].id >= 0) continue;
    int id = vocab_find(b, b->added[k].content, b->added[k].len);
    if (id < 0) {
      if (max_added < 0)
        id = b->n_model;
      else
        id = max_added >= b->n_model || b->n_model == 0 ? max_added + 1 : b->n_model;
    }
    if (id >= BPE_MAX_IDS)
      return dapo_errf(e, DAPO_ERANGE, "added_tokens[%zu]: id %d beyond %d", i, id, BPE_MAX_IDS);
    if (id > max_added) max_added = id;
    b->added[k].id = id;
  }
  if (max_added + 1 > b->n_ids) { /* ids past the model's vocabulary */
    size_t nid = (size_t)max_added + 1;
    size_t *vo = realloc(b->voff, nid * sizeof *vo);
    if (vo) b->voff = vo;
    uint32_t *vl = vo ? realloc(b->vlen, nid * sizeof *vl) : NULL;
    if (!vl) return dapo_errf(e, DAPO_ENOMEM, "out of memory loading added_tokens");
    b->vlen = vl;
    for (size_t i = (size_t)b->n_ids; i < nid; i++) {
      b->voff[i] = SIZE_MAX;
      b->vlen[i] = 0;
    }
    b->n_ids = max_added + 1;
  }
  b->added_of_id = malloc((size_t)(b->n_ids > 0 ? b->n_ids : 1) * sizeof *b->added_of_id);
  if (!b->added_of_id) return dapo_errf(e, DAPO_ENOMEM, "out of memory loading added_tokens");
  for (int i = 0; i < b->n_ids; i++) b->added_of_id[i] = -1;
  for (int k = 0; k < b->n_added; k++) b->added_of_id[b->added[k].id] = k;
  if (trie_build(b, &b->trie_raw, 0) || trie_build(b, &b->trie_norm, 1))
    return dapo_errf(e, DAPO_ENOMEM, "out of memory loading added_tokens");
  return 0;
}

static pcre2_code *compile_re(const char *pat, size_t len, int literal, const char *path,
                              struct dapo_err *e);

/* A JSON member that must be a string of valid UTF-8 (any length, up to max bytes). */
static const json_t *get_string(const json_t *o, const char *key, size_t max, const char *path,
                                struct dapo_err *e) {
  const json_t *v = json_object_get(o, key);
  if (!json_is_string(v)) {
    dapo_errf(e, DAPO_EFORMAT, "%s.%s must be a string", path, key);
    return NULL;
  }
  if (json_string_length(v) > max) {
    dapo_errf(e, DAPO_ERANGE, "%s.%s is longer than %zu bytes", path, key, max);
    return NULL;
  }
  if (utf8_check(json_string_value(v), json_string_length(v)) != json_string_length(v)) {
    dapo_errf(e, DAPO_EFORMAT, "%s.%s is not valid UTF-8", path, key);
    return NULL;
  }
  return v;
}

/* A member that must be a string of exactly one character: its code point, or -1. */
static int32_t get_char(const json_t *o, const char *key, const char *path, struct dapo_err *e) {
  const json_t *v = get_string(o, key, 8, path, e);
  if (!v) return -1;
  size_t adv, n = json_string_length(v);
  int32_t cp = n ? utf8_cp(json_string_value(v), n, &adv) : -1;
  if (cp < 0 || adv != n) {
    dapo_errf(e, DAPO_EFORMAT, "%s.%s must be one character", path, key);
    return -1;
  }
  return cp;
}

static char *dup_bytes(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

/* Replace (normalizer or decoder): {"pattern": {"String": s} | {"Regex": r}, "content": c}. The
 * reference compiles both into a regex (the String escaped); a non-empty String is searched as
 * bytes, which finds the same leftmost non-overlapping matches. */
static int load_replace(const json_t *o, const char *path, struct nstep *r, struct dapo_err *e) {
  const json_t *pat = json_object_get(o, "pattern");
  const json_t *rx = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
  const json_t *src = rx ? rx : str;
  char sub[160];
  snprintf(sub, sizeof sub, "%.100s.pattern", path);
  if (!json_is_object(pat) || json_object_size(pat) != 1 || !json_is_string(src))
    return dapo_errf(e, DAPO_EFORMAT, "%s must be {\"Regex\": string} or {\"String\": string}",
                     sub);
  if (json_string_length(src) > BPE_MAX_PATTERN)
    return dapo_errf(e, DAPO_ERANGE, "%s is longer than %d bytes", sub, BPE_MAX_PATTERN);
  if (utf8_check(json_string_value(src), json_string_length(src)) != json_string_length(src))
    return dapo_errf(e, DAPO_EFORMAT, "%s is not valid UTF-8", sub);
  const json_t *c = get_string(o, "content", BPE_MAX_TOKEN_BYTES, path, e);
  if (!c) return e ? e->code : DAPO_EFORMAT;
  r->kind = NORM_REPLACE;
  if (!(r->s = dup_bytes(json_string_value(c), json_string_length(c))))
    return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  r->n = json_string_length(c);
  if (src == str && json_string_length(str) > 0) {
    if (!(r->lit = dup_bytes(json_string_value(str), json_string_length(str))))
      return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    r->litn = json_string_length(str);
    return 0;
  }
  if (!(r->re = compile_re(json_string_value(src), json_string_length(src), src == str, sub, e)))
    return e ? e->code : DAPO_EFORMAT;
  return 0;
}

static void nstep_free(struct nstep *r) {
  free(r->s);
  free(r->lit);
  pcre2_code_free(r->re);
}

static int load_normalizer(struct bpe *b, const json_t *n, const char *path, int depth,
                           struct dapo_err *e) {
  if (!n || json_is_null(n)) return 0;
  if (!json_is_object(n)) return dapo_errf(e, DAPO_EFORMAT, "%s must be an object or null", path);
  const char *type = type_of(n);
  if (strcmp(type, "Sequence") == 0) {
    const json_t *list = json_object_get(n, "normalizers");
    if (!json_is_array(list))
      return dapo_errf(e, DAPO_EFORMAT, "%s.normalizers must be an array", path);
    if (depth >= BPE_MAX_NESTING)
      return dapo_errf(e, DAPO_ERANGE, "%s: Sequence nested too deeply", path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      char sub[160];
      snprintf(sub, sizeof sub, "%.100s.normalizers[%zu]", path, i);
      int rc = load_normalizer(b, json_array_get(list, i), sub, depth + 1, e);
      if (rc) return rc;
    }
    return 0;
  }
  int opt = 0;
  if (b->n_norm >= BPE_MAX_COMPONENTS)
    return dapo_errf(e, DAPO_ERANGE, "%s: more than %d normalizers", path, BPE_MAX_COMPONENTS);
  struct nstep *st = &b->norm[b->n_norm];
  memset(st, 0, sizeof *st);
  if (strcmp(type, "Prepend") == 0) {
    const json_t *v = get_string(n, "prepend", BPE_MAX_TOKEN_BYTES, path, e);
    if (!v) return e ? e->code : DAPO_EFORMAT;
    st->kind = NORM_PREPEND;
    if (!(st->s = dup_bytes(json_string_value(v), json_string_length(v))))
      return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    st->n = json_string_length(v);
    b->n_norm++;
    return 0;
  }
  if (strcmp(type, "Replace") == 0) {
    b->n_norm++; /* freed with b on failure */
    return load_replace(n, path, st, e);
  }
  if (strcmp(type, "NFC") == 0)
    opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
  else if (strcmp(type, "NFD") == 0)
    opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
  else if (strcmp(type, "NFKC") == 0)
    opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  else if (strcmp(type, "NFKD") == 0)
    opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  else
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "%s.type \"%.64s\" is not supported (NFC, NFD, NFKC, NFKD, Prepend, "
                     "Replace, Sequence)",
                     path, type);
  st->kind = NORM_FORM;
  st->opt = opt;
  b->n_norm++;
  return 0;
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static pcre2_code *compile_re(const char *pat, size_t len, int literal, const char *path,
                              struct dapo_err *e) {
  int err;
  PCRE2_SIZE off;
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &err, &off, NULL);
  if (!re) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(err, msg, sizeof msg);
    dapo_errf(e, DAPO_EFORMAT, "%s: regex does not compile at offset %zu: %s", path, (size_t)off,
              (const char *)msg);
    return NULL;
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter remains when JIT is missing */
  return re;
}

static int add_step(struct bpe *b, struct step s, const char *path, struct dapo_err *e) {
  if (b->bytelevel) {
    pcre2_code_free(s.re);
    return dapo_errf(e, DAPO_EUNSUPPORTED, "%s: a pre-tokenizer after ByteLevel is not supported",
                     path);
  }
  if (b->n_steps >= BPE_MAX_COMPONENTS) {
    pcre2_code_free(s.re);
    return dapo_errf(e, DAPO_ERANGE, "%s: more than %d pre-tokenizers", path, BPE_MAX_COMPONENTS);
  }
  b->steps[b->n_steps++] = s;
  if (s.kind == STEP_BYTELEVEL) b->bytelevel = 1;
  return 0;
}

/* Metaspace (pre-tokenizer or decoder) as the reference reads it: replacement (one character),
 * prepend_scheme "always" (the default) / "first" / "never", the legacy add_prefix_space (false
 * means "never", and contradicts any other declared scheme), split (default true). */
static int load_metaspace(const json_t *p, const char *path, struct step *s, struct dapo_err *e) {
  int32_t cp = get_char(p, "replacement", path, e);
  if (cp < 0) return e ? e->code : DAPO_EFORMAT;
  s->kind = STEP_METASPACE;
  s->replen = (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)s->rep);
  const json_t *ps = json_object_get(p, "prepend_scheme");
  const char *scheme = json_string_value(ps);
  if (ps && !json_is_null(ps) && !scheme)
    return dapo_errf(e, DAPO_EFORMAT, "%s.prepend_scheme must be a string", path);
  if (!scheme || strcmp(scheme, "always") == 0)
    s->scheme = PREPEND_ALWAYS;
  else if (strcmp(scheme, "first") == 0)
    s->scheme = PREPEND_FIRST;
  else if (strcmp(scheme, "never") == 0)
    s->scheme = PREPEND_NEVER;
  else
    return dapo_errf(e, DAPO_EFORMAT,
                     "%s.prepend_scheme \"%.64s\" is not one of always, first, never", path,
                     scheme);
  const json_t *aps = json_object_get(p, "add_prefix_space");
  if (aps && !json_is_null(aps) && !json_is_boolean(aps))
    return dapo_errf(e, DAPO_EFORMAT, "%s.add_prefix_space must be a boolean", path);
  if (json_is_false(aps)) {
    if (s->scheme != PREPEND_NEVER)
      return dapo_errf(e, DAPO_EFORMAT,
                       "%s: add_prefix_space false does not match prepend_scheme \"%s\"", path,
                       scheme ? scheme : "always");
    s->scheme = PREPEND_NEVER;
  }
  return get_bool(p, "split", 1, path, &s->split, e);
}

static int load_pretok(struct bpe *b, const json_t *p, const char *path, int depth,
                       struct dapo_err *e) {
  if (!p || json_is_null(p)) return 0;
  if (!json_is_object(p)) return dapo_errf(e, DAPO_EFORMAT, "%s must be an object or null", path);
  const char *type = type_of(p);
  struct step s = {0};
  if (strcmp(type, "Sequence") == 0) {
    const json_t *list = json_object_get(p, "pretokenizers");
    if (!json_is_array(list))
      return dapo_errf(e, DAPO_EFORMAT, "%s.pretokenizers must be an array", path);
    if (depth >= BPE_MAX_NESTING)
      return dapo_errf(e, DAPO_ERANGE, "%s: Sequence nested too deeply", path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      char sub[160];
      snprintf(sub, sizeof sub, "%.100s.pretokenizers[%zu]", path, i);
      int rc = load_pretok(b, json_array_get(list, i), sub, depth + 1, e);
      if (rc) return rc;
    }
    return 0;
  } else if (strcmp(type, "ByteLevel") == 0) {
    int use_regex = 1, ts = 0;
    if (get_bool(p, "add_prefix_space", 1, path, &s.add_prefix_space, e) ||
        get_bool(p, "use_regex", 1, path, &use_regex, e) ||
        get_bool(p, "trim_offsets", 1, path, &ts, e))
      return e ? e->code : DAPO_EFORMAT;
    s.kind = STEP_BYTELEVEL;
    s.beh = BEH_ISOLATED;
    if (use_regex && !(s.re = compile_re(GPT2_PATTERN, PCRE2_ZERO_TERMINATED, 0, path, e)))
      return e ? e->code : DAPO_EFORMAT;
  } else if (strcmp(type, "Split") == 0) {
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *rx = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    const json_t *src = rx ? rx : str;
    if (!json_is_object(pat) || json_object_size(pat) != 1 || !json_is_string(src))
      return dapo_errf(e, DAPO_EFORMAT,
                       "%s.pattern must be {\"Regex\": string} or {\"String\": string}", path);
    if (json_string_length(src) > BPE_MAX_PATTERN)
      return dapo_errf(e, DAPO_ERANGE, "%s.pattern is longer than %d bytes", path, BPE_MAX_PATTERN);
    const char *beh = json_string_value(json_object_get(p, "behavior"));
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    int k = 0;
    while (k < 5 && !(beh && strcmp(beh, names[k]) == 0)) k++;
    if (k == 5)
      return dapo_errf(e, beh ? DAPO_EUNSUPPORTED : DAPO_EFORMAT,
                       "%s.behavior \"%.64s\" is not supported (Removed, Isolated, "
                       "MergedWithPrevious, MergedWithNext, Contiguous)",
                       path, beh ? beh : "(missing)");
    s.kind = STEP_SPLIT;
    s.beh = (enum behavior)k;
    if (get_bool(p, "invert", 0, path, &s.invert, e)) return e ? e->code : DAPO_EFORMAT;
    char sub[160];
    snprintf(sub, sizeof sub, "%.100s.pattern", path);
    if (utf8_check(json_string_value(src), json_string_length(src)) != json_string_length(src))
      return dapo_errf(e, DAPO_EFORMAT, "%s is not valid UTF-8", sub);
    if (!(s.re = compile_re(json_string_value(src), json_string_length(src), src == str, sub, e)))
      return e ? e->code : DAPO_EFORMAT;
  } else if (strcmp(type, "Digits") == 0) {
    int ind = 0;
    if (get_bool(p, "individual_digits", 0, path, &ind, e)) return e ? e->code : DAPO_EFORMAT;
    s.kind = STEP_DIGITS;
    s.beh = ind ? BEH_ISOLATED : BEH_CONTIGUOUS;
    if (!(s.re = compile_re("\\p{N}", PCRE2_ZERO_TERMINATED, 0, path, e)))
      return e ? e->code : DAPO_EFORMAT;
  } else if (strcmp(type, "Metaspace") == 0) {
    int rc = load_metaspace(p, path, &s, e);
    if (rc) return rc;
  } else {
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "%s.type \"%.64s\" is not supported (ByteLevel, Split, Digits, Metaspace, "
                     "Sequence)",
                     path, type);
  }
  return add_step(b, s, path, e);
}

static int template_special(struct bpe *b, const json_t *specials, const char *name, int *out,
                            int *n_out, const char *path, struct dapo_err *e) {
  const json_t *st = json_object_get(specials, name);
  const json_t *ids = json_object_get(st, "ids");
  if (!json_is_object(st) || !json_is_array(ids))
    return dapo_errf(e, DAPO_EFORMAT,
                     "%s: special token \"%.64s\" is not in special_tokens "
                     "with an ids array",
                     path, name);
  for (size_t i = 0; i < json_array_size(ids); i++) {
    json_int_t id = json_integer_value(json_array_get(ids, i));
    if (!json_is_integer(json_array_get(ids, i)) || id < 0 || id >= b->n_ids)
      return dapo_errf(e, DAPO_EFORMAT, "%s: special_tokens[\"%.64s\"].ids[%zu] is not a token id",
                       path, name, i);
    if (*n_out >= BPE_MAX_COMPONENTS)
      return dapo_errf(e, DAPO_ERANGE, "%s: more than %d special tokens", path, BPE_MAX_COMPONENTS);
    out[(*n_out)++] = (int)id;
  }
  return 0;
}

static int load_post(struct bpe *b, const json_t *p, const char *path, int depth,
                     struct dapo_err *e) {
  if (!p || json_is_null(p)) return 0;
  if (!json_is_object(p)) return dapo_errf(e, DAPO_EFORMAT, "%s must be an object or null", path);
  const char *type = type_of(p);
  if (strcmp(type, "ByteLevel") == 0) return 0; /* offsets only */
  if (strcmp(type, "Sequence") == 0) {
    const json_t *list = json_object_get(p, "processors");
    if (!json_is_array(list))
      return dapo_errf(e, DAPO_EFORMAT, "%s.processors must be an array", path);
    if (depth >= BPE_MAX_NESTING)
      return dapo_errf(e, DAPO_ERANGE, "%s: Sequence nested too deeply", path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      char sub[160];
      snprintf(sub, sizeof sub, "%.100s.processors[%zu]", path, i);
      int rc = load_post(b, json_array_get(list, i), sub, depth + 1, e);
      if (rc) return rc;
    }
    return 0;
  }
  if (strcmp(type, "TemplateProcessing") != 0)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "%s.type \"%.64s\" is not supported (TemplateProcessing, ByteLevel, Sequence)",
                     path, type);
  if (b->n_pre || b->n_post)
    return dapo_errf(e, DAPO_EUNSUPPORTED, "%s: a second TemplateProcessing is not supported",
                     path);
  const json_t *single = json_object_get(p, "single"),
               *specials = json_object_get(p, "special_tokens");
  if (!json_is_array(single)) return dapo_errf(e, DAPO_EFORMAT, "%s.single must be an array", path);
  if (specials && !json_is_object(specials))
    return dapo_errf(e, DAPO_EFORMAT, "%s.special_tokens must be an object", path);
  const json_t *pair = json_object_get(p, "pair");
  if (pair && !json_is_array(pair) && !json_is_null(pair))
    return dapo_errf(e, DAPO_EFORMAT, "%s.pair must be an array", path);
  int seen_a = 0;
  for (size_t i = 0; i < json_array_size(single); i++) {
    const json_t *it = json_array_get(single, i);
    char sub[160];
    snprintf(sub, sizeof sub, "%.100s.single[%zu]", path, i);
    const json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
    if (sp && json_is_string(json_object_get(sp, "id"))) {
      int rc = template_special(b, specials, json_string_value(json_object_get(sp, "id")),
                                seen_a ? b->post_ids : b->pre_ids, seen_a ? &b->n_post : &b->n_pre,
                                sub, e);
      if (rc) return rc;
    } else if (sq && json_is_string(json_object_get(sq, "id"))) {
      if (strcmp(json_string_value(json_object_get(sq, "id")), "A") != 0 || seen_a)
        return dapo_errf(e, DAPO_EUNSUPPORTED, "%s: only one Sequence \"A\" is supported", sub);
      seen_a = 1;
    } else {
      return dapo_errf(
          e, DAPO_EFORMAT,
          "%s must be {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": {\"id\": ...}}", sub);
    }
  }
  if (!seen_a) return dapo_errf(e, DAPO_EFORMAT, "%s.single has no Sequence \"A\"", path);
  return 0;
}

static const char DECODERS[] =
    "ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence, null";

/* One decoder of the chain (Sequence flattened, in order). */
static int load_dstep(struct bpe *b, const json_t *d, const char *path, int depth,
                      struct dapo_err *e) {
  if (!json_is_object(d)) return dapo_errf(e, DAPO_EFORMAT, "%s must be an object", path);
  const char *type = type_of(d);
  if (strcmp(type, "Sequence") == 0) {
    const json_t *list = json_object_get(d, "decoders");
    if (!json_is_array(list))
      return dapo_errf(e, DAPO_EFORMAT, "%s.decoders must be an array", path);
    if (depth >= BPE_MAX_NESTING)
      return dapo_errf(e, DAPO_ERANGE, "%s: Sequence nested too deeply", path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      char sub[160];
      snprintf(sub, sizeof sub, "%.100s.decoders[%zu]", path, i);
      int rc = load_dstep(b, json_array_get(list, i), sub, depth + 1, e);
      if (rc) return rc;
    }
    return 0;
  }
  if (strcmp(type, "ByteLevel") == 0)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "%s: ByteLevel is only supported alone or as the one decoder of a Sequence",
                     path);
  if (b->n_dec >= BPE_MAX_COMPONENTS)
    return dapo_errf(e, DAPO_ERANGE, "%s: more than %d decoders", path, BPE_MAX_COMPONENTS);
  struct dstep *st = &b->dec[b->n_dec];
  memset(st, 0, sizeof *st);
  int after_fuse = b->dec_fuse < b->n_dec;
  if (strcmp(type, "Replace") == 0) {
    if (after_fuse)
      return dapo_errf(e, DAPO_EUNSUPPORTED, "%s: Replace after Fuse is not supported", path);
    st->kind = DEC_REPLACE;
    b->n_dec++; /* freed with b on failure */
    return load_replace(d, path, &st->rp, e);
  }
  if (strcmp(type, "ByteFallback") == 0) {
    if (after_fuse)
      return dapo_errf(e, DAPO_EUNSUPPORTED, "%s: ByteFallback after Fuse is not supported", path);
    for (int k = 0; k < b->n_dec; k++)
      if (b->dec[k].kind == DEC_BYTEFALLBACK)
        return dapo_errf(e, DAPO_EUNSUPPORTED, "%s: a second ByteFallback is not supported", path);
    st->kind = DEC_BYTEFALLBACK;
  } else if (strcmp(type, "Fuse") == 0) {
    st->kind = DEC_FUSE;
    if (!after_fuse) b->dec_fuse = b->n_dec;
  } else if (strcmp(type, "Strip") == 0) {
    st->kind = DEC_STRIP;
    if ((st->ch = get_char(d, "content", path, e)) < 0) return e ? e->code : DAPO_EFORMAT;
    static const char *const keys[] = {"start", "stop"};
    for (int i = 0; i < 2; i++) {
      const json_t *v = json_object_get(d, keys[i]);
      if (!json_is_integer(v) || json_integer_value(v) < 0 ||
          json_integer_value(v) > BPE_MAX_TOKEN_BYTES)
        return dapo_errf(e, DAPO_EFORMAT, "%s.%s must be an integer in [0, %d]", path, keys[i],
                         BPE_MAX_TOKEN_BYTES);
      *(i ? &st->stop : &st->start) = (int)json_integer_value(v);
    }
  } else if (strcmp(type, "Metaspace") == 0) {
    struct step ms = {0};
    int rc = load_metaspace(d, path, &ms, e);
    if (rc) return rc;
    st->kind = DEC_METASPACE;
    size_t adv;
    st->ch = utf8_cp(ms.rep, ms.replen, &adv);
    st->never = ms.scheme == PREPEND_NEVER;
  } else {
    return dapo_errf(e, DAPO_EUNSUPPORTED, "%s.type \"%.64s\" is not supported (%s)", path, type,
                     DECODERS);
  }
  b->n_dec++;
  return 0;
}

/* ByteLevel alone (or the one decoder of a Sequence), no decoder (tokens joined with spaces), or a
 * chain of Replace, ByteFallback, Fuse, Strip and Metaspace (Sequence nesting flattened). After a
 * Fuse there is one growing text, so only Strip, Metaspace and Fuse may follow it. */
static int load_decoder(struct bpe *b, const json_t *d, const char *path, struct dapo_err *e) {
  if (!d || json_is_null(d)) {
    b->dec_join = 1;
    return 0;
  }
  if (!json_is_object(d)) return dapo_errf(e, DAPO_EFORMAT, "%s must be an object or null", path);
  const char *type = type_of(d);
  if (strcmp(type, "ByteLevel") == 0) return 0;
  const json_t *list = json_object_get(d, "decoders");
  if (strcmp(type, "Sequence") == 0 && json_array_size(list) == 1 &&
      strcmp(type_of(json_array_get(list, 0)), "ByteLevel") == 0)
    return 0;
  static const char *const known[] = {"Sequence", "Replace", "ByteFallback",
                                      "Fuse",     "Strip",   "Metaspace"};
  int k = 0;
  while (k < 6 && strcmp(type, known[k]) != 0) k++;
  if (k == 6)
    return dapo_errf(e, DAPO_EUNSUPPORTED, "%s.type \"%.64s\" is not supported (%s)", path, type,
                     DECODERS);
  b->dec_chain = 1;
  b->dec_fuse = BPE_MAX_COMPONENTS + 1;
  int rc = load_dstep(b, d, path, 0, e);
  if (b->dec_fuse > b->n_dec) b->dec_fuse = b->n_dec;
  return rc;
}

/* Per id, the decoder's bytes: ByteLevel maps each character back to its byte, a token with a
 * character outside the byte alphabet is kept as it is (the reference does the same). */
static int build_decoded(struct bpe *b, struct dapo_err *e) {
  size_t nid = b->n_ids > 0 ? (size_t)b->n_ids : 1;
  b->doff = malloc(nid * sizeof *b->doff);
  b->dlen = calloc(nid, sizeof *b->dlen);
  struct bvec ar = {0};
  if (!b->doff || !b->dlen) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  for (int id = 0; id < b->n_ids; id++) {
    const char *s = bpe_id_to_token(b, id);
    b->doff[id] = SIZE_MAX;
    if (!s) continue;
    size_t n = strlen(s);
    b->doff[id] = ar.n;
    size_t start = ar.n;
    int raw = b->dec_join || b->dec_chain; /* the chain decodes the token text */
    for (size_t i = 0; i < n && !raw;) {
      size_t adv;
      int32_t cp = utf8_cp(s + i, n - i, &adv);
      if (cp < 0 || cp >= 324 || b->bm.rev[cp] < 0) {
        raw = 1;
        break;
      }
      char c = (char)b->bm.rev[cp];
      if (bvec_add(&ar, &c, 1)) goto oom;
      i += adv;
    }
    if (raw) {
      ar.n = start;
      if (bvec_add(&ar, s, n)) goto oom;
    }
    b->dlen[id] = (uint32_t)(ar.n - start);
  }
  if (bvec_add(&ar, "", 0)) goto oom;
  b->darena = ar.v;
  return 0;
oom:
  free(ar.v);
  return dapo_errf(e, DAPO_ENOMEM, "out of memory");
}

struct bpe *bpe_from_json(const json_t *j, struct dapo_err *e) {
  if (!json_is_object(j)) {
    dapo_errf(e, DAPO_EFORMAT, "the top level must be an object");
    return NULL;
  }
  struct bpe *b = calloc(1, sizeof *b);
  if (!b) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&b->lock, NULL);
  bytemap_init(&b->bm);
  int rc = 0;
  const json_t *v;
  static const char *const must_be_null[] = {"truncation", "padding"};
  for (int i = 0; i < 2; i++) {
    v = json_object_get(j, must_be_null[i]);
    if (v && !json_is_null(v)) {
      rc = dapo_errf(e, DAPO_EUNSUPPORTED, "%s is not supported (must be null)", must_be_null[i]);
      goto out;
    }
  }
  if ((rc = load_model(b, json_object_get(j, "model"), e))) goto out;
  if ((rc = load_normalizer(b, json_object_get(j, "normalizer"), "normalizer", 0, e))) goto out;
  if ((rc = load_added(b, json_object_get(j, "added_tokens"), e))) goto out;
  if ((rc = load_pretok(b, json_object_get(j, "pre_tokenizer"), "pre_tokenizer", 0, e))) goto out;
  if ((rc = load_post(b, json_object_get(j, "post_processor"), "post_processor", 0, e))) goto out;
  if ((rc = load_decoder(b, json_object_get(j, "decoder"), "decoder", e))) goto out;
  if ((rc = build_decoded(b, e))) goto out;
  b->cache = calloc(BPE_CACHE_SLOTS, sizeof *b->cache);
  if (!b->cache) {
    rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
    goto out;
  }
  b->json = json_incref((json_t *)j);
out:
  if (rc) {
    bpe_free(b);
    return NULL;
  }
  return b;
}

static void scratch_free(struct scratch *w);

void bpe_free(struct bpe *b) {
  if (!b) return;
  json_decref(b->json);
  free(b->varena);
  free(b->voff);
  free(b->vlen);
  free(b->vslots);
  free(b->mkeys);
  free(b->mrank);
  free(b->mnew);
  for (int i = 0; i < b->n_added; i++) {
    if (b->added[i].pat != b->added[i].content) free(b->added[i].pat);
    free(b->added[i].content);
  }
  free(b->added);
  free(b->added_of_id);
  free(b->aslots);
  free(b->trie_raw.idx);
  free(b->trie_norm.idx);
  for (int i = 0; i < b->n_steps; i++) pcre2_code_free(b->steps[i].re);
  for (int i = 0; i < b->n_norm; i++) nstep_free(&b->norm[i]);
  for (int i = 0; i < b->n_dec; i++) nstep_free(&b->dec[i].rp);
  free(b->darena);
  free(b->doff);
  free(b->dlen);
  if (b->cache)
    for (int i = 0; i < BPE_CACHE_SLOTS; i++) free(b->cache[i].key);
  free(b->cache);
  for (int i = 0; i < b->n_pool; i++) {
    scratch_free(b->pool[i]);
    free(b->pool[i]);
  }
  pthread_mutex_destroy(&b->lock);
  free(b);
}

json_t *bpe_json(const struct bpe *b) {
  return b->json;
}
int bpe_vocab_size(const struct bpe *b) {
  return b->n_ids;
}
int bpe_joins_with_space(const struct bpe *b) {
  return b->dec_join;
}
int bpe_bos_id(const struct bpe *b) {
  return b->n_pre ? b->pre_ids[0] : -1;
}

const char *bpe_id_to_token(const struct bpe *b, int id) {
  if (id < 0 || id >= b->n_ids) return NULL;
  if (b->added_of_id[id] >= 0) return b->added[b->added_of_id[id]].content;
  if (b->voff[id] == SIZE_MAX) return NULL;
  return b->varena + b->voff[id];
}

int bpe_is_special(const struct bpe *b, int id) {
  return id >= 0 && id < b->n_ids && b->added_of_id[id] >= 0 &&
         b->added[b->added_of_id[id]].special;
}

int bpe_token_to_id(const struct bpe *b, const char *token) {
  size_t n = strlen(token);
  int a = added_find(b, token, n);
  if (a >= 0) return b->added[a].id;
  return vocab_find(b, token, n);
}

const char *bpe_token_bytes(const struct bpe *b, int id, size_t *len) {
  if (id < 0 || id >= b->n_ids || b->doff[id] == SIZE_MAX) return NULL;
  *len = b->dlen[id];
  return b->darena + b->doff[id];
}

/* ---- encoding ---- */

struct split {
  size_t s, e;
  int match;
};

struct scratch {
  struct bvec work; /* text the pieces point into */
  struct pvec a, b; /* pieces before / after a step */
  struct split *sp; /* one step's matches */
  size_t nsp, capsp;
  pcre2_match_data *md;
  struct bvec mapped; /* byte-level form of one pre-token */
  /* BPE word */
  int *sym, *prev, *next;
  size_t capsym;
  uint64_t *heap; /* rank << 32 | pos */
  int *heap_new;
  size_t nheap, capheap;
};

static int sp_push(struct scratch *w, size_t s, size_t e, int match) {
  if (w->nsp == w->capsp) {
    size_t c = w->capsp ? 2 * w->capsp : 64;
    struct split *p = realloc(w->sp, c * sizeof *p);
    if (!p) return DAPO_ENOMEM;
    w->sp = p;
    w->capsp = c;
  }
  w->sp[w->nsp].s = s;
  w->sp[w->nsp].e = e;
  w->sp[w->nsp].match = match;
  w->nsp++;
  return 0;
}

/* One Split-like step over the piece text[0..n): matches as the reference's find_matches, the
 * behaviour as its SplitDelimiterBehavior, non-empty results appended to out (offsets + base). */
static int split_piece(struct scratch *w, const struct step *st, const char *text, size_t n,
                       size_t base, struct pvec *out, struct dapo_err *e) {
  w->nsp = 0;
  if (n == 0) return 0;
  size_t pos = 0, prev = 0;
  while (pos <= n) {
    int rc = pcre2_match(st->re, (PCRE2_SPTR)text, n, pos, PCRE2_NO_UTF_CHECK, w->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[120];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return dapo_errf(e, DAPO_EINVAL, "pre-tokenizer regex failed: %s", (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
    size_t ms = ov[0], me = ov[1];
    if (prev != ms && sp_push(w, prev, ms, 0)) return DAPO_ENOMEM;
    if (sp_push(w, ms, me, 1)) return DAPO_ENOMEM;
    prev = me;
    if (me == ms) {
      if (me >= n) break;
      size_t adv;
      utf8_cp(text + me, n - me, &adv);
      pos = me + adv;
    } else {
      pos = me;
    }
  }
  if (prev != n && sp_push(w, prev, n, 0)) return DAPO_ENOMEM;
  if (st->invert)
    for (size_t i = 0; i < w->nsp; i++) w->sp[i].match = !w->sp[i].match;
  /* behaviours, in place over w->sp (the reference's fold) */
  size_t k = 0;
  int prev_match = 0;
  switch (st->beh) {
  case BEH_ISOLATED: k = w->nsp; break;
  case BEH_REMOVED:
    for (size_t i = 0; i < w->nsp; i++)
      if (!w->sp[i].match) w->sp[k++] = w->sp[i];
    break;
  case BEH_MERGED_PREV:
    for (size_t i = 0; i < w->nsp; i++) {
      struct split c = w->sp[i];
      if (c.match && !prev_match && k > 0)
        w->sp[k - 1].e = c.e;
      else
        w->sp[k++] = c;
      prev_match = c.match;
    }
    break;
  case BEH_CONTIGUOUS:
    for (size_t i = 0; i < w->nsp; i++) {
      struct split c = w->sp[i];
      if (c.match == prev_match && k > 0)
        w->sp[k - 1].e = c.e;
      else
        w->sp[k++] = c;
      prev_match = c.match;
    }
    break;
  case BEH_MERGED_NEXT: {
    /* from the right; results land at the end of the array, then move down */
    size_t top = w->nsp;
    for (size_t i = w->nsp; i-- > 0;) {
      struct split c = w->sp[i];
      if (c.match && !prev_match && top < w->nsp)
        w->sp[top].s = c.s;
      else
        w->sp[--top] = c;
      prev_match = c.match;
    }
    for (size_t i = top; i < w->nsp; i++) w->sp[k++] = w->sp[i];
    break;
  }
  }
  for (size_t i = 0; i < k; i++)
    if (w->sp[i].e > w->sp[i].s && pvec_push(out, base + w->sp[i].s, w->sp[i].e - w->sp[i].s))
      return DAPO_ENOMEM;
  return 0;
}

static void heap_push(struct scratch *w, uint64_t key, int nid) {
  size_t i = w->nheap++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (w->heap[p] <= key) break;
    w->heap[i] = w->heap[p];
    w->heap_new[i] = w->heap_new[p];
    i = p;
  }
  w->heap[i] = key;
  w->heap_new[i] = nid;
}

static void heap_pop(struct scratch *w) {
  uint64_t key = w->heap[--w->nheap];
  int nid = w->heap_new[w->nheap];
  size_t i = 0, n = w->nheap;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
    if (key <= w->heap[c]) break;
    w->heap[i] = w->heap[c];
    w->heap_new[i] = w->heap_new[c];
    i = c;
  }
  if (n) {
    w->heap[i] = key;
    w->heap_new[i] = nid;
  }
}

/* The reference's Word::merge_all: a queue of (rank, position), lowest first; each pop checked
 * against the current neighbours. O(n log n) in the word length. */
static int bpe_word(const struct bpe *b, struct scratch *w, const char *s, size_t n,
                    struct ivec *out) {
  if (b->ignore_merges) {
    int id = vocab_find(b, s, n);
    if (id >= 0) return ivec_push(out, id);
  }
  if (n + 1 > w->capsym) {
    size_t c = pow2_at_least(n + 1);
    int *a = realloc(w->sym, c * sizeof *a), *p = a ? realloc(w->prev, c * sizeof *p) : NULL;
    if (a) w->sym = a;
    if (p) w->prev = p;
    int *q = p ? realloc(w->next, c * sizeof *q) : NULL;
    if (q) w->next = q;
    uint64_t *h = q ? realloc(w->heap, 2 * c * sizeof *h) : NULL;
    if (h) w->heap = h;
    int *hn = h ? realloc(w->heap_new, 2 * c * sizeof *hn) : NULL;
    if (hn) w->heap_new = hn;
    if (!hn) return DAPO_ENOMEM;
    w->capsym = c;
    w->capheap = 2 * c;
  }
  /* The symbols, as the reference's merge_word: a character in the vocabulary; else with
   * byte_fallback its bytes as <0xXX> when all of those exist; else unk (consecutive ones fused
   * with fuse_unk) or, without unk_token, nothing. A pending unk is only written when the next
   * known character (or the end) comes, so it lands after byte tokens that came meanwhile: the
   * reference does the same. At most one symbol per byte. */
  int m = 0, unk = 0;
#define BPE_SYM(x)                                                                                 \
  do {                                                                                             \
    w->sym[m] = (x);                                                                               \
    w->prev[m] = m - 1;                                                                            \
    w->next[m] = m + 1;                                                                            \
    m++;                                                                                           \
  } while (0)
  for (size_t i = 0; i < n;) {
    size_t adv;
    utf8_cp(s + i, n - i, &adv);
    int id = vocab_find(b, s + i, adv);
    i += adv;
    if (id >= 0) {
      if (unk) BPE_SYM(b->unk_id);
      unk = 0;
      BPE_SYM(id);
      continue;
    }
    if (b->byte_fallback) {
      size_t k = 0;
      while (k < adv && b->byte_id[(unsigned char)s[i - adv + k]] >= 0) k++;
      if (k == adv) {
        for (k = 0; k < adv; k++) BPE_SYM(b->byte_id[(unsigned char)s[i - adv + k]]);
        continue;
      }
    }
    if (b->unk_id == -1) continue; /* no unk token: the reference drops the character */
    if (b->unk_id < 0) return DAPO_EFORMAT;
    if (unk && !b->fuse_unk) BPE_SYM(b->unk_id);
    unk = 1;
  }
  if (unk) BPE_SYM(b->unk_id);
#undef BPE_SYM
  if (m == 0) return 0;
  w->next[m - 1] = -1;
  w->nheap = 0;
  int rank, nid;
  for (int i = 0; i + 1 < m; i++)
    if (merge_find(b, w->sym[i], w->sym[i + 1], &rank, &nid))
      heap_push(w, ((uint64_t)rank << 32) | (uint32_t)i, nid);
  while (w->nheap) {
    uint64_t top = w->heap[0];
    int tnew = w->heap_new[0];
    heap_pop(w);
    int pos = (int)(uint32_t)top;
    if (w->sym[pos] < 0 || w->next[pos] < 0) continue;
    int nx = w->next[pos];
    if (!merge_find(b, w->sym[pos], w->sym[nx], &rank, &nid) || nid != tnew) continue;
    w->sym[pos] = tnew;
    w->sym[nx] = -1;
    w->next[pos] = w->next[nx];
    if (w->next[nx] >= 0) w->prev[w->next[nx]] = pos;
    /* at most two pushes per merge and one merge per symbol: the heap never exceeds 2n */
    if (w->prev[pos] >= 0 && merge_find(b, w->sym[w->prev[pos]], w->sym[pos], &rank, &nid))
      heap_push(w, ((uint64_t)rank << 32) | (uint32_t)w->prev[pos], nid);
    if (w->next[pos] >= 0 && merge_find(b, w->sym[pos], w->sym[w->next[pos]], &rank, &nid))
      heap_push(w, ((uint64_t)rank << 32) | (uint32_t)pos, nid);
  }
  for (int i = 0; i >= 0; i = w->next[i])
    if (ivec_push(out, w->sym[i])) return DAPO_ENOMEM;
  return 0;
}

/* BPE of one pre-token through the cache (short words only). */
static int model_word(const struct bpe *b, struct scratch *w, const char *s, size_t n,
                      struct ivec *out) {
  if (n > BPE_CACHE_WORD_BYTES) return bpe_word(b, w, s, n, out);
  struct bpe *mb = (struct bpe *)b; /* the cache is the only mutable part, under the lock */
  uint64_t h = hash_bytes(s, n);
  struct cache_slot *c = &mb->cache[h & (BPE_CACHE_SLOTS - 1)];
  pthread_mutex_lock(&mb->lock);
  if (c->key && c->h == h && c->klen == n && memcmp(c->key, s, n) == 0) {
    int rc = 0;
    for (int i = 0; i < c->nids && !rc; i++) rc = ivec_push(out, c->ids[i]);
    pthread_mutex_unlock(&mb->lock);
    return rc;
  }
  pthread_mutex_unlock(&mb->lock);
  size_t first = out->n;
  int rc = bpe_word(b, w, s, n, out);
  if (rc) return rc;
  int nids = (int)(out->n - first);
  size_t kpad = (n + sizeof(int) - 1) / sizeof(int) * sizeof(int);
  char *mem = malloc(kpad + (size_t)nids * sizeof(int) + 1);
  if (!mem) return 0; /* the cache is an optimisation */
  memcpy(mem, s, n);
  int *ids = (int *)(void *)(mem + kpad);
  if (nids) memcpy(ids, out->v + first, (size_t)nids * sizeof(int));
  pthread_mutex_lock(&mb->lock);
  free(c->key);
  c->key = mem;
  c->h = h;
  c->klen = n;
  c->nids = nids;
  c->ids = ids;
  pthread_mutex_unlock(&mb->lock);
  return 0;
}

/* Metaspace on one piece: spaces become the replacement, which is put in front as the scheme
 * says (FIRST: only for the piece that starts the input, *origin), then the text is split before
 * every replacement (MergedWithNext) when st->split. The new text goes at the end of w->work. */
static int metaspace_piece(struct scratch *w, const struct step *st, struct piece p,
                           size_t *origin) {
  size_t at = w->work.n;
  int starts =
      p.len && (w->work.v[p.off] == ' ' ||
                (p.len >= st->replen && memcmp(w->work.v + p.off, st->rep, st->replen) == 0));
  if (!starts &&
      (st->scheme == PREPEND_ALWAYS || (st->scheme == PREPEND_FIRST && p.off == *origin)))
    if (bvec_add(&w->work, st->rep, st->replen)) return DAPO_ENOMEM;
  for (size_t j = 0; j < p.len;) {
    const char *src = w->work.v + p.off + j; /* again after each realloc */
    const char *sp = memchr(src, ' ', p.len - j);
    size_t run = sp ? (size_t)(sp - src) : p.len - j;
    if (bvec_add(&w->work, NULL, run)) return DAPO_ENOMEM;
    memcpy(w->work.v + w->work.n - run, w->work.v + p.off + j, run);
    j += run;
    if (sp) {
      if (bvec_add(&w->work, st->rep, st->replen)) return DAPO_ENOMEM;
      j++;
    }
  }
  if (p.off == *origin) *origin = at;
  size_t end = w->work.n, start = at;
  if (st->split)
    for (size_t j = at + 1; j + st->replen <= end; j++)
      if (memcmp(w->work.v + j, st->rep, st->replen) == 0) {
        if (pvec_push(&w->b, start, j - start)) return DAPO_ENOMEM;
        start = j;
        j += st->replen - 1;
      }
  return end > start ? pvec_push(&w->b, start, end - start) : 0;
}

/* Normalizer, pre-tokenizer and model over one piece of text that is not an added token;
 * at_origin when the piece starts the input (for Metaspace's prepend_scheme "first"). */
static int encode_plain(const struct bpe *b, struct scratch *w, const char *s, size_t n,
                        int at_origin, struct ivec *out, struct dapo_err *e) {
  w->work.n = 0;
  if (bvec_add(&w->work, s, n)) return DAPO_ENOMEM;
  w->a.n = 0;
  if (n && pvec_push(&w->a, 0, n)) return DAPO_ENOMEM;
  size_t origin = at_origin ? 0 : SIZE_MAX; /* where the piece that starts the input is */
  for (int k = 0; k < b->n_steps; k++) {
    const struct step *st = &b->steps[k];
    w->b.n = 0;
    for (size_t i = 0; i < w->a.n; i++) {
      struct piece p = w->a.v[i];
      if (st->kind == STEP_METASPACE) {
        if (metaspace_piece(w, st, p, &origin)) return DAPO_ENOMEM;
        continue;
      }
      if (st->kind == STEP_BYTELEVEL && st->add_prefix_space && w->work.v[p.off] != ' ') {
        size_t at = w->work.n;
        if (bvec_add(&w->work, " ", 1) || bvec_add(&w->work, NULL, p.len)) return DAPO_ENOMEM;
        memcpy(w->work.v + at + 1, w->work.v + p.off, p.len); /* after the realloc */
        if (p.off == origin) origin = at;
        p.off = at;
        p.len++;
      }
      int rc = st->re ? split_piece(w, st, w->work.v + p.off, p.len, p.off, &w->b, e)
                      : pvec_push(&w->b, p.off, p.len);
      if (rc) return rc;
    }
    struct pvec t = w->a;
    w->a = w->b;
    w->b = t;
  }
  for (size_t i = 0; i < w->a.n; i++) {
    const char *p = w->work.v + w->a.v[i].off;
    size_t len = w->a.v[i].len;
    int rc;
    if (b->bytelevel) {
      w->mapped.n = 0;
      for (size_t j = 0; j < len; j++) {
        unsigned char c = (unsigned char)p[j];
        if (bvec_add(&w->mapped, b->bm.utf8[c], b->bm.n[c])) return DAPO_ENOMEM;
      }
      rc = model_word(b, w, w->mapped.v, w->mapped.n, out);
    } else {
      rc = model_word(b, w, p, len, out);
    }
    if (rc == DAPO_EFORMAT)
      return dapo_errf(e, DAPO_EINVAL,
                       "model.unk_token \"%.64s\" is not in model.vocab (the text needs it)",
                       b->unk_name);
    if (rc) return rc == DAPO_ENOMEM ? dapo_errf(e, rc, "out of memory encoding") : rc;
  }
  return 0;
}

/* One utf8proc normal form of s into a new string. utf8proc 2.6 (Debian 12) composes an LV syllable
 * with U+11A7 (one below the first trailing consonant, which composes with nothing) and drops it;
 * that character is a starter that composes with nothing either side, so the text is normalized in
 * pieces around it, which is exact. */
static int map_form(const char *s, size_t n, int opt, char **out, size_t *outn) {
  struct bvec acc = {0};
  size_t at = 0;
  for (;;) {
    const char *hit = memmem(s + at, n - at, "\xE1\x86\xA7", 3);
    size_t end = hit ? (size_t)(hit - s) : n;
    if (end > at) {
      utf8proc_uint8_t *dst = NULL;
      utf8proc_ssize_t r =
          utf8proc_map((const utf8proc_uint8_t *)s + at, (utf8proc_ssize_t)(end - at), &dst, opt);
      if (r < 0 || bvec_add(&acc, dst, (size_t)r)) {
        free(dst);
        free(acc.v);
        return DAPO_ENOMEM; /* input is valid UTF-8: only allocation can fail */
      }
      free(dst);
    }
    if (!hit) break;
    if (bvec_add(&acc, hit, 3)) {
      free(acc.v);
      return DAPO_ENOMEM;
    }
    at = end + 3;
  }
  if (!acc.v && bvec_add(&acc, "", 0)) return DAPO_ENOMEM;
  *out = acc.v;
  *outn = acc.n;
  return 0;
}

/* Replace of s[0..n) into out: every match of r's pattern (leftmost, non-overlapping; after an
 * empty match the search moves one character on, as the reference's find_iter) becomes r's
 * content. *hits counts the matches; md is NULL for a literal pattern. An empty s has no match,
 * as in the reference. */
static int replace_all(const struct nstep *r, pcre2_match_data *md, const char *s, size_t n,
                       struct bvec *out, size_t *hits) {
  size_t pos = 0, prev = 0;
  *hits = 0;
  out->n = 0;
  if (bvec_add(out, "", 0)) return DAPO_ENOMEM;
  if (n == 0) return 0;
  if (r->lit) {
    for (;;) {
      const char *hit = pos < n ? memmem(s + pos, n - pos, r->lit, r->litn) : NULL;
      if (!hit) break;
      size_t at = (size_t)(hit - s);
      if (bvec_add(out, s + prev, at - prev) || bvec_add(out, r->s, r->n)) return DAPO_ENOMEM;
      (*hits)++;
      pos = prev = at + r->litn;
    }
    return bvec_add(out, s + prev, n - prev);
  }
  while (pos <= n) {
    int rc = pcre2_match(r->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return DAPO_EINVAL;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t ms = ov[0], me = ov[1];
    if (bvec_add(out, s + prev, ms - prev) || bvec_add(out, r->s, r->n)) return DAPO_ENOMEM;
    (*hits)++;
    prev = me;
    if (me == ms) {
      if (me >= n) break;
      size_t adv;
      utf8_cp(s + me, n - me, &adv);
      pos = me + adv;
    } else {
      pos = me;
    }
  }
  return bvec_add(out, s + prev, n - prev);
}

static int is_ascii(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] >= 0x80) return 0;
  return 1;
}

/* The normalizers over s[0..n): *res a new string (free), or NULL when nothing changed. */
static int normalize(const struct bpe *b, const char *s, size_t n, char **res, size_t *rn) {
  *res = NULL;
  *rn = n;
  char *cur = NULL;
  size_t curn = n;
  pcre2_match_data *md = NULL;
  int rc = 0;
  for (int k = 0; k < b->n_norm && !rc; k++) {
    const struct nstep *st = &b->norm[k];
    const char *in = cur ? cur : s;
    char *next = NULL;
    size_t nn = 0;
    if (st->kind == NORM_FORM) {
      if (is_ascii(in, curn)) continue; /* every normal form of ASCII is itself */
      rc = map_form(in, curn, st->opt, &next, &nn);
    } else if (st->kind == NORM_PREPEND) {
      if (curn == 0) continue; /* the reference prepends to non-empty text only */
      if (!(next = malloc(st->n + curn + 1))) {
        rc = DAPO_ENOMEM;
        break;
      }
      memcpy(next, st->s, st->n);
      memcpy(next + st->n, in, curn);
      nn = st->n + curn;
      next[nn] = 0;
    } else {
      if (st->re && !md && !(md = pcre2_match_data_create(4, NULL))) {
        rc = DAPO_ENOMEM;
        break;
      }
      struct bvec out = {0};
      size_t hits;
      rc = replace_all(st, md, in, curn, &out, &hits);
      if (rc || !hits) {
        free(out.v);
        continue;
      }
      next = out.v;
      nn = out.n;
    }
    if (rc) break;
    free(cur);
    cur = next;
    curn = nn;
  }
  pcre2_match_data_free(md);
  if (rc) {
    free(cur);
    return rc;
  }
  *res = cur;
  *rn = curn;
  return 0;
}

/* The reference's AddedVocabulary::find_matches over s[0..n) with one trie: pieces appended to
 * out as (off, len, added index or -1). */
struct aseg {
  size_t s, e;
  int a;
};

struct asegs {
  struct aseg *v;
  size_t n, cap;
};

static int aseg_push(struct asegs *g, size_t s, size_t e, int a) {
  if (g->n == g->cap) {
    size_t c = g->cap ? 2 * g->cap : 16;
    struct aseg *p = realloc(g->v, c * sizeof *p);
    if (!p) return DAPO_ENOMEM;
    g->v = p;
    g->cap = c;
  }
  g->v[g->n].s = s;
  g->v[g->n].e = e;
  g->v[g->n].a = a;
  g->n++;
  return 0;
}

static int32_t cp_before(const char *s, size_t at) {
  if (at == 0) return -1;
  size_t i = at - 1;
  while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
  size_t adv;
  return utf8_cp(s + i, at - i, &adv);
}

static int find_added(const struct bpe *b, const struct trie *t, const char *s, size_t n,
                      struct asegs *g) {
  g->n = 0;
  if (t->start[256] == 0) return n ? aseg_push(g, 0, n, -1) : 0;
  size_t start_off = 0, i = 0;
  while (i < n) {
    unsigned char c = (unsigned char)s[i];
    int hit = -1;
    for (int k = t->start[c]; k < t->start[c + 1]; k++) {
      const struct added *a = &b->added[t->idx[k]];
      if (a->plen <= n - i && memcmp(s + i, a->pat, a->plen) == 0) {
        hit = t->idx[k];
        break;
      }
    }
    if (hit < 0) {
      i++;
      continue;
    }
    const struct added *a = &b->added[hit];
    size_t ms = i, me = i + a->plen;
    i = me; /* the search goes on after the match as found, before any strip */
    if (a->single_word) {
      size_t adv;
      int start_ok = ms == 0 || !is_word_char(cp_before(s, ms));
      int stop_ok = me == n || !is_word_char(utf8_cp(s + me, n - me, &adv));
      if (!start_ok || !stop_ok) continue;
    }
    if (a->lstrip) {
      size_t ns = ms;
      while (ns > 0) {
        int32_t cp = cp_before(s, ns);
        if (!is_white_space(cp)) break;
        size_t back = ns - 1;
        while (back > 0 && ((unsigned char)s[back] & 0xC0) == 0x80) back--;
        ns = back;
      }
      ms = ns > start_off ? ns : start_off;
    }
    if (a->rstrip) {
      while (me < n) {
        size_t adv;
        int32_t cp = utf8_cp(s + me, n - me, &adv);
        if (!is_white_space(cp)) break;
        me += adv;
      }
    }
    if (start_off < ms && aseg_push(g, start_off, ms, -1)) return DAPO_ENOMEM;
    if (aseg_push(g, ms, me, hit)) return DAPO_ENOMEM;
    start_off = me;
  }
  if (start_off < n && aseg_push(g, start_off, n, -1)) return DAPO_ENOMEM;
  return 0;
}

static void scratch_free(struct scratch *w) {
  free(w->work.v);
  free(w->a.v);
  free(w->b.v);
  free(w->sp);
  pcre2_match_data_free(w->md);
  free(w->mapped.v);
  free(w->sym);
  free(w->prev);
  free(w->next);
  free(w->heap);
  free(w->heap_new);
}

/* Work buffers come from a small pool in the tokenizer (the facade is thread-safe, so each call
 * needs its own, and allocating them per call cost ~10% on short strings). */
static struct scratch *scratch_get(const struct bpe *b) {
  struct bpe *mb = (struct bpe *)b;
  struct scratch *w = NULL;
  pthread_mutex_lock(&mb->lock);
  if (mb->n_pool > 0) w = mb->pool[--mb->n_pool];
  pthread_mutex_unlock(&mb->lock);
  if (w) return w;
  w = calloc(1, sizeof *w);
  if (w && !(w->md = pcre2_match_data_create(4, NULL))) {
    free(w);
    w = NULL;
  }
  return w;
}

static void scratch_put(const struct bpe *b, struct scratch *w) {
  struct bpe *mb = (struct bpe *)b;
  if (!w) return;
  /* a huge input's buffers are not kept */
  if (w->capsym <= (1u << 16) && w->work.cap <= (1u << 20) && w->mapped.cap <= (1u << 20)) {
    pthread_mutex_lock(&mb->lock);
    if (mb->n_pool < (int)(sizeof mb->pool / sizeof *mb->pool)) {
      mb->pool[mb->n_pool++] = w;
      w = NULL;
    }
    pthread_mutex_unlock(&mb->lock);
  }
  if (w) {
    scratch_free(w);
    free(w);
  }
}

static int encode_all(const struct bpe *b, const char *text, size_t len, int add_special,
                      struct ivec *out, struct dapo_err *e) {
  size_t bad = utf8_check(text, len);
  if (bad != len) return dapo_errf(e, DAPO_EINVAL, "invalid UTF-8 at byte %zu", bad);
  struct scratch *w = scratch_get(b);
  struct asegs g1 = {0}, g2 = {0};
  int rc = 0;
  if (!w) {
    rc = DAPO_ENOMEM;
    goto out;
  }
  if (add_special)
    for (int i = 0; i < b->n_pre && !rc; i++) rc = ivec_push(out, b->pre_ids[i]);
  if (rc || (rc = find_added(b, &b->trie_raw, text, len, &g1))) goto out;
  for (size_t i = 0; i < g1.n && !rc; i++) {
    struct aseg s1 = g1.v[i];
    if (s1.a >= 0) {
      rc = ivec_push(out, b->added[s1.a].id);
      continue;
    }
    char *norm;
    size_t nn;
    if ((rc = normalize(b, text + s1.s, s1.e - s1.s, &norm, &nn))) {
      if (rc != DAPO_ENOMEM) dapo_errf(e, rc, "normalizer: a Replace regex failed");
      break;
    }
    const char *p = norm ? norm : text + s1.s;
    rc = find_added(b, &b->trie_norm, p, nn, &g2);
    for (size_t k = 0; k < g2.n && !rc; k++) {
      if (g2.v[k].a >= 0)
        rc = ivec_push(out, b->added[g2.v[k].a].id);
      else
        rc = encode_plain(b, w, p + g2.v[k].s, g2.v[k].e - g2.v[k].s, s1.s == 0 && g2.v[k].s == 0,
                          out, e);
    }
    free(norm);
  }
  if (add_special)
    for (int i = 0; i < b->n_post && !rc; i++) rc = ivec_push(out, b->post_ids[i]);
out:
  if (rc == DAPO_ENOMEM && (!e || e->code != DAPO_ENOMEM))
    dapo_errf(e, rc, "out of memory encoding %zu bytes", len);
  scratch_put(b, w);
  free(g1.v);
  free(g2.v);
  return rc;
}

int bpe_encode(const struct bpe *b, const char *text, size_t len, int add_special, int *ids,
               int cap, int *n_out, struct dapo_err *e) {
  struct ivec out = {0};
  *n_out = 0;
  if (len > (size_t)INT32_MAX / 2)
    return dapo_errf(e, DAPO_ERANGE, "text of %zu bytes is too long to encode", len);
  int rc = encode_all(b, text, len, add_special, &out, e);
  if (rc) {
    free(out.v);
    return rc;
  }
  *n_out = (int)out.n;
  if (!ids && cap == 0) {
    free(out.v);
    return 0;
  }
  if (!ids || out.n > (size_t)(cap > 0 ? cap : 0)) {
    free(out.v);
    return dapo_errf(e, DAPO_ERANGE, "%d ids do not fit in %d", *n_out, cap);
  }
  if (out.n) memcpy(ids, out.v, out.n * sizeof *ids);
  free(out.v);
  return 0;
}

/* ---- the decoder chain ----
 * Replace, ByteFallback, Strip and Metaspace work token by token (a list of strings in, a list
 * out, as the reference's decode_chain), each step handing its tokens to the next as they come.
 * Fuse joins them: what follows it sees one growing text, character by character. Batch decode
 * pushes every token then finishes, streaming does the same over several calls, so the two give
 * the same text by construction. Only ByteFallback (a run of byte tokens, which becomes U+FFFD per
 * byte when it is not valid UTF-8 as a whole) and a Strip after Fuse (trailing characters) hold
 * text back. Every token is valid UTF-8 and so is the output. */

struct strip_state {
  int lead;      /* leading content characters stripped so far */
  int lead_done; /* a character that is not stripped came */
  int held;      /* trailing content characters held back */
};

struct bpe_dstream {
  const struct bpe *b;
  long count[BPE_MAX_COMPONENTS]; /* tokens that entered each step (Metaspace's first) */
  struct strip_state st[BPE_MAX_COMPONENTS];
  struct bvec buf[BPE_MAX_COMPONENTS]; /* each step's output token */
  struct bvec run;                     /* ByteFallback's pending bytes */
  struct bvec out;                     /* text made by the current call */
  pcre2_match_data *md;
};

/* The byte of a token "<0xXX>" as the reference reads it (u8::from_str_radix of XX: hex digits,
 * a leading '+' allowed), or -1. */
static int byte_token(const char *t, size_t n) {
  if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>') return -1;
  int v = 0, digits = 0;
  for (int i = 3; i < 5; i++) {
    int c = (unsigned char)t[i], d;
    if (c == '+' && i == 3) continue;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return -1;
    v = v * 16 + d;
    digits++;
  }
  return digits ? v : -1;
}

/* One character (UTF-8, n bytes) through the steps after Fuse from step k. */
static int ds_char(struct bpe_dstream *s, int k, const char *c, size_t n) {
  const struct bpe *b = s->b;
  for (; k < b->n_dec; k++) {
    const struct dstep *d = &b->dec[k];
    if (d->kind == DEC_FUSE) continue;
    size_t adv;
    int32_t cp = utf8_cp(c, n, &adv);
    if (d->kind == DEC_METASPACE) { /* one token after Fuse: it is the first */
      if (cp != d->ch) continue;
      if (!d->never) return 0;
      c = " ";
      n = 1;
      continue;
    }
    struct strip_state *st = &s->st[k]; /* DEC_STRIP */
    if (!st->lead_done) {
      if (st->lead < d->start && cp == d->ch) {
        st->lead++;
        return 0;
      }
      st->lead_done = 1;
    }
    if (d->stop == 0) continue;
    if (cp == d->ch) {
      if (++st->held <= d->stop) return 0;
      st->held--; /* the oldest held one is not among the last stop */
      return ds_char(s, k + 1, c, n);
    }
    char enc[4];
    size_t en = (size_t)utf8proc_encode_char(d->ch, (utf8proc_uint8_t *)enc);
    for (; st->held > 0; st->held--)
      if (ds_char(s, k + 1, enc, en)) return DAPO_ENOMEM;
  }
  return bvec_add(&s->out, c, n);
}

/* A token's text into the fused text: through the character steps when there are any. */
static int ds_fused(struct bpe_dstream *s, const char *t, size_t n) {
  if (s->b->dec_fuse + 1 >= s->b->n_dec) return bvec_add(&s->out, t, n);
  for (size_t i = 0; i < n;) {
    size_t adv;
    utf8_cp(t + i, n - i, &adv);
    if (ds_char(s, s->b->dec_fuse + 1, t + i, adv)) return DAPO_ENOMEM;
    i += adv;
  }
  return 0;
}

static int ds_token(struct bpe_dstream *s, int k, const char *t, size_t n);

/* ByteFallback (step k) hands on its pending bytes: as one string when they are valid UTF-8, else
 * one U+FFFD per byte. */
static int ds_flush_run(struct bpe_dstream *s, int k) {
  if (!s->run.n) return 0;
  int rc = 0;
  size_t n = s->run.n;
  s->run.n = 0; /* ds_token below does not touch run for steps after k */
  if (utf8_check(s->run.v, n) == n) return ds_token(s, k + 1, s->run.v, n);
  for (size_t i = 0; i < n && !rc; i++) rc = ds_token(s, k + 1, "\xEF\xBF\xBD", 3);
  return rc;
}

/* Token t[0..n) into step k. */
static int ds_token(struct bpe_dstream *s, int k, const char *t, size_t n) {
  const struct bpe *b = s->b;
  if (k >= b->dec_fuse) return ds_fused(s, t, n);
  const struct dstep *d = &b->dec[k];
  struct bvec *o = &s->buf[k];
  switch (d->kind) {
  case DEC_REPLACE: {
    size_t hits;
    if (d->rp.re && !s->md && !(s->md = pcre2_match_data_create(4, NULL))) return DAPO_ENOMEM;
    int rc = replace_all(&d->rp, s->md, t, n, o, &hits);
    if (rc) return rc;
    return hits ? ds_token(s, k + 1, o->v, o->n) : ds_token(s, k + 1, t, n);
  }
  case DEC_BYTEFALLBACK: {
    int byte = byte_token(t, n);
    if (byte >= 0) {
      char c = (char)byte;
      return bvec_add(&s->run, &c, 1);
    }
    int rc = ds_flush_run(s, k);
    return rc ? rc : ds_token(s, k + 1, t, n);
  }
  case DEC_METASPACE: {
    int first = s->count[k]++ == 0;
    o->n = 0;
    if (bvec_add(o, "", 0)) return DAPO_ENOMEM;
    for (size_t i = 0; i < n;) {
      size_t adv;
      int32_t cp = utf8_cp(t + i, n - i, &adv);
      int rc = cp != d->ch ? bvec_add(o, t + i, adv) : first && !d->never ? 0 : bvec_add(o, " ", 1);
      if (rc) return rc;
      i += adv;
    }
    return ds_token(s, k + 1, o->v, o->n);
  }
  case DEC_STRIP: { /* one token: leading and trailing content characters */
    size_t a = 0, z = n, adv;
    for (int i = 0; i < d->start && a < n && utf8_cp(t + a, n - a, &adv) == d->ch; i++) a += adv;
    for (int i = 0; i < d->stop && z > a; i++) {
      size_t back = z - 1;
      while (back > a && ((unsigned char)t[back] & 0xC0) == 0x80) back--;
      if (utf8_cp(t + back, z - back, &adv) != d->ch) break;
      z = back;
    }
    return ds_token(s, k + 1, t + a, z - a);
  }
  case DEC_FUSE: break; /* k < dec_fuse */
  }
  return ds_token(s, k + 1, t, n);
}

int bpe_decodes_by_chain(const struct bpe *b) {
  return b->dec_chain;
}

struct bpe_dstream *bpe_dstream_new(const struct bpe *b) {
  struct bpe_dstream *s = calloc(1, sizeof *s);
  if (s) s->b = b;
  return s;
}

void bpe_dstream_free(struct bpe_dstream *s) {
  if (!s) return;
  for (int k = 0; k < BPE_MAX_COMPONENTS; k++) free(s->buf[k].v);
  free(s->run.v);
  free(s->out.v);
  pcre2_match_data_free(s->md);
  free(s);
}

static const char *ds_result(struct bpe_dstream *s, int rc, size_t *len, struct dapo_err *e) {
  if (!rc && !bvec_add(&s->out, "", 0)) {
    *len = s->out.n;
    return s->out.v;
  }
  *len = 0;
  dapo_errf(e, rc == DAPO_EINVAL ? rc : DAPO_ENOMEM,
            rc == DAPO_EINVAL ? "decoder: a Replace regex failed" : "out of memory decoding");
  return NULL;
}

const char *bpe_dstream_push(struct bpe_dstream *s, int id, size_t *len, struct dapo_err *e) {
  const char *t = bpe_id_to_token(s->b, id);
  s->out.n = 0;
  if (!t) {
    *len = 0;
    dapo_errf(e, DAPO_EINVAL, "id %d is not a token id (vocabulary of %d)", id, s->b->n_ids);
    return NULL;
  }
  return ds_result(s, ds_token(s, 0, t, strlen(t)), len, e);
}

const char *bpe_dstream_finish(struct bpe_dstream *s, size_t *len, struct dapo_err *e) {
  s->out.n = 0;
  int rc = 0;
  for (int k = 0; k < s->b->dec_fuse && !rc; k++)
    if (s->b->dec[k].kind == DEC_BYTEFALLBACK) rc = ds_flush_run(s, k);
  /* held trailing characters of a Strip after Fuse are what it strips: dropped */
  return ds_result(s, rc, len, e);
}

char *bpe_decode(const struct bpe *b, const int *ids, int n, int skip_special, size_t *len_out,
                 struct dapo_err *e) {
  struct bvec raw = {0}, txt = {0};
  if (b->dec_chain) {
    struct bpe_dstream *s = bpe_dstream_new(b);
    if (!s) goto oom;
    for (int i = 0; i <= n; i++) {
      if (i < n && !bpe_id_to_token(b, ids[i])) {
        dapo_errf(e, DAPO_EINVAL, "ids[%d] = %d is not a token id (vocabulary of %d)", i, ids[i],
                  b->n_ids);
        bpe_dstream_free(s);
        free(txt.v);
        return NULL;
      }
      if (i < n && skip_special && bpe_is_special(b, ids[i])) continue;
      size_t tl;
      const char *piece =
          i < n ? bpe_dstream_push(s, ids[i], &tl, e) : bpe_dstream_finish(s, &tl, e);
      if (!piece || bvec_add(&txt, piece, tl)) {
        bpe_dstream_free(s);
        if (piece) goto oom; /* frees txt */
        free(txt.v);
        return NULL;
      }
    }
    bpe_dstream_free(s);
    if (bvec_add(&txt, "", 0)) goto oom;
    *len_out = txt.n;
    return txt.v;
  }
  int first = 1;
  for (int i = 0; i < n; i++) {
    size_t tl;
    const char *tb = bpe_token_bytes(b, ids[i], &tl);
    if (!tb) {
      free(raw.v);
      dapo_errf(e, DAPO_EINVAL, "ids[%d] = %d is not a token id (vocabulary of %d)", i, ids[i],
                b->n_ids);
      return NULL;
    }
    if (skip_special && bpe_is_special(b, ids[i])) continue;
    if ((b->dec_join && !first && bvec_add(&raw, " ", 1)) || bvec_add(&raw, tb, tl)) goto oom;
    first = 0;
  }
  if (utf8_lossy_add(&txt, raw.v ? raw.v : "", raw.n)) goto oom;
  free(raw.v);
  *len_out = txt.n;
  return txt.v;
oom:
  free(raw.v);
  free(txt.v);
  dapo_errf(e, DAPO_ENOMEM, "out of memory decoding %d tokens", n);
  return NULL;
}
