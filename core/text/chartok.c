/* chartok: a character-level tokenizer over a stated alphabet of code points (chartok.h), and
 * its Hugging Face tokenizer.json form (BPE, single-character vocabulary, no merges). Lookup is
 * a direct table for ASCII and a binary search over the sorted non-ASCII code points. */
#include "chartok.h"

#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "utf8.h"

/* Texts of the specials, indexed by id. */
static const char *const special_text[CHARTOK_N_SPECIAL] = {"<unk>", "<s>", "</s>"};

struct tok_text {
  char s[8]; /* NUL-terminated UTF-8: one code point (<= 4 bytes) or a special (<= 5 bytes) */
  unsigned char len;
};

struct cp_id {
  uint32_t cp;
  int id;
  size_t off; /* byte offset in the alphabet (for duplicate messages) */
};

struct chartok {
  char *alphabet;        /* owned copy */
  int vocab;             /* CHARTOK_N_SPECIAL + characters */
  struct tok_text *text; /* vocab entries, owned */
  int ascii[128];        /* id of each ASCII code point, -1 when absent */
  struct cp_id *wide;    /* non-ASCII code points sorted by cp, owned */
  int n_wide;
};

/* A code point for messages: 'a' (U+0061) when printable ASCII, else U+XXXX alone. */
static const char *cp_show(uint32_t cp, char *buf, size_t cap) {
  if (cp >= 0x20 && cp < 0x7F && cp != '\'')
    snprintf(buf, cap, "'%c' (U+%04X)", (char)cp, (unsigned)cp);
  else
    snprintf(buf, cap, "U+%04X", (unsigned)cp);
  return buf;
}

static int cmp_cp_id(const void *a, const void *b) {
  const struct cp_id *x = a, *y = b;
  if (x->cp != y->cp) return x->cp < y->cp ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

struct chartok *chartok_new(const char *alphabet, struct dapo_err *e) {
  struct chartok *t = NULL;
  struct cp_id *all = NULL;
  size_t len = alphabet ? strlen(alphabet) : 0;
  if (len == 0) {
    dapo_errf(e, DAPO_EINVAL, "alphabet: empty");
    return NULL;
  }
  if (len > (size_t)INT32_MAX / 2) {
    dapo_errf(e, DAPO_ERANGE, "alphabet: %zu bytes is too long", len);
    return NULL;
  }
  t = calloc(1, sizeof *t);
  all = calloc(len, sizeof *all);
  if (!t || !all) goto oom;
  t->alphabet = strdup(alphabet);
  if (!t->alphabet) goto oom;

  /* Pass 1: decode, giving the k-th character id 3 + k. */
  const unsigned char *s = (const unsigned char *)alphabet;
  int n = 0;
  for (size_t i = 0; i < len;) {
    uint32_t cp;
    size_t k = utf8_next(s + i, len - i, &cp);
    if (k == 0) {
      dapo_errf(e, DAPO_EINVAL, "alphabet: invalid UTF-8 at byte %zu (character %d, byte 0x%02X)",
                i, n, s[i]);
      goto fail;
    }
    all[n].cp = cp;
    all[n].id = CHARTOK_N_SPECIAL + n;
    all[n].off = i;
    n++;
    i += k;
  }
  t->vocab = CHARTOK_N_SPECIAL + n;
  t->text = calloc((size_t)t->vocab, sizeof *t->text);
  if (!t->text) goto oom;
  for (int id = 0; id < CHARTOK_N_SPECIAL; id++) {
    t->text[id].len = (unsigned char)strlen(special_text[id]);
    memcpy(t->text[id].s, special_text[id], t->text[id].len);
  }
  for (int k = 0; k < n; k++) {
    struct tok_text *tt = &t->text[all[k].id];
    tt->len =
        (unsigned char)utf8proc_encode_char((utf8proc_int32_t)all[k].cp, (utf8proc_uint8_t *)tt->s);
  }

  /* Pass 2: sort by code point; equal neighbours are duplicates. Report the duplicate that
   * appears first in the alphabet, and where its character first occurred. */
  qsort(all, (size_t)n, sizeof *all, cmp_cp_id);
  int dup = -1;
  for (int k = 1; k < n; k++)
    if (all[k].cp == all[k - 1].cp && (dup < 0 || all[k].off < all[dup].off)) dup = k;
  if (dup >= 0) {
    int first = dup;
    while (first > 0 && all[first - 1].cp == all[dup].cp) first--;
    char show[32];
    dapo_errf(e, DAPO_EINVAL,
              "alphabet: duplicate character %s at byte %zu (character %d), first at byte %zu",
              cp_show(all[dup].cp, show, sizeof show), all[dup].off,
              all[dup].id - CHARTOK_N_SPECIAL, all[first].off);
    goto fail;
  }
  for (int c = 0; c < 128; c++) t->ascii[c] = -1;
  int n_ascii = 0;
  while (n_ascii < n && all[n_ascii].cp < 128) {
    t->ascii[all[n_ascii].cp] = all[n_ascii].id;
    n_ascii++;
  }
  t->n_wide = n - n_ascii;
  t->wide = calloc((size_t)(t->n_wide ? t->n_wide : 1), sizeof *t->wide);
  if (!t->wide) goto oom;
  memcpy(t->wide, all + n_ascii, (size_t)t->n_wide * sizeof *t->wide);
  free(all);
  return t;
oom:
  dapo_errf(e, DAPO_ENOMEM, "out of memory building the tokenizer");
fail:
  free(all);
  chartok_free(t);
  return NULL;
}

void chartok_free(struct chartok *t) {
  if (!t) return;
  free(t->alphabet);
  free(t->text);
  free(t->wide);
  free(t);
}

int chartok_vocab_size(const struct chartok *t) {
  return t->vocab;
}

const char *chartok_alphabet(const struct chartok *t) {
  return t->alphabet;
}

const char *chartok_token_text(const struct chartok *t, int id) {
  if (id < 0 || id >= t->vocab) return NULL;
  return t->text[id].s;
}

static int lookup(const struct chartok *t, uint32_t cp) {
  if (cp < 128) return t->ascii[cp] >= 0 ? t->ascii[cp] : CHARTOK_UNK;
  int lo = 0, hi = t->n_wide;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (t->wide[mid].cp < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < t->n_wide && t->wide[lo].cp == cp ? t->wide[lo].id : CHARTOK_UNK;
}

/* The special whose text starts s[0..len), or -1. No special is a prefix of another, so the
 * first match is also the longest (Hugging Face matches added tokens leftmost-longest). */
static int match_special(const char *s, size_t len) {
  if (len == 0 || s[0] != '<') return -1;
  for (int id = 0; id < CHARTOK_N_SPECIAL; id++) {
    size_t n = strlen(special_text[id]);
    if (n <= len && memcmp(s, special_text[id], n) == 0) return id;
  }
  return -1;
}

int chartok_encode(const struct chartok *t, const char *text, size_t len, int *ids, int cap,
                   int *n_out, struct dapo_err *e) {
  assert(cap >= 0 && (ids || cap == 0));
  const unsigned char *s = (const unsigned char *)text;
  size_t count = 0;
  *n_out = 0;
  for (size_t i = 0; i < len;) {
    int id = match_special(text + i, len - i);
    if (id >= 0) {
      i += t->text[id].len;
    } else {
      uint32_t cp;
      size_t k = utf8_next(s + i, len - i, &cp);
      if (k == 0)
        return dapo_errf(e, DAPO_EINVAL, "text: invalid UTF-8 at byte %zu (byte 0x%02X)", i, s[i]);
      id = lookup(t, cp);
      i += k;
    }
    if (count < (size_t)cap) ids[count] = id;
    if (count == (size_t)INT32_MAX)
      return dapo_errf(e, DAPO_ERANGE, "text: more than %d tokens", INT32_MAX);
    count++;
  }
  *n_out = (int)count;
  if (ids && count > (size_t)cap)
    return dapo_errf(e, DAPO_ERANGE, "text: %zu tokens do not fit in %d", count, cap);
  return 0;
}

int chartok_decode(const struct chartok *t, const int *ids, int n, char *buf, size_t cap,
                   size_t *len_out, int skip_special, struct dapo_err *e) {
  assert(n >= 0 && (buf || cap == 0));
  size_t need = 0;
  *len_out = 0;
  for (int i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->vocab)
      return dapo_errf(e, DAPO_EINVAL, "ids[%d]: %d outside the vocabulary [0, %d)", i, ids[i],
                       t->vocab);
    if (!(skip_special && ids[i] < CHARTOK_N_SPECIAL)) need += t->text[ids[i]].len;
  }
  *len_out = need;
  if (!buf) return 0;
  size_t w = 0;
  for (int i = 0; i < n; i++) {
    if (skip_special && ids[i] < CHARTOK_N_SPECIAL) continue;
    const struct tok_text *tt = &t->text[ids[i]];
    if (w + tt->len + 1 > cap) break;
    memcpy(buf + w, tt->s, tt->len);
    w += tt->len;
  }
  if (cap > 0) buf[w] = '\0';
  if (need + 1 > cap)
    return dapo_errf(e, DAPO_ERANGE, "decoded text of %zu bytes does not fit in %zu", need, cap);
  return 0;
}

json_t *chartok_to_json(const struct chartok *t) {
  json_t *j = json_object(), *added = json_array(), *vocab = json_object(), *model = json_object();
  if (!j || !added || !vocab || !model) goto oom;
  for (int id = 0; id < CHARTOK_N_SPECIAL; id++) {
    json_t *a =
        json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", special_text[id],
                  "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
    if (json_array_append_new(added, a)) goto oom;
  }
  for (int id = 0; id < t->vocab; id++)
    if (json_object_set_new(vocab, t->text[id].s, json_integer(id))) goto oom;
  /* jansson keeps insertion order, so keys appear in the order HF writes them. Every set_new
   * below runs (|=) and steals its value even on failure, so nothing leaks on out of memory. */
  int bad = 0;
  bad |= json_object_set_new(model, "type", json_string("BPE"));
  bad |= json_object_set_new(model, "dropout", json_null());
  bad |= json_object_set_new(model, "unk_token", json_string(special_text[CHARTOK_UNK]));
  bad |= json_object_set_new(model, "continuing_subword_prefix", json_null());
  bad |= json_object_set_new(model, "end_of_word_suffix", json_null());
  bad |= json_object_set_new(model, "fuse_unk", json_false());
  bad |= json_object_set_new(model, "byte_fallback", json_false());
  bad |= json_object_set_new(model, "ignore_merges", json_false());
  bad |= json_object_set_new(model, "vocab", vocab);
  bad |= json_object_set_new(model, "merges", json_array());
  bad |= json_object_set_new(j, "version", json_string("1.0"));
  bad |= json_object_set_new(j, "truncation", json_null());
  bad |= json_object_set_new(j, "padding", json_null());
  bad |= json_object_set_new(j, "added_tokens", added);
  bad |= json_object_set_new(j, "normalizer", json_null());
  bad |= json_object_set_new(j, "pre_tokenizer", json_null());
  bad |= json_object_set_new(j, "post_processor", json_null());
  bad |= json_object_set_new(j, "decoder", json_pack("{s:s}", "type", "Fuse"));
  bad |= json_object_set_new(j, "model", model);
  if (bad) {
    json_decref(j);
    return NULL;
  }
  return j;
oom:
  json_decref(vocab);
  json_decref(added);
  json_decref(model);
  json_decref(j);
  return NULL;
}

/* --- chartok_from_json: accept only the form chartok_to_json writes. --- */

/* Absent or null. */
static int is_none(const json_t *v) {
  return !v || json_is_null(v);
}

/* Absent, null or false. */
static int is_off(const json_t *v) {
  return !v || json_is_null(v) || json_is_false(v);
}

static const char *type_of(const json_t *v) {
  const char *s = json_string_value(json_object_get(v, "type"));
  return s ? s : "?";
}

static int check_model(const json_t *m, struct dapo_err *e) {
  if (!json_is_object(m)) return dapo_errf(e, DAPO_EFORMAT, "model: missing or not an object");
  const char *type = json_string_value(json_object_get(m, "type"));
  if (!type || strcmp(type, "BPE") != 0)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "model.type: '%s' is not supported (character-level BPE only; WordPiece, "
                     "Unigram and WordLevel models are not implemented)",
                     type ? type : "(none)");
  json_t *merges = json_object_get(m, "merges");
  if (merges && !json_is_array(merges))
    return dapo_errf(e, DAPO_EFORMAT, "model.merges: not an array");
  if (json_array_size(merges) > 0)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "model.merges: not a character-level tokenizer (byte-level BPE lands with "
                     "issue 5)");
  const char *unk = json_string_value(json_object_get(m, "unk_token"));
  if (!unk || strcmp(unk, special_text[CHARTOK_UNK]) != 0)
    return dapo_errf(e, DAPO_EUNSUPPORTED, "model.unk_token: must be \"%s\"",
                     special_text[CHARTOK_UNK]);
  static const char *const must_be_null[] = {"dropout", "continuing_subword_prefix",
                                             "end_of_word_suffix"};
  for (size_t k = 0; k < sizeof must_be_null / sizeof *must_be_null; k++)
    if (!is_none(json_object_get(m, must_be_null[k])))
      return dapo_errf(e, DAPO_EUNSUPPORTED, "model.%s: must be null for a character-level BPE",
                       must_be_null[k]);
  static const char *const must_be_false[] = {"fuse_unk", "byte_fallback"};
  for (size_t k = 0; k < sizeof must_be_false / sizeof *must_be_false; k++)
    if (!is_off(json_object_get(m, must_be_false[k])))
      return dapo_errf(e, DAPO_EUNSUPPORTED, "model.%s: must be false for a character-level BPE",
                       must_be_false[k]);
  if (!json_is_object(json_object_get(m, "vocab")))
    return dapo_errf(e, DAPO_EFORMAT, "model.vocab: missing or not an object");
  return 0;
}

static int check_pipeline(const json_t *j, struct dapo_err *e) {
  static const char *const must_be_null[] = {"truncation", "padding", "normalizer", "pre_tokenizer",
                                             "post_processor"};
  for (size_t k = 0; k < sizeof must_be_null / sizeof *must_be_null; k++) {
    json_t *v = json_object_get(j, must_be_null[k]);
    if (!is_none(v))
      return dapo_errf(e, DAPO_EUNSUPPORTED,
                       "%s: '%s' is not supported (a character-level tokenizer has none)",
                       must_be_null[k], json_is_object(v) ? type_of(v) : "set");
  }
  json_t *d = json_object_get(j, "decoder");
  if (!json_is_object(d) || strcmp(type_of(d), "Fuse") != 0)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "decoder: '%s' is not supported (a character-level tokenizer uses Fuse)",
                     json_is_object(d) ? type_of(d) : "(none)");
  return 0;
}

/* added_tokens must be exactly the three specials, special, with no stripping. */
static int check_added(const json_t *added, struct dapo_err *e) {
  if (!json_is_array(added))
    return dapo_errf(e, DAPO_EFORMAT, "added_tokens: missing or not an array");
  int seen[CHARTOK_N_SPECIAL] = {0};
  size_t i;
  json_t *a;
  json_array_foreach(added, i, a) {
    json_t *idj = json_object_get(a, "id");
    const char *content = json_string_value(json_object_get(a, "content"));
    if (!json_is_integer(idj) || !content)
      return dapo_errf(e, DAPO_EFORMAT, "added_tokens[%zu]: needs an integer id and a content", i);
    json_int_t id = json_integer_value(idj);
    if (id < 0 || id >= CHARTOK_N_SPECIAL || strcmp(content, special_text[id]) != 0)
      return dapo_errf(e, DAPO_EUNSUPPORTED,
                       "added_tokens[%zu]: %" JSON_INTEGER_FORMAT
                       " is not one of <unk>=0, <s>=1, </s>=2",
                       i, id);
    if (seen[id]++)
      return dapo_errf(e, DAPO_EFORMAT, "added_tokens[%zu]: id %" JSON_INTEGER_FORMAT " repeated",
                       i, id);
    if (!json_is_true(json_object_get(a, "special")))
      return dapo_errf(e, DAPO_EUNSUPPORTED, "added_tokens[%zu]: %s must be special", i, content);
    static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
    for (size_t k = 0; k < sizeof flags / sizeof *flags; k++)
      if (!is_off(json_object_get(a, flags[k])))
        return dapo_errf(e, DAPO_EUNSUPPORTED, "added_tokens[%zu].%s: must be false", i, flags[k]);
  }
  for (int id = 0; id < CHARTOK_N_SPECIAL; id++)
    if (!seen[id])
      return dapo_errf(e, DAPO_EUNSUPPORTED, "added_tokens: %s (id %d) is missing",
                       special_text[id], id);
  return 0;
}

struct chartok *chartok_from_json(const json_t *j, struct dapo_err *e) {
  const char **by_id = NULL;
  size_t *by_id_len = NULL;
  char *alphabet = NULL;
  struct chartok *t = NULL;
  if (!json_is_object(j)) {
    dapo_errf(e, DAPO_EFORMAT, "tokenizer.json: not a JSON object");
    return NULL;
  }
  json_t *m = json_object_get(j, "model");
  if (check_model(m, e) || check_pipeline(j, e) ||
      check_added(json_object_get(j, "added_tokens"), e))
    return NULL;

  json_t *vocab = json_object_get(m, "vocab");
  size_t n = json_object_size(vocab);
  if (n <= CHARTOK_N_SPECIAL || n > 0x110000 + CHARTOK_N_SPECIAL) {
    dapo_errf(e, DAPO_EFORMAT,
              "model.vocab: %zu entries (expected the 3 specials and 1 to %d "
              "characters)",
              n, 0x110000);
    return NULL;
  }
  by_id = calloc(n, sizeof *by_id);
  by_id_len = calloc(n, sizeof *by_id_len);
  alphabet = malloc(4 * n + 1);
  if (!by_id || !by_id_len || !alphabet) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory reading the tokenizer");
    goto out;
  }
  const char *key;
  size_t key_len;
  json_t *v;
  json_object_keylen_foreach((json_t *)vocab, key, key_len, v) {
    json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
    if (id < 0 || (size_t)id >= n) {
      dapo_errf(e, DAPO_EFORMAT, "model.vocab: \"%.32s\" has no id in [0, %zu)", key, n);
      goto out;
    }
    if (by_id[id]) {
      dapo_errf(e, DAPO_EFORMAT, "model.vocab: id %" JSON_INTEGER_FORMAT " given twice", id);
      goto out;
    }
    by_id[id] = key;
    by_id_len[id] = key_len;
  }
  for (int id = 0; id < CHARTOK_N_SPECIAL; id++)
    if (by_id_len[id] != strlen(special_text[id]) || strcmp(by_id[id], special_text[id]) != 0) {
      dapo_errf(e, DAPO_EUNSUPPORTED, "model.vocab: id %d is \"%.32s\", expected \"%s\"", id,
                by_id[id], special_text[id]);
      goto out;
    }
  size_t w = 0;
  for (size_t id = CHARTOK_N_SPECIAL; id < n; id++) {
    const unsigned char *s = (const unsigned char *)by_id[id];
    size_t len = by_id_len[id];
    uint32_t cp;
    size_t k = utf8_next(s, len, &cp);
    if (k == 0 || k != len || cp == 0) {
      dapo_errf(e, DAPO_EUNSUPPORTED,
                "model.vocab: token %zu \"%.32s\" is not a single character (not a "
                "character-level tokenizer)",
                id, by_id[id]);
      goto out;
    }
    memcpy(alphabet + w, s, k);
    w += k;
  }
  alphabet[w] = '\0';
  t = chartok_new(alphabet, e);
  if (!t) dapo_err_prefix(e, "model.vocab: ");
out:
  free(by_id);
  free(by_id_len);
  free(alphabet);
  return t;
}
