/* The instruction sets of the hand-vectorised kernels a test runs each check on (kernels.h): this
 * CPU's, from the portable code up to the best, then the baseline build (always available). */
#ifndef DAPO_TEST_ISA_H
#define DAPO_TEST_ISA_H

#include "kernels.h"

static int isa_list(int out[4]) {
  int best = kernels_force_isa(0), n = 0;
  for (int isa = KERNELS_ISA_PORTABLE; isa <= best; isa++)
    if (kernels_force_isa(isa) == isa) out[n++] = isa;
  if (kernels_force_isa(KERNELS_ISA_BASELINE) == KERNELS_ISA_BASELINE)
    out[n++] = KERNELS_ISA_BASELINE;
  kernels_force_isa(0);
  return n;
}

#endif
