/* Memory measurements shared by the tests that hold a memory plan against the process: the
 * heap in use (mallinfo2), the resident set size and its peak (/proc/self/status), and a new
 * peak started (/proc/self/clear_refs). */
#ifndef DAPO_TEST_MEMORY_H
#define DAPO_TEST_MEMORY_H

#include <malloc.h>
#include <stdio.h>

/* The bytes malloc has handed out and not had back. */
static inline size_t heap_now(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

/* Resident set size now and its peak since the last reset (/proc/self/status), in bytes. */
static inline void rss(size_t *now, size_t *peak) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  *now = *peak = 0;
  while (f && fgets(line, sizeof line, f)) {
    unsigned long kb;
    if (sscanf(line, "VmRSS: %lu kB", &kb) == 1) *now = (size_t)kb * 1024;
    if (sscanf(line, "VmHWM: %lu kB", &kb) == 1) *peak = (size_t)kb * 1024;
  }
  if (f) fclose(f);
}

/* Starts a new peak (/proc/self/clear_refs "5"); 0 when the kernel does not allow it. */
static inline int peak_restart(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  int reset = f && fputs("5", f) >= 0;
  if (f) reset &= fclose(f) == 0;
  return reset;
}

#endif
