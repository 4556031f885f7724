/* Streaming SHA-256 (FIPS 180-4): upload content hashes computed while the file is written,
 * checkpoint file digests (the downloads' ETag), and the idempotency hash of job bodies. */
#ifndef DAPO_SHA256_H
#define DAPO_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct sha256_ctx {
  uint32_t h[8];
  uint64_t len; /* bytes hashed */
  unsigned char buf[64];
  size_t n; /* bytes in buf */
};

void sha256_begin(struct sha256_ctx *c);
void sha256_feed(struct sha256_ctx *c, const void *data, size_t len);
/* Finishes and writes 64 lower-case hex digits and a NUL into out; c must be begun again to be
 * reused. */
void sha256_end_hex(struct sha256_ctx *c, char out[65]);

#endif
