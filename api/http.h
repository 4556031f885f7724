/* The HTTP layer on libmicrohttpd: the daemon (internal thread pool, suspend/resume), the one
 * static route table (404/405 and path parameters in one place), the per-request struct, the
 * central body handling (bounded buffer, JSON parsed once with a depth limit, or a streamed body
 * handed to the route chunk by chunk) and the reply helpers every handler answers through.
 *
 * A handler sees only struct api_req and answers through api_reply_*; exactly one reply per
 * request (a second one is a bug: it is logged and ignored). Replies are built at once and
 * queued by the dispatcher when libmicrohttpd allows it (before the body, or after all of it). */
#ifndef DAPOD_API_HTTP_H
#define DAPOD_API_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "error.h"
#include "errors.h"

struct server;
struct api_http;
struct api_hub;
struct MHD_Connection;
struct MHD_Response;

#define API_MAX_PARAMS 4

/* What a route does with a request body. */
enum api_body {
  API_BODY_NONE = 0, /* a body, if any, is read up to max_body_bytes and ignored */
  API_BODY_JSON,     /* application/json, read up to max_body_bytes, parsed into req->json */
  API_BODY_STREAM,   /* handed to the route's begin/chunk/handle, never buffered here */
};

/* One request. Allocated at the first access-handler call, freed in the completion callback;
 * lives on one HTTP thread at a time. Strings are owned by the request (or by libmicrohttpd for
 * as long as the request lives) unless said otherwise. */
struct api_req {
  struct server *srv;                 /* borrowed: the process */
  struct MHD_Connection *conn;        /* borrowed: libmicrohttpd's connection */
  const struct api_route *route;      /* matched route; NULL for 404/405 */
  const char *method;                 /* "GET", ... (points into method_buf) */
  char method_buf[24];                /* the method as sent (cut at 23 bytes) */
  char *path;                         /* the decoded path (owned copy) */
  char *params_buf;                   /* owned: a copy of path that params point into */
  const char *params[API_MAX_PARAMS]; /* path parameters in pattern order: {id} -> params[0] */
  int n_params;
  const char *owner;        /* whose resources: NULL = admin / no auth (see api_auth) */
  char owner_buf[65];       /* the key's name that owner points to (a copy: keys reload) */
  const char *content_type; /* the request's Content-Type or NULL (libmicrohttpd's) */
  int64_t content_length;   /* -1 when not given (chunked or no body) */
  uint64_t body_bytes;      /* body bytes received so far */
  uint64_t drained;         /* body bytes thrown away after the reply was decided */
  char *body;               /* API_BODY_NONE/JSON: the body (owned, NUL-terminated) */
  size_t body_len, body_cap;
  json_t *json; /* API_BODY_JSON: the parsed body (owned; NULL when empty) */
  /* Route state for streamed bodies, owned through ctx_free: freed when the request completes,
   * or just before an error reply (status >= 400) is queued. */
  void *ctx;
  void (*ctx_free)(void *ctx);
  struct timespec start; /* CLOCK_MONOTONIC at the first call: access log, latency */
  /* The pending reply (set by api_reply_*, queued by the dispatcher). */
  struct MHD_Response *resp;
  int status;                /* 0 until a reply exists */
  int suspended;             /* the handler suspended the request (api_wait_event): no reply yet */
  struct api_hub *hub;       /* borrowed: the daemon's suspend/resume hub */
  struct api_caches *caches; /* borrowed: the HTTP layer's caches (handlers.h) */
};

/* A route. begin (may be NULL) runs once the headers are known; for API_BODY_STREAM, chunk
 * gets every body chunk in order; handle runs once after the whole body. Any of them may reply;
 * after a reply, the rest of the body is drained and handle is not called. Each returns 0, or
 * -1 when it could not even build a reply (the connection is then closed). */
struct api_route {
  const char *method;  /* "GET", "POST", "DELETE" (GET routes also answer HEAD) */
  const char *pattern; /* "/v1/files/{id}/content": literal segments and {name} parameters */
  enum api_body body;
  int (*begin)(struct api_req *r);
  int (*chunk)(struct api_req *r, const char *data, size_t n);
  int (*handle)(struct api_req *r);
};

/* Starts libmicrohttpd on srv->cfg.listen (IPv4, IPv6 or a host name; port 0 picks a free
 * port, read back into srv->port) with srv->cfg's thread pool size, connection limits and
 * timeout. Returns the owned handle or NULL with e set (address in use, bad address...). */
struct api_http *api_http_start(struct server *srv, struct dapo_err *e);

/* Stops accepting, waits for the HTTP threads (requests in flight complete) and frees h. NULL is
 * fine. */
void api_http_stop(struct api_http *h);

/* The port h is bound to. */
int api_http_port(const struct api_http *h);

/* ---- what handlers use ---- */

/* The owner whose resources a request may see: NULL means all (admin, or no keys configured).
 * With keys, a missing or unknown Bearer key gets a 401 reply (and NULL). The returned name is
 * a copy in r->owner_buf, so a key set replaced by SIGHUP meanwhile does not matter. */
const char *api_auth(struct api_req *r);

/* A query argument (decoded; borrowed, lives as long as the request) or NULL. */
const char *api_query(struct api_req *r, const char *name);

/* A request header (borrowed, lives as long as the request) or NULL. */
const char *api_header(struct api_req *r, const char *name);

/* 1 when the request's Content-Type has media type `type` (case-insensitive, parameters such as
 * "; charset=utf-8" ignored). */
int api_content_type_is(const struct api_req *r, const char *type);

/* The list query `?limit=` (default 20, 1..100) and `?after=`; on bad input replies 400 naming
 * the parameter and returns -1 (the handler then returns 0). */
int api_page_params(struct api_req *r, int *limit, const char **after);

/* FNV-1a of s continued from h (start with API_FNV_SEED): the slot of a job id in the small
 * process-wide caches of api/ (framed events, metrics lists). */
#define API_FNV_SEED 1469598103934665603ull
static inline uint64_t api_fnv1a(uint64_t h, const char *s) {
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* A page of a list as every list endpoint answers it: {"object": "list", "data", "has_more",
 * "next_after"}; data and next_after are stolen (next_after NULL or ignored when !has_more: null).
 * NULL when out of memory or when data is NULL. */
json_t *api_list_json(json_t *data, int has_more, json_t *next_after);

/* Replies status with json (stolen) as `application/json; charset=utf-8`, compact, ending in a
 * newline. json NULL (a failed allocation upstream) replies 503 unavailable. Returns 0, or -1
 * when not even an error reply could be built. */
int api_reply_json_steal(struct api_req *r, int status, json_t *json);

/* Replies the registry row `code` as RFC 9457 application/problem+json: {type, title, status,
 * detail, errors?}. detail (borrowed; NULL: the row's hint) is the occurrence's explanation;
 * errors (stolen, may be NULL) is an array of {field|line, message}. Same returns. */
int api_reply_error(struct api_req *r, enum api_err code, const char *detail, json_t *errors);

/* api_reply_error with a printf-formatted detail (cut at 1024 bytes). */
int api_reply_errorf(struct api_req *r, enum api_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Replies a store or libdapo error code (rc) with e's message as detail: not found -> 404,
 * file in use -> 409, conflicts -> 409, bad input -> 400, out of memory -> 503, anything else
 * (I/O, SQLite) -> 500 with the message logged. */
int api_reply_store_error(struct api_req *r, int rc, const struct dapo_err *e);

/* Replies len bytes of text (copied) with the given Content-Type. */
int api_reply_text(struct api_req *r, int status, const char *content_type, const char *text,
                   size_t len);

/* Replies the first size bytes of the open file fd (stolen: closed when sent or on failure)
 * with the given Content-Type and Content-Length, sent from the file (sendfile where possible),
 * never read into memory. */
int api_reply_fd(struct api_req *r, int status, const char *content_type, int fd, uint64_t size);

/* Replies status with resp (stolen: a response built by the handler, e.g. from a callback for
 * an event stream). Returns 0, or -1 (resp NULL: nothing could be built). */
int api_reply_response(struct api_req *r, int status, struct MHD_Response *resp);

/* Replies len bytes of the open file fd from offset (fd stolen: closed when sent or on failure)
 * with the given Content-Type; sent from the file, never read into memory. */
int api_reply_fd_range(struct api_req *r, int status, const char *content_type, int fd,
                       uint64_t offset, uint64_t len);

/* api_reply_error with extension members: the members of ext (borrowed object, may be NULL) are
 * added to the problem (e.g. {"job_status": "succeeded"} for a 409 of the status machine). */
int api_reply_error_ext(struct api_req *r, enum api_err code, const char *detail, json_t *errors,
                        const json_t *ext);

/* ---- waiting without holding an HTTP thread ----
 * A request (or an event stream's reader) that waits for a job's next event is suspended
 * (MHD_suspend_connection) and registered with the hub: a thread that resumes it when the bus
 * publishes an event after after_id for the job, when its deadline passes, or when the daemon
 * stops. No HTTP thread is held while it waits and nothing polls. */

/* Milliseconds of CLOCK_MONOTONIC (for deadlines). */
int64_t api_now_ms(void);

/* Suspends request r until job_id has an event after after_id, deadline_ms (api_now_ms clock)
 * passes or the daemon stops; the route's handle then runs again (r->ctx keeps its state). The
 * handler returns 0 without a reply after a 0 return. Returns 0 (suspended), 1 (an event after
 * after_id is already there: answer or look again now) or -1 (the daemon is stopping: answer
 * now). Only from a route's handle. */
int api_wait_event(struct api_req *r, const char *job_id, int64_t after_id, int64_t deadline_ms);

/* The same for a connection whose response is produced by a content-reader callback (an event
 * stream): called from that callback, which then returns 0; libmicrohttpd calls it again after
 * the resume. Same returns. */
int api_hub_suspend(struct api_hub *h, struct MHD_Connection *conn, const char *job_id,
                    int64_t after_id, int64_t deadline_ms);

/* 1 once the daemon is stopping (streams end). */
int api_hub_closing(struct api_hub *h);

/* Event streams open now: api_hub_stream_enter counts one more unless max are open (then it
 * returns -1 and counts nothing); api_hub_stream_leave counts one less. */
int api_hub_stream_enter(struct api_hub *h, int max);
void api_hub_stream_leave(struct api_hub *h);

/* Adds a header to the reply just built (Location, Allow, Content-Disposition ...). Returns 0 or
 * -1 (no reply yet, or out of memory). */
int api_reply_header(struct api_req *r, const char *name, const char *value);

/* Milliseconds since the request began. */
double api_req_ms(const struct api_req *r);

#endif
