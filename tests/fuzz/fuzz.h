/* Shared by the fuzz targets: the libFuzzer entry point and a check that aborts (so that
 * libFuzzer, or the replay driver under ASan, reports the input) with file:line. */
#ifndef DAPO_FUZZ_H
#define DAPO_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond);                \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

#endif
