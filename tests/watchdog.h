/* A watchdog for the C tests whose threads could block for ever: watchdog_start(seconds) arms
 * it, watchdog_section("what") names the part running (printed with the seconds it took when the
 * next begins), and when the deadline passes it prints the section, every thread's stack (gdb,
 * where the machine has it) and aborts, so that a hang on a machine we cannot reach (CI) says
 * where it was instead of ending in ctest's timeout with nothing to read. */
#ifndef DAPO_TEST_WATCHDOG_H
#define DAPO_TEST_WATCHDOG_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static const char *volatile watchdog_what = "start";
static double watchdog_t0;

static inline double watchdog_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void watchdog_section(const char *what) {
  double now = watchdog_now();
  fprintf(stderr, "[%.1f s] %s done; %s\n", now - watchdog_t0, watchdog_what, what);
  watchdog_what = what;
}

static void *watchdog_main(void *p) {
  int seconds = (int)(long)p;
  sleep((unsigned)seconds);
  fprintf(stderr, "watchdog: still in '%s' after %d s; the threads' stacks:\n", watchdog_what,
          seconds);
  char cmd[160];
  snprintf(cmd, sizeof cmd,
           "command -v gdb >/dev/null && gdb -q -batch -p %d -ex 'thread apply all bt' 1>&2",
           (int)getpid());
  if (system(cmd)) fprintf(stderr, "watchdog: no stacks (gdb is missing or failed)\n");
  abort();
  return NULL;
}

/* Arms the watchdog: the process aborts after `seconds` (a detached thread). */
static inline void watchdog_start(int seconds) {
  pthread_t th;
  watchdog_t0 = watchdog_now();
  if (!pthread_create(&th, NULL, watchdog_main, (void *)(long)seconds)) pthread_detach(th);
}

#endif
