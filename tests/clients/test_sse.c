/* Unit test of dapoctl's Server-Sent Events parser (clients/dapoctl/sse.c): the same stream fed
 * whole and in every split into two and three chunks gives the same events; LF, CRLF and CR line
 * ends (a CRLF split across chunks included), comments, multi-line data, events without an id,
 * the size cap, and a callback that stops parsing. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "sse.h"

struct got {
  char text[4096]; /* every event as "id|event|data;" */
  size_t n;
  int events;
  int stop_at; /* return 1 from this event on (1-based); 0: never */
};

static int on_event(const struct sse_event *ev, void *ud) {
  struct got *g = ud;
  int k = snprintf(g->text + g->n, sizeof g->text - g->n, "%s|%s|%.*s;", ev->id ? ev->id : "-",
                   ev->event, (int)ev->data_len, ev->data);
  if (k > 0 && (size_t)k < sizeof g->text - g->n) g->n += (size_t)k;
  CHECK(strlen(ev->data) == ev->data_len);
  g->events++;
  return g->stop_at && g->events >= g->stop_at;
}

/* Feeds s in chunks cut at a and b (a <= b <= len) and returns the events' text. */
static void feed3(const char *s, size_t a, size_t b, struct got *g) {
  struct sse_parser p;
  memset(g, 0, sizeof *g);
  sse_init(&p, on_event, g, 0);
  size_t n = strlen(s);
  CHECK(sse_feed(&p, s, a) == 0);
  CHECK(sse_feed(&p, s + a, b - a) == 0);
  CHECK(sse_feed(&p, s + b, n - b) == 0);
  sse_deinit(&p);
}

static void all_splits(const char *stream, const char *want) {
  size_t n = strlen(stream);
  int bad = 0;
  for (size_t a = 0; a <= n; a++)
    for (size_t b = a; b <= n; b++) {
      struct got g;
      feed3(stream, a, b, &g);
      if (strcmp(g.text, want)) {
        if (!bad++) fprintf(stderr, "split %zu/%zu: got '%s' want '%s'\n", a, b, g.text, want);
      }
    }
  CHECK_MSG(bad == 0, "%d splits of a %zu-byte stream differ", bad, n);
}

int main(void) {
  /* dapod's own shape: an opening comment, events, a heartbeat without id, end. */
  all_splits(": stream\n\n"
             "id: 1\nevent: status\ndata: {\"status\":\"queued\"}\n\n"
             "event: heartbeat\ndata: {}\n\n"
             "id: 2\nevent: metrics\ndata: {\"step\":1,\"reward/mean\":-0.5}\n\n"
             "id: 3\nevent: end\ndata: {\"status\":\"succeeded\"}\n\n",
             "1|status|{\"status\":\"queued\"};-|heartbeat|{};"
             "2|metrics|{\"step\":1,\"reward/mean\":-0.5};3|end|{\"status\":\"succeeded\"};");
  /* CRLF and CR line ends, no space after the colon, multi-line data, unknown fields. */
  all_splits("id:7\r\nevent:log\r\ndata:a\r\ndata: b\r\nretry: 10\r\nfoo\r\n\r\n"
             "id: 8\rdata: x\r\r"
             "data\n\n",
             "7|log|a\nb;8|message|x;-|message|;");
  /* A half event at the end is not dispatched. */
  {
    struct got g;
    feed3("id: 1\ndata: {}\n\nid: 2\ndata: {\"half\"", 5, 20, &g);
    CHECK(!strcmp(g.text, "1|message|{};"));
    CHECK(g.events == 1);
  }
  /* sse_reset forgets a half event (a new connection starts clean). */
  {
    struct got g = {0};
    struct sse_parser p;
    sse_init(&p, on_event, &g, 0);
    CHECK(sse_feed(&p, "id: 5\nevent: log\ndata: par", 26) == 0);
    sse_reset(&p);
    CHECK(sse_feed(&p, "tial\n\nid: 6\ndata: 1\n\n", 21) == 0);
    CHECK_MSG(!strcmp(g.text, "6|message|1;"), "%s", g.text);
    sse_deinit(&p);
  }
  /* The callback stops parsing: sse_feed returns its value and nothing after is seen. */
  {
    struct got g = {.stop_at = 1};
    struct sse_parser p;
    sse_init(&p, on_event, &g, 0);
    const char *s = "id: 1\ndata: a\n\nid: 2\ndata: b\n\n";
    CHECK(sse_feed(&p, s, strlen(s)) == 1);
    CHECK(g.events == 1);
    sse_deinit(&p);
  }
  /* Lines and data over the cap are refused (-1), not grown without bound. */
  {
    struct got g = {0};
    struct sse_parser p;
    sse_init(&p, on_event, &g, 16);
    CHECK(sse_feed(&p, "data: 0123456789abcdef\n", 23) == -1);
    sse_deinit(&p);
    sse_init(&p, on_event, &g, 16);
    CHECK(sse_feed(&p, "data: 0123456789\ndata: 0123456789\n", 34) == -1);
    sse_deinit(&p);
  }
  return check_done("test_sse");
}
