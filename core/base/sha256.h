/* Streaming SHA-256 (FIPS 180-4): upload content hashes computed while the file is written,
 * checkpoint file digests (the downloads' ETag), API key hashes and the idempotency hash of job
 * bodies. A thin wrapper over Debian's nettle, whose <nettle/sha2.h> owns struct sha256_ctx and
 * the sha256_init/update/digest names; ours are all dapo_sha256. */
#ifndef DAPO_SHA256_H
#define DAPO_SHA256_H

#include <stddef.h>

#include <nettle/sha2.h>

/* Caller-placed; no resources held, so there is nothing to release. Not shared between threads. */
struct dapo_sha256 {
  struct sha256_ctx nettle;
};

void dapo_sha256_begin(struct dapo_sha256 *c);
void dapo_sha256_feed(struct dapo_sha256 *c, const void *data, size_t len);
/* Finishes and writes 64 lower-case hex digits and a NUL into out; c must be begun again to be
 * reused. */
void dapo_sha256_end_hex(struct dapo_sha256 *c, char out[65]);

#endif
