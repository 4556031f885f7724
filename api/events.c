/* Handlers: GET /v1/jobs/{id}/events (the job's event log, paginated by event id) and
 * GET /v1/jobs/{id}/events/stream (the same events as Server-Sent Events).
 *
 * A stream is a libmicrohttpd content-reader callback over the store: it keeps the last id it
 * sent, reads newer events by id (so a Last-Event-ID replay and live delivery are one code path)
 * in batches, and when there are none it suspends its connection with the hub (api_hub_suspend)
 * until the bus publishes the job's next event or the heartbeat is due; no HTTP thread waits and
 * nothing polls. A reader only reads the store, so subscribers cost the job nothing. Memory per
 * stream is one batch; a live client that falls more than sse_backlog_events behind the job is
 * disconnected and resumes with its Last-Event-ID. After `end` the stream closes; it also closes
 * when the daemon stops.
 *
 * Many subscribers of one job cost one store read per event, not one each: framed events are
 * kept in a small process-wide cache keyed by (job, event id) (events never change once stored),
 * and a live stream asks the store only when the bus says there is something newer than what it
 * sent. Whether a job is over is asked once when a stream goes live and then at heartbeats (a
 * finished job's `end` event normally closes the stream first). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "bus.h"
#include "handlers.h"
#include "http.h"
#include "log.h"
#include "outbuf.h"
#include "parse.h"
#include "server.h"
#include "store.h"

#define EVENTS_PAGE_DEFAULT 20
#define EVENTS_PAGE_MAX 100
#define STREAM_BATCH 50                   /* events read from the store at a time */
#define STREAM_BLOCK (16 * 1024)          /* libmicrohttpd's block size for the callback */
#define STREAM_BUF_MAX (64 << 20)         /* one batch never needs more */
#define FRAME_CACHE 512                   /* framed events kept for other subscribers */
#define FRAME_CACHE_MAX_BYTES (64 * 1024) /* larger frames are not cached */

static json_t *event_json(const struct store_event *ev) {
  return json_pack("{s:I, s:s, s:s, s:O, s:I}", "id", (json_int_t)ev->id, "object", "event", "type",
                   ev->type, "data", ev->data ? ev->data : json_object(), "created_at",
                   (json_int_t)ev->created_at);
}

int api_events_list(struct api_req *r) {
  const char *id = r->params[0];
  const char *l = api_query(r, "limit"), *a = api_query(r, "after");
  int limit = EVENTS_PAGE_DEFAULT;
  int64_t after = 0;
  if (l && parse_int(l, 1, EVENTS_PAGE_MAX, &limit, "limit", NULL))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                            "limit: '%.32s' is not an integer in [1, %d]", l, EVENTS_PAGE_MAX);
  if (a && parse_i64(a, 0, INT64_MAX, &after, "after", NULL))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                            "after: '%.32s' is not an event id (a non-negative integer)", a);
  struct store_job job;
  if (api_job_load(r, id, &job)) return 0;
  store_job_deinit(&job);
  struct store_event_list el = {0};
  struct dapo_err e = {0};
  int rc = store_event_list(r->srv->store, id, after, limit, &el, &e);
  if (rc) return api_reply_store_error(r, rc, &e);
  json_t *data = json_array();
  for (size_t i = 0; data && i < el.n; i++)
    if (json_array_append_new(data, event_json(&el.v[i]))) {
      json_decref(data);
      data = NULL;
    }
  json_t *o = api_list_json(data, el.has_more, el.n ? json_integer(el.v[el.n - 1].id) : NULL);
  store_event_list_deinit(&el);
  return api_reply_json_steal(r, 200, o);
}

/* ---- the stream ---- */

struct stream {
  struct server *srv;
  struct api_hub *hub;
  struct api_frames *frames; /* borrowed: the framed events of every stream (api_caches) */
  struct MHD_Connection *conn;
  char job_id[STORE_ID_MAX];
  int64_t last_id;       /* the last event id written to out */
  int live;              /* the replay reached the newest event once */
  int ended;             /* `end` is in out: close after it */
  int64_t heartbeat_ms;  /* when the next heartbeat is due (api_now_ms clock) */
  struct api_outbuf out; /* framed bytes not yet handed to libmicrohttpd */
};

static void stream_free(void *cls) {
  struct stream *s = cls;
  if (!s) return;
  api_hub_stream_leave(s->hub);
  api_outbuf_deinit(&s->out);
  free(s);
}

/* ---- framed events shared by the streams of a job ---- */

struct frame_slot {
  char job[STORE_ID_MAX];
  int64_t id; /* 0: empty */
  int end;    /* an `end` event */
  char *text; /* the framed event (owned) */
  size_t len;
};

struct api_frames {
  pthread_mutex_t mu;
  struct frame_slot v[FRAME_CACHE];
};

struct api_frames *api_frames_new(void) {
  struct api_frames *f = calloc(1, sizeof *f);
  if (f) pthread_mutex_init(&f->mu, NULL);
  return f;
}

void api_frames_free(struct api_frames *f) {
  if (!f) return;
  for (int i = 0; i < FRAME_CACHE; i++) free(f->v[i].text);
  pthread_mutex_destroy(&f->mu);
  free(f);
}

static struct frame_slot *frame_slot(struct api_frames *frames, const char *job, int64_t id) {
  uint64_t h = api_fnv1a(API_FNV_SEED, job); /* then the event id */
  h = (h ^ (uint64_t)id) * 1099511628211ull;
  return &frames->v[h % FRAME_CACHE];
}

/* Appends the cached frame of (job, id) to s; 1 when it was there, 0 when not, -1 on error. */
static int frame_from_cache(struct stream *s, int64_t id) {
  int rc = 0;
  pthread_mutex_lock(&s->frames->mu);
  struct frame_slot *f = frame_slot(s->frames, s->job_id, id);
  if (f->id == id && !strcmp(f->job, s->job_id)) {
    rc = api_outbuf_add(&s->out, f->text, f->len) ? -1 : 1;
    if (rc == 1) {
      s->last_id = id;
      if (f->end) s->ended = 1;
    }
  }
  pthread_mutex_unlock(&s->frames->mu);
  return rc;
}

static void frame_to_cache(struct api_frames *frames, const char *job, const struct store_event *ev,
                           const char *text, size_t len) {
  if (len > FRAME_CACHE_MAX_BYTES) return;
  char *copy = malloc(len);
  if (!copy) return;
  memcpy(copy, text, len);
  pthread_mutex_lock(&frames->mu);
  struct frame_slot *f = frame_slot(frames, job, ev->id);
  free(f->text);
  snprintf(f->job, sizeof f->job, "%s", job);
  f->id = ev->id;
  f->end = !strcmp(ev->type, "end");
  f->text = copy;
  f->len = len;
  pthread_mutex_unlock(&frames->mu);
}

/* One event in SSE framing: id, event, one-line JSON data, blank line; also into the cache. */
static int frame(struct stream *s, const struct store_event *ev) {
  char head[96];
  int h = snprintf(head, sizeof head, "id: %lld\nevent: %s\ndata: ", (long long)ev->id, ev->type);
  char *data = json_dumps(ev->data ? ev->data : json_object(), JSON_COMPACT | JSON_ENCODE_ANY);
  if (!data) return -1;
  struct api_outbuf *b = &s->out;
  size_t start = b->len;
  int rc = api_outbuf_add(b, head, (size_t)h) || api_outbuf_add(b, data, strlen(data)) ||
           api_outbuf_add(b, "\n\n", 2);
  free(data);
  if (!rc) frame_to_cache(s->frames, s->job_id, ev, b->buf + start, b->len - start);
  return rc ? -1 : 0;
}

static void heartbeat(struct stream *s) {
  static const char hb[] = "event: heartbeat\ndata: {}\n\n";
  api_outbuf_add(&s->out, hb, sizeof hb - 1);
}

static int64_t heartbeat_due(const struct stream *s) {
  return api_now_ms() + (int64_t)s->srv->cfg.sse_heartbeat_s * 1000;
}

/* Reads the next batch of events after last_id into buf. Returns the number read, or -1. */
static int refill(struct stream *s) {
  int n = 0, c;
  while (n < STREAM_BATCH && !s->ended && (c = frame_from_cache(s, s->last_id + 1)) != 0) {
    if (c < 0) return -1;
    n++;
  }
  if (n > 0) return n;
  struct store_event_list el = {0};
  struct dapo_err e = {0};
  if (store_event_list(s->srv->store, s->job_id, s->last_id, STREAM_BATCH, &el, &e)) {
    LOG(WARN, "event stream of %s: %s", s->job_id, e.msg);
    return -1;
  }
  for (size_t i = 0; i < el.n && !s->ended; i++, n++) {
    if (frame(s, &el.v[i])) {
      store_event_list_deinit(&el);
      return -1;
    }
    s->last_id = el.v[i].id;
    if (!strcmp(el.v[i].type, "end")) s->ended = 1;
  }
  store_event_list_deinit(&el);
  return n;
}

/* 1 when the job is gone or finished (nothing will follow what the store has). */
static int job_over(struct stream *s) {
  struct store_job job;
  struct dapo_err e = {0};
  int rc = store_job_get(s->srv->store, s->job_id, NULL, &job, &e);
  if (rc) return rc == STORE_ENOTFOUND;
  int over = store_job_status_terminal(job.status);
  store_job_deinit(&job);
  return over;
}

/* 1 when the job is gone or finished and the store holds nothing after what s has sent; 0
 * otherwise (newer events, if any, are now in buf: the status that ends a job is committed with
 * its last events, which the bus may not have announced yet); -1 on a read error. */
static int over_and_drained(struct stream *s) {
  if (!job_over(s)) return 0;
  int n = refill(s);
  return n < 0 ? -1 : n == 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
  struct stream *s = cls;
  (void)pos;
  for (;;) {
    size_t taken = api_outbuf_take(&s->out, out, max);
    if (taken) return (ssize_t)taken;
    if (s->ended || api_hub_closing(s->hub)) return MHD_CONTENT_READER_END_OF_STREAM;
    if (s->live) {
      /* A client this far behind is let go: it reconnects with its Last-Event-ID. */
      int64_t newest = bus_last_id(s->srv->bus, s->job_id);
      if (newest - s->last_id > s->srv->cfg.sse_backlog_events) {
        LOG(INFO, "event stream of %s: client %lld events behind, disconnected", s->job_id,
            (long long)(newest - s->last_id));
        return MHD_CONTENT_READER_END_OF_STREAM;
      }
    }
    /* live and the bus knows nothing newer: no store read (the bus hears of every event this
     * process stores; older ones were read during the replay) */
    int n = s->live && bus_last_id(s->srv->bus, s->job_id) <= s->last_id ? 0 : refill(s);
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (n > 0) {
      s->heartbeat_ms = heartbeat_due(s);
      continue;
    }
    if (!s->live) {
      s->live = 1;
      int d = over_and_drained(s); /* e.g. replay after `end` */
      if (d) return d < 0 ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
      if (api_outbuf_pending(&s->out)) continue;
    }
    if (api_now_ms() >= s->heartbeat_ms) {
      int d = over_and_drained(s); /* e.g. a deleted job */
      if (d) return d < 0 ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
      if (api_outbuf_pending(&s->out)) continue;
      heartbeat(s);
      s->heartbeat_ms = heartbeat_due(s);
      continue;
    }
    int rc = api_hub_suspend(s->hub, s->conn, s->job_id, s->last_id, s->heartbeat_ms);
    if (rc == 0) return 0; /* called again after the resume */
    if (rc < 0) return MHD_CONTENT_READER_END_OF_STREAM;
    /* rc == 1: an event arrived meanwhile: read it */
  }
}

int api_events_stream(struct api_req *r) {
  const char *id = r->params[0];
  const char *lei = api_header(r, "Last-Event-ID");
  const char *q = api_query(r, "last_event_id");
  int64_t last = 0;
  if (!lei) lei = q;
  if (lei && parse_i64(lei, 0, INT64_MAX, &last, "Last-Event-ID", NULL))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                            "Last-Event-ID: '%.32s' is not an event id (a non-negative integer)",
                            lei);
  struct store_job job;
  if (api_job_load(r, id, &job)) return 0;
  store_job_deinit(&job);
  if (api_hub_stream_enter(r->hub, r->srv->cfg.max_sse_subscribers)) {
    int rc = api_reply_errorf(r, API_ERR_UNAVAILABLE,
                              "%d event streams are open (max_sse_subscribers); retry later",
                              r->srv->cfg.max_sse_subscribers);
    api_reply_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "5");
    return rc;
  }
  struct stream *s = calloc(1, sizeof *s);
  if (!s) {
    api_hub_stream_leave(r->hub);
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  }
  s->srv = r->srv;
  s->frames = r->caches->frames;
  s->hub = r->hub;
  s->conn = r->conn;
  snprintf(s->job_id, sizeof s->job_id, "%s", id);
  s->last_id = last;
  s->heartbeat_ms = heartbeat_due(s);
  api_outbuf_init(&s->out, STREAM_BUF_MAX);
  /* An immediate comment line: the client sees the headers and a first byte at once. */
  api_outbuf_add(&s->out, ": stream\n\n", 10);
  struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK,
                                                                stream_read, s, stream_free);
  if (!resp) {
    stream_free(s);
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  return api_reply_response(r, 200, resp);
}
