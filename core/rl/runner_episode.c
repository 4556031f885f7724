/* Multi-turn episodes of the job runner (runner_impl.h, docs/AGENTS.md). A pass's episodes take
 * the sampler's slots in order, a free slot the next episode; every round feeds the ones that can
 * go on (a prompt, a sampled token, or the last token of a turn with the world's answer after it)
 * into one gen_advance, while the ones whose calls are out wait, and the answers are taken as they
 * come. Token in, token out: an episode's sequence is its prompt, each turn's tokens as sampled,
 * and each answer rendered in the tool-call format and tokenized once, appended; nothing is ever
 * rendered or tokenized again. The sampled tokens alone are trained (ro.trained).
 *
 * The world is the job's tools, or its environment: then an episode begins with /reset (its
 * observation follows the prompt), every model turn is the action of a /step whose observation
 * follows the turn, the episode ends when the environment says done (or at the episode's limits),
 * and /close is sent, best effort.
 *
 * Which episodes are fed together never changes a bit (gen_advance's feeds are independent) and
 * each turn draws from its own stream (seed, step, prompt, sample, turn), so the tokens do not
 * depend on when the tools answer, on the batch or on the number of ranks. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner_impl.h"
#include "utf8.h"

#define TAG_ENV_SEED 0x656e760000000000ULL /* "env": an environment's seeds */

enum ep_state {
  EP_FEED, /* its next feed is ready: the prompt, a sampled token, or a turn's end and answers */
  EP_WAIT, /* its calls are out */
  EP_DONE
};

struct ep {
  int item;          /* dataset item */
  int key;           /* its sampling key: prompt key * 65536 + sample */
  const int *prompt; /* borrowed (ids of the item) */
  int plen;
  int *seq;            /* [after_prompt] tokens after the prompt */
  unsigned char *mask; /* [after_prompt] 1: the model's */
  float *lp;           /* [max_new_tokens] sampler log-probs of the model's tokens */
  int n_seq, n_model;
  int fed;           /* tokens of seq already in the sampler's cache */
  int primed;        /* the prompt is in the sampler's cache */
  int *first;        /* the first feed when the world spoke before it: prompt, then seq */
  int turn, turn0;   /* the model's turn, and where in seq it began */
  int ended_by_stop; /* the last turn ended with a stop token */
  enum ep_state state;
  struct rng rng;
  int calls_out, n_answers;
  struct tc_answer_slot {
    char name[TC_NAME_MAX + 1];
    char *content;
    enum tool_err err;
  } answers[TC_MAX_CALLS];
  enum env_op env_op; /* the environment call out (EP_WAIT) */
  json_t *turns;
  struct ep_stats es;
  enum ep_finish finish;
  char *final_text;
  char id[96];
};

const char *ep_finish_name(enum ep_finish f) {
  static const char *const names[EPF_COUNT] = {"",          "stop", "length", "max_turns",
                                               "truncated", "done", "error"};
  return f >= 0 && f < EPF_COUNT ? names[f] : "";
}

static int is_stop(const struct sampler_opts *o, int tok) {
  for (int i = 0; i < o->n_stop; i++)
    if (o->stop_ids[i] == tok) return 1;
  return 0;
}

static json_t *int_array(const int *v, int n) {
  json_t *a = json_array();
  for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return a;
}

static json_t *real_array(const float *v, int n) {
  json_t *a = json_array();
  for (int i = 0; a && i < n; i++) json_array_append_new(a, json_real(v[i]));
  return a;
}

/* The fields of item i of d that a tool receives, built once per item (kept for the job: a
 * call holds it until its answer is taken). NULL out of memory. */
static const json_t *item_of(struct trainer *t, const struct dataset *d, int i) {
  json_t **cache = d == t->train ? t->item_json : t->vitem_json;
  if (!cache[i]) {
    const struct ds_item *it = ds_get(d, i);
    cache[i] = json_pack("{s:s, s:s?, s:O?, s:s, s:O?}", "id", it->id, "prompt", it->prompt,
                         "messages", it->messages, "answer", it->answer, "metadata", it->metadata);
  }
  return cache[i];
}

/* A copy of s with every byte that is not part of valid UTF-8 replaced by '?'. */
static char *valid_utf8(const char *s) {
  size_t n = strlen(s);
  char *o = malloc(n + 1);
  if (!o) return NULL;
  for (size_t i = 0; i < n;) {
    size_t l = utf8_next((const unsigned char *)s + i, n - i, NULL);
    if (!l) {
      o[i++] = '?';
      continue;
    }
    memcpy(o + i, s + i, l);
    i += l;
  }
  o[n] = '\0';
  return o;
}

/* The content the model reads of an answer: valid UTF-8, at most max_tokens tokens of it. */
static char *bounded(const struct trainer *t, const char *content, int max_tokens) {
  char *v = valid_utf8(content ? content : "");
  if (!v) return NULL;
  int n = 0;
  struct dapo_err e = {0};
  if (tok_encode(t->lm.tok, v, strlen(v), NULL, 0, &n, &e) != DAPO_ERANGE && n <= max_tokens)
    return v;
  int *ids = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
  char *cut = NULL;
  if (ids && !tok_encode(t->lm.tok, v, strlen(v), ids, n, &n, &e))
    cut = tok_decode_alloc(t->lm.tok, ids, max_tokens, 0, &e);
  free(ids);
  free(v);
  return cut;
}

static int env_job(const struct trainer *t) {
  return toolbox_is_env(t->tools);
}

/* Ends episode x with reason f; final_text (stolen) is what the judge reads: its last turn's.
 * An environment's episode is closed (best effort: nobody waits for the answer). */
static int finish(struct trainer *t, struct ep *x, enum ep_finish f, char *final_text,
                  int *active) {
  x->finish = f;
  if (final_text != x->final_text) free(x->final_text);
  x->final_text = final_text;
  x->state = EP_DONE;
  (*active)--;
  if (!env_job(t)) return 0;
  json_t *body = json_pack("{s:s, s:s}", "episode_id", x->id, "job_id", t->spec->job_id);
  return !body || toolbox_submit_env(t->tools, -1, ENV_CLOSE, body) ? trainer_oom(t) : 0;
}

/* The model ended its turn (x->seq[x->turn0 .. n_seq)): its record, then a final answer, the
 * end of the episode, or its calls (submitted, or answered at once when they cannot be made). */
static int end_turn(struct trainer *t, const struct dataset *d, struct ep *x, int idx,
                    int *active) {
  const struct episode_spec *ep = &t->spec->episode;
  int n = x->n_seq - x->turn0, text_n = n - (x->ended_by_stop ? 1 : 0);
  struct dapo_err e = {0};
  char *text = tok_decode_alloc(t->lm.tok, x->seq + x->turn0, text_n, 0, &e);
  if (!text) return trainer_fail_err(t, FAIL_GENERATION_FAILED, NULL, &e);
  if (env_job(t)) { /* the turn is the action of a /step, whose reply says what follows */
    json_array_append_new(x->turns,
                          json_pack("{s:s, s:s, s:o, s:b, s:o}", "role", "assistant", "content",
                                    text, "token_ids", int_array(x->seq + x->turn0, n), "trained",
                                    1, "logprobs", real_array(x->lp + x->n_model - n, n)));
    x->es.turns++;
    free(x->final_text);
    x->final_text = text;
    json_t *body =
        json_pack("{s:s, s:s, s:i, s:{s:s, s:s}}", "episode_id", x->id, "job_id", t->spec->job_id,
                  "turn", x->turn, "action", "role", "assistant", "content", text);
    x->turn++;
    x->state = EP_WAIT;
    x->env_op = ENV_STEP;
    x->calls_out = 1;
    return !body || toolbox_submit_env(t->tools, idx * TC_MAX_CALLS, ENV_STEP, body)
               ? trainer_oom(t)
               : 0;
  }
  /* a line's tools are what its model may call there (each the job's tool of its name) */
  struct tc_turn call;
  const char *line_names[TOOLS_MAX];
  const char *const *names = t->tool_names;
  int n_tools = toolbox_count(t->tools);
  const struct ds_item *it = ds_get(d, x->item);
  if (it->tools) {
    n_tools = ds_item_tool_names(it, line_names, TOOLS_MAX);
    names = line_names;
  }
  if (tc_read_turn(t->tool_format, text, strlen(text), names, n_tools, &call)) {
    free(text);
    return trainer_oom(t);
  }
  json_t *tc = NULL;
  if (call.n_calls) {
    tc = json_array();
    for (int i = 0; i < call.n_calls; i++)
      json_array_append_new(tc, json_pack("{s:s, s:O}", "name", call.calls[i].name, "arguments",
                                          call.calls[i].arguments));
  }
  json_array_append_new(x->turns,
                        json_pack("{s:s, s:s, s:o, s:b, s:o, s:o*, s:s*}", "role", "assistant",
                                  "content", text, "token_ids", int_array(x->seq + x->turn0, n),
                                  "trained", 1, "logprobs", real_array(x->lp + x->n_model - n, n),
                                  "tool_calls", tc, "malformed", call.malformed ? call.why : NULL));
  x->es.turns++;
  int calls = call.n_calls || call.malformed;
  if (!calls) {
    tc_turn_free(&call);
    return finish(t, x, x->ended_by_stop ? EPF_STOP : EPF_LENGTH, text, active);
  }
  if (x->turn + 1 >= ep->max_turns || x->n_model >= t->hp->max_new_tokens) {
    tc_turn_free(&call);
    return finish(t, x, x->turn + 1 >= ep->max_turns ? EPF_MAX_TURNS : EPF_LENGTH, text, active);
  }
  free(x->final_text); /* the last turn's text stands, should the episode end before another */
  x->final_text = text;
  x->turn++;
  x->n_answers = call.malformed ? 1 : call.n_calls;
  x->calls_out = 0;
  x->state = EP_WAIT;
  if (call.malformed) {
    struct tc_answer_slot *a = &x->answers[0];
    int unknown = !strncmp(call.why, "there is no tool", 16);
    a->err = unknown ? TOOL_UNKNOWN : TOOL_MALFORMED;
    snprintf(a->name, sizeof a->name, "%s", "");
    a->content = NULL;
    if (asprintf(&a->content, "error: %s", call.why) < 0) a->content = NULL;
    x->es.tool_errors[a->err]++;
  }
  for (int i = 0; i < call.n_calls; i++) {
    struct tc_answer_slot *a = &x->answers[i];
    int tool = toolbox_find(t->tools, call.calls[i].name);
    snprintf(a->name, sizeof a->name, "%s", call.calls[i].name);
    a->content = NULL;
    char why[300];
    x->es.tool_calls++;
    if (toolbox_check_args(t->tools, tool, call.calls[i].arguments, why, sizeof why)) {
      a->err = TOOL_BAD_ARGUMENTS;
      if (asprintf(&a->content, "error: %s", why) < 0) a->content = NULL;
      x->es.tool_errors[a->err]++;
      continue;
    }
    const json_t *item = item_of(t, d, x->item);
    if (!item) {
      tc_turn_free(&call);
      return trainer_oom(t);
    }
    json_t *args = call.calls[i].arguments;
    call.calls[i].arguments = NULL; /* stolen by the submission */
    if (toolbox_submit(t->tools, idx * TC_MAX_CALLS + i, tool, args, item, t->spec->job_id,
                       x->id)) {
      tc_turn_free(&call);
      return trainer_oom(t);
    }
    x->calls_out++;
  }
  tc_turn_free(&call);
  return 0;
}

/* The text the world's messages (world: [{"role", "content"[, "name"]}], borrowed) make after
 * x's last turn, or after its prompt (first), in the job's format: the dapod format's lines, or
 * what the chat template adds there (chat_render_after: after the turn's end-of-turn token, or
 * writing it when the turn was cut). *text owned. 0, or 1 with res set. */
static int render_world(struct trainer *t, const struct ep *x, const json_t *world, int first,
                        char **text) {
  *text = NULL;
  if (t->tool_format != TC_DAPOD) {
    int by_stop = x->n_seq > 0 && t->n_chat_stop > 0 && x->seq[x->n_seq - 1] == t->chat_stop[0];
    enum chat_after after = first ? CHAT_AFTER_PROMPT : by_stop ? CHAT_AFTER_STOP : CHAT_AFTER_CUT;
    struct dapo_err e = {0};
    if (!chat_render_after(t->chat, after, world, text, &e)) return 0;
    return trainer_fail_err(t, FAIL_GENERATION_FAILED, NULL, &e);
  }
  struct tc_answer ans[ENV_MESSAGES_MAX];
  size_t n = json_array_size(world);
  for (size_t i = 0; i < n && i < ENV_MESSAGES_MAX; i++) {
    const json_t *m = json_array_get(world, i);
    const char *name = json_string_value(json_object_get(m, "name"));
    ans[i] = (struct tc_answer){name ? name : "", json_string_value(json_object_get(m, "content")),
                                json_string_value(json_object_get(m, "role"))};
  }
  return tc_render_answers(TC_DAPOD, ans, (int)n, text) ? trainer_oom(t) : 0;
}

/* The world's text tokenized into x's sequence after its tokens (not yet counted): *n tokens,
 * *fits when they and one more token fit the episode. 0, or 1 with res set. */
static int encode_world(struct trainer *t, struct ep *x, const char *text, int *n, int *fits) {
  int room = t->after_prompt - x->n_seq;
  struct dapo_err e = {0};
  int erc = tok_encode(t->lm.tok, text, strlen(text), x->seq + x->n_seq, room, n, &e);
  *fits = !erc && *n + 1 <= room;
  if (!*fits) *n = 0;
  return erc && erc != DAPO_ERANGE ? trainer_fail_err(t, FAIL_GENERATION_FAILED, NULL, &e) : 0;
}

/* The world's n tokens encoded after x's sequence (encode_world) join it, trained 0, and the
 * model's next turn begins there, drawing from its own stream (seed, step, prompt, sample,
 * turn): turn 0's is the episode's first, which an environment's /reset leaves as it is. */
static void next_turn(struct trainer *t, struct ep *x, int n, uint64_t tag, uint64_t a) {
  memset(x->mask + x->n_seq, 0, (size_t)n);
  x->n_seq += n;
  x->es.world_tokens += n;
  x->state = EP_FEED;
  x->turn0 = x->n_seq;
  if (x->turn > 0)
    rng_seed(&x->rng, t->spec->seed,
             trainer_stream(tag + (uint64_t)x->turn, (uint64_t)t->step, a, (uint64_t)x->key));
}

/* Every answer of x's turn is in: rendered, tokenized and appended after the turn (trained 0),
 * unless it does not fit the episode (truncated). The next turn starts where the answer ends,
 * drawing from its own stream (seed, step, prompt, sample, turn). */
static int world_turn(struct trainer *t, struct ep *x, uint64_t tag, uint64_t a, int *active) {
  const struct episode_spec *ep = &t->spec->episode;
  char *kept[TC_MAX_CALLS] = {0};
  json_t *list = json_array(), *world = json_array();
  int rc = 0;
  for (int i = 0; i < x->n_answers; i++) {
    kept[i] = bounded(t, x->answers[i].content, ep->max_answer_tokens);
    if (!kept[i]) rc = trainer_oom(t);
    json_array_append_new(world, json_pack("{s:s, s:s, s:s}", "role", "tool", "name",
                                           x->answers[i].name, "content", kept[i] ? kept[i] : ""));
    json_array_append_new(list, json_pack("{s:s, s:s, s:s}", "name", x->answers[i].name, "content",
                                          kept[i] ? kept[i] : "", "status",
                                          tool_err_name(x->answers[i].err)));
  }
  char *text = NULL;
  if (!rc) rc = render_world(t, x, world, 0, &text);
  json_decref(world);
  int n = 0, fits = 0;
  if (!rc) rc = encode_world(t, x, text, &n, &fits);
  if (!rc) {
    json_t *turn =
        json_pack("{s:s, s:s, s:o, s:b, s:O}", "role", "tool", "content", text, "token_ids",
                  int_array(x->seq + x->n_seq, n), "trained", 0, "answers", list);
    if (turn && !fits) json_object_set_new(turn, "fits", json_false());
    json_array_append_new(x->turns, turn);
    if (fits)
      next_turn(t, x, n, tag, a);
    else
      rc = finish(t, x, EPF_TRUNCATED, x->final_text, active);
  }
  json_decref(list);
  free(text);
  for (int i = 0; i < x->n_answers; i++) {
    free(kept[i]);
    free(x->answers[i].content);
    x->answers[i].content = NULL;
  }
  x->n_answers = 0;
  return rc;
}

/* The environment answered x's /reset or /step (got: its answer, cleared by the caller): its
 * reward counted; then the episode ends (done, its turns or tokens spent, the observation does
 * not fit, or the call failed under on_env_error "drop") or the observation is appended after
 * the prompt or the turn, tokenized once, and the model's next turn begins, drawing from its own
 * stream (seed, step, prompt, sample, turn). */
static int env_answer(struct trainer *t, struct ep *x, const struct tool_answer *got, uint64_t tag,
                      uint64_t a, int *active) {
  const struct episode_spec *ep = &t->spec->episode;
  x->calls_out = 0;
  x->es.tool_errors[got->err]++;
  x->es.tool_ms += got->ms;
  if (got->err != TOOL_OK) {
    const char *why = got->content ? got->content : "out of memory";
    if (ep->on_env_error == EP_ENV_FAIL)
      return trainer_fail(t, FAIL_ENVIRONMENT_ERROR, "episode.environment", "episode %s: %s", x->id,
                          why);
    x->es.env_failed = 1;
    json_array_append_new(x->turns,
                          json_pack("{s:s, s:s, s:[], s:b, s:s}", "role", "environment", "content",
                                    "", "token_ids", "trained", 0, "error", why));
    return finish(t, x, EPF_ERROR, x->final_text, active);
  }
  const struct env_reply *r = &got->env;
  if (x->env_op == ENV_STEP) x->es.env_steps++;
  if (r->has_reward) x->es.env_rewards++, x->es.env_reward += r->reward;
  enum ep_finish f = r->done                               ? EPF_DONE
                     : x->turn >= ep->max_turns            ? EPF_MAX_TURNS
                     : x->n_model >= t->hp->max_new_tokens ? EPF_LENGTH
                                                           : EPF_NONE;
  /* the observation's messages, each cut at max_answer_tokens */
  json_t *world = json_deep_copy(r->messages);
  int rc = world ? 0 : trainer_oom(t);
  size_t i;
  json_t *m;
  json_array_foreach(world, i, m) {
    char *kept =
        rc ? NULL
           : bounded(t, json_string_value(json_object_get(m, "content")), ep->max_answer_tokens);
    if (!kept && !rc) rc = trainer_oom(t);
    if (kept) json_object_set_new(m, "content", json_string(kept));
    free(kept);
  }
  char *text = NULL;
  if (!rc) rc = render_world(t, x, world, x->env_op == ENV_RESET, &text);
  json_decref(world);
  int n = 0, fits = 0;
  if (!rc && f == EPF_NONE) rc = encode_world(t, x, text, &n, &fits);
  if (!rc && f == EPF_NONE && !fits) f = EPF_TRUNCATED;
  if (!rc) {
    json_t *turn = json_pack("{s:s, s:s, s:o, s:b, s:O, s:o, s:b}", "role", "environment",
                             "content", text, "token_ids", int_array(x->seq + x->n_seq, n),
                             "trained", 0, "messages", r->messages, "reward",
                             r->has_reward ? json_real(r->reward) : json_null(), "done", r->done);
    if (turn && r->info) json_object_set(turn, "info", r->info);
    if (turn && f == EPF_TRUNCATED) json_object_set_new(turn, "fits", json_false());
    json_array_append_new(x->turns, turn);
  }
  free(text);
  if (rc) return rc;
  if (f != EPF_NONE) return finish(t, x, f, x->final_text, active);
  next_turn(t, x, n, tag, a);
  return 0;
}

/* One more episode of the pass is done (of total), sampled tokens so far. */
static void ep_progress(struct progress *g, int64_t *done, int64_t sampled, int64_t total) {
  ++*done;
  progress_at(g, *done, sampled, PROGRESS_PARTS * *done / total);
}

static void ep_free(struct ep *x) {
  free(x->seq), free(x->mask), free(x->lp), free(x->first);
  free(x->final_text);
  json_decref(x->turns);
  for (int i = 0; i < TC_MAX_CALLS; i++) free(x->answers[i].content);
}

/* The pass's episodes become rollouts, in order (their arrays moved into the ros). */
static int keep_episodes(struct trainer *t, struct ep *eps, int ns, int k, const int *items,
                         int group0, int round, int *n_tokens) {
  for (int s = 0; s < ns; s++) {
    struct ep *x = &eps[s];
    struct ro *r = NULL;
    if (t->n_ro == t->cap_ro) {
      int cap = t->cap_ro ? 2 * t->cap_ro : 256;
      struct ro *nr = realloc(t->ros, sizeof *nr * (size_t)cap);
      if (!nr) return trainer_oom(t);
      t->ros = nr;
      t->cap_ro = cap;
    }
    r = &t->ros[t->n_ro++];
    memset(r, 0, sizeof *r);
    r->item = items[s / k];
    r->group = group0 + s / k;
    r->index = s % k;
    r->round = round;
    r->toks = x->seq, x->seq = NULL;
    r->trained = x->mask, x->mask = NULL;
    r->slogp = x->lp, x->lp = NULL;
    r->len = x->n_model;
    r->seq_len = x->n_seq;
    r->truncated = x->finish == EPF_LENGTH || x->finish == EPF_TRUNCATED;
    r->text = x->final_text ? x->final_text : strdup("");
    x->final_text = NULL;
    r->turns = x->turns, x->turns = NULL;
    r->finish = x->finish;
    r->es = x->es;
    if (!r->text) return trainer_oom(t);
    *n_tokens += r->len;
  }
  return 0;
}

/* Episode s of the pass begins (its buffers, id and stream), in sampler slot `slot`; an
 * environment's with its /reset: {"episode_id", "seed", "item", "job_id", "step", "group",
 * "index"}, the seed the same for a group's episodes (they face the same task). */
static int ep_begin(struct trainer *t, const struct dataset *d, struct ep *x, int s, int slot,
                    const int *items, int *const *ids, const int *lens, int k, uint64_t tag,
                    uint64_t a, int key0, int group0, int round) {
  int q = s / k, i = s % k, it = items[q];
  x->item = it;
  x->key = (key0 + q) * 65536 + i;
  x->prompt = ids[it];
  x->plen = lens[it];
  x->seq = malloc(sizeof(int) * (size_t)t->after_prompt);
  x->mask = malloc((size_t)t->after_prompt);
  x->lp = malloc(sizeof(float) * (size_t)t->hp->max_new_tokens);
  x->turns = json_array();
  if (!x->seq || !x->mask || !x->lp || !x->turns) return trainer_oom(t);
  snprintf(x->id, sizeof x->id, "%ss%" PRId64 "-r%d-g%d-%d", d == t->train ? "" : "eval-", t->step,
           round, group0 + q, i);
  rng_seed(&x->rng, t->spec->seed, trainer_stream(tag, (uint64_t)t->step, a, (uint64_t)x->key));
  gen_slot_clear(t->gs, slot);
  if (!env_job(t)) return 0;
  const json_t *item = item_of(t, d, it);
  uint64_t seed = trainer_stream(tag ^ TAG_ENV_SEED, (uint64_t)t->step, a, (uint64_t)(key0 + q));
  json_t *body = item
                     ? json_pack("{s:s, s:I, s:O, s:s, s:I, s:i, s:i}", "episode_id", x->id, "seed",
                                 (json_int_t)(seed >> 11), "item", item, "job_id", t->spec->job_id,
                                 "step", (json_int_t)t->step, "group", group0 + q, "index", i)
                     : NULL;
  x->state = EP_WAIT;
  x->env_op = ENV_RESET;
  x->calls_out = 1;
  return !body || toolbox_submit_env(t->tools, s * TC_MAX_CALLS, ENV_RESET, body) ? trainer_oom(t)
                                                                                  : 0;
}

/* Takes the answers that came (waiting up to wait_ms for the first; 0: not at all), each to its
 * episode: an environment's reply, or a tool's answer (the world's turn once all its calls are
 * answered). Returns how many came; *stop set (res too) on a failure. */
static int take_answers(struct trainer *t, struct ep *eps, int wait_ms, uint64_t tag, uint64_t a,
                        int *active, int *stop) {
  struct tool_answer got[64];
  int na = toolbox_take(t->tools, got, 64, wait_ms, t->o ? t->o->cancel : NULL), used = 0;
  for (; used < na && !*stop; used++) {
    int s = got[used].tag / TC_MAX_CALLS, c = got[used].tag % TC_MAX_CALLS;
    struct ep *x = &eps[s];
    if (env_job(t)) {
      *stop = env_answer(t, x, &got[used], tag, a, active);
      tool_answer_clear(&got[used]);
      continue;
    }
    x->answers[c].content = got[used].content;
    x->answers[c].err = got[used].err;
    x->es.tool_errors[got[used].err]++;
    x->es.tool_ms += got[used].ms;
    if (--x->calls_out == 0) *stop = world_turn(t, x, tag, a, active);
  }
  for (; used < na; used++) tool_answer_clear(&got[used]);
  return na;
}

/* The longest a round waits to gather answers into its batch, in ms. */
#define GATHER_MS_MAX 50.0

int trainer_episodes(struct trainer *t, const struct dataset *d, int n, const int *items,
                     int *const *ids, const int *lens, int k, const struct sampler_opts *so,
                     uint64_t tag, uint64_t a, int key0, int group0, int round, const char *pass,
                     int *n_tokens) {
  const struct episode_spec *ep = &t->spec->episode;
  int total = n * k, maxn = t->hp->max_new_tokens;
  int cap = t->gen_cap < total ? t->gen_cap : total;
  struct ep *eps = calloc((size_t)total, sizeof *eps);
  struct gen_feed *feeds = malloc(sizeof *feeds * (size_t)cap);
  int *who = malloc(sizeof(int) * (size_t)cap), *tok = malloc(sizeof(int) * (size_t)cap);
  int *in_slot = malloc(sizeof(int) * (size_t)cap);
  float *lp = malloc(sizeof(float) * (size_t)cap);
  struct rng *rngs = malloc(sizeof *rngs * (size_t)cap);
  double step_ms = 0; /* the last decoding round's time: what gathering may cost */
  int stop = !eps || !feeds || !who || !tok || !in_slot || !lp || !rngs ? trainer_oom(t) : 0;
  struct progress g;
  int64_t done_eps = 0, sampled = 0;
  progress_begin(&g, t, pass, round + 1, total,
                 (double)model_param_count(&t->lm.model->cfg) * (double)total * maxn);
  for (int c = 0; !stop && c < cap; c++) in_slot[c] = -1;
  int next = 0, active = total;
  while (active > 0 && !stop) {
    if (trainer_cancelled(t)) {
      stop = trainer_fail(t, FAIL_CANCELLED, NULL, "cancelled");
      break;
    }
    /* a free slot takes the next episode: the slots stay busy while episodes end at their own
     * pace (a group's episodes that begin together share their prompt's prefill) */
    for (int c = 0; c < cap && next < total && !stop; c++)
      if (in_slot[c] < 0) {
        in_slot[c] = next;
        stop =
            ep_begin(t, d, &eps[next], next, c, items, ids, lens, k, tag, a, key0, group0, round);
        next++;
      }
    /* gather: when more episodes wait for the world than could be fed now, answers that come
     * within one decoding round's time join this round, so that the batch stays whole instead of
     * decoding a few episodes a round while the rest trickle in (each round reads every weight
     * once whatever its batch). At most one round's time is spent so. Which episodes go together
     * changes no bit (gen_advance). */
    double until = now_s() * 1e3 + (step_ms < GATHER_MS_MAX ? step_ms : GATHER_MS_MAX);
    while (t->tools && !stop) {
      int ready = 0, waiting = 0;
      for (int c = 0; c < cap; c++)
        if (in_slot[c] >= 0) {
          ready += eps[in_slot[c]].state == EP_FEED;
          waiting += eps[in_slot[c]].state == EP_WAIT;
        }
      double left = until - now_s() * 1e3;
      if (waiting <= ready || left < 1 ||
          take_answers(t, eps, (int)left, tag, a, &active, &stop) == 0)
        break;
    }
    /* feed every episode that can go on */
    int nf = 0;
    for (int c = 0; c < cap && !stop; c++) {
      if (in_slot[c] < 0) continue;
      struct ep *x = &eps[in_slot[c]];
      if (x->state != EP_FEED) continue;
      /* the prompt first (with an environment's first observation after it); then what follows
       * the cached tokens: one sampled token, or a turn's last token with the world's answer
       * after it */
      if (x->primed) {
        feeds[nf] = (struct gen_feed){c, x->seq + x->fed, x->n_seq - x->fed};
      } else if (x->n_seq == 0) {
        feeds[nf] = (struct gen_feed){c, x->prompt, x->plen};
      } else {
        if (!(x->first = malloc(sizeof(int) * (size_t)(x->plen + x->n_seq)))) {
          stop = trainer_oom(t);
          break;
        }
        memcpy(x->first, x->prompt, sizeof(int) * (size_t)x->plen);
        memcpy(x->first + x->plen, x->seq, sizeof(int) * (size_t)x->n_seq);
        feeds[nf] = (struct gen_feed){c, x->first, x->plen + x->n_seq};
      }
      rngs[nf] = x->rng;
      who[nf++] = in_slot[c];
    }
    if (nf && !stop) {
      struct dapo_err e = {0};
      double t0 = now_s();
      if (gen_advance(t->gs, t->lm.model, nf, feeds, rngs, so, tok, lp, &e)) {
        stop = trainer_fail_err(t, FAIL_GENERATION_FAILED, NULL, &e);
        break;
      }
      step_ms = (now_s() - t0) * 1e3;
      sampled += nf;
      for (int f = 0; f < nf && !stop; f++) {
        struct ep *x = &eps[who[f]];
        x->rng = rngs[f];
        x->primed = 1;
        free(x->first);
        x->first = NULL;
        x->fed = x->n_seq; /* the prompt is not in seq: fed counts seq's tokens */
        x->seq[x->n_seq] = tok[f];
        x->mask[x->n_seq++] = 1;
        x->lp[x->n_model++] = lp[f];
        int turn_len = x->n_seq - x->turn0;
        x->ended_by_stop = is_stop(so, tok[f]);
        if (x->ended_by_stop || turn_len >= ep->max_new_tokens_per_turn || x->n_model >= maxn ||
            x->n_seq >= t->after_prompt) {
          stop = end_turn(t, d, x, who[f], &active);
          if (!stop && x->state == EP_WAIT && x->calls_out == 0) /* answered at once */
            stop = world_turn(t, x, tag, a, &active);
        }
      }
    }
    /* the answers that came; wait for one when nobody could be fed */
    int na = t->tools && !stop ? take_answers(t, eps, nf ? 0 : 50, tag, a, &active, &stop) : 0;
    /* the episodes that ended give back their slots */
    for (int c = 0; c < cap; c++)
      if (in_slot[c] >= 0 && eps[in_slot[c]].state == EP_DONE) {
        in_slot[c] = -1;
        ep_progress(&g, &done_eps, sampled, total);
      }
    if (!nf && !na && !stop && t->tools && toolbox_pending(t->tools) == 0 && active > 0)
      stop = trainer_fail(t, FAIL_INTERNAL, NULL, "episodes wait for answers nobody owes");
  }
  if (!stop) stop = keep_episodes(t, eps, total, k, items, group0, round, n_tokens);
  for (int s = 0; eps && s < total; s++) ep_free(&eps[s]);
  free(eps), free(feeds), free(who), free(tok), free(in_slot), free(lp), free(rngs);
  return stop;
}
