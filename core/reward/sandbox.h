/* Internal to core/reward: code from outside (python graders, the python tool) run by Debian's
 * /usr/bin/python3 in a sandbox made with bubblewrap: no network, no file system but a read-only
 * /usr and an empty /tmp, no capabilities, a cleared environment, rlimits on memory, CPU time,
 * file size and open files, a wall-clock deadline and a cap on what it writes back. */
#ifndef DAPO_SANDBOX_H
#define DAPO_SANDBOX_H

#include <stddef.h>

struct sandbox_limits {
  int wall_ms;         /* killed after this long */
  int wall_s;          /* RLIMIT_CPU (seconds of CPU time) */
  long memory;         /* RLIMIT_AS, bytes */
  size_t output_bytes; /* killed when it writes more to stdout */
};

/* Runs `python3 -I -c program` in the sandbox with input[0..n_in) on stdin; *out (malloc'd,
 * NUL-terminated) gets what it wrote to stdout. Returns 0 when it exited by itself, 1 when it was
 * killed at its limits, -1 when it could not start (why, cap bytes, says why). Thread-safe. */
int sandbox_run(const char *program, const char *input, size_t n_in,
                const struct sandbox_limits *lim, char **out, char *why, size_t cap);

/* 1 when the sandbox runs here: bubblewrap and /usr/bin/python3 are installed and a trial
 * program runs in it; else 0 with why saying what is missing. Checked once per process. */
int sandbox_available(char *why, size_t cap);

#endif
