/* libFuzzer target: the JSON Lines dataset reader. The input is fed through ds_stream twice, once
 * whole and once in chunks whose sizes come from a seeded generator, and both must agree on every
 * count, every reported error and the result; every item kept must pass ds_check_line again. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "fuzz.h"

static int run(const uint8_t *data, size_t size, uint32_t split_seed, struct ds_report *rep,
               struct dataset **out) {
  struct ds_limits lim = {.max_line_bytes = 4096, .max_items = 2000, .max_errors_reported = 8};
  struct ds_stream *s = ds_stream_new(&lim, 1);
  if (!s) return DAPO_ENOMEM;
  struct dapo_err e = {0};
  int rc = 0;
  size_t off = 0;
  uint32_t x = split_seed | 1;
  while (off < size && !rc) {
    size_t n = size - off;
    if (split_seed) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5; /* xorshift32 */
      size_t k = 1 + x % 64;
      if (k < n) n = k;
    }
    rc = ds_stream_feed(s, data + off, n, &e);
    off += n;
  }
  int frc = ds_stream_finish(s, out, rep, &e);
  ds_stream_free(s);
  return rc ? rc : frc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint32_t seed = 0x9e3779b9u;
  for (size_t i = 0; i < size && i < 8; i++) seed = seed * 31 + data[i];
  struct ds_report a, b;
  ds_report_init(&a);
  ds_report_init(&b);
  struct dataset *da = NULL, *db = NULL;
  int ra = run(data, size, 0, &a, &da);
  int rb = run(data, size, seed ? seed : 1, &b, &db);
  FUZZ_CHECK(ra == rb);
  FUZZ_CHECK(a.n_lines == b.n_lines && a.n_items == b.n_items && a.n_errors == b.n_errors);
  FUZZ_CHECK(a.n_reported == b.n_reported);
  for (int i = 0; i < a.n_reported; i++) {
    FUZZ_CHECK(a.errors[i].line == b.errors[i].line);
    FUZZ_CHECK(strcmp(a.errors[i].message, b.errors[i].message) == 0);
    FUZZ_CHECK(a.errors[i].line >= 1 && a.errors[i].line <= a.n_lines);
  }
  FUZZ_CHECK((ra == 0) == (da != NULL));
  if (da) {
    FUZZ_CHECK(ds_count(da) == a.n_items && a.n_errors == 0 && a.n_items >= 1);
    FUZZ_CHECK(ds_count(db) == ds_count(da));
    for (int i = 0; i < ds_count(da); i++) {
      const struct ds_item *x = ds_get(da, i), *y = ds_get(db, i);
      FUZZ_CHECK(x && y && x->id && x->answer && (x->prompt || x->messages));
      FUZZ_CHECK(strcmp(x->id, y->id) == 0 && strcmp(x->answer, y->answer) == 0);
      FUZZ_CHECK(x->line == y->line && !x->prompt == !y->prompt);
    }
    struct ds_cursor c = {.seed = seed};
    for (int i = 0; i < 3 * ds_count(da) && i < 100; i++) {
      int k = ds_next(da, &c);
      FUZZ_CHECK(k >= 0 && k < ds_count(da));
    }
  }
  json_t *j = ds_report_to_json(&a);
  FUZZ_CHECK(j && (int)json_array_size(j) == a.n_reported);
  json_decref(j);
  ds_free(da);
  ds_free(db);
  ds_report_deinit(&a);
  ds_report_deinit(&b);

  /* every physical line through ds_check_line directly */
  size_t start = 0;
  int lineno = 1;
  for (size_t i = 0; i <= size && lineno < 200; i++) {
    if (i == size || data[i] == '\n') {
      size_t len = i - start + (i < size);
      if (len <= 4096) {
        struct ds_item it = {0};
        struct dapo_err e = {0};
        int rc = ds_check_line((const char *)data + start, len, lineno, &it, &e);
        FUZZ_CHECK(rc == 0 || rc == 1 || rc == DAPO_EFORMAT || rc == DAPO_ENOMEM);
        if (rc == 0) FUZZ_CHECK(it.id && it.answer && it.line == lineno);
        if (rc == DAPO_EFORMAT) FUZZ_CHECK(e.msg[0] != '\0');
        ds_item_deinit(&it);
      }
      start = i + 1;
      lineno++;
    }
  }
  return 0;
}
