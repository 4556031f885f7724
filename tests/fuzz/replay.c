/* Replays files through a fuzz target's LLVMFuzzerTestOneInput without libFuzzer, so that the
 * seed corpus and every crash input kept in tests/fuzz/regressions/ run in the normal test suite
 * (and under its ASan+UBSan stage). Arguments are files or folders (every regular file inside,
 * not recursive; a missing folder is fine). Prints how many inputs ran; exits 1 when none did. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

#define REPLAY_MAX_INPUT ((size_t)1 << 22)

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return -1;
  }
  uint8_t *buf = malloc(REPLAY_MAX_INPUT);
  size_t n = buf ? fread(buf, 1, REPLAY_MAX_INPUT, f) : 0;
  fclose(f);
  if (!buf) return -1;
  /* an exact-size copy, so that ASan sees reads past the input's end */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) {
    free(buf);
    return -1;
  }
  memcpy(exact, buf, n);
  free(buf);
  fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
  int ran = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st)) continue;
    if (!S_ISDIR(st.st_mode)) {
      if (run_file(argv[i])) return 1;
      ran++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    if (!d) return 1;
    char **names = NULL;
    size_t nn = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
      if (de->d_name[0] == '.') continue;
      char **nx = realloc(names, (nn + 1) * sizeof *names);
      if (!nx) return 1;
      names = nx;
      size_t l = strlen(argv[i]) + strlen(de->d_name) + 2;
      names[nn] = malloc(l);
      if (!names[nn]) return 1;
      snprintf(names[nn], l, "%s/%s", argv[i], de->d_name);
      nn++;
    }
    closedir(d);
    qsort(names, nn, sizeof *names, cmp_str);
    for (size_t k = 0; k < nn; k++) {
      if (!stat(names[k], &st) && S_ISREG(st.st_mode)) {
        if (run_file(names[k])) return 1;
        ran++;
      }
      free(names[k]);
    }
    free(names);
  }
  printf("replay: %d inputs, no failure\n", ran);
  return ran ? 0 : 1;
}
