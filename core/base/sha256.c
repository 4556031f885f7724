/* Streaming SHA-256, see sha256.h: nettle does the hashing, this file only adapts its API (a
 * void pointer in, lower-case hex out). The FIPS 180-4 vectors are checked in
 * tests/api/test_api_units.c, fed in chunks of 1 to 65 bytes and larger odd sizes. */
#include "sha256.h"

void dapo_sha256_begin(struct dapo_sha256 *c) {
  sha256_init(&c->nettle);
}

void dapo_sha256_feed(struct dapo_sha256 *c, const void *data, size_t len) {
  sha256_update(&c->nettle, len, data);
}

void dapo_sha256_end_hex(struct dapo_sha256 *c, char out[65]) {
  static const char HEX[] = "0123456789abcdef";
  uint8_t d[SHA256_DIGEST_SIZE];
  sha256_digest(&c->nettle, sizeof d, d);
  for (size_t i = 0; i < sizeof d; i++) {
    out[2 * i] = HEX[d[i] >> 4];
    out[2 * i + 1] = HEX[d[i] & 15];
  }
  out[64] = '\0';
}
