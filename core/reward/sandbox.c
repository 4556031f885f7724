/* The sandbox (sandbox.h): Debian's /usr/bin/python3 inside bubblewrap: new namespaces for
 * everything (no network: only a loopback device that nothing listens on), /usr read-only and
 * nothing else of the host's file system, an empty /tmp (tmpfs) as working folder, no
 * capabilities, a cleared environment, rlimits on address space, CPU time, file size and open
 * files, and a wall-clock deadline after which the sandbox is killed. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "sandbox.h"

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

/* bubblewrap's arguments; the program goes in at PROGRAM_ARG */
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
                                         NULL, /* the program */
                                         NULL};
#define N_BWRAP_ARGS (sizeof BWRAP_ARGS / sizeof BWRAP_ARGS[0])
#define PROGRAM_ARG (N_BWRAP_ARGS - 2)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int sandbox_run(const char *program, const char *input, size_t n_in,
                const struct sandbox_limits *lim, char **out, char *why, size_t cap) {
  const char *argv[N_BWRAP_ARGS];
  memcpy(argv, BWRAP_ARGS, sizeof argv);
  argv[PROGRAM_ARG] = program;
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
    struct rlimit as = {(rlim_t)lim->memory, (rlim_t)lim->memory};
    struct rlimit cpu = {(rlim_t)lim->wall_s, (rlim_t)lim->wall_s + 1};
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
    execv(BWRAP, (char *const *)argv);
    _exit(127);
  }
  close(in_sp[1]);
  close(out_sp[1]);
  int wfd = in_sp[0], rfd = out_sp[0];
  fcntl(wfd, F_SETFL, O_NONBLOCK);
  size_t cap_out = 4096, n_out = 0, sent = 0;
  char *buf = malloc(cap_out);
  int killed = 0;
  double deadline = now_s() + lim->wall_ms / 1000.0;
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
        if (cap_out >= lim->output_bytes + 4096) {
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
             "the sandbox exited with status %d before its program wrote anything "
             "(bubblewrap refused to start, or python3 is missing)",
             WEXITSTATUS(status));
    return -1;
  }
  return killed;
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
  struct sandbox_limits lim = {
      .wall_ms = 30000, .wall_s = 30, .memory = (long)1 << 30, .output_bytes = 4096};
  char *out = NULL, why[256] = "";
  int r = sandbox_run("import sys\nsys.stdout.write(sys.stdin.read()[::-1])\n", "ko", 2, &lim, &out,
                      why, sizeof why);
  if (r == 0 && out && !strcmp(out, "ok"))
    probe_ok = 1;
  else
    snprintf(probe_why, sizeof probe_why, "a trial program failed in the sandbox: %s",
             r < 0 ? why
             : r   ? "stopped at its limits"
                   : "wrong output");
  free(out);
}

int sandbox_available(char *why, size_t cap) {
  pthread_once(&probe_once, probe);
  if (!probe_ok && why && cap) snprintf(why, cap, "%s", probe_why);
  return probe_ok;
}
