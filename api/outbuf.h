/* The output buffer of a streamed reply (server-sent events): bytes are appended as they are
 * framed and handed out to libmicrohttpd's content-reader callback in pieces of at most what it
 * asks for. One buffer per stream, used by one thread at a time (the callback's); api/events.c
 * (a job's events) and api/completions.c (a streamed completion or chat) share it. */
#ifndef DAPOD_API_OUTBUF_H
#define DAPOD_API_OUTBUF_H

#include <stddef.h>

/* Pending bytes are buf[off, len); buf (owned) grows by doubling from 4 KiB, never past max
 * bytes. Caller-placed: api_outbuf_init, then api_outbuf_deinit. Fields are read-only outside
 * outbuf.c; a caller may read what it has just appended, buf[len before, len) (events.c caches
 * a frame it wrote). */
struct api_outbuf {
  char *buf;
  size_t len, off, cap;
  size_t max; /* the most bytes it may hold at once */
};

/* An empty buffer that may hold up to max bytes at once. */
void api_outbuf_init(struct api_outbuf *b, size_t max);

/* Frees the bytes; b is then empty (as zeroed). */
void api_outbuf_deinit(struct api_outbuf *b);

/* Appends n bytes of p. 0, or -1 (nothing appended) when the buffer would have to grow past max
 * bytes, or out of memory. */
int api_outbuf_add(struct api_outbuf *b, const char *p, size_t n);

/* Moves up to max pending bytes into out, oldest first; returns how many (0: none pending). Once
 * every pending byte is out, the buffer starts again from its beginning (no copying). */
size_t api_outbuf_take(struct api_outbuf *b, char *out, size_t max);

/* The bytes waiting to be taken. */
static inline size_t api_outbuf_pending(const struct api_outbuf *b) {
  return b->len - b->off;
}

#endif
