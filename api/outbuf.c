/* The output buffer of streamed replies (outbuf.h). */
#include "outbuf.h"

#include <stdlib.h>
#include <string.h>

#define OUTBUF_FIRST 4096 /* bytes of the first allocation */

void api_outbuf_init(struct api_outbuf *b, size_t max) {
  memset(b, 0, sizeof *b);
  b->max = max;
}

void api_outbuf_deinit(struct api_outbuf *b) {
  size_t max = b->max;
  free(b->buf);
  api_outbuf_init(b, max);
}

int api_outbuf_add(struct api_outbuf *b, const char *p, size_t n) {
  if (!n) return 0; /* buf may still be NULL */
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : OUTBUF_FIRST;
    while (cap < b->len + n) cap *= 2;
    if (cap > b->max) return -1;
    char *nb = realloc(b->buf, cap);
    if (!nb) return -1;
    b->buf = nb, b->cap = cap;
  }
  memcpy(b->buf + b->len, p, n);
  b->len += n;
  return 0;
}

size_t api_outbuf_take(struct api_outbuf *b, char *out, size_t max) {
  size_t n = b->len - b->off < max ? b->len - b->off : max;
  if (!n) return 0; /* buf may still be NULL */
  memcpy(out, b->buf + b->off, n);
  b->off += n;
  if (b->off == b->len) b->off = b->len = 0;
  return n;
}
