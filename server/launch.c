/* Multi-process jobs through the configured launcher (launch.h). */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "failure.h"
#include "jobspec.h"
#include "log.h"

#define POLL_MS 200
#define CANCEL_GRACE_S 30 /* a cancelled launcher still running after this is sent SIGTERM */
#define KILL_GRACE_S 10   /* and SIGKILL this long after a SIGTERM */
#define EXIT_WAIT_S 30    /* after its output ended, the launcher is waited for this long */
#define LINE_MAX_BYTES (64u << 20)
#define LOG_TAIL_BYTES 600 /* of launch.log, quoted when an attempt fails */

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the command line ---- */

struct words {
  char **v;
  int n, cap;
};

static int push(struct words *w, char *s) { /* takes s */
  if (!s) return -1;
  if (w->n + 2 > w->cap) {
    int cap = w->cap ? 2 * w->cap : 16;
    char **v = realloc(w->v, sizeof *v * (size_t)cap);
    if (!v) {
      free(s);
      return -1;
    }
    w->v = v, w->cap = cap;
  }
  w->v[w->n++] = s;
  w->v[w->n] = NULL;
  return 0;
}

static void words_free(struct words *w) {
  for (int i = 0; i < w->n; i++) free(w->v[i]);
  free(w->v);
  memset(w, 0, sizeof *w);
}

/* word with every "{processes}" replaced by n (malloc'ed). */
static char *subst(const char *word, size_t len, int n) {
  static const char key[] = "{processes}";
  char num[16];
  snprintf(num, sizeof num, "%d", n);
  size_t cap = len * strlen(num) + len + 1, o = 0;
  char *r = malloc(cap);
  if (!r) return NULL;
  for (size_t i = 0; i < len;) {
    if (len - i >= sizeof key - 1 && !memcmp(word + i, key, sizeof key - 1)) {
      memcpy(r + o, num, strlen(num));
      o += strlen(num);
      i += sizeof key - 1;
    } else
      r[o++] = word[i++];
  }
  r[o] = '\0';
  return r;
}

/* The launcher's words, then this dapod's `train` command line. 0, or -1 with msg set. */
static int command(const struct config *cfg, int processes, const char *job_file,
                   const char *judges_file, const char *out, struct words *w, char *msg,
                   size_t cap) {
  const char *s = cfg->launcher;
  while (*s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strcspn(s, " \t");
    if (n && push(w, subst(s, n, processes))) goto oom;
    s += n;
  }
  if (!w->n) {
    snprintf(msg, cap, "no launcher is configured (the launcher setting)");
    return -1;
  }
  char self[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k <= 0) {
    snprintf(msg, cap, "cannot find this dapod's own binary: %s", strerror(errno));
    return -1;
  }
  self[k] = '\0';
  const char *tail[] = {self, "train",    "--config",        job_file,   "--out",
                        out,  "--events", "--server-config", judges_file};
  for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++)
    if (push(w, strdup(tail[i]))) goto oom;
  /* the launcher's path, looked up now: the child may only call async-signal-safe functions */
  if (!strchr(w->v[0], '/')) {
    const char *path = getenv("PATH");
    char found[PATH_MAX] = "";
    for (const char *p = path ? path : "/usr/bin:/bin"; *p && !found[0];) {
      size_t n = strcspn(p, ":");
      char cand[PATH_MAX];
      if (n && (size_t)snprintf(cand, sizeof cand, "%.*s/%s", (int)n, p, w->v[0]) < sizeof cand &&
          access(cand, X_OK) == 0)
        snprintf(found, sizeof found, "%s", cand);
      p += n + (p[n] == ':');
    }
    if (!found[0]) {
      snprintf(msg, cap, "launcher: '%s' is not found on PATH", w->v[0]);
      return -1;
    }
    char *d = strdup(found);
    if (!d) goto oom;
    free(w->v[0]);
    w->v[0] = d;
  }
  return 0;
oom:
  snprintf(msg, cap, "out of memory");
  return -1;
}

/* Writes j (stolen) to path through a temporary file: 0, or -1 with msg ("what: why"). */
static int write_json(json_t *j, const char *path, const char *what, char *msg, size_t cap) {
  char tmp[PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  struct dapo_err e = {0};
  int rc = !j ? dapo_errf(&e, DAPO_ENOMEM, "out of memory") : ckpt_write_json(tmp, j, &e);
  json_decref(j);
  if (!rc && rename(tmp, path)) rc = dapo_errf(&e, DAPO_EIO, "%s: %s", path, strerror(errno));
  if (rc) snprintf(msg, cap, "writing %s: %.400s", what, e.msg);
  return rc ? -1 : 0;
}

/* The daemon's judge settings as a config file the ranks read (dapod train --server-config):
 * judge_allowed_hosts, judge_allow_private and the judge models reached over HTTP, so that the
 * ranks' judges are the ones the daemon checked the job against. The models the daemon serves
 * itself are left out (its completion service is not in the ranks; jobs.c refuses a
 * multi-process job that names one): launch-judges.json. */
static int write_judges_file(const struct config *cfg, const char *path, char *msg, size_t cap) {
  json_t *all = config_to_json(cfg), *j = json_object(), *models = json_object();
  const char *name;
  json_t *entry;
  json_object_foreach(cfg->judge_models, name, entry) {
    if (!json_object_get(entry, "serve")) json_object_set(models, name, entry);
  }
  if (all && j && models) {
    json_object_set(j, "judge_allowed_hosts", json_object_get(all, "judge_allowed_hosts"));
    json_object_set(j, "judge_allow_private", json_object_get(all, "judge_allow_private"));
    json_object_set(j, "judge_models", models);
  }
  json_decref(all);
  json_decref(models);
  return write_json(j, path, "the ranks' judge settings", msg, cap);
}

/* The spec the ranks run, without resources, named by the job's id: launch-job.json. */
static int write_job_file(const struct job_spec *spec, const char *path, char *msg, size_t cap) {
  json_t *j = jobspec_to_json(spec);
  if (j && json_object_set_new(j, "job_id", json_string(spec->job_id))) {
    json_decref(j);
    j = NULL;
  }
  return write_json(j, path, "the ranks' job file", msg, cap);
}

/* The last bytes of launch.log on one line (what the launcher and the ranks said last). */
static void log_tail(const char *path, char *buf, size_t cap) {
  buf[0] = '\0';
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st;
  if (!fstat(fd, &st)) {
    off_t from = st.st_size > LOG_TAIL_BYTES ? st.st_size - LOG_TAIL_BYTES : 0;
    ssize_t n = pread(fd, buf, cap - 1 < LOG_TAIL_BYTES ? cap - 1 : LOG_TAIL_BYTES, from);
    buf[n > 0 ? n : 0] = '\0';
    for (char *p = buf; *p; p++)
      if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
  }
  close(fd);
}

/* ---- the ranks' events ---- */

struct relay {
  const struct runner_hooks *h;
  struct runner_result *res;
  int have_result, hook_failed, heard;
  int64_t step; /* the last step whose metrics were told */
};

static int64_t jint(const json_t *o, const char *k) {
  return json_integer_value(json_object_get(o, k));
}
static const char *jstr(const json_t *o, const char *k) {
  const char *s = json_string_value(json_object_get(o, k));
  return s ? s : "";
}

/* One line of the ranks' stdout: an event told to the hooks. Non-zero: a hook refused it. */
static int on_line(struct relay *r, const char *line, size_t n) {
  json_error_t je;
  json_t *o = json_loadb(line, n, 0, &je);
  const char *ev = json_string_value(json_object_get(o, "event"));
  if (!ev) {
    LOG(WARN, "launcher: a line that is not an event: %.200s", line);
    json_decref(o);
    return 0;
  }
  r->heard = 1;
  const struct runner_hooks *h = r->h;
  int rc = 0;
  if (!strcmp(ev, "metrics")) {
    struct runner_metrics m = {.step = jint(o, "step"),
                               .eval = json_is_true(json_object_get(o, "eval")),
                               .tokens_generated = jint(o, "tokens_generated"),
                               .tokens_trained = jint(o, "tokens_trained"),
                               .data = json_object_get(o, "data")};
    if (!m.eval) r->step = m.step;
    rc = h->metrics ? h->metrics(h->ctx, &m) : 0;
  } else if (!strcmp(ev, "checkpoint")) {
    struct ckpt_manifest man;
    struct dapo_err e = {0};
    const json_t *metrics = json_object_get(o, "metrics");
    struct runner_checkpoint c = {.step = jint(o, "step"),
                                  .path = jstr(o, "path"),
                                  .manifest = &man,
                                  .metrics = json_is_object(metrics) ? metrics : NULL};
    if (ckpt_manifest_read(c.path, &man, &e)) {
      LOG(ERROR, "launcher: the ranks' checkpoint %s: %s", c.path, e.msg);
      rc = -1;
    } else
      rc = h->checkpoint ? h->checkpoint(h->ctx, &c) : 0;
  } else if (!strcmp(ev, "log")) {
    rc = h->log ? h->log(h->ctx, jstr(o, "level"), jint(o, "step"), jstr(o, "message")) : 0;
  } else if (!strcmp(ev, "phase")) {
    if (h->phase) h->phase(h->ctx, jstr(o, "phase"));
  } else if (!strcmp(ev, "progress")) {
    struct runner_progress p = {.step = jint(o, "step"),
                                .pass = jstr(o, "pass"),
                                .round = (int)jint(o, "round"),
                                .done = jint(o, "done"),
                                .total = jint(o, "total"),
                                .tokens = jint(o, "tokens")};
    if (h->progress) h->progress(h->ctx, &p);
  } else if (!strcmp(ev, "result")) {
    static const char *const names[] = {"succeeded", "paused", "cancelled", "failed"};
    struct runner_result *res = r->res;
    res->status = RUNNER_FAILED;
    for (int i = 0; i < 4; i++)
      if (!strcmp(jstr(o, "status"), names[i])) res->status = (enum runner_status)i;
    res->step = jint(o, "step");
    res->failure = failure_by_name(jstr(o, "failure"));
    snprintf(res->param, sizeof res->param, "%s", jstr(o, "param"));
    snprintf(res->message, sizeof res->message, "%s", jstr(o, "message"));
    r->have_result = 1;
  }
  json_decref(o);
  return rc;
}

/* ---- one attempt ---- */

static void signal_group(pid_t pid, int sig) {
  if (kill(-pid, sig) && errno == ESRCH) kill(pid, sig);
}

/* Starts the launcher (w) and relays its events until its stdout ends; its exit status into
 * *status (-1: could not start). */
static void attempt(struct words *w, const char *log_path, struct relay *r,
                    const struct runner_opts *o, int *status) {
  *status = -1;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) {
    LOG(ERROR, "launcher: pipe: %s", strerror(errno));
    return;
  }
  int logfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t parent = getpid();
  pid_t pid = logfd < 0 || nullfd < 0 ? -1 : fork();
  if (pid == 0) { /* the child: async-signal-safe calls only */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* the daemon's thread gone: the launcher goes too */
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    dup2(nullfd, 0);
    dup2(fds[1], 1);
    dup2(logfd, 2);
    close_range(3, ~0U, 0); /* none of the daemon's files (database, sockets) in the ranks */
    execv(w->v[0], w->v);
    _exit(127);
  }
  close(fds[1]);
  if (logfd >= 0) close(logfd);
  if (nullfd >= 0) close(nullfd);
  if (pid < 0) {
    LOG(ERROR, "launcher: cannot start %s: %s", w->v[0], strerror(errno));
    close(fds[0]);
    return;
  }
  setpgid(pid, pid); /* also here: whichever runs first */
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int sent_pause = 0, sent_cancel = 0;
  double cancel_at = 0, term_at = 0;
  for (;;) {
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    int pr = poll(&p, 1, POLL_MS);
    if (pr < 0 && errno != EINTR) break;
    if (pr > 0) {
      if (len + 65536 > cap) {
        size_t nc = cap ? 2 * cap : 131072;
        char *nb = nc <= 2 * (size_t)LINE_MAX_BYTES ? realloc(buf, nc) : NULL;
        if (!nb) {
          LOG(ERROR, "launcher: an event line longer than %u bytes", LINE_MAX_BYTES);
          r->hook_failed = 1;
          break;
        }
        buf = nb, cap = nc;
      }
      ssize_t k = read(fds[0], buf + len, cap - len);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break; /* every writer closed it: the launcher and its ranks are done */
      len += (size_t)k;
      char *start = buf, *nl;
      while ((nl = memchr(start, '\n', len - (size_t)(start - buf)))) {
        *nl = '\0';
        if (!r->hook_failed && on_line(r, start, (size_t)(nl - start))) r->hook_failed = 1;
        start = nl + 1;
      }
      len -= (size_t)(start - buf);
      memmove(buf, start, len);
    }
    /* requests reach the ranks once they have said something (their handlers are set) */
    double now = mono_s();
    int cancel = o && o->cancel && __atomic_load_n(o->cancel, __ATOMIC_RELAXED);
    int pause = o && o->pause && __atomic_load_n(o->pause, __ATOMIC_RELAXED);
    if (r->heard && cancel && !sent_cancel) {
      signal_group(pid, SIGUSR2);
      sent_cancel = 1;
      cancel_at = now;
    }
    if (r->heard && pause && !sent_pause && !sent_cancel) {
      signal_group(pid, SIGUSR1);
      sent_pause = 1;
    }
    if (!term_at && ((cancel && now - (cancel_at ? cancel_at : now) > CANCEL_GRACE_S) ||
                     (cancel && !r->heard) || r->hook_failed)) {
      signal_group(pid, SIGTERM);
      term_at = now;
    }
    if (term_at && now - term_at > KILL_GRACE_S) signal_group(pid, SIGKILL);
  }
  close(fds[0]);
  free(buf);
  /* its output ended: it exits now (or is made to) */
  double until = mono_s() + EXIT_WAIT_S;
  int st = 0;
  pid_t got;
  while ((got = waitpid(pid, &st, WNOHANG)) == 0 && mono_s() < until) {
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (got == 0) {
    signal_group(pid, SIGKILL);
    got = waitpid(pid, &st, 0);
  }
  kill(-pid, SIGKILL); /* stragglers of its group, if any */
  *status = got == pid ? st : -1;
}

static void describe(int status, char *buf, size_t cap) {
  if (status == -1)
    snprintf(buf, cap, "could not be started");
  else if (WIFEXITED(status))
    snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, cap, "was killed by signal %d", WTERMSIG(status));
  else
    snprintf(buf, cap, "ended (status %d)", status);
}

int launch_run(const struct config *cfg, const struct job_spec *spec, const char *out,
               const struct runner_hooks *h, const struct runner_opts *o,
               struct runner_result *res) {
  memset(res, 0, sizeof *res);
  res->resumed_from = -1;
  res->status = RUNNER_FAILED;
  res->failure = FAIL_LAUNCH_FAILED;
  char job_file[PATH_MAX], judges_file[PATH_MAX], log_path[PATH_MAX];
  snprintf(job_file, sizeof job_file, "%s/launch-job.json", out);
  snprintf(judges_file, sizeof judges_file, "%s/launch-judges.json", out);
  snprintf(log_path, sizeof log_path, "%s/launch.log", out);
  struct words w = {0};
  if (write_job_file(spec, job_file, res->message, sizeof res->message) ||
      write_judges_file(cfg, judges_file, res->message, sizeof res->message) ||
      command(cfg, spec->processes, job_file, judges_file, out, &w, res->message,
              sizeof res->message)) {
    words_free(&w);
    return 0;
  }
  struct relay r = {.h = h, .res = res, .step = -1};
  int attempts = cfg->launch_retries + 1;
  for (int a = 1; a <= attempts; a++) {
    LOG(INFO, "job %s: launching %d processes (attempt %d of %d): %s ...", spec->job_id,
        spec->processes, a, attempts, w.v[0]);
    r.have_result = r.heard = 0;
    int status;
    attempt(&w, log_path, &r, o, &status);
    if (r.hook_failed) {
      res->status = RUNNER_FAILED;
      res->failure = FAIL_EVENT_STORE_FAILED;
      snprintf(res->message, sizeof res->message, "could not record the ranks' events");
      break;
    }
    if (r.have_result) break; /* the ranks ended the job (or the attempt) themselves */
    char how[64], tail[LOG_TAIL_BYTES + 1];
    describe(status, how, sizeof how);
    log_tail(log_path, tail, sizeof tail);
    if (o && o->cancel && __atomic_load_n(o->cancel, __ATOMIC_RELAXED)) {
      res->status = RUNNER_CANCELLED;
      res->failure = FAIL_CANCELLED;
      res->step = r.step;
      break;
    }
    if (a == attempts) {
      res->status = RUNNER_FAILED;
      res->failure = FAIL_LAUNCH_FAILED;
      res->step = r.step;
      snprintf(res->message, sizeof res->message,
               "the launcher %s before the job ended, %d time%s (launch_retries %d); "
               "launch.log ends: %s",
               how, attempts, attempts > 1 ? "s" : "", cfg->launch_retries, tail);
      break;
    }
    char msg[LOG_TAIL_BYTES + 256];
    snprintf(msg, sizeof msg,
             "the launcher %s before the job ended (attempt %d of %d); starting again from the "
             "last checkpoint. launch.log ends: %s",
             how, a, attempts, tail);
    LOG(WARN, "job %s: %s", spec->job_id, msg);
    if (h->log && h->log(h->ctx, "warning", r.step > 0 ? r.step : 0, msg)) {
      res->status = RUNNER_FAILED;
      res->failure = FAIL_EVENT_STORE_FAILED;
      snprintf(res->message, sizeof res->message, "could not record a log event");
      break;
    }
  }
  words_free(&w);
  return 0;
}
