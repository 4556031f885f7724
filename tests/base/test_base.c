/* core/base against independent references: the streaming SHA-256 (FIPS 180-4's vectors, fed in
 * every chunking), xoshiro256** and splitmix64 (the outputs of Blackman and Vigna's reference
 * code for a known state), the strict number parsers (junk, overflow, bounds, non-finite values
 * refused, naming what was parsed). */
#include <string.h>

#include "check.h"
#include "parse.h"
#include "rng.h"
#include "sha256.h"

static void hash_chunks(const char *msg, size_t len, size_t chunk, char out[65]) {
  struct dapo_sha256 c;
  dapo_sha256_begin(&c);
  for (size_t i = 0; i < len; i += chunk)
    dapo_sha256_feed(&c, msg + i, len - i < chunk ? len - i : chunk);
  dapo_sha256_end_hex(&c, out);
}

static void check_sha256(void) {
  static const struct {
    const char *msg, *hex;
  } V[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  char out[65];
  for (size_t v = 0; v < sizeof V / sizeof V[0]; v++)
    for (size_t chunk = 1; chunk <= 65; chunk++) {
      hash_chunks(V[v].msg, strlen(V[v].msg), chunk, out);
      CHECK_MSG(!strcmp(out, V[v].hex), "'%s' in chunks of %zu: %s", V[v].msg, chunk, out);
    }
  /* one million 'a' */
  static char a[1000000];
  memset(a, 'a', sizeof a);
  for (size_t chunk = 63; chunk <= 4096; chunk *= 4) {
    hash_chunks(a, sizeof a, chunk, out);
    CHECK_MSG(!strcmp(out, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
              "a*1e6 in chunks of %zu: %s", chunk, out);
  }
}

static void check_rng(void) {
  /* xoshiro256** from the state {1, 2, 3, 4}: the reference algorithm's first outputs */
  struct rng r = {{1, 2, 3, 4}};
  static const uint64_t want[] = {11520, 0, 1509978240, 1215971899390074240ULL};
  for (int i = 0; i < 4; i++) {
    uint64_t got = rng_u64(&r);
    CHECK_MSG(got == want[i], "output %d: %llu, want %llu", i, (unsigned long long)got,
              (unsigned long long)want[i]);
  }
  /* rng_seed fills the state from splitmix64 started at seed ^ (stream * C + D): the seed that
   * cancels stream 0's constant gives splitmix64's stream from 0 */
  rng_seed(&r, 0x632be59bd9b4e019ULL, 0);
  static const uint64_t sm[] = {0xe220a8397b1dcdafULL, 0x6e789e6aa1b965f4ULL, 0x06c45d188009454fULL,
                                0xf88bb8a8724c81ecULL};
  for (int i = 0; i < 4; i++) CHECK_MSG(r.s[i] == sm[i], "splitmix64 word %d", i);
  /* streams of one seed differ; one (seed, stream) repeats */
  struct rng a, b;
  rng_seed(&a, 7, 1);
  rng_seed(&b, 7, 2);
  CHECK(rng_u64(&a) != rng_u64(&b));
  rng_seed(&a, 7, 1);
  rng_seed(&b, 7, 1);
  for (int i = 0; i < 100; i++) CHECK(rng_u64(&a) == rng_u64(&b));
  /* floats are the top 24 bits; rng_below stays below; a shuffle is a permutation */
  rng_seed(&a, 7, 3);
  b = a;
  for (int i = 0; i < 1000; i++) {
    float f = rng_float(&a);
    CHECK(f == (float)(rng_u64(&b) >> 40) / 16777216.0f && f >= 0.0f && f < 1.0f);
  }
  for (uint64_t n = 1; n < 50; n++) CHECK(rng_below(&a, n) < n);
  int p[64], seen[64] = {0};
  for (int i = 0; i < 64; i++) p[i] = i;
  rng_shuffle_int(&a, p, 64);
  int moved = 0;
  for (int i = 0; i < 64; i++) seen[p[i]]++, moved += p[i] != i;
  for (int i = 0; i < 64; i++) CHECK(seen[i] == 1);
  CHECK(moved > 0);
}

static void check_parse(void) {
  struct dapo_err e;
  int64_t v = 0;
  CHECK(parse_i64("-42", -100, 100, &v, "x", &e) == 0 && v == -42);
  static const char *bad_i64[] = {"", " 1", "1 ", "4x", "0x10", "9223372036854775808", "1.0"};
  for (size_t i = 0; i < sizeof bad_i64 / sizeof bad_i64[0]; i++) {
    v = 5;
    CHECK_MSG(parse_i64(bad_i64[i], INT64_MIN, INT64_MAX, &v, "limit", &e) == DAPO_EINVAL && v == 5,
              "'%s' accepted", bad_i64[i]);
    CHECK_MSG(!strncmp(e.msg, "limit: ", 7), "'%s': %s", bad_i64[i], e.msg);
  }
  CHECK(parse_i64("101", -100, 100, &v, "limit", &e) == DAPO_EINVAL);
  CHECK_MSG(!strcmp(e.msg, "limit: 101 not in [-100, 100]"), "%s", e.msg);
  int n = 0;
  CHECK(parse_int("2147483647", 0, 2147483647, &n, "n", &e) == 0 && n == 2147483647);
  CHECK(parse_int("2147483648", 0, 2147483647, &n, "n", &e) == DAPO_EINVAL);
  uint64_t u = 0;
  CHECK(parse_u64("18446744073709551615", &u, "u", &e) == 0 && u == UINT64_MAX);
  CHECK(parse_u64("18446744073709551616", &u, "u", &e) == DAPO_EINVAL);
  CHECK(parse_u64("-1", &u, "u", &e) == DAPO_EINVAL); /* strtoull would wrap it */
  double d = 0;
  CHECK(parse_double("2.5e-3", 0, 1, &d, "lr", &e) == 0 && d == 2.5e-3);
  static const char *bad_double[] = {"nan", "inf", "-inf", "1e999", "", " 1", "1,5"};
  for (size_t i = 0; i < sizeof bad_double / sizeof bad_double[0]; i++)
    CHECK_MSG(parse_double(bad_double[i], -1e300, 1e300, &d, "lr", &e) == DAPO_EINVAL,
              "'%s' accepted", bad_double[i]);
  CHECK(parse_double("2", 0, 1, &d, "lr", &e) == DAPO_EINVAL);
}

int main(void) {
  check_sha256();
  check_rng();
  check_parse();
  return check_done("test_base");
}
