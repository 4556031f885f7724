/* libFuzzer target: the safetensors reader. The input is a whole file (in a memfd, opened by
 * path like any file); when st_open accepts it, every tensor's metadata must be consistent and
 * every tensor must read back (raw, and as float32 for F32/F16/BF16) without going out of bounds.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "safetensors.h"

#define MAX_READ ((uint64_t)1 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) return 0;
  size_t off = 0;
  while (off < size) {
    ssize_t w = write(fd, data + off, size - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  struct st_file *f = NULL;
  struct dapo_err e = {0};
  int rc = st_open(path, &f, &e);
  FUZZ_CHECK(rc == 0 || rc == DAPO_EIO || rc == DAPO_EFORMAT || rc == DAPO_ENOMEM);
  FUZZ_CHECK((rc == 0) == (f != NULL));
  if (rc) FUZZ_CHECK(e.msg[0] != '\0');
  if (f) {
    uint64_t prev_end = 0;
    for (int i = 0; i < st_count(f); i++) {
      const struct st_info *t = st_at(f, i);
      FUZZ_CHECK(t && t->name && t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
      FUZZ_CHECK(t->end >= t->begin && t->end - t->begin == t->numel * st_dtype_size(t->dtype));
      FUZZ_CHECK(t->end <= size);
      FUZZ_CHECK(st_find(f, t->name) == t);
      if (t->end > t->begin) {
        FUZZ_CHECK(t->begin >= prev_end); /* ascending, no overlap */
        prev_end = t->end;
      }
      uint64_t bytes = t->end - t->begin;
      if (bytes > MAX_READ) continue;
      void *raw = malloc(bytes ? bytes : 1);
      float *fl = malloc((t->numel ? t->numel : 1) * sizeof *fl);
      if (raw && fl) {
        FUZZ_CHECK(st_read_raw(f, t, raw, bytes, &e) == 0);
        int r2 = st_read_f32(f, t, fl, t->numel, &e);
        int conv = t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16;
        FUZZ_CHECK(conv ? r2 == 0 : r2 == DAPO_EUNSUPPORTED);
        if (conv && t->dtype == ST_F32 && bytes) FUZZ_CHECK(memcmp(raw, fl, bytes) == 0);
      }
      free(raw);
      free(fl);
    }
    const json_t *md = st_metadata(f);
    if (md) {
      FUZZ_CHECK(json_is_object(md));
      const char *k;
      json_t *v;
      json_object_foreach((json_t *)md, k, v) FUZZ_CHECK(json_is_string(v));
    }
    st_close(f);
  }
  close(fd);
  return 0;
}
