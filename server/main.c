/* dapod: entry point. Subcommands over libdapo; the HTTP daemon (`dapod serve`) lands with the
 * daemon issue. */
#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f, "usage: dapod [serve] [--listen HOST:PORT] [--data-dir DIR] [--models-dir DIR]\n"
             "       dapod --help\n");
}

int main(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "dapod: the HTTP daemon is not built yet (see issue 4)\n");
  return 2;
}
