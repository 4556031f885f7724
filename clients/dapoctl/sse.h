/* An incremental Server-Sent Events parser (the WHATWG event-stream rules that dapod's
 * GET /v1/jobs/{id}/events/stream uses): bytes in any chunking, one callback per event. */
#ifndef DAPOCTL_SSE_H
#define DAPOCTL_SSE_H

#include <stddef.h>

/* One dispatched event. All pointers are borrowed, valid during the callback only. id is NULL
 * when the event had no `id:` line (dapod's heartbeats); event is "message" when it had no
 * `event:` line; data is the `data:` lines joined with '\n' (NUL-terminated). */
struct sse_event {
  const char *id;
  const char *event;
  const char *data;
  size_t data_len;
};

/* Returns 0 to go on, anything else to stop: sse_feed then returns that value. */
typedef int (*sse_event_fn)(const struct sse_event *ev, void *ud);

struct sse_parser {
  sse_event_fn cb;
  void *ud;
  size_t max_bytes; /* cap of one line and of one event's data */
  char *line;       /* owned: the line being read */
  size_t line_len, line_cap;
  char *data; /* owned: the event's data so far */
  size_t data_len, data_cap;
  int has_data;
  char id[64];
  int has_id;
  char event[64];
  int last_cr; /* the previous chunk ended in '\r': a '\n' first in the next one is its pair */
};

/* Sets p up; max_bytes caps a line and an event's data (0: 1 MiB). */
void sse_init(struct sse_parser *p, sse_event_fn cb, void *ud, size_t max_bytes);
/* Frees p's buffers (p may be reused after sse_init). */
void sse_deinit(struct sse_parser *p);
/* Forgets a half-read line and event (a new connection starts clean). */
void sse_reset(struct sse_parser *p);
/* Feeds n bytes. Returns 0, the callback's non-zero value (parsing stops there), -1 when a line
 * or an event's data passes max_bytes, or -2 out of memory. */
int sse_feed(struct sse_parser *p, const char *buf, size_t n);

#endif
