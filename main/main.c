/* dapod: entry point. `dapod` / `dapod serve` runs the daemon in visible phases (config
 * defaults, file, flags, validation; storage, recovery, workers, HTTP; wait for SIGINT/SIGTERM,
 * SIGHUP reloading the API keys; stop in order: jobs pause at a safe point, streams end, HTTP,
 * workers, storage); the other subcommands work offline over libdapo: train one job, list
 * presets, save a preset as a checkpoint folder, sample text. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "blas_choice.h"
#include "config.h"
#include "dist.h"
#include "failure.h"
#include "grader.h"
#include "http.h"
#include "judge.h"
#include "kernels.h"
#include "lm.h"
#include "log.h"
#include "server.h"
#include "runner.h"
#include "parse.h"
#include "pool.h"
#include "preset.h"
#include "rng.h"
#include "sampler.h"

static char g_isa_describe[96]; /* the decoding kernels' instruction set (kernels_isa_apply) */

static void usage(FILE *f) {
  fprintf(f, "usage: dapod [serve] [--config FILE] [--listen HOST:PORT] [--data-dir DIR] "
             "[--models-dir DIR] [flags]\n"
             "       dapod train --config JOB.json --out DIR [--threads N] [--stop-after-step N]\n"
             "                   [--server-config FILE]  the judges of a daemon config file\n"
             "                                (judge_models, judge_allowed_hosts, ...)\n"
             "       dapod train --config JOB.json --plan   the job checked and its memory plan\n"
             "                                (JSON on stdout), nothing trained\n"
             "                   [--events]   also as `mpirun -np N dapod train ...`: one job,\n"
             "                                data-parallel over N processes (docs/SCALE.md);\n"
             "                                --events: every event as a JSON line on stdout\n"
             "       dapod presets\n"
             "       dapod failures [--json]     the codes a failed job's error.code may show\n"
             "       dapod save-preset NAME DIR [--seed N] [--bf16]\n"
             "       dapod generate MODEL --prompt TEXT [--max-tokens N] [--temperature T]\n"
             "                      [--top-p P] [--n N] [--seed N]\n"
             "       dapod merge ADAPTER OUT [--bf16]   an adapter checkpoint merged into a full\n"
             "                                          model folder\n"
             "       dapod kernels [--json]   measures OpenBLAS's kernels here, prints the\n"
             "                                table and refreshes the cached choice, and\n"
             "                                names the decoding kernels' instruction set\n"
             "       dapod --help\n"
             "MODEL is a preset name, a checkpoint folder (config.json, model.safetensors,\n"
             "tokenizer.json) or an adapter checkpoint (adapter_config.json,\n"
             "adapter_model.safetensors, base_model.json, tokenizer files).\n"
             "Environment: DAPOD_BLAS_KERNEL (library, or an OpenBLAS core name; default: the\n"
             "one measured fastest here), DAPOD_KERNELS_ISA (auto, avx512, avx2, portable,\n"
             "baseline: the decoding kernels' instruction set; default: the best here).\n");
}

static int fail(const struct dapo_err *e) {
  fprintf(stderr, "dapod: %s\n", e->msg);
  return 1;
}

/* The registry of failure codes (core/rl/failure.h): "name  category  meaning" lines, or a JSON
 * array of {code, category, meaning} with --json (what openapi.yaml's JobError.code lists). */
static int cmd_failures(int argc, char **argv) {
  int as_json = argc > 2 && !strcmp(argv[2], "--json");
  json_t *a = as_json ? json_array() : NULL;
  for (int i = FAIL_FIRST_SHOWN; i < FAIL_COUNT; i++) {
    const struct failure_info *f = failure_info((enum failure)i);
    if (a)
      json_array_append_new(a, json_pack("{s:s, s:s, s:s}", "code", f->name, "category",
                                         f->category, "meaning", f->meaning));
    else
      printf("%-22s %-7s %s\n", f->name, f->category, f->meaning);
  }
  if (a) {
    json_dumpf(a, stdout, JSON_INDENT(2));
    fputc('\n', stdout);
    json_decref(a);
  }
  return 0;
}

static int cmd_presets(void) {
  for (int i = 0; i < preset_count(); i++) {
    const struct preset *p = preset_get(i);
    struct dapo_err e;
    struct model *m = model_new(&p->cfg, &e);
    printf("%-12s %10zu parameters  %s\n", p->name, m ? m->n_params : 0, p->description);
    model_free(m);
  }
  return 0;
}

static int cmd_save_preset(int argc, char **argv) {
  struct dapo_err e = {0};
  uint64_t seed = 0;
  int bf16 = 0;
  if (argc < 4) {
    usage(stderr);
    return 2;
  }
  for (int i = 4; i < argc; i++) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
      if (parse_u64(argv[++i], &seed, "--seed", &e)) return fail(&e);
    } else if (!strcmp(argv[i], "--bf16"))
      bf16 = 1;
    else {
      fprintf(stderr, "dapod save-preset: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (!preset_find(argv[2])) {
    preset_lookup(argv[2], &e);
    return fail(&e);
  }
  struct lm lm;
  if (lm_open(argv[2], seed, &lm, &e)) return fail(&e);
  int rc = lm_save(&lm, argv[3], bf16, &e);
  lm_close(&lm);
  if (rc) return fail(&e);
  printf("%s\n", argv[3]);
  return 0;
}

/* dapod merge ADAPTER OUT [--bf16]: the adapter folder's base with W + s B A written as a full
 * model folder (config.json, model.safetensors, tokenizer and side files) that transformers
 * loads without PEFT. */
static int cmd_merge(int argc, char **argv) {
  int bf16 = argc == 5 && !strcmp(argv[4], "--bf16");
  if (argc != 4 && !bf16) {
    usage(stderr);
    return 2;
  }
  struct dapo_err e = {0};
  struct lm lm;
  if (lm_open(argv[2], 0, &lm, &e)) return fail(&e);
  int rc = 0;
  if (!lm.lora) {
    fprintf(stderr, "dapod merge: %s is not an adapter folder (no adapter_config.json)\n", argv[2]);
    rc = 2;
  } else if (lm_save(&lm, argv[3], bf16, &e)) {
    rc = fail(&e);
  } else {
    printf("%s: the base %s with the adapter %s merged in (%s)\n", argv[3], lm.base, argv[2],
           bf16 ? "bfloat16" : "float32");
  }
  lm_close(&lm);
  return rc;
}

static int cmd_generate(int argc, char **argv) {
  struct dapo_err e = {0};
  const char *prompt = NULL;
  int max_tokens = 64, n = 1;
  double temp = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  if (argc < 3) {
    usage(stderr);
    return 2;
  }
  for (int i = 3; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (!v) {
      fprintf(stderr, "dapod generate: %s needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "--prompt"))
      prompt = v;
    else if (!strcmp(a, "--max-tokens"))
      bad = parse_int(v, 1, 1 << 20, &max_tokens, a, &e);
    else if (!strcmp(a, "--temperature"))
      bad = parse_double(v, 0, 100, &temp, a, &e);
    else if (!strcmp(a, "--top-p"))
      bad = parse_double(v, 1e-6, 1, &top_p, a, &e);
    else if (!strcmp(a, "--n"))
      bad = parse_int(v, 1, 256, &n, a, &e);
    else if (!strcmp(a, "--seed"))
      bad = parse_u64(v, &seed, a, &e);
    else {
      fprintf(stderr, "dapod generate: unknown argument '%s'\n", a);
      return 2;
    }
    if (bad) return fail(&e);
    i++;
  }
  if (!prompt) {
    fprintf(stderr, "dapod generate: --prompt is required\n");
    return 2;
  }
  struct lm lm;
  if (lm_open(argv[2], seed, &lm, &e)) return fail(&e);
  int rc = 1, n_ids = 0;
  int *ids = NULL;
  struct lm_samples smp = {0};
  /* the prompt as training and /v1/completions encode it (Llama 3's BOS included) */
  if (lm_encode_prompt(&lm, prompt, strlen(prompt), LM_PROMPT_TEXT, max_tokens, &ids, &n_ids, &e)) {
    dapo_err_prefix(&e, "%s: ", e.code == DAPO_ERANGE ? "--prompt with --max-tokens" : "--prompt");
    goto out;
  }
  struct sampler_opts o = {
      .temperature = (float)temp, .top_p = (float)top_p, .max_new_tokens = max_tokens};
  if (lm_sample(&lm, ids, n_ids, n, &o, seed, &smp, &e)) goto out;
  for (int i = 0; i < n; i++) {
    const int *toks = smp.tokens + (size_t)i * max_tokens;
    const float *lp = smp.logp + (size_t)i * max_tokens;
    char *text = tok_decode_alloc(lm.tok, toks, smp.len[i], 1, &e);
    if (!text) goto out;
    double sum = 0;
    for (int t = 0; t < smp.len[i]; t++) sum += lp[t];
    printf("--- sample %d: %d tokens, finish %s, logprob %.3f\n%s%s\n", i, smp.len[i],
           smp.finish[i] == FINISH_STOP ? "stop" : "length", sum, prompt, text);
    free(text);
  }
  rc = 0;
out:
  if (rc) fail(&e);
  free(ids);
  lm_samples_free(&smp);
  lm_close(&lm);
  return rc;
}

/* ---- dapod train ---- */

static volatile sig_atomic_t g_signals;
static volatile int g_pause, g_cancel;

static void on_signal(int sig) {
  if (sig == SIGUSR1 || sig == SIGUSR2) { /* what mpirun forwards to every rank */
    if (sig == SIGUSR1)
      g_pause = 1; /* pause at the next safe point, with a checkpoint */
    else
      g_cancel = 1;
    return;
  }
  g_signals++;
  if (g_signals == 1)
    g_pause = 1; /* first ^C: checkpoint and stop, resumable */
  else
    g_cancel = 1;
}

/* dapod train's hooks: each metrics object on stdout (JSON Lines), a summary line per step, the
 * log and the checkpoints on stderr. */
static int train_metrics(void *ctx, const struct runner_metrics *m) {
  (void)ctx;
  const json_t *data = m->data;
  char *line = json_dumps(data, JSON_COMPACT);
  if (!line) return -1;
  printf("%s\n", line);
  fflush(stdout);
  free(line);
  const json_t *loss = json_object_get(data, "train/loss"),
               *vloss = json_object_get(data, "valid/loss");
  const json_t *acc = json_object_get(data, "rewards/accuracy"),
               *vacc = json_object_get(data, "valid/rewards/accuracy");
  if (acc || vacc) /* a DPO job's */
    fprintf(
        stderr, "step %lld: %s loss %.4f rewards/accuracy %.3f margin %.3f\n", (long long)m->step,
        acc ? "train" : "valid", json_real_value(loss ? loss : vloss),
        json_real_value(acc ? acc : vacc),
        json_real_value(json_object_get(data, acc ? "rewards/margin" : "valid/rewards/margin")));
  else if (loss || vloss) /* a supervised job's */
    fprintf(stderr, "step %lld: %s loss %.4f token accuracy %.3f\n", (long long)m->step,
            loss ? "train" : "valid", json_real_value(loss ? loss : vloss),
            json_real_value(json_object_get(data, loss ? "train/mean_token_accuracy"
                                                       : "valid/mean_token_accuracy")));
  else if (!m->eval)
    fprintf(stderr,
            "step %lld: reward %.3f accuracy %.3f entropy %.3f length %.1f kept %lld/%lld "
            "(%.1f s)\n",
            (long long)m->step, json_real_value(json_object_get(data, "reward/mean")),
            json_real_value(json_object_get(data, "accuracy")),
            json_real_value(json_object_get(data, "entropy")),
            json_real_value(json_object_get(data, "response_length/mean")),
            (long long)json_integer_value(json_object_get(data, "groups/kept")),
            (long long)json_integer_value(json_object_get(data, "groups/sampled")),
            json_real_value(json_object_get(data, "time/step_s")));
  else
    fprintf(stderr, "step %lld: eval accuracy %.3f\n", (long long)m->step,
            json_real_value(json_object_get(data, "eval/accuracy")));
  return 0;
}

static int train_log(void *ctx, const char *level, int64_t step, const char *message) {
  (void)ctx, (void)step;
  fprintf(stderr, "%s: %s\n", level, message);
  return 0;
}

static int train_checkpoint(void *ctx, const struct runner_checkpoint *c) {
  (void)ctx;
  fprintf(stderr, "checkpoint: %s\n", c->path);
  return 0;
}

/* A long pass's progress, one line each (at most 21 a pass; passes above
 * RUNNER_PROGRESS_MIN_WORK only). */
static void train_progress(void *ctx, const struct runner_progress *p) {
  (void)ctx;
  int gen = !strcmp(p->pass, "generation") || !strcmp(p->pass, "evaluation");
  char round[32] = "";
  if (!strcmp(p->pass, "generation")) snprintf(round, sizeof round, " round %d", p->round);
  fprintf(stderr, "step %lld: %s%s %lld/%lld %s, %lld tokens\n", (long long)p->step, p->pass, round,
          (long long)p->done, (long long)p->total, gen ? "sequences" : "micro-batches",
          (long long)p->tokens);
}

/* dapod train --events (what the daemon's launcher runs, server/launch.c): every hook as one
 * JSON line on stdout, {"event": TYPE, ...}, flushed at once, then {"event": "result", ...}. */
static int emit(json_t *o) {
  char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (!line) return -1;
  int rc = printf("%s\n", line) < 0 || fflush(stdout) ? -1 : 0;
  free(line);
  return rc;
}

static int ev_metrics(void *ctx, const struct runner_metrics *m) {
  (void)ctx;
  return emit(json_pack("{s:s, s:I, s:b, s:I, s:I, s:O}", "event", "metrics", "step",
                        (json_int_t)m->step, "eval", m->eval, "tokens_generated",
                        (json_int_t)m->tokens_generated, "tokens_trained",
                        (json_int_t)m->tokens_trained, "data", m->data));
}

static int ev_checkpoint(void *ctx, const struct runner_checkpoint *c) {
  (void)ctx;
  return emit(json_pack("{s:s, s:I, s:s, s:O?}", "event", "checkpoint", "step", (json_int_t)c->step,
                        "path", c->path, "metrics", c->metrics));
}

static int ev_log(void *ctx, const char *level, int64_t step, const char *message) {
  (void)ctx;
  return emit(json_pack("{s:s, s:s, s:I, s:s}", "event", "log", "level", level, "step",
                        (json_int_t)step, "message", message));
}

static void ev_phase(void *ctx, const char *phase) {
  (void)ctx;
  emit(json_pack("{s:s, s:s}", "event", "phase", "phase", phase));
}

static void ev_progress(void *ctx, const struct runner_progress *p) {
  (void)ctx;
  emit(json_pack("{s:s, s:I, s:s, s:i, s:I, s:I, s:I}", "event", "progress", "step",
                 (json_int_t)p->step, "pass", p->pass, "round", p->round, "done",
                 (json_int_t)p->done, "total", (json_int_t)p->total, "tokens",
                 (json_int_t)p->tokens));
}

static void ev_result(const struct runner_result *res) {
  static const char *const names[] = {"succeeded", "paused", "cancelled", "failed"};
  emit(json_pack("{s:s, s:s, s:I, s:I, s:s, s:s, s:s}", "event", "result", "status",
                 names[res->status], "step", (json_int_t)res->step, "resumed_from",
                 (json_int_t)res->resumed_from, "failure", failure_info(res->failure)->name,
                 "param", res->param, "message", res->message));
}

/* Relative file paths in a job file are relative to the job file's folder. */
static int resolve_path(json_t *body, const char *key, const char *base, int maybe_preset) {
  const char *v = json_string_value(json_object_get(body, key));
  if (!v || v[0] == '/') return 0;
  char p[PATH_MAX];
  if ((size_t)snprintf(p, sizeof p, "%s/%s", base, v) >= sizeof p) return -1;
  struct stat st;
  if (maybe_preset && stat(p, &st) != 0) return 0; /* a preset name */
  json_object_set_new(body, key, json_string(p));
  return 0;
}

/* dapod train --server-config FILE: the judge settings of a daemon configuration file
 * (judge_models, judge_allowed_hosts, judge_allow_private; its other keys are checked as the
 * daemon checks them, then unused), so that a job run from the command line, or a rank of a
 * multi-process job (server/launch.c writes the daemon's), names the judges a job in the daemon
 * may. Judge models the daemon serves itself (`serve`) are not among them: no completion service
 * runs here. 0, or the exit status (2) after saying why on stderr; pol borrows cfg. */
static int train_judges(const char *path, struct config *cfg, struct judge_policy *pol) {
  struct dapo_err e = {0};
  if (config_load_file(cfg, path, &e)) {
    fprintf(stderr, "dapod train: --server-config %s\n", e.msg);
    return 2;
  }
  *pol = (struct judge_policy){.allowed_hosts = (const char *const *)cfg->judge_allowed_hosts.v,
                               .n_allowed = cfg->judge_allowed_hosts.n,
                               .allow_private = cfg->judge_allow_private,
                               .judge_models = cfg->judge_models};
  if (grader_models_check(cfg->judge_models, pol, "judge_models", &e)) {
    fprintf(stderr, "dapod train: --server-config %s: %s\n", path, e.msg);
    return 2;
  }
  return 0;
}

/* Parses dapod train's command line and job file into spec (the judges under *pol, which
 * --server-config fills from cfg; else the defaults: loopback http judges, no judge models): 0,
 * or the exit status (2) after saying why on stderr. */
static int train_parse(int argc, char **argv, struct job_spec *spec, const char **out, int *threads,
                       int *stop_after, int *events, struct config *cfg,
                       const struct judge_policy **pol) {
  static struct judge_policy judges;
  const char *config = NULL;
  struct dapo_err e = {0};
  *pol = NULL;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--config") && i + 1 < argc)
      config = argv[++i];
    else if (!strcmp(argv[i], "--server-config") && i + 1 < argc) {
      if (train_judges(argv[++i], cfg, &judges)) return 2;
      *pol = &judges;
    } else if (!strcmp(argv[i], "--out") && i + 1 < argc)
      *out = argv[++i];
    else if (!strcmp(argv[i], "--events"))
      *events = 1;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      if (parse_int(argv[++i], 1, 1024, threads, "--threads", &e)) return fail(&e);
    } else if (!strcmp(argv[i], "--stop-after-step") && i + 1 < argc) {
      if (parse_int(argv[++i], 1, 1 << 30, stop_after, "--stop-after-step", &e)) return fail(&e);
    } else {
      fprintf(stderr, "dapod train: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (!config || !*out) {
    fprintf(stderr, "dapod train: --config JOB.json and --out DIR are required\n");
    return 2;
  }
  json_error_t je;
  json_t *body = json_load_file(config, JSON_REJECT_DUPLICATES, &je);
  if (!body) {
    fprintf(stderr, "dapod train: %s: line %d column %d: %s\n", config, je.line, je.column,
            je.text);
    return 2;
  }
  char cfgcopy[PATH_MAX];
  snprintf(cfgcopy, sizeof cfgcopy, "%s", config);
  const char *base = dirname(cfgcopy);
  if (resolve_path(body, "training_file", base, 0) ||
      resolve_path(body, "validation_file", base, 0) || resolve_path(body, "model", base, 1)) {
    fprintf(stderr, "dapod train: a path in %s is too long\n", config);
    json_decref(body);
    return 2;
  }
  json_t *errors = json_array();
  int n = jobspec_parse(body, *pol, spec, errors);
  json_decref(body);
  if (n > 0) {
    fprintf(stderr, "dapod train: %s: %d problem%s\n", config, n, n > 1 ? "s" : "");
    for (size_t i = 0; i < json_array_size(errors); i++) {
      json_t *x = json_array_get(errors, i);
      fprintf(stderr, "  %s: %s\n", json_string_value(json_object_get(x, "field")),
              json_string_value(json_object_get(x, "message")));
    }
    json_decref(errors);
    jobspec_deinit(spec);
    return 2;
  }
  json_decref(errors);
  return 0;
}

/* dapod train as rank dist->rank of dist->size (alone: 0 of 1): every rank parses the same
 * command line and job, trains its share (runner_opts.dist) and returns the same status; rank 0
 * alone prints the metrics and what happens (the others say only what fails on them alone). */
static int train_as(const struct dist *dist, int argc, char **argv) {
  const char *out = NULL;
  int stop_after = 0, threads = pool_cpu_count() / dist->local_size, events = 0;
  if (threads < 1) threads = 1;
  struct job_spec spec;
  struct config cfg;
  const struct judge_policy *judges = NULL;
  if (config_init(&cfg)) {
    fprintf(stderr, "dapod train: out of memory\n");
    return 2;
  }
  int rc = train_parse(argc, argv, &spec, &out, &threads, &stop_after, &events, &cfg, &judges);
  /* pause and cancel signals are honoured from here (before the collective below: once rank 0
   * says anything, every rank has its handlers; the daemon's launcher relies on that) */
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGUSR2, &sa, NULL);
  if (events) { /* the daemon's launcher: pause and cancel come as SIGUSR1 and SIGUSR2, and a
                   SIGTERM means the daemon is gone (PR_SET_PDEATHSIG): stop at once, so that
                   no step runs that nobody records */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
  }
  /* every rank reads its own files: one that failed stops them all, before any training */
  int worst = dist_max(dist, rc);
  if (worst) {
    if (!rc) jobspec_deinit(&spec);
    config_deinit(&cfg);
    return worst;
  }
  int says = dist->rank == 0;
  /* the job's memory plan (what the daemon shows as the job's "memory"), once, on stderr */
  struct mem_plan plan;
  json_t *errors = json_array();
  if (says && errors && runner_check_job(&spec, &plan, errors) == 0) {
    json_t *pj = mem_plan_to_json(&plan);
    char *txt = pj ? json_dumps(pj, JSON_COMPACT) : NULL;
    if (txt) fprintf(stderr, "memory plan%s: %s\n", dist->size > 1 ? " (each rank)" : "", txt);
    free(txt);
    json_decref(pj);
  }
  json_decref(errors);
  if (says)
    fprintf(stderr, "OpenBLAS kernel: %s\ndecoding kernels: %s\n", blas_choice_describe(),
            g_isa_describe);
  if (says && dist->size > 1)
    fprintf(stderr, "data-parallel over %d ranks (%d on this machine), %d threads each\n",
            dist->size, dist->local_size, threads);
  struct runner_hooks hooks = {.metrics = train_metrics,
                               .checkpoint = train_checkpoint,
                               .log = train_log,
                               .progress = train_progress};
  if (events)
    hooks = (struct runner_hooks){.metrics = ev_metrics,
                                  .checkpoint = ev_checkpoint,
                                  .log = ev_log,
                                  .phase = ev_phase,
                                  .progress = ev_progress};
  struct pool *pool = pool_new(threads);
  struct runner_opts opts = {.cancel = &g_cancel,
                             .pause = &g_pause,
                             .stop_after_step = stop_after,
                             .progress_min_work = RUNNER_PROGRESS_MIN_WORK,
                             .dist = dist->size > 1 ? dist : NULL,
                             .pool = pool,
                             .judge_policy = judges};
  struct runner_result res;
  runner_run(&spec, out, &hooks, &opts, &res);
  pool_free(pool);
  jobspec_deinit(&spec);
  config_deinit(&cfg);
  if (events && says) ev_result(&res);
  const struct failure_info *f = failure_info(res.failure);
  switch (res.status) {
  case RUNNER_SUCCEEDED:
    if (says) fprintf(stderr, "succeeded at step %lld\n", (long long)res.step);
    return 0;
  case RUNNER_PAUSED:
    if (says)
      fprintf(stderr, "paused after step %lld; run the same command again to resume\n",
              (long long)res.step);
    return 3;
  case RUNNER_CANCELLED:
    if (says) fprintf(stderr, "cancelled at step %lld\n", (long long)res.step);
    return 4;
  case RUNNER_FAILED: break;
  }
  if (says)
    fprintf(stderr, "dapod train: failed (%s, %s%s%s): %s\n", f->name, f->category,
            res.param[0] ? ", " : "", res.param, res.message);
  return 1;
}

/* dapod train --config JOB.json --plan: the job checked against its model and data, and its
 * memory plan (the daemon's job "memory") printed as JSON on stdout, without loading weights or
 * training: 0, 1 when the job has problems (listed on stderr), 2 on a bad command line. */
static int train_plan(int argc, char **argv) {
  const char *out = "-";
  int threads = 1, stop_after = 0, events = 0;
  struct job_spec spec;
  struct config cfg;
  const struct judge_policy *judges;
  if (config_init(&cfg)) {
    fprintf(stderr, "dapod train: out of memory\n");
    return 2;
  }
  int rc = train_parse(argc, argv, &spec, &out, &threads, &stop_after, &events, &cfg, &judges);
  if (rc) {
    config_deinit(&cfg);
    return rc;
  }
  struct mem_plan plan;
  json_t *errors = json_array();
  int n = errors ? runner_check_job(&spec, &plan, errors) : -1;
  if (n == 0) {
    json_t *pj = mem_plan_to_json(&plan);
    if (pj) json_dumpf(pj, stdout, JSON_INDENT(2)), fputc('\n', stdout);
    json_decref(pj);
  }
  for (size_t i = 0; i < json_array_size(errors); i++) {
    json_t *x = json_array_get(errors, i);
    fprintf(stderr, "  %s: %s\n", json_string_value(json_object_get(x, "field")),
            json_string_value(json_object_get(x, "message")));
  }
  json_decref(errors);
  jobspec_deinit(&spec);
  config_deinit(&cfg);
  return n == 0 ? 0 : 1;
}

static int cmd_train(int argc, char **argv) {
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "--plan")) {
      memmove(argv + i, argv + i + 1, sizeof *argv * (size_t)(argc - i)); /* argv[argc] NULL */
      return train_plan(argc - 1, argv);
    }
  /* one rank of a data-parallel job when an MPI launcher started us (core/rl/dist.h) */
  struct dist dist;
  struct dapo_err e = {0};
  if (dist_init(&dist, &argc, &argv, &e)) {
    fprintf(stderr, "dapod train: %s\n", e.msg);
    return 2;
  }
  int rc = train_as(&dist, argc, argv);
  dist_finalize(&dist);
  return rc;
}

/* ---- dapod serve ---- */

/* sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET (Type=notify units). */
static void notify_systemd(const char *msg) {
  const char *path = getenv("NOTIFY_SOCKET");
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t n = path ? strlen(path) : 0;
  if (n == 0 || n >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@')) return;
  memcpy(sa.sun_path, path, n);
  if (sa.sun_path[0] == '@') sa.sun_path[0] = '\0'; /* abstract socket */
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0)
    LOG(WARN, "sd_notify %s: failed", msg);
  close(fd);
}

/* The self-pipe of SIGINT/SIGTERM: the handler writes one byte, main waits for it. */
static int g_stop_pipe[2] = {-1, -1};
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) {
  int saved = errno;
  g_stop_signal = sig;
  ssize_t k = write(g_stop_pipe[1], "x", 1); /* a full pipe already holds a wake-up */
  (void)k;
  errno = saved;
}

/* SIGHUP: the handler writes 'h' to the same pipe; main re-reads the configuration. */
static void on_hup_signal(int sig) {
  int saved = errno;
  (void)sig;
  ssize_t k = write(g_stop_pipe[1], "h", 1);
  (void)k;
  errno = saved;
}

/* SIGHUP: parses the serve arguments again (so the config file is re-read and flags still win)
 * and, when the result passes config_finish for the running listen address, swaps in its
 * api_keys atomically (server_set_api_keys). Only api_keys change at run time; other keys that
 * differ are named in a warning and wait for a restart. An invalid file, or one that would turn
 * authentication off (keys -> none), keeps the keys in use. Runs on the main thread, the only
 * writer of srv->cfg, which therefore reads srv->cfg without the lock. */
static void reload_config(struct server *srv, int argc, char **argv) {
  struct config fresh;
  struct dapo_err e = {0};
  enum config_action act;
  if (config_init(&fresh)) {
    LOG(ERROR, "SIGHUP: out of memory; the API keys in use stay");
    return;
  }
  int rc = config_parse_args(&fresh, argc, argv, &act, &e);
  if (!rc) {
    fresh.listen = srv->cfg.listen; /* the address actually served decides the loopback rule */
    rc = config_finish(&fresh, 0, &e);
  }
  if (!rc && srv->cfg.api_keys.n && !fresh.api_keys.n)
    rc = dapo_errf(&e, DAPO_EINVAL,
                   "api_keys: the new configuration has none; turning authentication off "
                   "needs a restart");
  if (rc) {
    LOG(ERROR, "SIGHUP: configuration not reloaded, the %d API keys in use stay: %s",
        srv->cfg.api_keys.n, e.msg);
    config_deinit(&fresh);
    return;
  }
  char ignored[512] = "";
  json_t *was = config_to_json(&srv->cfg), *now = config_to_json(&fresh);
  const char *k;
  json_t *v;
  json_object_foreach(was, k, v) {
    if (!strcmp(k, "api_keys") || json_equal(v, json_object_get(now, k))) continue;
    size_t n = strlen(ignored);
    snprintf(ignored + n, sizeof ignored - n, "%s%s", n ? ", " : "", k);
  }
  json_decref(was);
  json_decref(now);
  int admins = 0;
  for (int i = 0; i < fresh.api_keys.n; i++) admins += fresh.api_keys.v[i].admin != 0;
  int n_new = fresh.api_keys.n;
  server_set_api_keys(srv, &fresh.api_keys); /* fresh now holds the old keys */
  LOG(INFO, "SIGHUP: API keys reloaded: %d key%s (%d admin), %d before", n_new,
      n_new == 1 ? "" : "s", admins, fresh.api_keys.n);
  if (ignored[0]) LOG(WARN, "SIGHUP: changed settings that need a restart (ignored): %s", ignored);
  config_deinit(&fresh);
}

static void serve_help(FILE *f) {
  usage(f);
  fprintf(f, "\n");
  config_print_help(f);
}

/* argv[0] is "serve" or the program (skipped); the rest are config flags. */
static int cmd_serve(int argc, char **argv) {
  struct config cfg;
  struct dapo_err e = {0};
  enum config_action act;
  /* Phase 1: defaults, config file, flags, validation. */
  if (config_init(&cfg)) {
    fprintf(stderr, "dapod: out of memory\n");
    return 1;
  }
  if (config_parse_args(&cfg, argc, argv, &act, &e)) {
    fprintf(stderr, "dapod: %s\n", e.msg);
    config_deinit(&cfg);
    return 2;
  }
  if (act == CONFIG_HELP || act == CONFIG_PRINT_EXAMPLE) {
    char *ex = act == CONFIG_PRINT_EXAMPLE ? config_example_text() : NULL;
    if (act == CONFIG_HELP)
      serve_help(stdout);
    else if (ex)
      fputs(ex, stdout);
    free(ex);
    config_deinit(&cfg);
    return act == CONFIG_PRINT_EXAMPLE && !ex ? 1 : 0;
  }
  if (config_finish(&cfg, 0, &e)) {
    fprintf(stderr, "dapod: %s\n", e.msg);
    config_deinit(&cfg);
    return 2;
  }
  if (act == CONFIG_PRINT) {
    char *t = config_to_text(&cfg);
    if (t) fputs(t, stdout);
    free(t);
    config_deinit(&cfg);
    return t ? 0 : 1;
  }
  log_set_level((enum log_level)cfg.log_level);

  /* SIGINT/SIGTERM: the handler only records the signal and writes a byte to a pipe that the
   * main thread waits on (a self-pipe; sigwait with blocked signals is not enough, since
   * libraries such as OpenBLAS start threads before main that would take the signal with its
   * default action). SIGPIPE: a client that hangs up must not kill the daemon. */
  if (pipe2(g_stop_pipe, O_CLOEXEC)) {
    fprintf(stderr, "dapod: pipe: %s\n", strerror(errno));
    config_deinit(&cfg);
    return 1;
  }
  fcntl(g_stop_pipe[1], F_SETFL, O_NONBLOCK);
  struct sigaction sa = {0}, ign = {0};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART; /* other threads' system calls go on; the pipe wakes main */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = on_hup_signal;
  sigaction(SIGHUP, &sa, NULL);
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, NULL);
  /* The threads started below (workers and their compute pools, the completion and checker
   * threads, HTTP) inherit a mask that blocks the stop and reload signals, so that the kernel
   * gives them to this thread (or a library's thread started before main), never to one of ours:
   * under ThreadSanitizer, a signal taken by a thread that is blocked outside the runtime is
   * deferred until that thread next enters it, and once in eight ThreadSanitizer runs a daemon
   * that had served one request ignored SIGTERM for 20 s. */
  sigset_t stop_set;
  sigemptyset(&stop_set);
  sigaddset(&stop_set, SIGINT);
  sigaddset(&stop_set, SIGTERM);
  sigaddset(&stop_set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_set, NULL);

  /* Phase 2: storage, recovery of jobs left live, bus, workers (server_start), then HTTP. */
  struct server srv;
  server_init(&srv, &cfg);
  struct api_http *http = NULL;
  int started = !server_start(&srv, &e) && (http = api_http_start(&srv, &e)) != NULL;
  pthread_sigmask(SIG_UNBLOCK, &stop_set, NULL); /* pending ones run now, in this thread */
  if (!started) {
    fprintf(stderr, "dapod: %s\n", e.msg);
    server_stop(&srv);
    judge_global_cleanup();
    close(g_stop_pipe[0]);
    close(g_stop_pipe[1]);
    return 1;
  }
  server_set_ready(&srv, api_http_port(http));
  struct config_addr bound = srv.cfg.listen;
  char addr[300];
  bound.port = srv.port;
  config_addr_format(&bound, addr, sizeof addr);
  fprintf(stderr, "dapod: listening on %s://%s\n", srv.cfg.tls_cert[0] ? "https" : "http", addr);
  fflush(stderr);
  LOG(INFO, "serving: data_dir %s, models_dir %s, %d HTTP threads, %d workers", srv.cfg.data_dir,
      srv.cfg.models_dir, srv.cfg.http_threads, srv.cfg.workers);
  LOG(INFO, "OpenBLAS kernel: %s; decoding kernels: %s", blas_choice_describe(), g_isa_describe);
  char note[400]; /* READY=1 and a STATUS= line for `systemctl status` in one datagram */
  snprintf(note, sizeof note, "READY=1\nSTATUS=serving on %s://%s",
           srv.cfg.tls_cert[0] ? "https" : "http", addr);
  notify_systemd(note);

  /* Phase 3: wait for a signal (SIGHUP reloads the API keys), then stop in order. */
  for (;;) {
    /* poll first: unlike read, poll is never restarted after a handler (SA_RESTART), which
     * ThreadSanitizer needs to run a handler it deferred while the thread was blocked */
    struct pollfd pf = {.fd = g_stop_pipe[0], .events = POLLIN};
    if (poll(&pf, 1, -1) < 0) continue; /* EINTR */
    char byte;
    ssize_t k = read(g_stop_pipe[0], &byte, 1);
    if (k < 0 && errno == EINTR) continue;
    if (k == 1 && byte == 'h') {
      reload_config(&srv, argc, argv);
      continue;
    }
    break;
  }
  LOG(INFO, "%s: stopping", g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
  notify_systemd("STOPPING=1\nSTATUS=stopping: pausing running jobs at a safe point");
  server_quiesce(&srv); /* jobs pause, streams end */
  api_http_stop(http);  /* in-flight requests finish, no new ones */
  server_stop(&srv);
  judge_global_cleanup();
  close(g_stop_pipe[0]);
  close(g_stop_pipe[1]);
  LOG(INFO, "stopped");
  return 0;
}

/* DAPOD_KERNELS_ISA: the instruction set of the decoding kernels (docs/ENGINE.md, "The decoding
 * kernels' instruction set"); unset, empty or "auto": the best this processor has. Every one
 * gives the same bits, so it changes speed only. 0, or 2 after saying why on stderr. */
static int kernels_isa_apply(void) {
  const char *v = getenv("DAPOD_KERNELS_ISA");
  if (!v || !*v || !strcmp(v, "auto")) {
    snprintf(g_isa_describe, sizeof g_isa_describe, "%s, the best this processor has",
             kernels_isa_name(kernels_isa()));
    return 0;
  }
  int isa = kernels_isa_by_name(v);
  if (!isa) {
    fprintf(stderr,
            "dapod: DAPOD_KERNELS_ISA=%.40s: not one of auto, avx512, avx2, portable, baseline\n",
            v);
    return 2;
  }
  if (kernels_force_isa(isa) != isa) {
    fprintf(stderr, "dapod: DAPOD_KERNELS_ISA=%s: this processor lacks it (its best: %s)\n", v,
            kernels_isa_name(kernels_isa()));
    return 2;
  }
  snprintf(g_isa_describe, sizeof g_isa_describe, "%s, set by DAPOD_KERNELS_ISA", v);
  return 0;
}

int main(int argc, char **argv) {
  const char *cmd = argc > 1 ? argv[1] : "serve";
  /* the commands that compute run the OpenBLAS kernel measured fastest here (may re-execute)
   * and the decoding kernels DAPOD_KERNELS_ISA names */
  int help = !strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help");
  int computes = !strcmp(cmd, "serve") || !strcmp(cmd, "train") || !strcmp(cmd, "generate") ||
                 argc == 1 || cmd[0] == '-';
  if (computes || !strcmp(cmd, "__blas-probe")) blas_choice_apply(argc, argv);
  if ((computes || !strcmp(cmd, "kernels")) && !help && kernels_isa_apply()) return 2;
  if (help) {
    serve_help(stdout);
    return 0;
  }
  if (!strcmp(cmd, "presets")) return cmd_presets();
  if (!strcmp(cmd, "failures")) return cmd_failures(argc, argv);
  if (!strcmp(cmd, "train")) return cmd_train(argc, argv);
  if (!strcmp(cmd, "save-preset")) return cmd_save_preset(argc, argv);
  if (!strcmp(cmd, "generate")) return cmd_generate(argc, argv);
  if (!strcmp(cmd, "merge")) return cmd_merge(argc, argv);
  if (!strcmp(cmd, "kernels")) {
    int rc = blas_choice_cmd(argc, argv);
    if (!rc && !(argc > 2 && !strcmp(argv[2], "--json")))
      printf("decoding kernels: %s\n", g_isa_describe);
    return rc;
  }
  if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
  if (argc == 1 || cmd[0] == '-') return cmd_serve(argc, argv);
  fprintf(stderr, "dapod: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
