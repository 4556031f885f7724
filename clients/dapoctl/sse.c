/* Server-Sent Events parser: lines end in LF, CRLF or CR; `field: value` (one optional space
 * after the colon); lines starting with ':' are comments; a blank line dispatches the event. */
#include "sse.h"

#include <stdlib.h>
#include <string.h>

void sse_init(struct sse_parser *p, sse_event_fn cb, void *ud, size_t max_bytes) {
  memset(p, 0, sizeof *p);
  p->cb = cb;
  p->ud = ud;
  p->max_bytes = max_bytes ? max_bytes : (size_t)1 << 20;
}

void sse_deinit(struct sse_parser *p) {
  if (!p) return;
  free(p->line);
  free(p->data);
  p->line = p->data = NULL;
  p->line_len = p->line_cap = p->data_len = p->data_cap = 0;
}

static void reset_event(struct sse_parser *p) {
  p->data_len = 0;
  p->has_data = 0;
  p->has_id = 0;
  p->id[0] = p->event[0] = '\0';
}

void sse_reset(struct sse_parser *p) {
  reset_event(p);
  p->line_len = 0;
  p->last_cr = 0;
}

/* Grows *buf to hold need bytes (need <= cap + 1 for the NUL). */
static int reserve(char **buf, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  char *b = realloc(*buf, c);
  if (!b) return -2;
  *buf = b;
  *cap = c;
  return 0;
}

static void copy_field(char *dst, size_t cap, const char *v, size_t n) {
  if (n >= cap) n = cap - 1; /* ids and event names are short; longer ones are cut */
  memcpy(dst, v, n);
  dst[n] = '\0';
}

/* One complete line (without its terminator). */
static int line_done(struct sse_parser *p) {
  const char *l = p->line ? p->line : "";
  size_t n = p->line_len;
  if (n == 0) {
    int rc = 0;
    if (p->has_data || p->event[0] || p->has_id) {
      if (reserve(&p->data, &p->data_cap, p->data_len + 1)) return -2;
      p->data[p->data_len] = '\0';
      struct sse_event ev = {p->has_id ? p->id : NULL, p->event[0] ? p->event : "message", p->data,
                             p->data_len};
      rc = p->cb ? p->cb(&ev, p->ud) : 0;
    }
    reset_event(p);
    return rc;
  }
  if (l[0] == ':') return 0; /* comment */
  const char *colon = memchr(l, ':', n);
  size_t fn = colon ? (size_t)(colon - l) : n;
  const char *v = colon ? colon + 1 : l + n;
  size_t vn = colon ? n - fn - 1 : 0;
  if (vn && *v == ' ') v++, vn--;
  if (fn == 4 && !memcmp(l, "data", 4)) {
    size_t need = p->data_len + (p->has_data ? 1 : 0) + vn + 1;
    if (need > p->max_bytes) return -1;
    if (reserve(&p->data, &p->data_cap, need)) return -2;
    if (p->has_data) p->data[p->data_len++] = '\n';
    memcpy(p->data + p->data_len, v, vn);
    p->data_len += vn;
    p->has_data = 1;
  } else if (fn == 5 && !memcmp(l, "event", 5)) {
    copy_field(p->event, sizeof p->event, v, vn);
  } else if (fn == 2 && !memcmp(l, "id", 2)) {
    if (!memchr(v, '\0', vn)) { /* the spec ignores ids with NUL */
      copy_field(p->id, sizeof p->id, v, vn);
      p->has_id = 1;
    }
  } /* retry and unknown fields: ignored */
  return 0;
}

int sse_feed(struct sse_parser *p, const char *buf, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char ch = buf[i];
    if (p->last_cr) {
      p->last_cr = 0;
      if (ch == '\n') continue; /* the LF of a CRLF split across chunks */
    }
    if (ch == '\r' || ch == '\n') {
      p->last_cr = ch == '\r';
      int rc = line_done(p);
      p->line_len = 0;
      if (rc) return rc;
      continue;
    }
    if (p->line_len + 1 > p->max_bytes) return -1;
    if (reserve(&p->line, &p->line_cap, p->line_len + 1)) return -2;
    p->line[p->line_len++] = ch;
  }
  return 0;
}
