/* File helpers shared by the tests: a file read whole, two files compared byte for byte, the
 * addition dataset the runner tests train on, and the path of a file in tests/data. */
#ifndef DAPO_TEST_FILES_H
#define DAPO_TEST_FILES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole file at path (malloc'd, NUL-terminated; *len its size), or NULL. */
static inline char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
  *len = b ? fread(b, 1, (size_t)n, f) : 0;
  if (b) b[*len] = 0;
  fclose(f);
  return b;
}

/* 1 when both files exist and hold the same bytes (says which differ on stderr otherwise). */
static inline int same_file(const char *a, const char *b) {
  size_t la = 0, lb = 0;
  char *x = slurp(a, &la), *y = slurp(b, &lb);
  int same = x && y && la == lb && !memcmp(x, y, la);
  if (!same) fprintf(stderr, "files differ: %s %s\n", a, b);
  free(x), free(y);
  return same;
}

/* n lines {"prompt": "a+b=", "answer": "(a+b) mod 10"} for a, b the digits of i. */
static inline void write_dataset(const char *path, int n) {
  FILE *f = fopen(path, "w");
  for (int i = 0; f && i < n; i++) {
    int a = i % 10, b = (i / 10) % 10;
    fprintf(f, "{\"prompt\": \"%d+%d=\", \"answer\": \"%d\"}\n", a, b, (a + b) % 10);
  }
  if (f) fclose(f);
}

/* The path of tests/data/name (DAPO_TEST_DATA, given by tests/CMakeLists.txt) in buf. */
static inline void data_path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", DAPO_TEST_DATA, name);
}

#endif
