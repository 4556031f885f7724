/* text_similarity metrics (similarity.h). Words are interned to integer ids shared by the two
 * texts, n-grams are compared as runs of ids (sorted multisets, merged to count overlaps), and
 * fuzzy_match works on code points with an LCS table (so its inputs are bounded:
 * FUZZY_MAX_CHARS). */
#include "similarity.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

#define FUZZY_MAX_CHARS 256 /* fuzzy_match reads the first 256 code points of each text */

static const char *const NAMES[SIM_COUNT] = {"fuzzy_match", "bleu",    "gleu",    "meteor",
                                             "rouge_1",     "rouge_2", "rouge_3", "rouge_4",
                                             "rouge_5",     "rouge_l"};

int sim_metric_find(const char *name) {
  for (int i = 0; name && i < SIM_COUNT; i++)
    if (!strcmp(NAMES[i], name)) return i;
  return -1;
}

const char *sim_metric_name(enum sim_metric m) {
  return (int)m >= 0 && m < SIM_COUNT ? NAMES[m] : "unknown";
}

/* ---- words ---- */

struct span {
  const char *p;
  int len;
};

static int is_word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
}

static unsigned char lower(unsigned char c) {
  return c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c;
}

/* The words of s[0..n) as spans into s; *out owned (free). Returns the count, -1 on OOM. */
static int split_words(const char *s, size_t n, struct span **out) {
  int cap = 16, k = 0;
  struct span *w = malloc((size_t)cap * sizeof *w);
  if (!w) return -1;
  for (size_t i = 0; i < n;) {
    while (i < n && !is_word_byte((unsigned char)s[i])) i++;
    size_t st = i;
    while (i < n && is_word_byte((unsigned char)s[i])) i++;
    if (i == st) continue;
    if (k == cap) {
      struct span *nw = realloc(w, (size_t)(cap *= 2) * sizeof *w);
      if (!nw) return free(w), -1;
      w = nw;
    }
    w[k++] = (struct span){s + st, (int)(i - st)};
  }
  *out = w;
  return k;
}

static int span_cmp(const struct span *a, const struct span *b) {
  int n = a->len < b->len ? a->len : b->len;
  for (int i = 0; i < n; i++) {
    int d = (int)lower((unsigned char)a->p[i]) - (int)lower((unsigned char)b->p[i]);
    if (d) return d;
  }
  return a->len - b->len;
}

static int span_cmp_q(const void *a, const void *b) {
  return span_cmp(a, b);
}

/* Both texts as word ids (equal words, case-folded, get equal ids). */
struct words {
  int *a, *b;
  int na, nb;
};

static void words_free(struct words *w) {
  free(w->a);
  free(w->b);
}

static int words_of(const char *x, const char *y, struct words *w) {
  memset(w, 0, sizeof *w);
  size_t lx = strnlen(x, SIM_MAX_BYTES), ly = strnlen(y, SIM_MAX_BYTES);
  struct span *sx = NULL, *sy = NULL, *all = NULL;
  int nx = split_words(x, lx, &sx), ny = nx < 0 ? -1 : split_words(y, ly, &sy), rc = -1;
  if (nx < 0 || ny < 0) goto out;
  all = malloc((size_t)(nx + ny + 1) * sizeof *all);
  w->a = malloc((size_t)(nx + 1) * sizeof *w->a);
  w->b = malloc((size_t)(ny + 1) * sizeof *w->b);
  if (!all || !w->a || !w->b) goto out;
  memcpy(all, sx, (size_t)nx * sizeof *all);
  memcpy(all + nx, sy, (size_t)ny * sizeof *all);
  qsort(all, (size_t)(nx + ny), sizeof *all, span_cmp_q);
  int nu = 0; /* unique words, sorted: a word's id is its index */
  for (int i = 0; i < nx + ny; i++)
    if (nu == 0 || span_cmp(&all[nu - 1], &all[i])) all[nu++] = all[i];
  for (int side = 0; side < 2; side++) {
    struct span *src = side ? sy : sx;
    int *dst = side ? w->b : w->a, n = side ? ny : nx;
    for (int i = 0; i < n; i++) {
      int lo = 0, hi = nu - 1;
      while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (span_cmp(&all[mid], &src[i]) < 0)
          lo = mid + 1;
        else
          hi = mid;
      }
      dst[i] = lo;
    }
  }
  w->na = nx;
  w->nb = ny;
  rc = 0;
out:
  free(sx);
  free(sy);
  free(all);
  if (rc) words_free(w);
  return rc;
}

/* ---- n-grams as sorted multisets ---- */

struct gram_sort {
  const int *ids;
  int n;
};
static _Thread_local struct gram_sort g_sort; /* qsort has no context argument */

static int gram_cmp(const int *ids, int i, int j, int n) {
  for (int k = 0; k < n; k++)
    if (ids[i + k] != ids[j + k]) return ids[i + k] < ids[j + k] ? -1 : 1;
  return 0;
}

static int gram_cmp_q(const void *a, const void *b) {
  return gram_cmp(g_sort.ids, *(const int *)a, *(const int *)b, g_sort.n);
}

/* Start offsets of the n-grams of ids[0..len), sorted; count in *k. NULL on OOM. */
static int *grams(const int *ids, int len, int n, int *k) {
  *k = len >= n ? len - n + 1 : 0;
  int *o = malloc((size_t)(*k + 1) * sizeof *o);
  if (!o) return NULL;
  for (int i = 0; i < *k; i++) o[i] = i;
  g_sort = (struct gram_sort){ids, n};
  qsort(o, (size_t)*k, sizeof *o, gram_cmp_q);
  return o;
}

static int cmp_across(const int *a, int i, const int *b, int j, int n) {
  for (int k = 0; k < n; k++)
    if (a[i + k] != b[j + k]) return a[i + k] < b[j + k] ? -1 : 1;
  return 0;
}

/* Clipped matches of n-grams: sum over grams of min(count in a, count in b). -1 on OOM; totals
 * in *ta, *tb. */
static long overlap(const struct words *w, int n, long *ta, long *tb) {
  int ka, kb;
  int *ga = grams(w->a, w->na, n, &ka), *gb = ga ? grams(w->b, w->nb, n, &kb) : NULL;
  if (!ga || !gb) {
    free(ga);
    return -1;
  }
  long m = 0;
  for (int i = 0, j = 0; i < ka && j < kb;) {
    int c = cmp_across(w->a, ga[i], w->b, gb[j], n);
    if (c < 0)
      i++;
    else if (c > 0)
      j++;
    else
      m++, i++, j++;
  }
  free(ga);
  free(gb);
  *ta = ka;
  *tb = kb;
  return m;
}

static double fmeasure(double p, double r) {
  return p + r > 0 ? 2 * p * r / (p + r) : 0;
}

/* a: the output (hypothesis), b: the reference. */
static double rouge_n(const struct words *w, int n) {
  long ta, tb, m = overlap(w, n, &ta, &tb);
  if (m < 0) return -1;
  if (ta == 0 || tb == 0) return 0;
  return fmeasure((double)m / (double)ta, (double)m / (double)tb);
}

static long lcs_ints(const int *a, int na, const int *b, int nb) {
  long *row = calloc((size_t)nb + 1, sizeof *row);
  if (!row) return -1;
  for (int i = 1; i <= na; i++) {
    long diag = 0;
    for (int j = 1; j <= nb; j++) {
      long up = row[j];
      row[j] = a[i - 1] == b[j - 1] ? diag + 1 : (row[j - 1] > up ? row[j - 1] : up);
      diag = up;
    }
  }
  long r = row[nb];
  free(row);
  return r;
}

static double rouge_l(const struct words *w) {
  if (w->na == 0 || w->nb == 0) return 0;
  long l = lcs_ints(w->a, w->na, w->b, w->nb);
  if (l < 0) return -1;
  return fmeasure((double)l / w->na, (double)l / w->nb);
}

/* nltk's sentence_bleu with one reference, weights (0.25,)*4, SmoothingFunction().method0. */
static double bleu(const struct words *w) {
  double logsum = 0;
  for (int n = 1; n <= 4; n++) {
    long ta, tb, m = overlap(w, n, &ta, &tb);
    if (m < 0) return -1;
    if (n == 1 && m == 0) return 0;
    double p = m > 0 ? (double)m / (double)(ta > 0 ? ta : 1) : 2.2250738585072014e-308;
    logsum += 0.25 * log(p);
  }
  double c = w->na, r = w->nb;
  double bp = c > r ? 1 : (c == 0 ? 0 : exp(1 - r / c));
  return bp * exp(logsum);
}

/* nltk's sentence_gleu: n-grams of orders 1..4 together. */
static double gleu(const struct words *w) {
  long match = 0, ta_all = 0, tb_all = 0;
  for (int n = 1; n <= 4; n++) {
    long ta, tb, m = overlap(w, n, &ta, &tb);
    if (m < 0) return -1;
    match += m, ta_all += ta, tb_all += tb;
  }
  long den = ta_all > tb_all ? ta_all : tb_all;
  return den > 0 ? (double)match / (double)den : 0;
}

/* nltk's meteor_score, exact stage only: hypothesis words are aligned, last first, to the last
 * unmatched equal reference word (nltk's _match_enums order). */
static double meteor(const struct words *w) {
  int na = w->na, nb = w->nb;
  if (na == 0 || nb == 0) return 0;
  int *ref_of = malloc((size_t)na * sizeof *ref_of);
  unsigned char *used = calloc((size_t)nb, 1);
  if (!ref_of || !used) {
    free(ref_of);
    free(used);
    return -1;
  }
  int m = 0;
  for (int i = na - 1; i >= 0; i--) {
    ref_of[i] = -1;
    for (int j = nb - 1; j >= 0; j--) {
      if (!used[j] && w->a[i] == w->b[j]) {
        used[j] = 1;
        ref_of[i] = j;
        m++;
        break;
      }
    }
  }
  double score = 0;
  if (m > 0) {
    /* chunks: runs of matches adjacent in both texts, in hypothesis order */
    int chunks = 0, prev_i = -2, prev_j = -2;
    for (int i = 0; i < na; i++) {
      if (ref_of[i] < 0) continue;
      if (!(i == prev_i + 1 && ref_of[i] == prev_j + 1)) chunks++;
      prev_i = i;
      prev_j = ref_of[i];
    }
    double p = (double)m / na, r = (double)m / nb, alpha = 0.9;
    double fmean = p * r / (alpha * p + (1 - alpha) * r);
    double frag = (double)chunks / m;
    score = (1 - 0.5 * pow(frag, 3)) * fmean;
  }
  free(ref_of);
  free(used);
  return score;
}

/* ---- fuzzy_match: rapidfuzz's WRatio ---- */

struct cps {
  uint32_t c[FUZZY_MAX_CHARS];
  int n;
};

static void decode(const char *s, struct cps *o) {
  o->n = 0;
  size_t len = strlen(s);
  for (size_t i = 0; i < len && o->n < FUZZY_MAX_CHARS;) {
    uint32_t cp;
    size_t l = utf8_next((const unsigned char *)s + i, len - i, &cp);
    if (!l) {
      cp = 0xDC00u + (unsigned char)s[i]; /* a lone byte: its own character */
      l = 1;
    }
    o->c[o->n++] = cp;
    i += l;
  }
}

static int lcs_cp(const uint32_t *a, int na, const uint32_t *b, int nb) {
  int row[2 * FUZZY_MAX_CHARS + 2];
  if (nb > 2 * FUZZY_MAX_CHARS + 1) nb = 2 * FUZZY_MAX_CHARS + 1;
  for (int j = 0; j <= nb; j++) row[j] = 0;
  for (int i = 1; i <= na; i++) {
    int diag = 0;
    for (int j = 1; j <= nb; j++) {
      int up = row[j];
      row[j] = a[i - 1] == b[j - 1] ? diag + 1 : (row[j - 1] > up ? row[j - 1] : up);
      diag = up;
    }
  }
  return row[nb];
}

/* fuzz.ratio: 100 * (1 - indel distance / total length). */
static double ratio(const uint32_t *a, int na, const uint32_t *b, int nb) {
  if (na + nb == 0) return 100;
  int l = lcs_cp(a, na, b, nb);
  return 100.0 * (2.0 * l) / (na + nb);
}

/* fuzz.partial_ratio: the best ratio of the shorter text against any window of the longer one
 * of the shorter's length (windows cut at the ends included, as rapidfuzz aligns them). */
static double partial_ratio(const uint32_t *a, int na, const uint32_t *b, int nb) {
  if (na > nb) {
    const uint32_t *t = a;
    a = b, b = t;
    int tn = na;
    na = nb, nb = tn;
  }
  if (na == 0) return nb == 0 ? 100 : 0;
  double best = 0;
  for (int i = -(na - 1); i < nb && best < 100; i++) {
    int s = i < 0 ? 0 : i, e = i + na > nb ? nb : i + na;
    double r = ratio(a, na, b + s, e - s);
    if (r > best) best = r;
  }
  if (na == nb) {
    for (int i = -(na - 1); i < na && best < 100; i++) {
      int s = i < 0 ? 0 : i, e = i + na > na ? na : i + na;
      double r = ratio(b, nb, a + s, e - s);
      if (r > best) best = r;
    }
  }
  return best;
}

/* Whitespace-separated tokens of a code point string. */
struct toks {
  int st[FUZZY_MAX_CHARS], len[FUZZY_MAX_CHARS];
  int n;
  const uint32_t *c;
};

static int is_ws(uint32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static void tokens_of(const struct cps *s, struct toks *t) {
  t->n = 0;
  t->c = s->c;
  for (int i = 0; i < s->n;) {
    while (i < s->n && is_ws(s->c[i])) i++;
    int st = i;
    while (i < s->n && !is_ws(s->c[i])) i++;
    if (i > st) t->st[t->n] = st, t->len[t->n] = i - st, t->n++;
  }
}

static int tok_cmp2(const struct toks *a, int i, const struct toks *b, int j) {
  int la = a->len[i], lb = b->len[j], n = la < lb ? la : lb;
  for (int k = 0; k < n; k++) {
    uint32_t x = a->c[a->st[i] + k], y = b->c[b->st[j] + k];
    if (x != y) return x < y ? -1 : 1;
  }
  return la - lb;
}

static _Thread_local const struct toks *g_toks;
static int tok_cmp_q(const void *x, const void *y) {
  return tok_cmp2(g_toks, *(const int *)x, g_toks, *(const int *)y);
}

/* The sorted, de-duplicated (dedup) token indices of t in idx; returns their count. */
static int sorted_tokens(const struct toks *t, int *idx, int dedup) {
  for (int i = 0; i < t->n; i++) idx[i] = i;
  g_toks = t;
  qsort(idx, (size_t)t->n, sizeof *idx, tok_cmp_q);
  if (!dedup) return t->n;
  int k = 0;
  for (int i = 0; i < t->n; i++)
    if (k == 0 || tok_cmp2(t, idx[k - 1], t, idx[i])) idx[k++] = idx[i];
  return k;
}

/* Joins tokens idx[0..k) of t with single spaces into out; returns the length. */
static int join(const struct toks *t, const int *idx, int k, uint32_t *out) {
  int n = 0;
  for (int i = 0; i < k; i++) {
    if (i) out[n++] = ' ';
    memcpy(out + n, t->c + t->st[idx[i]], (size_t)t->len[idx[i]] * sizeof *out);
    n += t->len[idx[i]];
  }
  return n;
}

struct token_sets {
  uint32_t sect[FUZZY_MAX_CHARS], ab[FUZZY_MAX_CHARS], ba[FUZZY_MAX_CHARS];
  int n_sect, n_ab, n_ba;                            /* joined lengths */
  int k_sect, k_ab, k_ba;                            /* token counts */
  uint32_t sa[FUZZY_MAX_CHARS], sb[FUZZY_MAX_CHARS]; /* all tokens sorted, joined */
  int n_sa, n_sb, k_a, k_b;
};

static void token_sets(const struct toks *ta, const struct toks *tb, struct token_sets *o) {
  int ia[FUZZY_MAX_CHARS], ib[FUZZY_MAX_CHARS], is[FUZZY_MAX_CHARS], iab[FUZZY_MAX_CHARS],
      iba[FUZZY_MAX_CHARS];
  int ka = sorted_tokens(ta, ia, 1), kb = sorted_tokens(tb, ib, 1), ks = 0, kab = 0, kba = 0;
  for (int i = 0, j = 0; i < ka || j < kb;) {
    int c = i == ka ? 1 : j == kb ? -1 : tok_cmp2(ta, ia[i], tb, ib[j]);
    if (c == 0)
      is[ks++] = ia[i], i++, j++;
    else if (c < 0)
      iab[kab++] = ia[i++];
    else
      iba[kba++] = ib[j++];
  }
  o->n_sect = join(ta, is, ks, o->sect);
  o->n_ab = join(ta, iab, kab, o->ab);
  o->n_ba = join(tb, iba, kba, o->ba);
  o->k_sect = ks, o->k_ab = kab, o->k_ba = kba;
  o->n_sa = join(ta, ia, ka, o->sa);
  o->n_sb = join(tb, ib, kb, o->sb);
  o->k_a = ka, o->k_b = kb;
}

static double token_set_ratio(const struct token_sets *s) {
  if (s->k_sect && (!s->k_ab || !s->k_ba)) return 100;
  int sect_ab = s->n_sect + (s->n_sect != 0) + s->n_ab;
  int sect_ba = s->n_sect + (s->n_sect != 0) + s->n_ba;
  int lcs = lcs_cp(s->ab, s->n_ab, s->ba, s->n_ba);
  int dist = s->n_ab + s->n_ba - 2 * lcs;
  double best = sect_ab + sect_ba ? 100.0 * (1.0 - (double)dist / (sect_ab + sect_ba)) : 0;
  if (s->n_sect) {
    double r1 = 100.0 * (1.0 - (double)((s->n_sect != 0) + s->n_ab) / (s->n_sect + sect_ab));
    double r2 = 100.0 * (1.0 - (double)((s->n_sect != 0) + s->n_ba) / (s->n_sect + sect_ba));
    if (r1 > best) best = r1;
    if (r2 > best) best = r2;
  }
  return best;
}

static double token_sort_ratio(const struct toks *ta, const struct toks *tb) {
  int ia[FUZZY_MAX_CHARS], ib[FUZZY_MAX_CHARS];
  uint32_t ja[FUZZY_MAX_CHARS], jb[FUZZY_MAX_CHARS];
  int ka = sorted_tokens(ta, ia, 0), kb = sorted_tokens(tb, ib, 0);
  int na = join(ta, ia, ka, ja), nb = join(tb, ib, kb, jb);
  return ratio(ja, na, jb, nb);
}

static double partial_token_ratio(const struct toks *ta, const struct toks *tb,
                                  const struct token_sets *s) {
  if (s->k_sect) return 100;
  int ia[FUZZY_MAX_CHARS], ib[FUZZY_MAX_CHARS];
  uint32_t ja[FUZZY_MAX_CHARS], jb[FUZZY_MAX_CHARS];
  int ka = sorted_tokens(ta, ia, 0), kb = sorted_tokens(tb, ib, 0);
  int na = join(ta, ia, ka, ja), nb = join(tb, ib, kb, jb);
  double best = partial_ratio(ja, na, jb, nb);
  if (s->k_ab == s->k_a && s->k_ba == s->k_b) return best;
  double r = partial_ratio(s->ab, s->n_ab, s->ba, s->n_ba);
  return r > best ? r : best;
}

static double wratio(const char *x, const char *y) {
  struct cps *a = malloc(sizeof *a), *b = malloc(sizeof *b);
  struct toks *ta = malloc(sizeof *ta), *tb = malloc(sizeof *tb);
  struct token_sets *s = malloc(sizeof *s);
  double r = -1;
  if (!a || !b || !ta || !tb || !s) goto out;
  decode(x, a);
  decode(y, b);
  r = 0;
  if (a->n == 0 || b->n == 0) goto out;
  tokens_of(a, ta);
  tokens_of(b, tb);
  token_sets(ta, tb, s);
  double len_ratio = a->n > b->n ? (double)a->n / b->n : (double)b->n / a->n;
  r = ratio(a->c, a->n, b->c, b->n);
  if (len_ratio < 1.5) {
    double t = token_sort_ratio(ta, tb), u = token_set_ratio(s);
    t = (t > u ? t : u) * 0.95;
    r = r > t ? r : t;
    goto out;
  }
  double partial_scale = len_ratio < 8.0 ? 0.9 : 0.6;
  double p = partial_ratio(a->c, a->n, b->c, b->n) * partial_scale;
  double q = partial_token_ratio(ta, tb, s) * 0.95 * partial_scale;
  r = r > p ? r : p;
  r = r > q ? r : q;
out:
  free(a);
  free(b);
  free(ta);
  free(tb);
  free(s);
  return r < 0 ? -1 : r / 100.0;
}

double sim_score(enum sim_metric m, const char *output, const char *reference) {
  if (!output) output = "";
  if (!reference) reference = "";
  if (m == SIM_FUZZY_MATCH) return wratio(output, reference);
  struct words w;
  if (words_of(output, reference, &w)) return -1;
  double r;
  switch (m) {
  case SIM_BLEU: r = bleu(&w); break;
  case SIM_GLEU: r = gleu(&w); break;
  case SIM_METEOR: r = meteor(&w); break;
  case SIM_ROUGE_L: r = rouge_l(&w); break;
  default: r = rouge_n(&w, (int)m - SIM_ROUGE_1 + 1); break;
  }
  words_free(&w);
  return r;
}
