/* The project's own PRNG: xoshiro256** seeded through splitmix64. Pure integer arithmetic, so a
 * seed gives the same stream on every machine; floats are derived from the top 24 bits. Every
 * random stream in a job is an explicit struct rng, saved in checkpoints for exact resumption. */
#ifndef DAPO_RNG_H
#define DAPO_RNG_H

#include <stdint.h>

struct rng {
  uint64_t s[4];
};

/* Seeds r from (seed, stream): distinct streams from one seed are independent. */
void rng_seed(struct rng *r, uint64_t seed, uint64_t stream);
uint64_t rng_u64(struct rng *r);
/* Uniform in [0, 1) with 24 random bits (exactly representable as float). */
float rng_float(struct rng *r);
/* Uniform in [0, n), n > 0, without modulo bias. */
uint64_t rng_below(struct rng *r, uint64_t n);
/* Standard normal (Box-Muller on two 53-bit doubles), deterministic across machines with IEEE
 * double and a correctly rounded libm log/sqrt/cos (glibc). */
double rng_normal(struct rng *r);
/* Fisher-Yates shuffle of n ints in place. */
void rng_shuffle_int(struct rng *r, int *a, int n);

#endif
