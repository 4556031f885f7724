/* A stand-in server for the C tests: a program started here that prints the loopback port it
 * listens on as its first line of stdout (the judges, tools and environments of tests/), stopped
 * with SIGTERM (then SIGKILL) at the end, or killed with the test should it die first. Every wait
 * has a deadline. */
#ifndef DAPO_TEST_CHILD_H
#define DAPO_TEST_CHILD_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct child {
  pid_t pid;
  int port;
};

static inline double child_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void child_nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

/* Starts argv (argv[0] a path, NULL-terminated) and reads its port within 15 s. 0, or -1 (the
 * child, if any, is stopped). */
static inline int child_start(struct child *c, const char *const *argv) {
  int fd[2];
  c->pid = -1;
  c->port = 0;
  if (pipe(fd)) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(fd[0]);
    close(fd[1]);
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that crashes leaves no server behind */
    dup2(fd[1], STDOUT_FILENO);
    close(fd[0]);
    close(fd[1]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(fd[1]);
  c->pid = pid;
  char line[32];
  size_t n = 0;
  double deadline = child_now_s() + 15;
  while (n < sizeof line - 1 && !memchr(line, '\n', n)) {
    int left = (int)((deadline - child_now_s()) * 1000);
    if (left <= 0) break;
    struct pollfd p = {.fd = fd[0], .events = POLLIN};
    int r = poll(&p, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    ssize_t got = read(fd[0], line + n, sizeof line - 1 - n);
    if (got <= 0) break;
    n += (size_t)got;
  }
  close(fd[0]);
  line[n] = '\0';
  char *end = NULL;
  long port = strtol(line, &end, 10);
  if (!memchr(line, '\n', n) || end == line || *end != '\n' || port < 1 || port > 65535) {
    kill(c->pid, SIGKILL);
    waitpid(c->pid, NULL, 0);
    c->pid = -1;
    return -1;
  }
  c->port = (int)port;
  return 0;
}

static inline void child_stop(struct child *c) {
  if (c->pid <= 0) return;
  kill(c->pid, SIGTERM);
  double deadline = child_now_s() + 5;
  int status;
  for (;;) {
    pid_t r = waitpid(c->pid, &status, WNOHANG);
    if (r == c->pid || (r < 0 && errno != EINTR)) break;
    if (child_now_s() > deadline) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &status, 0);
      break;
    }
    child_nap_ms(10);
  }
  c->pid = -1;
}

#endif
