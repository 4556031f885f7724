/* The completion service (completions.h): the queue and its sampling threads, admission of a
 * completion's memory in the ledger (admit.h), the cache of opened models, and the tickets that
 * callers poll and the bus announces. */
#include "completions.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "admit.h"
#include "bus.h"
#include "jsongrammar.h"
#include "log.h"
#include "pool.h"
#include "rng.h"
#include "sampler.h"
#include "server.h"
#include "tokenizer.h"

/* Entries of a model folder that its stamp looks at (a model folder has about ten). */
#define STAMP_ENTRIES_MAX 4096

/* One opened model: in the cache list while it may serve later completions; a stale one (its
 * folder changed) is off the list and closed when its last user is done. Its weights are
 * reserved in the ledger while refs > 0, cached while it is idle on the list. */
struct cmodel {
  char *spec;     /* the lm_open spec (owned) */
  uint64_t stamp; /* folder_stamp when it was opened */
  struct lm lm;
  uint64_t bytes;      /* its weights, as the ledger counts them */
  int refs;            /* completions using it now (the one loading it included) */
  int listed;          /* on c->models */
  uint64_t used_tick;  /* c->tick when last taken: least recently used goes first */
  struct cmodel *next; /* c->models, or a list of models to close */
  /* structured outputs: the vocabulary sorted by bytes, built by the first request with a
   * response_format (set once, atomically; freed with the model) */
  struct jvocab *jv;
};

/* m's sorted vocabulary of V ids (built once, kept with the model); NULL + e on failure. */
static struct jvocab *model_jvocab(struct cmodel *m, int V, struct dapo_err *e) {
  struct jvocab *jv = __atomic_load_n(&m->jv, __ATOMIC_ACQUIRE), *none = NULL;
  if (jv) return jv;
  if (!(jv = jvocab_new(m->lm.tok, V, e))) return NULL;
  if (!__atomic_compare_exchange_n(&m->jv, &none, jv, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    jvocab_free(jv); /* another completion's came first */
    jv = none;
  }
  return jv;
}

/* One choice of a completion as it grows. */
struct cchoice {
  struct tok_stream *ts; /* the sampling thread's: its text, token by token */
  /* under the completion's smu */
  char *text; /* its text so far (special tokens left out), cut before a stop string */
  size_t len, cap;
  size_t *out_at; /* [max_tokens]: text released once token k was out (completion_token) */
  int ntok;       /* tokens out */
  int finish;     /* -1 while it runs, then enum finish_reason */
};

/* One completion, shared by its caller and the service (refs). */
struct completion {
  struct completions *c;
  uint64_t seq;
  char key[32]; /* "completion-<seq>": its bus key */
  /* the request (owned copies) */
  char *model, *spec, *prompt;
  size_t prompt_len;
  struct model_config cfg;
  int max_tokens, n, logprobs, top_logprobs;
  float temperature, top_p;
  uint64_t seed;
  char *stop[COMPLETION_STOP_MAX];
  int n_stop, stream;
  json_t *response_format; /* NULL: free text */
  size_t stop_max;         /* the longest stop string's length */
  pthread_mutex_t smu;     /* guards version and the choices' shared fields */
  int64_t version;         /* the id last published on the bus */
  struct cchoice *ch;      /* [n] */
  /* under c->mu */
  enum completion_state state;
  int refs;      /* the caller's and, until it is done with it, the service's */
  int queued;    /* on the queue (not yet taken by a thread) */
  int cancelled; /* before it started, the caller gave up (1: completion_cancel) or left (2) */
  int released;  /* the caller released it: nothing is published any more */
  struct completion *next;
  struct timespec submitted, started;
  struct completion_result res; /* written by the thread serving it, read after DONE */
};

struct sampler {
  struct completions *c;
  int idx;
  pthread_t th;
  int started;
  struct pool *pool; /* owned: this thread's compute pool (pinned to compute_cpus) */
};

struct completions {
  struct server *srv;
  struct admit *ledger; /* borrowed: srv->admit */
  int listening;        /* on_memory_freed is a listener of the ledger; reclaim is its hook */
  pthread_mutex_t mu;   /* guards everything below and every completion's shared fields */
  /* A completion was queued, the head was released, memory came free, a completion was
   * cancelled, or the service stops. */
  pthread_cond_t cond;
  int stopping;
  struct completion *head, *tail; /* the queue, oldest first */
  int waiting;                    /* queued + the one being admitted */
  int admitting;                  /* a thread admits the head: the others wait (first in, first
                                     started) */
  int waiting_memory;             /* the head waits for memory */
  int running;
  uint64_t seq;
  double avg_s; /* moving average of a completion's time in a thread (Retry-After) */
  struct cmodel *models;
  int n_models;
  uint64_t tick;
  uint64_t outcomes[COMPLETION_OUTCOMES];
  uint64_t model_loads, model_evictions;
  int n;
  struct sampler *v;
};

static const char *const OUTCOME_NAMES[COMPLETION_OUTCOMES] = {
    "ok", "invalid", "too_large", "stopping", "no_memory", "failed", "busy", "timeout"};

const char *completion_outcome_name(enum completion_outcome o) {
  return (int)o >= 0 && o < COMPLETION_OUTCOMES ? OUTCOME_NAMES[o] : "?";
}

/* ---- sizes ---- */

/* What a model's weights hold while it serves: a BF16 folder's matrices stay BF16 (opened as a
 * frozen base is, lm_open_frozen: nothing trains them here) with the tile its products convert
 * at a time; any other model's are float32. */
static uint64_t weights_bytes(const struct model_config *cfg) {
  size_t tile = 0;
  if (cfg->bf16_weights) return model_frozen_bf16_bytes(cfg, &tile) + tile;
  return (uint64_t)model_param_count(cfg) * sizeof(float);
}

/* What one alternative's piece holds beside its struct: its text and bytes, malloc'd (a token
 * is a few bytes; a long added token is rare, and covered by the allowance of the others). */
#define PIECE_BYTES 64

uint64_t completion_memory(const struct model_config *cfg, int n, int seq_len, int max_new,
                           int top_k) {
  /* lm_sample's arrays: tokens and log-probs of every slot (with top_k alternatives each, and
   * their pieces), then per sample its length, finish, stream and prompt pointer/length */
  uint64_t per_slot = sizeof(int) + sizeof(float) +
                      (uint64_t)top_k * (sizeof(int) + sizeof(float) +
                                         sizeof(struct completion_piece) + PIECE_BYTES);
  uint64_t arrays = (uint64_t)n * (uint64_t)max_new * per_slot +
                    (uint64_t)n * (3 * sizeof(int) + sizeof(struct rng) + sizeof(int *));
  return (uint64_t)gen_state_bytes(cfg, NULL, n, seq_len) + arrays;
}

static double secs_between(const struct timespec *a, const struct timespec *b) {
  return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
}

/* ---- the folder stamp ---- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h;
}

/* A hash of what a folder holds: each entry's name, size, mtime and inode, summed (readdir's
 * order does not matter), and the folder's inode. 0 for a preset (no folder). */
static uint64_t folder_stamp(const char *spec) {
  struct stat st;
  if (stat(spec, &st) || !S_ISDIR(st.st_mode)) return 0;
  DIR *d = opendir(spec);
  uint64_t sum = fnv(1469598103934665603ull, &st.st_ino, sizeof st.st_ino);
  if (!d) return sum;
  struct dirent *de;
  char p[4096 + 256];
  for (int i = 0; i < STAMP_ENTRIES_MAX && (de = readdir(d)); i++) {
    if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
      continue;
    if ((size_t)snprintf(p, sizeof p, "%s/%s", spec, de->d_name) >= sizeof p) continue;
    struct stat fs;
    if (stat(p, &fs)) continue;
    uint64_t h = fnv(1469598103934665603ull, de->d_name, strlen(de->d_name));
    int64_t parts[4] = {(int64_t)fs.st_size, (int64_t)fs.st_mtim.tv_sec,
                        (int64_t)fs.st_mtim.tv_nsec, (int64_t)fs.st_ino};
    sum += fnv(h, parts, sizeof parts);
  }
  closedir(d);
  return sum ? sum : 1;
}

/* ---- the cache of opened models (under c->mu) ---- */

static void unlist(struct completions *c, struct cmodel *m) {
  for (struct cmodel **p = &c->models; *p; p = &(*p)->next)
    if (*p == m) {
      *p = m->next;
      m->next = NULL;
      m->listed = 0;
      c->n_models--;
      return;
    }
}

/* Models taken off the list to be closed once c->mu is released, with what the ledger holds of
 * them (their weights, reserved or cached). */
struct to_close {
  struct cmodel *reserved, *cached;
};

static void push(struct cmodel **list, struct cmodel *m) {
  m->next = *list;
  *list = m;
}

/* The least recently used model nobody uses, or NULL. */
static struct cmodel *idle_lru(struct completions *c) {
  struct cmodel *best = NULL;
  for (struct cmodel *m = c->models; m; m = m->next)
    if (!m->refs && (!best || m->used_tick < best->used_tick)) best = m;
  return best;
}

/* Takes the least recently used idle model off the list for closing: its bytes, or 0 when every
 * kept model is in use. */
static uint64_t evict_one(struct completions *c, struct to_close *tc) {
  struct cmodel *m = idle_lru(c);
  if (!m) return 0;
  unlist(c, m);
  push(&tc->cached, m);
  c->model_evictions++;
  return m->bytes ? m->bytes : 1;
}

/* Closes what tc holds and gives its memory back to the ledger (which wakes whoever waits for
 * memory). Without c->mu. */
static void close_models(struct completions *c, struct to_close *tc) {
  for (int k = 0; k < 2; k++) {
    struct cmodel *m = k ? tc->cached : tc->reserved;
    while (m) {
      struct cmodel *next = m->next;
      uint64_t bytes = m->bytes;
      if (m->lm.model) /* (one whose opening failed is only given back) */
        LOG(INFO, "completions: closed %s (%.1f MiB of weights)", m->spec,
            (double)bytes / (1 << 20));
      lm_close(&m->lm);
      jvocab_free(m->jv);
      free(m->spec);
      free(m);
      if (k)
        admit_uncache(c->ledger, bytes);
      else
        admit_release(c->ledger, bytes);
      m = next;
    }
  }
  tc->reserved = tc->cached = NULL;
}

/* The ledger's reclaim hook: a job was claimed into memory that kept models hold; close idle
 * ones, least recently used first, until over bytes are given back. */
static void reclaim(void *ctx, uint64_t over) {
  struct completions *c = ctx;
  struct to_close tc = {0};
  uint64_t freed = 0;
  pthread_mutex_lock(&c->mu);
  for (uint64_t got = 1; freed < over && got;) freed += got = evict_one(c, &tc);
  pthread_mutex_unlock(&c->mu);
  if (freed < over)
    LOG(WARN, "completions: a job needs %" PRIu64 " more bytes than kept models could give back",
        over - freed);
  close_models(c, &tc);
}

/* The ledger's listener: memory came free, so the head may fit now. */
static void on_memory_freed(void *ctx) {
  struct completions *c = ctx;
  pthread_mutex_lock(&c->mu);
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->mu);
}

/* A completion is done with m (under c->mu): an idle model stays listed, its weights cached,
 * unless it is stale or the cache is full (then it, or the least recently used idle one, goes
 * into tc). */
static void unpin(struct completions *c, struct cmodel *m, struct to_close *tc) {
  if (--m->refs > 0) return;
  if (!m->listed || c->srv->cfg.completion_cache_models == 0) {
    if (m->listed) unlist(c, m);
    push(&tc->reserved, m);
    return;
  }
  admit_to_cache(c->ledger, m->bytes);
  while (c->n_models > c->srv->cfg.completion_cache_models && evict_one(c, tc)) {
  }
}

/* ---- results ---- */

static void piece_deinit(struct completion_piece *p) {
  free(p->text);
  free(p->bytes);
}

/* p: token id as a reply shows it alone. Returns 1 when out of memory (an id without a token
 * leaves p empty). */
static int piece_fill(const struct tokenizer *tok, int id, struct completion_piece *p) {
  struct dapo_err e = {0};
  if (!(p->text = tok_decode_alloc(tok, &id, 1, 0, &e)) && e.code == DAPO_ENOMEM) return 1;
  e = (struct dapo_err){0};
  return tok_token_bytes(tok, id, &p->bytes, &p->n_bytes, &e) == DAPO_ENOMEM;
}

static void result_deinit(struct completion_result *r) {
  json_decref(r->errors);
  free(r->prompt_ids);
  for (int i = 0; r->text && i < r->samples.n; i++) free(r->text[i]);
  free(r->text);
  size_t slots = (size_t)r->samples.n * (size_t)r->samples.max_new;
  for (size_t i = 0; r->pieces && i < slots; i++) piece_deinit(&r->pieces[i]);
  free(r->pieces);
  for (size_t i = 0; r->top_pieces && i < slots * (size_t)r->samples.top_k; i++)
    piece_deinit(&r->top_pieces[i]);
  free(r->top_pieces);
  lm_samples_free(&r->samples);
  memset(r, 0, sizeof *r);
}

/* Sets a refusal of fields (each with the same message) as t's result. */
static void refuse(struct completion *t, enum completion_outcome o, const char *f1, const char *f2,
                   const char *msg) {
  t->res.outcome = o;
  json_decref(t->res.errors);
  t->res.errors = json_array();
  if (!t->res.errors || dapo_errors_add(t->res.errors, f1, msg) ||
      (f2 && dapo_errors_add(t->res.errors, f2, msg))) {
    t->res.outcome = COMPLETION_NO_MEMORY;
    snprintf(t->res.message, sizeof t->res.message, "out of memory");
  }
}

static void fail(struct completion *t, enum completion_outcome o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(struct completion *t, enum completion_outcome o, const char *fmt, ...) {
  t->res.outcome = o;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->res.message, sizeof t->res.message, fmt, ap);
  va_end(ap);
}

static void completion_free(struct completion *t) {
  result_deinit(&t->res);
  for (int i = 0; t->ch && i < t->n; i++) {
    tok_stream_free(t->ch[i].ts);
    free(t->ch[i].text);
    free(t->ch[i].out_at);
  }
  free(t->ch);
  for (int i = 0; i < t->n_stop; i++) free(t->stop[i]);
  json_decref(t->response_format);
  pthread_mutex_destroy(&t->smu);
  free(t->model);
  free(t->spec);
  free(t->prompt);
  free(t);
}

/* The service is done with t (under c->mu): its result is there; published unless its caller
 * left already. */
static void finish(struct completions *c, struct completion *t) {
  t->state = COMPLETION_DONE;
  if (t->res.outcome >= 0 && t->res.outcome < COMPLETION_OUTCOMES && !t->cancelled)
    c->outcomes[t->res.outcome]++;
  pthread_mutex_lock(&t->smu); /* (after DONE: a reader that read the version before sees it) */
  int64_t v = ++t->version;
  pthread_mutex_unlock(&t->smu);
  if (!t->released) bus_publish(c->srv->bus, t->key, v);
  if (--t->refs == 0) completion_free(t);
}

/* ---- admission and sampling of the head ---- */

/* What a completion holds while it runs. */
struct hold {
  struct cmodel *m; /* pinned */
  uint64_t mem;     /* its generation state and arrays, reserved */
};

/* 1 when the head t must end instead of waiting on (under c->mu): its caller gave up, or the
 * service stops (t's outcome then says so). */
static int must_end(struct completions *c, struct completion *t) {
  if (t->cancelled) return 1;
  if (!c->stopping) return 0;
  fail(t, COMPLETION_STOPPING, "the daemon is stopping");
  return 1;
}

/* Waits (under c->mu) until memory comes free, or something else wakes the head. */
static void wait_memory(struct completions *c) {
  c->waiting_memory = 1;
  pthread_cond_wait(&c->cond, &c->mu);
  c->waiting_memory = 0;
}

/* Pins t's model into h->m (under c->mu, which it releases while opening the model): a kept one
 * when its folder is unchanged, else opened after its weights are reserved. Returns 0 (pinned),
 * 1 (no memory now: wait and try again) or -1 (t's result says why it ends). */
static int pin_model(struct completions *c, struct completion *t, uint64_t stamp, struct hold *h,
                     struct to_close *tc) {
  struct cmodel *m = c->models;
  while (m && strcmp(m->spec, t->spec)) m = m->next;
  if (m && m->stamp != stamp) { /* the folder changed on disk: open it again */
    unlist(c, m);
    if (!m->refs) {
      push(&tc->cached, m);
      return 1; /* closed first, then look again */
    }
    m = NULL; /* closed by its last user's unpin */
  }
  if (m) {
    if (!m->refs && admit_from_cache(c->ledger, m->bytes)) return 1; /* being reclaimed */
    m->refs++;
    m->used_tick = ++c->tick;
    h->m = m;
    return 0;
  }
  uint64_t limit = admit_limit(c->ledger), w = weights_bytes(&t->cfg);
  uint64_t least =
      w + completion_memory(&t->cfg, t->n, 1 + t->max_tokens, t->max_tokens, t->top_logprobs);
  char msg[512];
  if (w > limit || least > limit) {
    if (w > limit)
      snprintf(msg, sizeof msg,
               "the model's weights take %" PRIu64 " bytes, more than memory_limit_bytes (%" PRIu64
               ") allows",
               w, limit);
    else
      snprintf(msg, sizeof msg,
               "n %d samples of max_tokens %d need at least %" PRIu64 " bytes (weights %" PRIu64
               ", generation %" PRIu64 "), more than memory_limit_bytes (%" PRIu64
               ") allows; lower max_tokens or n",
               t->n, t->max_tokens, least, w, least - w, limit);
    refuse(t, COMPLETION_TOO_LARGE, w > limit ? "model" : "max_tokens", w > limit ? NULL : "n",
           msg);
    return -1;
  }
  if (!(m = calloc(1, sizeof *m)) || !(m->spec = strdup(t->spec))) {
    free(m);
    fail(t, COMPLETION_NO_MEMORY, "out of memory");
    return -1;
  }
  if (admit_try(c->ledger, w)) { /* no room now: an idle model goes (closed, then try again) */
    free(m->spec);
    free(m);
    evict_one(c, tc);
    return 1;
  }
  m->stamp = stamp;
  m->bytes = w;
  m->refs = 1;
  m->used_tick = ++c->tick;
  m->listed = 1;
  m->next = c->models;
  c->models = m;
  c->n_models++;
  c->model_loads++;
  pthread_mutex_unlock(&c->mu);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  struct dapo_err e = {0};
  int rc = t->cfg.bf16_weights ? lm_open_frozen(t->spec, 0, &m->lm, &e)
                               : lm_open(t->spec, 0, &m->lm, &e);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (!rc && weights_bytes(&m->lm.cfg) != w) {
    lm_close(&m->lm);
    rc = dapo_errf(&e, DAPO_EINVAL, "%s changed while it was opened; retry", t->spec);
  }
  pthread_mutex_lock(&c->mu);
  if (rc) {
    unlist(c, m);
    push(&tc->reserved, m); /* its weights were reserved */
    if (rc == DAPO_ENOMEM)
      fail(t, COMPLETION_NO_MEMORY, "%s", e.msg);
    else
      refuse(t, COMPLETION_INVALID, "model", NULL, e.msg);
    return -1;
  }
  LOG(INFO, "completions: opened %s (%.1f MiB of weights) in %.0f ms", t->spec,
      (double)w / (1 << 20), secs_between(&t0, &t1) * 1e3);
  h->m = m;
  return 0;
}

/* Admits the head t (under c->mu, released at times): its model pinned and its prompt encoded,
 * then its generation memory reserved. Returns 0 (admitted: h holds it) or 1 (t ends: its result
 * says why, or it was cancelled; h is released, or handed to tc). */
static int admit(struct completions *c, struct completion *t, struct hold *h, struct to_close *tc) {
  pthread_mutex_unlock(&c->mu);
  uint64_t stamp = folder_stamp(t->spec);
  pthread_mutex_lock(&c->mu);
  for (;;) {
    if (must_end(c, t)) return 1;
    int rc = pin_model(c, t, stamp, h, tc);
    if (rc < 0) return 1;
    if (rc == 0) break;
    if (tc->reserved || tc->cached) { /* close what was evicted, then look again */
      pthread_mutex_unlock(&c->mu);
      close_models(c, tc);
      pthread_mutex_lock(&c->mu);
      continue;
    }
    wait_memory(c);
  }
  /* the prompt, with the pinned model's tokenizer */
  pthread_mutex_unlock(&c->mu);
  struct dapo_err e = {0};
  int rc = lm_encode_prompt(&h->m->lm, t->prompt, t->prompt_len, LM_PROMPT_TEXT, t->max_tokens,
                            &t->res.prompt_ids, &t->res.n_prompt, &e);
  pthread_mutex_lock(&c->mu);
  if (rc) {
    if (rc == DAPO_ENOMEM)
      fail(t, COMPLETION_NO_MEMORY, "out of memory");
    else
      refuse(t, COMPLETION_INVALID, rc == DAPO_ERANGE ? "max_tokens" : "prompt", NULL, e.msg);
    unpin(c, h->m, tc);
    h->m = NULL;
    return 1;
  }
  uint64_t limit = admit_limit(c->ledger);
  uint64_t mem = completion_memory(&h->m->lm.cfg, t->n, t->res.n_prompt + t->max_tokens,
                                   t->max_tokens, t->top_logprobs);
  if (h->m->bytes + mem > limit) {
    char msg[512];
    snprintf(msg, sizeof msg,
             "n %d samples of %d prompt tokens + max_tokens %d need %" PRIu64
             " bytes (weights %" PRIu64 ", generation %" PRIu64
             "), more than memory_limit_bytes (%" PRIu64 ") allows; lower max_tokens or n",
             t->n, t->res.n_prompt, t->max_tokens, h->m->bytes + mem, h->m->bytes, mem, limit);
    refuse(t, COMPLETION_TOO_LARGE, "max_tokens", "n", msg);
    unpin(c, h->m, tc);
    h->m = NULL;
    return 1;
  }
  for (;;) {
    if (must_end(c, t)) { /* checked under the lock up to the start: no cancel is missed */
      unpin(c, h->m, tc);
      h->m = NULL;
      return 1;
    }
    if (!admit_try(c->ledger, mem)) break;
    if (evict_one(c, tc)) { /* another idle model gives its memory back */
      pthread_mutex_unlock(&c->mu);
      close_models(c, tc);
      pthread_mutex_lock(&c->mu);
      continue;
    }
    wait_memory(c);
  }
  h->mem = mem;
  return 0;
}

/* ---- sampling, with stop strings and streaming ---- */

/* What the step hook needs beside t. */
struct run_ctx {
  struct completion *t;
  const struct tokenizer *tok;
  int id_stops[COMPLETION_STOP_MAX]; /* the stop strings that are one token */
  int n_id_stops;
  int failed; /* out of memory while decoding */
  /* structured outputs (t->response_format): the mask of each choice's matcher */
  struct jmasker *jk;
  struct jmatch **jm; /* [n] */
  int stuck;          /* a choice's next bytes are no token's: the vocabulary cannot go on */
};

/* gen_run's mask hook (on the sampling thread: the state has no pool). */
static void on_mask(void *ctx, int seq, float *logits, int V) {
  struct run_ctx *x = ctx;
  int allowed = jmasker_apply(x->jk, x->jm[seq], logits, V);
  if (allowed < 0) x->failed = 1;
  if (allowed == 0) { /* (a tokenizer without every byte) the draw is dropped with the reply */
    x->stuck = 1;
    logits[0] = 0.0f;
  }
}

static int text_add(struct cchoice *ch, const char *p, size_t n) {
  if (ch->len + n + 1 > ch->cap) {
    size_t cap = ch->cap ? ch->cap : 64;
    while (cap < ch->len + n + 1) cap *= 2;
    char *nt = realloc(ch->text, cap);
    if (!nt) return -1;
    ch->text = nt, ch->cap = cap;
  }
  memcpy(ch->text + ch->len, p, n);
  ch->len += n;
  ch->text[ch->len] = '\0';
  return 0;
}

/* Cuts ch's text before the first stop string, looking where text added after byte `from` can
 * complete one; 1 when it did. */
static int cut_at_stop(const struct completion *t, struct cchoice *ch, size_t from) {
  size_t start = from >= t->stop_max ? from - (t->stop_max - 1) : 0, best = SIZE_MAX;
  for (int j = 0; j < t->n_stop && start < ch->len; j++) {
    const char *p = memmem(ch->text + start, ch->len - start, t->stop[j], strlen(t->stop[j]));
    if (p && (size_t)(p - ch->text) < best) best = (size_t)(p - ch->text);
  }
  if (best == SIZE_MAX) return 0;
  ch->len = best;
  ch->text[best] = '\0';
  return 1;
}

/* Bytes at the end of ch's text that may begin a stop string (held back while it runs). */
static size_t stop_prefix(const struct completion *t, const struct cchoice *ch) {
  size_t hold = 0;
  for (int j = 0; j < t->n_stop; j++) {
    size_t sl = strlen(t->stop[j]);
    for (size_t m = sl - 1 < ch->len ? sl - 1 : ch->len; m > hold; m--)
      if (!memcmp(ch->text + ch->len - m, t->stop[j], m)) {
        hold = m;
        break;
      }
  }
  return hold;
}

/* gen_run's step hook: decodes each choice's new token, ends a choice whose text now holds a
 * stop string (or whose token is a one-token stop string), releases what no stop string can
 * claim, and publishes the round when streamed. Once the caller has left, every choice ends. */
static void on_step(void *ctx, struct gen_out *out, int n, int max_new) {
  struct run_ctx *x = ctx;
  struct completion *t = x->t;
  struct completions *c = t->c;
  pthread_mutex_lock(&c->mu);
  int gone = t->released;
  pthread_mutex_unlock(&c->mu);
  int changed = 0;
  pthread_mutex_lock(&t->smu);
  for (int i = 0; i < n; i++) {
    struct cchoice *ch = &t->ch[i];
    const int *toks = out->tokens + (size_t)i * max_new;
    /* one round adds one token to each choice still running */
    for (int k = ch->ntok; ch->finish < 0 && k < out->len[i]; k++) {
      struct dapo_err e = {0};
      size_t before = ch->len, pl;
      const char *p = tok_stream_push(ch->ts, toks[k], &pl, &e);
      if (p ? text_add(ch, p, pl) : e.code == DAPO_ENOMEM) x->failed = 1;
      size_t at = (size_t)i * max_new + k;
      if (t->logprobs && piece_fill(x->tok, toks[k], &t->res.pieces[at])) x->failed = 1;
      for (int j = 0; t->res.top_pieces && j < t->top_logprobs; j++) {
        size_t aj = at * (size_t)t->top_logprobs + (size_t)j;
        if (piece_fill(x->tok, out->top_ids[aj], &t->res.top_pieces[aj])) x->failed = 1;
      }
      int stopped = cut_at_stop(t, ch, before);
      for (int j = 0; j < x->n_id_stops; j++) stopped |= toks[k] == x->id_stops[j];
      if (x->stuck) stopped = 1; /* the whole reply is refused after the run */
      if (x->jk) {               /* the value is complete: the choice ends there */
        if (jmasker_feed(x->jk, x->jm[i], toks[k])) stopped = 1; /* (never: it was masked) */
        if (jmatch_done(x->jm[i]) && !jmatch_can_continue(x->jm[i])) stopped = 1;
      }
      int end = stopped || gone || k + 1 >= max_new || out->finish[i] == FINISH_STOP;
      if (stopped || gone) out->finish[i] = FINISH_STOP;
      if (end && !stopped) { /* the rest: an unfinished character as U+FFFD */
        before = ch->len;
        if ((p = tok_stream_finish(ch->ts, &pl, &e)) ? text_add(ch, p, pl) : e.code == DAPO_ENOMEM)
          x->failed = 1;
        cut_at_stop(t, ch, before);
      }
      size_t prev = k ? ch->out_at[k - 1] : 0, safe = ch->len - stop_prefix(t, ch);
      ch->out_at[k] = end ? ch->len : safe > prev ? safe : prev;
      ch->ntok = k + 1;
      if (end) ch->finish = out->finish[i] == FINISH_STOP ? FINISH_STOP : FINISH_LENGTH;
      changed = 1;
    }
  }
  int64_t v = changed && t->stream ? ++t->version : 0;
  pthread_mutex_unlock(&t->smu);
  if (v) {
    pthread_mutex_lock(&c->mu);
    if (!t->released) bus_publish(c->srv->bus, t->key, v);
    pthread_mutex_unlock(&c->mu);
  }
}

/* Samples t with the model h holds, its choices decoded as they grow (without c->mu). */
static void run(struct completion *t, struct hold *h) {
  const struct lm *lm = &h->m->lm;
  struct completion_result *r = &t->res;
  int vocab = model_vocab_used(&lm->cfg);
  if (t->top_logprobs > vocab) t->top_logprobs = vocab; /* a smaller vocabulary lists it all */
  struct sampler_opts so = {.temperature = t->temperature,
                            .top_p = t->top_p,
                            .max_new_tokens = t->max_tokens,
                            .top_k = t->top_logprobs};
  struct run_ctx x = {.t = t, .tok = lm->tok};
  struct dapo_err e = {0};
  /* a stop string that is exactly one token is a stop id too, while the sampler has room beside
   * the model's own (the hook checks the id either way) */
  for (int j = 0; j < t->n_stop; j++) {
    int id[2], nid = 0;
    char back[256];
    size_t bl = 0;
    if (tok_encode(lm->tok, t->stop[j], strlen(t->stop[j]), id, 2, &nid, &e) || nid != 1 ||
        tok_decode(lm->tok, id, 1, back, sizeof back, &bl, 0, &e) || strcmp(back, t->stop[j]))
      continue;
    x.id_stops[x.n_id_stops++] = id[0];
    if (so.n_stop + lm->n_stop < SAMPLER_MAX_STOP) so.stop_ids[so.n_stop++] = id[0];
  }
  size_t slots = (size_t)t->n * (size_t)t->max_tokens;
  if (!(r->text = calloc((size_t)t->n, sizeof *r->text)) ||
      (t->logprobs && !(r->pieces = calloc(slots, sizeof *r->pieces))) ||
      (t->top_logprobs &&
       !(r->top_pieces = calloc(slots * (size_t)t->top_logprobs, sizeof *r->top_pieces)))) {
    fail(t, COMPLETION_NO_MEMORY, "out of memory");
    return;
  }
  for (int i = 0; i < t->n; i++)
    if (!(t->ch[i].ts = tok_stream_new(lm->tok, 1))) {
      fail(t, COMPLETION_NO_MEMORY, "out of memory");
      return;
    }
  struct jgrammar *g = NULL;
  struct jvocab *jv = NULL;
  int rc = 0;
  if (t->response_format) { /* checked by the caller: a failure here is memory */
    if (!(g = jgrammar_new(t->response_format, "response_format", &e)) ||
        !(jv = model_jvocab(h->m, vocab, &e)) ||
        !(x.jk = jmasker_new(g, jv, lm->stop_ids, lm->n_stop, &e)) ||
        !(x.jm = calloc((size_t)t->n, sizeof *x.jm)))
      rc = e.code ? e.code : DAPO_ENOMEM;
    for (int i = 0; !rc && i < t->n; i++)
      if (!(x.jm[i] = jmatch_new(g))) rc = DAPO_ENOMEM;
  }
  if (!rc)
    rc = lm_sample_hooks(lm, r->prompt_ids, r->n_prompt, t->n, &so, t->seed, on_step, &x,
                         x.jk ? on_mask : NULL, &x, &r->samples, &e);
  for (int i = 0; x.jm && i < t->n; i++) jmatch_free(x.jm[i]);
  free(x.jm);
  jmasker_free(x.jk);
  jgrammar_free(g);
  if (rc) {
    fail(t, rc == DAPO_ENOMEM ? COMPLETION_NO_MEMORY : COMPLETION_FAILED, "%s",
         e.msg[0] ? e.msg : "out of memory");
    return;
  }
  if (x.stuck) {
    refuse(t, COMPLETION_INVALID, "response_format", NULL,
           "the model's tokenizer has no token for what the schema requires next (a character "
           "outside its vocabulary)");
    return;
  }
  for (int i = 0; i < t->n && !x.failed; i++) /* (only this thread writes the choices) */
    if (!(r->text[i] = strndup(t->ch[i].text ? t->ch[i].text : "", t->ch[i].len))) x.failed = 1;
  if (x.failed) {
    fail(t, COMPLETION_NO_MEMORY, "out of memory");
    return;
  }
  r->outcome = COMPLETION_OK;
}

static void *sampler_main(void *arg) {
  struct sampler *sp = arg;
  struct completions *c = sp->c;
  server_pin_compute(sp->c->srv, sp->pool);
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->stopping && (!c->head || c->admitting)) pthread_cond_wait(&c->cond, &c->mu);
    if (c->stopping) break;
    struct completion *t = c->head;
    c->head = t->next;
    if (!c->head) c->tail = NULL;
    t->next = NULL;
    t->queued = 0;
    c->admitting = 1;
    struct hold h = {0};
    struct to_close tc = {0};
    int ended = admit(c, t, &h, &tc);
    c->admitting = 0;
    c->waiting--;
    pthread_cond_broadcast(&c->cond); /* the next head may be admitted */
    if (ended) {
      if (t->cancelled == 1) c->outcomes[COMPLETION_TIMEOUT]++;
      LOG(DEBUG, "completion %" PRIu64 " (%s): %s", t->seq, t->model,
          t->cancelled ? "cancelled while waiting" : completion_outcome_name(t->res.outcome));
      pthread_mutex_unlock(&c->mu);
      close_models(c, &tc); /* what it held is given back before its end is told */
      pthread_mutex_lock(&c->mu);
      finish(c, t);
      continue;
    }
    t->state = COMPLETION_RUNNING;
    clock_gettime(CLOCK_MONOTONIC, &t->started);
    c->running++;
    if (t->stream && !t->released) { /* its reader starts the reply */
      pthread_mutex_lock(&t->smu);
      int64_t v = ++t->version;
      pthread_mutex_unlock(&t->smu);
      bus_publish(c->srv->bus, t->key, v);
    }
    pthread_mutex_unlock(&c->mu);
    close_models(c, &tc);
    run(t, &h);
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    double took = secs_between(&t->started, &end);
    LOG(DEBUG,
        "completion %" PRIu64 " (%s): %s, n %d, %d prompt + %d max tokens, waited %.1f ms, "
        "sampled in %.1f ms",
        t->seq, t->model, completion_outcome_name(t->res.outcome), t->n, t->res.n_prompt,
        t->max_tokens, secs_between(&t->submitted, &t->started) * 1e3, took * 1e3);
    pthread_mutex_lock(&c->mu);
    c->running--;
    c->avg_s = c->avg_s > 0 ? 0.8 * c->avg_s + 0.2 * took : took;
    unpin(c, h.m, &tc);
    pthread_mutex_unlock(&c->mu);
    /* the memory goes back (waking the head and jobs waiting for it) before the caller hears of
     * the end, so that what it reads next (/metrics) no longer counts this completion */
    admit_release(c->ledger, h.mem);
    close_models(c, &tc);
    pthread_mutex_lock(&c->mu);
    finish(c, t);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* ---- the service ---- */

struct completions *completions_start(struct server *srv, struct dapo_err *e) {
  struct completions *c = calloc(1, sizeof *c);
  if (!c) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return NULL;
  }
  c->srv = srv;
  c->ledger = srv->admit;
  c->n = srv->cfg.completion_threads > 0 ? srv->cfg.completion_threads : 1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cond, NULL);
  if (!(c->v = calloc((size_t)c->n, sizeof *c->v))) {
    completions_free(c);
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return NULL;
  }
  if (admit_listen(c->ledger, on_memory_freed, c)) {
    completions_free(c);
    dapo_errf(e, DAPO_EINVAL, "the memory ledger has no room for another listener");
    return NULL;
  }
  admit_set_reclaim(c->ledger, reclaim, c);
  c->listening = 1;
  for (int i = 0; i < c->n; i++) {
    struct sampler *sp = &c->v[i];
    sp->c = c;
    sp->idx = i;
    if (!(sp->pool = pool_new(1))) {
      completions_free(c);
      dapo_errf(e, DAPO_ENOMEM, "completion thread %d: cannot make its compute pool", i);
      return NULL;
    }
    int err = pthread_create(&sp->th, NULL, sampler_main, sp);
    if (err) {
      completions_free(c);
      dapo_errf(e, DAPO_EIO, "cannot start completion thread %d: %s", i, strerror(err));
      return NULL;
    }
    sp->started = 1;
  }
  LOG(INFO, "completions: %d thread%s, queue %d, %d model%s kept open", c->n, c->n > 1 ? "s" : "",
      srv->cfg.completion_queue, srv->cfg.completion_cache_models,
      srv->cfg.completion_cache_models == 1 ? "" : "s");
  return c;
}

void completions_quiesce(struct completions *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->stopping = 1;
  while (c->head) {
    struct completion *t = c->head;
    c->head = t->next;
    t->next = NULL;
    t->queued = 0;
    c->waiting--;
    fail(t, COMPLETION_STOPPING, "the daemon is stopping");
    finish(c, t);
  }
  c->tail = NULL;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->mu);
}

void completions_free(struct completions *c) {
  if (!c) return;
  completions_quiesce(c);
  for (int i = 0; c->v && i < c->n; i++) {
    if (c->v[i].started) pthread_join(c->v[i].th, NULL);
    pool_free(c->v[i].pool);
  }
  if (c->listening) {
    admit_set_reclaim(c->ledger, NULL, NULL);
    admit_unlisten(c->ledger, on_memory_freed, c);
  }
  struct to_close tc = {0};
  pthread_mutex_lock(&c->mu);
  while (c->models) {
    struct cmodel *m = c->models;
    unlist(c, m);
    push(m->refs ? &tc.reserved : &tc.cached, m); /* none is in use once the threads are gone */
  }
  pthread_mutex_unlock(&c->mu);
  close_models(c, &tc);
  free(c->v);
  pthread_cond_destroy(&c->cond);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

int completions_submit(struct completions *c, const struct completion_req *req,
                       struct completion **out, struct dapo_err *e) {
  *out = NULL;
  struct completion *t = calloc(1, sizeof *t);
  if (!t) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  pthread_mutex_init(&t->smu, NULL);
  t->n = req->n;
  int bad = !(t->model = strdup(req->model)) || !(t->spec = strdup(req->spec)) ||
            !(t->prompt = malloc(req->prompt_len + 1)) ||
            !(t->ch = calloc((size_t)req->n, sizeof *t->ch));
  for (int i = 0; !bad && i < req->n; i++) {
    t->ch[i].finish = -1;
    bad = !(t->ch[i].out_at = calloc((size_t)req->max_tokens, sizeof *t->ch[i].out_at));
  }
  if (!bad && req->response_format)
    bad = !(t->response_format = json_deep_copy(req->response_format));
  for (int j = 0; !bad && j < req->n_stop && j < COMPLETION_STOP_MAX; j++) {
    if (!req->stop[j][0]) continue; /* (an empty one would stop at once) */
    bad = !(t->stop[t->n_stop] = strdup(req->stop[j]));
    t->n_stop += !bad;
    size_t sl = bad ? 0 : strlen(t->stop[t->n_stop - 1]);
    if (sl > t->stop_max) t->stop_max = sl;
  }
  if (bad) {
    completion_free(t);
    return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  }
  memcpy(t->prompt, req->prompt, req->prompt_len);
  t->prompt[req->prompt_len] = '\0';
  t->prompt_len = req->prompt_len;
  t->c = c;
  t->cfg = *req->cfg;
  t->max_tokens = req->max_tokens;
  t->logprobs = req->logprobs;
  t->top_logprobs = req->logprobs && req->top_logprobs > 0 && req->top_logprobs <= SAMPLER_TOP_MAX
                        ? req->top_logprobs
                        : 0;
  t->stream = req->stream;
  t->temperature = req->temperature;
  t->top_p = req->top_p;
  t->seed = req->seed;
  t->state = COMPLETION_WAITING;
  t->refs = 2;
  clock_gettime(CLOCK_MONOTONIC, &t->submitted);
  pthread_mutex_lock(&c->mu);
  int rc = 0;
  if (c->stopping) {
    rc = dapo_errf(e, COMPLETIONS_ESTOPPING, "the daemon is stopping");
  } else if (c->waiting >= c->srv->cfg.completion_queue) {
    c->outcomes[COMPLETION_BUSY]++;
    rc = dapo_errf(e, COMPLETIONS_EFULL,
                   "%d completions are waiting already (completion_queue %d), %d sampling",
                   c->waiting, c->srv->cfg.completion_queue, c->running);
  }
  if (rc) {
    pthread_mutex_unlock(&c->mu);
    completion_free(t);
    return rc;
  }
  t->seq = ++c->seq;
  snprintf(t->key, sizeof t->key, "completion-%" PRIu64, t->seq);
  t->queued = 1;
  if (c->tail)
    c->tail->next = t;
  else
    c->head = t;
  c->tail = t;
  c->waiting++;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->mu);
  *out = t;
  return 0;
}

const char *completion_key(const struct completion *t) {
  return t->key;
}

enum completion_state completion_poll(struct completion *t, const struct completion_result **res) {
  struct completions *c = t->c;
  pthread_mutex_lock(&c->mu);
  enum completion_state s = t->state;
  pthread_mutex_unlock(&c->mu);
  if (res) *res = s == COMPLETION_DONE ? &t->res : NULL;
  return s;
}

int64_t completion_version(struct completion *t) {
  pthread_mutex_lock(&t->smu);
  int64_t v = t->version;
  pthread_mutex_unlock(&t->smu);
  return v;
}

int completion_token(struct completion *t, int i, int k, struct completion_token *tk) {
  memset(tk, 0, sizeof *tk);
  tk->finish = -1;
  if (i < 0 || i >= t->n || k < 0 || k >= t->max_tokens) return -1;
  struct cchoice *ch = &t->ch[i];
  int rc = 1;
  pthread_mutex_lock(&t->smu);
  if (k >= ch->ntok) {
    rc = ch->finish >= 0 ? -1 : 0;
  } else {
    size_t from = k ? ch->out_at[k - 1] : 0, to = ch->out_at[k];
    if ((tk->text = malloc(to - from + 1))) {
      memcpy(tk->text, ch->text + from, to - from);
      tk->text[to - from] = '\0';
      tk->len = to - from;
    } else {
      rc = DAPO_ENOMEM;
    }
    if (k == ch->ntok - 1) tk->finish = ch->finish;
  }
  pthread_mutex_unlock(&t->smu);
  if (rc != 1) return rc;
  /* written before the round that let it out, never after */
  size_t at = (size_t)i * (size_t)t->max_tokens + (size_t)k;
  tk->id = t->res.samples.tokens[at];
  tk->logp = t->res.samples.logp[at];
  tk->piece = t->res.pieces ? &t->res.pieces[at] : NULL;
  if (t->res.top_pieces) {
    size_t aj = at * (size_t)t->top_logprobs;
    tk->n_top = t->top_logprobs;
    tk->top_ids = t->res.samples.top_ids + aj;
    tk->top_logp = t->res.samples.top_logp + aj;
    tk->top = t->res.top_pieces + aj;
  }
  return 1;
}

const int *completion_prompt_ids(struct completion *t, int *n) {
  *n = t->res.n_prompt;
  return t->res.prompt_ids;
}

/* Takes a queued t off the queue (under c->mu); the service's reference goes with it. */
static void dequeue(struct completions *c, struct completion *t) {
  struct completion *prev = NULL;
  for (struct completion *x = c->head; x && x != t; x = x->next) prev = x;
  if (prev)
    prev->next = t->next;
  else
    c->head = t->next;
  if (c->tail == t) c->tail = prev;
  t->next = NULL;
  t->queued = 0;
  c->waiting--;
  t->refs--;
}

int completion_cancel(struct completion *t) {
  struct completions *c = t->c;
  pthread_mutex_lock(&c->mu);
  int was = t->state == COMPLETION_WAITING && !t->cancelled;
  if (was) {
    t->cancelled = 1;
    if (t->queued) {
      dequeue(c, t);
      c->outcomes[COMPLETION_TIMEOUT]++;
    }
    /* else a thread admits it: it sees the flag, lets go of what it holds and counts it */
    pthread_cond_broadcast(&c->cond);
  }
  pthread_mutex_unlock(&c->mu);
  return was;
}

void completion_release(struct completion *t) {
  if (!t) return;
  struct completions *c = t->c;
  pthread_mutex_lock(&c->mu);
  if (t->queued) dequeue(c, t);
  if (t->state == COMPLETION_WAITING && !t->cancelled) t->cancelled = 2;
  t->released = 1;
  bus_forget(c->srv->bus, t->key);
  pthread_cond_broadcast(&c->cond);
  int last = --t->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (last) completion_free(t);
}

int completions_retry_after_s(struct completions *c) {
  pthread_mutex_lock(&c->mu);
  double s = (c->avg_s > 0 ? c->avg_s : 1.0) * (double)(c->waiting + c->running) / (double)c->n;
  pthread_mutex_unlock(&c->mu);
  int v = (int)(s + 0.999);
  return v < 1 ? 1 : v > 60 ? 60 : v;
}

void completions_stats(struct completions *c, struct completions_stats *out) {
  memset(out, 0, sizeof *out);
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  out->threads = c->n;
  out->queue_cap = c->srv->cfg.completion_queue;
  out->waiting = c->waiting;
  out->waiting_memory = c->waiting_memory;
  out->running = c->running;
  out->models_cached = c->n_models;
  memcpy(out->outcomes, c->outcomes, sizeof out->outcomes);
  out->model_loads = c->model_loads;
  out->model_evictions = c->model_evictions;
  pthread_mutex_unlock(&c->mu);
}
