/* Python graders (grader.h): the user's grade(sample, item) run by Debian's /usr/bin/python3
 * inside bubblewrap: new namespaces for everything (no network: only a loopback device that
 * nothing listens on), /usr read-only and nothing else of the host's file system, an empty /tmp
 * (tmpfs) as working folder, no capabilities, a cleared environment, rlimits on address space,
 * CPU time, file size and open files, and a wall-clock deadline after which the sandbox is
 * killed. One process grades a whole batch: the rows go in on stdin as JSON, one result line per
 * row comes back on a duplicate of stdout (the user's own prints go to /dev/null). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "grader.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BWRAP "/usr/bin/bwrap"
#define PYTHON "/usr/bin/python3"

/* The program the sandbox runs: reads {"source", "rows"} on stdin, writes {"i", "score"} or
 * {"i", "error"} per row, or one {"setup_error"} when the source does not define grade. */
static const char RUNNER[] =
    "import json, math, numbers, os, sys\n"
    "out = os.fdopen(os.dup(1), 'w')\n"
    "null = open(os.devnull, 'w')\n"
    "os.dup2(null.fileno(), 1)\n"
    "os.dup2(null.fileno(), 2)\n"
    "sys.stdout = sys.stderr = null\n"
    "def say(o):\n"
    "    out.write(json.dumps(o) + '\\n')\n"
    "    out.flush()\n"
    "def why(ex):\n"
    "    return ('%s: %s' % (type(ex).__name__, ex))[:240]\n"
    "req = json.loads(sys.stdin.buffer.read())\n"
    "ns = {'__name__': 'grader'}\n"
    "try:\n"
    "    exec(compile(req['source'], 'grader.py', 'exec'), ns)\n"
    "    grade = ns['grade']\n"
    "except BaseException as ex:\n"
    "    say({'setup_error': why(ex)})\n"
    "    sys.exit(0)\n"
    "for i, row in enumerate(req['rows']):\n"
    "    try:\n"
    "        v = grade(row['sample'], row['item'])\n"
    "        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):\n"
    "            raise TypeError('grade returned %s, not a finite number' % type(v).__name__)\n"
    "        say({'i': i, 'score': float(v)})\n"
    "    except BaseException as ex:\n"
    "        say({'i': i, 'error': why(ex)})\n";

static const char *const BWRAP_ARGS[] = {BWRAP,
                                         "--unshare-all",
                                         "--die-with-parent",
                                         "--new-session",
                                         "--cap-drop",
                                         "ALL",
                                         "--clearenv",
                                         "--setenv",
                                         "PATH",
                                         "/usr/bin",
                                         "--setenv",
                                         "HOME",
                                         "/tmp",
                                         "--setenv",
                                         "LANG",
                                         "C.UTF-8",
                                         "--ro-bind",
                                         "/usr",
                                         "/usr",
                                         "--symlink",
                                         "usr/lib",
                                         "/lib",
                                         "--symlink",
                                         "usr/lib64",
                                         "/lib64",
                                         "--symlink",
                                         "usr/bin",
                                         "/bin",
                                         "--proc",
                                         "/proc",
                                         "--dev",
                                         "/dev",
                                         "--tmpfs",
                                         "/tmp",
                                         "--chdir",
                                         "/tmp",
                                         PYTHON,
                                         "-I",
                                         "-c",
                                         RUNNER,
                                         NULL};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs the sandbox with input[0..n_in) on stdin; *out (malloc'd, NUL-terminated) gets what it
 * wrote to stdout, up to GRADER_PY_OUTPUT_BYTES. Returns 0 when it exited by itself, 1 when it
 * was killed at the deadline or for writing too much, -1 when it could not start (why set). */
static int run_sandbox(const char *input, size_t n_in, char **out, char *why, size_t cap) {
  int in_sp[2] = {-1, -1}, out_sp[2] = {-1, -1};
  *out = NULL;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_sp) ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, out_sp)) {
    snprintf(why, cap, "socketpair: %s", strerror(errno));
    for (int i = 0; i < 2; i++) {
      if (in_sp[i] >= 0) close(in_sp[i]);
    }
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, cap, "fork: %s", strerror(errno));
    close(in_sp[0]), close(in_sp[1]), close(out_sp[0]), close(out_sp[1]);
    return -1;
  }
  if (pid == 0) { /* only async-signal-safe calls until exec */
    setpgid(0, 0);
    dup2(in_sp[1], 0);
    dup2(out_sp[1], 1);
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 2);
    struct rlimit as = {GRADER_PY_MEMORY, GRADER_PY_MEMORY};
    struct rlimit cpu = {GRADER_PY_WALL_S, GRADER_PY_WALL_S + 1};
    struct rlimit fsz = {64 << 20, 64 << 20};
    struct rlimit nofile = {64, 64};
    setrlimit(RLIMIT_AS, &as);
    setrlimit(RLIMIT_CPU, &cpu);
    setrlimit(RLIMIT_FSIZE, &fsz);
    setrlimit(RLIMIT_NOFILE, &nofile);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    execv(BWRAP, (char *const *)BWRAP_ARGS);
    _exit(127);
  }
  close(in_sp[1]);
  close(out_sp[1]);
  int wfd = in_sp[0], rfd = out_sp[0];
  fcntl(wfd, F_SETFL, O_NONBLOCK);
  size_t cap_out = 4096, n_out = 0, sent = 0;
  char *buf = malloc(cap_out);
  int killed = 0;
  double deadline = now_s() + GRADER_PY_WALL_S;
  if (n_in == 0) shutdown(wfd, SHUT_WR);
  while (buf) {
    struct pollfd p[2] = {{rfd, POLLIN, 0}, {wfd, POLLOUT, 0}};
    int np = sent < n_in ? 2 : 1;
    int ms = (int)((deadline - now_s()) * 1000);
    if (ms <= 0) {
      killed = 1;
      break;
    }
    int r = poll(p, (nfds_t)np, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (np == 2 && (p[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t w = send(wfd, input + sent, n_in - sent, MSG_NOSIGNAL);
      if (w > 0) sent += (size_t)w;
      if (w < 0 && errno != EAGAIN && errno != EINTR) sent = n_in; /* it stopped reading */
      if (sent >= n_in) shutdown(wfd, SHUT_WR);
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      if (n_out + 4096 + 1 > cap_out) {
        if (cap_out >= GRADER_PY_OUTPUT_BYTES + 4096) {
          killed = 1;
          break;
        }
        char *nb = realloc(buf, cap_out * 2);
        if (!nb) break;
        buf = nb, cap_out *= 2;
      }
      ssize_t k = read(rfd, buf + n_out, cap_out - n_out - 1);
      if (k == 0) break;
      if (k > 0) n_out += (size_t)k;
      if (k < 0 && errno != EINTR && errno != EAGAIN) break;
    }
  }
  if (killed || !buf) kill(-pid, SIGKILL), kill(pid, SIGKILL);
  close(wfd);
  close(rfd);
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!buf) {
    snprintf(why, cap, "out of memory");
    return -1;
  }
  buf[n_out] = '\0';
  *out = buf;
  if (!killed && WIFEXITED(status) && WEXITSTATUS(status) == 127 && n_out == 0) {
    snprintf(why, cap, "%s could not be started", BWRAP);
    return -1;
  }
  if (!killed && WIFEXITED(status) && WEXITSTATUS(status) != 0 && n_out == 0) {
    snprintf(why, cap,
             "the sandbox exited with status %d before grading (bubblewrap refused "
             "to start, or python3 is missing)",
             WEXITSTATUS(status));
    return -1;
  }
  return killed;
}

int grader_python_run(const char *source, const json_t *rows, double *scores, int *kinds,
                      char *detail, size_t cap) {
  size_t n = json_array_size(rows);
  for (size_t i = 0; i < n; i++) scores[i] = 0, kinds[i] = GE_PYTHON_RUNTIME;
  if (cap) *detail = '\0';
  json_t *req = json_pack("{s:s, s:O}", "source", source, "rows", rows);
  char *input = req ? json_dumps(req, JSON_COMPACT) : NULL;
  json_decref(req);
  if (!input) return DAPO_ENOMEM;
  char *out = NULL, why[256] = "";
  int r = run_sandbox(input, strlen(input), &out, why, sizeof why);
  free(input);
  if (r < 0) {
    for (size_t i = 0; i < n; i++) kinds[i] = GE_PYTHON_SERVER;
    snprintf(detail, cap, "%s", why);
    free(out);
    return 0;
  }
  /* One JSON object a line; anything else (junk the grader wrote to the real stdout) is
   * skipped, and rows without a line keep their runtime error. */
  for (char *line = out, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    json_t *o = json_loads(line, 0, NULL);
    const char *setup = json_string_value(json_object_get(o, "setup_error"));
    if (setup) {
      snprintf(detail, cap, "%s", setup);
      json_decref(o);
      break;
    }
    json_t *ji = json_object_get(o, "i");
    if (json_is_integer(ji) && json_integer_value(ji) >= 0 && (size_t)json_integer_value(ji) < n) {
      size_t i = (size_t)json_integer_value(ji);
      json_t *sc = json_object_get(o, "score");
      const char *err = json_string_value(json_object_get(o, "error"));
      if (json_is_number(sc)) {
        scores[i] = json_number_value(sc);
        kinds[i] = GE_COUNT;
      } else if (err && cap && !*detail) {
        snprintf(detail, cap, "%s", err);
      }
    }
    json_decref(o);
  }
  if (r == 1 && cap && !*detail)
    snprintf(detail, cap, "the grader ran past %d s (or wrote over %zu bytes) and was stopped",
             GRADER_PY_WALL_S, GRADER_PY_OUTPUT_BYTES);
  free(out);
  return 0;
}

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_ok;
static char probe_why[320];

static void probe(void) {
  if (access(BWRAP, X_OK)) {
    snprintf(probe_why, sizeof probe_why,
             "%s is not installed (Debian package bubblewrap; scripts/setup.sh installs it)",
             BWRAP);
    return;
  }
  if (access(PYTHON, X_OK)) {
    snprintf(probe_why, sizeof probe_why, "%s is not installed", PYTHON);
    return;
  }
  json_t *rows = json_pack("[{s:{}, s:{}}]", "sample", "item");
  double score = 0;
  int kind = GE_COUNT;
  char detail[200] = "";
  int rc = rows ? grader_python_run("def grade(sample, item):\n    return 0.25\n", rows, &score,
                                    &kind, detail, sizeof detail)
                : DAPO_ENOMEM;
  json_decref(rows);
  if (!rc && kind == GE_COUNT && score == 0.25) {
    probe_ok = 1;
    return;
  }
  snprintf(probe_why, sizeof probe_why, "a trial grader failed in the sandbox: %s",
           detail[0] ? detail : "no result");
}

int grader_python_available(char *why, size_t cap) {
  pthread_once(&probe_once, probe);
  if (!probe_ok && why && cap) snprintf(why, cap, "%s", probe_why);
  return probe_ok;
}
