/* The text_similarity metrics (core/reward/similarity.c) for grader_nltk.py: each stdin line
 * "METRIC\tOUTPUT\tREFERENCE" is answered with one line, the score (%.17g), or "error". */
#include <stdio.h>
#include <string.h>

#include "similarity.h"

int main(void) {
  static char line[1 << 16];
  while (fgets(line, sizeof line, stdin)) {
    line[strcspn(line, "\n")] = '\0';
    char *out = strchr(line, '\t');
    char *ref = out ? strchr(out + 1, '\t') : NULL;
    if (!ref) {
      puts("error");
      continue;
    }
    *out++ = '\0';
    *ref++ = '\0';
    int m = sim_metric_find(line);
    if (m < 0) {
      puts("error");
      continue;
    }
    printf("%.17g\n", sim_score((enum sim_metric)m, out, ref));
  }
  return 0;
}
