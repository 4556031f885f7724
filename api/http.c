/* The HTTP layer (api/http.h): libmicrohttpd's daemon with its internal thread pool, the route
 * table, the per-request struct and its lifetime, central body handling (cap, JSON parse with a
 * depth limit, streaming), the reply helpers, the access log / request counters, and the hub
 * that resumes suspended connections (event streams, long-polls) when the bus publishes. */
#include "http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <microhttpd.h>

#include "bus.h"
#include "handlers.h"
#include "log.h"
#include "openai.h"
#include "parse.h"
#include "server.h"
#include "sha256.h"
#include "store.h"

/* ---- the route table ---------------------------------------------------------------------
 * Literal routes come before parameterised ones with the same shape: the first route whose
 * pattern and method match wins ("/v1/files/validate" before "/v1/files/{id}"). */
static const struct api_route ROUTES[] = {
    {"GET", "/healthz", API_BODY_NONE, NULL, NULL, api_health_live},
    {"GET", "/readyz", API_BODY_NONE, NULL, NULL, api_health_ready},
    {"GET", "/metrics", API_BODY_NONE, NULL, NULL, api_health_metrics},
    {"POST", "/v1/files", API_BODY_STREAM, api_files_upload_begin, api_files_upload_chunk,
     api_files_upload_end},
    {"GET", "/v1/files", API_BODY_NONE, NULL, NULL, api_files_list},
    {"POST", "/v1/files/validate", API_BODY_STREAM, api_files_validate_begin,
     api_files_upload_chunk, api_files_validate_end},
    {"GET", "/v1/files/{id}", API_BODY_NONE, NULL, NULL, api_files_get},
    {"DELETE", "/v1/files/{id}", API_BODY_NONE, NULL, NULL, api_files_delete},
    {"GET", "/v1/files/{id}/content", API_BODY_NONE, NULL, NULL, api_files_content},
    {"GET", "/v1/models", API_BODY_NONE, NULL, NULL, api_models_list},
    {"GET", "/v1/models/{id}", API_BODY_NONE, NULL, NULL, api_models_get},
    {"POST", "/v1/judges/test", API_BODY_JSON, NULL, NULL, api_judges_test},
    {"POST", "/v1/jobs", API_BODY_JSON, NULL, NULL, api_jobs_create},
    {"GET", "/v1/jobs", API_BODY_NONE, NULL, NULL, api_jobs_list},
    {"GET", "/v1/jobs/{id}", API_BODY_NONE, NULL, NULL, api_jobs_get},
    {"DELETE", "/v1/jobs/{id}", API_BODY_NONE, NULL, NULL, api_jobs_delete},
    {"POST", "/v1/jobs/{id}/cancel", API_BODY_NONE, NULL, NULL, api_jobs_cancel},
    {"POST", "/v1/jobs/{id}/pause", API_BODY_NONE, NULL, NULL, api_jobs_pause},
    {"POST", "/v1/jobs/{id}/resume", API_BODY_NONE, NULL, NULL, api_jobs_resume},
    {"GET", "/v1/jobs/{id}/events", API_BODY_NONE, NULL, NULL, api_events_list},
    {"GET", "/v1/jobs/{id}/events/stream", API_BODY_NONE, NULL, NULL, api_events_stream},
    {"GET", "/v1/jobs/{id}/metrics", API_BODY_NONE, NULL, NULL, api_jobs_metrics},
    {"GET", "/v1/jobs/{id}/checkpoints", API_BODY_NONE, NULL, NULL, api_checkpoints_list},
    {"GET", "/v1/jobs/{id}/checkpoints/{step}/{file}", API_BODY_NONE, NULL, NULL,
     api_checkpoints_file},
    {"GET", "/v1/jobs/{id}/rollouts", API_BODY_NONE, NULL, NULL, api_rollouts_get},
    {"POST", "/v1/completions", API_BODY_JSON, NULL, NULL, api_completions_create},
    {"POST", "/v1/chat/completions", API_BODY_JSON, NULL, NULL, api_chat_completions},
    {"POST", "/v1/fine_tuning/jobs", API_BODY_JSON, NULL, NULL, api_ft_jobs_create},
    {"GET", "/v1/fine_tuning/jobs", API_BODY_NONE, NULL, NULL, api_ft_jobs_list},
    {"GET", "/v1/fine_tuning/jobs/{id}", API_BODY_NONE, NULL, NULL, api_ft_jobs_get},
    {"POST", "/v1/fine_tuning/jobs/{id}/cancel", API_BODY_NONE, NULL, NULL, api_ft_jobs_cancel},
    {"POST", "/v1/fine_tuning/jobs/{id}/pause", API_BODY_NONE, NULL, NULL, api_ft_jobs_pause},
    {"POST", "/v1/fine_tuning/jobs/{id}/resume", API_BODY_NONE, NULL, NULL, api_ft_jobs_resume},
    {"GET", "/v1/fine_tuning/jobs/{id}/events", API_BODY_NONE, NULL, NULL, api_ft_events_list},
    {"GET", "/v1/fine_tuning/jobs/{id}/checkpoints", API_BODY_NONE, NULL, NULL,
     api_ft_checkpoints_list},
    {"POST", "/v1/fine_tuning/alpha/graders/run", API_BODY_JSON, NULL, NULL, api_ft_graders_run},
    {"POST", "/v1/fine_tuning/alpha/graders/validate", API_BODY_JSON, NULL, NULL,
     api_ft_graders_validate},
    {"GET", "/", API_BODY_NONE, NULL, NULL, api_static_root},
    {"GET", "/ui", API_BODY_NONE, NULL, NULL, api_static_root},
    {"GET", "/ui/", API_BODY_NONE, NULL, NULL, api_static_file},
    {"GET", "/ui/{file}", API_BODY_NONE, NULL, NULL, api_static_file},
};
#define NROUTES ((int)(sizeof ROUTES / sizeof ROUTES[0]))

/* Body bytes read and thrown away after a reply was decided (so that the client, which may
 * still be sending, reads the reply instead of a reset). Beyond this the connection is closed;
 * a larger announced Content-Length gets the reply before the body (Expect: 100-continue
 * clients such as curl then never send it). */
#define DRAIN_MAX ((uint64_t)1 << 20)
/* Multipart framing on top of max_upload_bytes (part headers, boundaries, small fields). */
#define MULTIPART_SLACK ((uint64_t)64 << 10)

/* A connection suspended until its job's next event, its deadline, or the stop. */
struct waiter {
  struct MHD_Connection *conn;
  char job_id[STORE_ID_MAX];
  int64_t after_id;
  int64_t deadline_ms;
  struct waiter *next;
};

struct api_hub {
  struct server *srv;
  pthread_mutex_t mu;  /* guards list and closing; suspend and resume happen under it */
  pthread_cond_t cond; /* closing (for the thread once the bus is closed) */
  struct waiter *list;
  int closing;
  pthread_t th;
  int started;
  int streams; /* open event streams (under mu) */
};

/* A connection, from libmicrohttpd's "started" notification to its "closed" one (the socket
 * context). libmicrohttpd's connection_timeout_s is an idle timeout that every received byte
 * resets, so a client sending its request line one byte at a time would hold its connection
 * (and a slot of max_connections) for ever. The guard thread shuts down the socket of a
 * connection whose request headers are not complete connection_timeout_s after the connection
 * opened or its previous request ended; libmicrohttpd then sees the end of the stream and closes
 * it. A request being served (headers complete) is not affected: event streams and long uploads
 * stay under the idle timeout alone. */
struct conn_track {
  struct conn_track *prev, *next;
  int fd;           /* the connection's socket (libmicrohttpd's; never closed here) */
  int awaiting;     /* 1 while request headers are awaited (under conn_mu) */
  int64_t since_ms; /* api_now_ms() when awaiting began */
};

struct api_http {
  struct MHD_Daemon *d;
  struct server *srv;
  int port;
  char *tls_cert, *tls_key; /* PEM text, kept while the daemon runs */
  struct api_hub hub;
  struct api_caches caches; /* owned: what handlers keep between requests */
  /* the slow-header guard (struct conn_track) */
  pthread_mutex_t conn_mu; /* guards conns, each track's awaiting/since_ms, guard_stop */
  pthread_cond_t guard_cond;
  struct conn_track *conns;
  pthread_t guard_th;
  int guard_started, guard_stop;
};

/* ---- small helpers ---- */

static double mono_ms_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

double api_req_ms(const struct api_req *r) {
  return mono_ms_since(&r->start);
}

/* Equal strings of n bytes, in time independent of where they differ. */
static int equal_ct(const char *a, const char *b, size_t n) {
  unsigned char d = 0;
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}

const char *api_auth(struct api_req *r) {
  /* Without keys the daemon only listens on loopback (config_finish) and every request is
   * admin. With keys, "Authorization: Bearer <key>" is hashed and compared, in constant time,
   * with every configured SHA-256; the owner is the key's name, or NULL (everything) for an
   * admin key. Liveness and readiness stay open for probes. */
  /* The key set is read under the server's keys_lock (SIGHUP replaces it whole): the name is
   * copied out before the lock is released. */
  if (!strcmp(r->path, "/healthz") || !strcmp(r->path, "/readyz")) return NULL;
  /* The dashboard's static files (api/static.c) hold no data: browsers load them without a key,
   * and the page sends the key the user enters with its API calls. */
  if (!strcmp(r->path, "/") || !strcmp(r->path, "/ui") || !strncmp(r->path, "/ui/", 4)) return NULL;
  const char *h = api_header(r, MHD_HTTP_HEADER_AUTHORIZATION);
  char hex[65] = "";
  if (h && !strncasecmp(h, "Bearer ", 7)) {
    const char *key = h + 7;
    while (*key == ' ') key++;
    struct dapo_sha256 c;
    dapo_sha256_begin(&c);
    dapo_sha256_feed(&c, key, strlen(key));
    dapo_sha256_end_hex(&c, hex);
  }
  pthread_rwlock_rdlock(&r->srv->keys_lock);
  const struct config_api_keys *ks = &r->srv->cfg.api_keys;
  int found = -1, admin = 0, none = ks->n == 0;
  if (hex[0])
    for (int i = 0; i < ks->n; i++) /* no early exit: the time does not tell which key */
      if (equal_ct(hex, ks->v[i].sha256, 64) && found < 0) found = i;
  if (found >= 0) {
    snprintf(r->owner_buf, sizeof r->owner_buf, "%s", ks->v[found].name);
    admin = ks->v[found].admin;
  }
  pthread_rwlock_unlock(&r->srv->keys_lock);
  if (none) return NULL;
  if (found < 0) {
    api_reply_error(r, API_ERR_UNAUTHORIZED,
                    h ? "unknown API key" : "missing Authorization: Bearer <key> header", NULL);
    api_reply_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    return NULL;
  }
  return admin ? NULL : r->owner_buf;
}

const char *api_query(struct api_req *r, const char *name) {
  return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *api_header(struct api_req *r, const char *name) {
  return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

int api_content_type_is(const struct api_req *r, const char *type) {
  const char *ct = r->content_type;
  if (!ct) return 0;
  while (*ct == ' ' || *ct == '\t') ct++;
  size_t n = strlen(type);
  if (strncasecmp(ct, type, n)) return 0;
  char c = ct[n];
  return c == '\0' || c == ';' || c == ' ' || c == '\t';
}

/* ---- replies ---- */

/* Sets the pending reply; a second reply is a bug in a handler: logged, the first one kept. */
static int set_reply(struct api_req *r, int status, struct MHD_Response *resp) {
  if (!resp) return -1;
  if (r->resp || r->status) {
    LOG(ERROR, "%s %s: second reply %d after %d ignored", r->method, r->path, status, r->status);
    MHD_destroy_response(resp);
    return 0;
  }
  r->resp = resp;
  r->status = status;
  return 0;
}

int api_reply_header(struct api_req *r, const char *name, const char *value) {
  if (!r->resp) return -1;
  return MHD_add_response_header(r->resp, name, value) == MHD_YES ? 0 : -1;
}

/* The last resort when nothing else can be built: a static problem body (no allocation). */
static int reply_static_unavailable(struct api_req *r) {
  static const char body[] =
      "{\"type\":\"" API_PROBLEM_BASE "unavailable\",\"title\":\"Service unavailable\","
      "\"status\":503,\"detail\":\"out of memory\"}\n";
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
  if (!resp) return -1;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/problem+json");
  return set_reply(r, 503, resp);
}

static int reply_json_typed(struct api_req *r, int status, json_t *json, const char *ctype) {
  if (!json) return reply_static_unavailable(r);
  size_t n = json_dumpb(json, NULL, 0, JSON_COMPACT);
  char *buf = n ? malloc(n + 1) : NULL;
  if (buf && json_dumpb(json, buf, n, JSON_COMPACT) != n) {
    free(buf);
    buf = NULL;
  }
  json_decref(json);
  if (!buf) return reply_static_unavailable(r);
  buf[n] = '\n';
  struct MHD_Response *resp = MHD_create_response_from_buffer(n + 1, buf, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(buf);
    return reply_static_unavailable(r);
  }
  if (MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype) != MHD_YES) {
    MHD_destroy_response(resp);
    return reply_static_unavailable(r);
  }
  return set_reply(r, status, resp);
}

int api_reply_json_steal(struct api_req *r, int status, json_t *json) {
  return reply_json_typed(r, status, json, "application/json; charset=utf-8");
}

/* An error of the registry in OpenAI's shape (the OpenAI-compatible routes): message is the
 * detail followed by each "field: message" of errors, param the first field, code the row's
 * name. 4xx other than 408/429 say `x-should-retry: false`, as api_oai_error does. */
static int reply_oai_error(struct api_req *r, const struct api_err_row *row, const char *detail,
                           const json_t *errors) {
  char msg[1024], param[192] = "";
  size_t used = (size_t)snprintf(msg, sizeof msg, "%s", detail ? detail : row->hint), i;
  const json_t *it;
  json_array_foreach((json_t *)errors, i, it) {
    const char *f = json_string_value(json_object_get(it, "field"));
    const char *m = json_string_value(json_object_get(it, "message"));
    if (f && !param[0]) snprintf(param, sizeof param, "%s", f);
    if (used >= sizeof msg) break;
    used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%s%s%s", i ? "; " : ": ", f ? f : "",
                             f && *f ? ": " : "", m ? m : "invalid");
  }
  int status = row->http_status;
  int rc = api_reply_json_steal(
      r, status, api_oai_error_body(status, NULL, param[0] ? param : NULL, row->name, msg));
  if (!rc && status >= 400 && status < 500 && status != 408 && status != 429)
    api_reply_header(r, "x-should-retry", "false");
  return rc;
}

int api_reply_error_ext(struct api_req *r, enum api_err code, const char *detail, json_t *errors,
                        const json_t *ext) {
  const struct api_err_row *row = api_err_row(code);
  if (r->path && api_oai_path(r->path)) {
    if (row->http_status >= 500)
      LOG(WARN, "%s %s: %d %s: %s", r->method, r->path, row->http_status, row->name,
          detail ? detail : row->hint);
    int rc = reply_oai_error(r, row, detail, errors);
    json_decref(errors);
    return rc;
  }
  char type[128];
  snprintf(type, sizeof type, "%s%s", API_PROBLEM_BASE, row->name);
  json_t *o = json_object();
  if (o) {
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "title", json_string(row->title));
    json_object_set_new(o, "status", json_integer(row->http_status));
    json_object_set_new(o, "detail", dapo_json_text(detail ? detail : row->hint));
    if (errors) json_object_set(o, "errors", errors);
    if (ext) json_object_update_missing(o, (json_t *)ext);
  }
  json_decref(errors);
  if (row->http_status >= 500)
    LOG(WARN, "%s %s: %d %s: %s", r->method, r->path, row->http_status, row->name,
        detail ? detail : row->hint);
  return reply_json_typed(r, row->http_status, o, "application/problem+json");
}

int api_reply_error(struct api_req *r, enum api_err code, const char *detail, json_t *errors) {
  return api_reply_error_ext(r, code, detail, errors, NULL);
}

int api_reply_errorf(struct api_req *r, enum api_err code, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return api_reply_error(r, code, buf, NULL);
}

int api_reply_store_error(struct api_req *r, int rc, const struct dapo_err *e) {
  const char *msg = e && e->msg[0] ? e->msg : store_strerror(rc);
  switch (rc) {
  case STORE_ENOTFOUND: return api_reply_error(r, API_ERR_NOT_FOUND, msg, NULL);
  case STORE_EINUSE: return api_reply_error(r, API_ERR_FILE_IN_USE, msg, NULL);
  case STORE_ECONFLICT:
  case STORE_ETRANSITION:
  case STORE_ESTATE:
  case STORE_EEXISTS: return api_reply_error(r, API_ERR_CONFLICT, msg, NULL);
  case DAPO_EINVAL:
  case DAPO_ERANGE: return api_reply_error(r, API_ERR_INVALID_REQUEST, msg, NULL);
  case DAPO_ENOMEM: return api_reply_error(r, API_ERR_UNAVAILABLE, msg, NULL);
  default: return api_reply_error(r, API_ERR_INTERNAL, msg, NULL);
  }
}

int api_reply_text(struct api_req *r, int status, const char *content_type, const char *text,
                   size_t len) {
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
  if (!resp) return reply_static_unavailable(r);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  return set_reply(r, status, resp);
}

int api_reply_fd(struct api_req *r, int status, const char *content_type, int fd, uint64_t size) {
  struct MHD_Response *resp = MHD_create_response_from_fd64(size, fd);
  if (!resp) {
    close(fd);
    return reply_static_unavailable(r);
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  return set_reply(r, status, resp);
}

int api_reply_fd_range(struct api_req *r, int status, const char *content_type, int fd,
                       uint64_t offset, uint64_t len) {
  struct MHD_Response *resp = MHD_create_response_from_fd_at_offset64(len, fd, offset);
  if (!resp) {
    close(fd);
    return reply_static_unavailable(r);
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  return set_reply(r, status, resp);
}

int api_reply_response(struct api_req *r, int status, struct MHD_Response *resp) {
  if (!resp) return reply_static_unavailable(r);
  return set_reply(r, status, resp);
}

/* ---- the hub: suspended connections, resumed by bus events, deadlines or the stop ---- */

int64_t api_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void *hub_main(void *arg) {
  struct api_hub *h = arg;
  struct bus *bus = h->srv->bus;
  for (;;) {
    uint64_t gen = bus_generation(bus);
    int bus_done = bus_closed(bus);
    int64_t now = api_now_ms(), next = now + 60000;
    pthread_mutex_lock(&h->mu);
    for (struct waiter **p = &h->list; *p;) {
      struct waiter *w = *p;
      if (h->closing || bus_done || now >= w->deadline_ms ||
          bus_last_id(bus, w->job_id) > w->after_id) {
        MHD_resume_connection(w->conn);
        *p = w->next;
        free(w);
        continue;
      }
      if (w->deadline_ms < next) next = w->deadline_ms;
      p = &w->next;
    }
    if (h->closing || bus_done) {
      /* nothing waits any more (api_hub_suspend refuses now): sleep until the stop */
      while (!h->closing) pthread_cond_wait(&h->cond, &h->mu);
      pthread_mutex_unlock(&h->mu);
      return NULL;
    }
    pthread_mutex_unlock(&h->mu);
    bus_wait_any(bus, gen, (int)(next - now));
  }
}

int api_hub_suspend(struct api_hub *h, struct MHD_Connection *conn, const char *job_id,
                    int64_t after_id, int64_t deadline_ms) {
  struct bus *bus = h->srv->bus;
  pthread_mutex_lock(&h->mu);
  if (h->closing || !h->started || bus_closed(bus)) {
    pthread_mutex_unlock(&h->mu);
    return -1;
  }
  if (bus_last_id(bus, job_id) > after_id) {
    pthread_mutex_unlock(&h->mu);
    return 1;
  }
  struct waiter *w = calloc(1, sizeof *w);
  if (!w) {
    pthread_mutex_unlock(&h->mu);
    return -1;
  }
  w->conn = conn;
  snprintf(w->job_id, sizeof w->job_id, "%s", job_id);
  w->after_id = after_id;
  w->deadline_ms = deadline_ms;
  w->next = h->list;
  h->list = w;
  MHD_suspend_connection(conn);
  pthread_mutex_unlock(&h->mu);
  bus_kick(bus); /* the hub recomputes its next deadline */
  return 0;
}

int api_wait_event(struct api_req *r, const char *job_id, int64_t after_id, int64_t deadline_ms) {
  int rc = api_hub_suspend(r->hub, r->conn, job_id, after_id, deadline_ms);
  if (rc == 0) r->suspended = 1;
  return rc;
}

int api_hub_closing(struct api_hub *h) {
  pthread_mutex_lock(&h->mu);
  int c = h->closing || bus_closed(h->srv->bus);
  pthread_mutex_unlock(&h->mu);
  return c;
}

int api_hub_stream_enter(struct api_hub *h, int max) {
  pthread_mutex_lock(&h->mu);
  int ok = h->streams < max;
  if (ok) h->streams++;
  pthread_mutex_unlock(&h->mu);
  return ok ? 0 : -1;
}

void api_hub_stream_leave(struct api_hub *h) {
  pthread_mutex_lock(&h->mu);
  h->streams--;
  pthread_mutex_unlock(&h->mu);
}

static int hub_start(struct api_hub *h, struct server *srv) {
  h->srv = srv;
  if (pthread_mutex_init(&h->mu, NULL)) return -1;
  if (pthread_cond_init(&h->cond, NULL)) {
    pthread_mutex_destroy(&h->mu);
    return -1;
  }
  if (!srv->bus || pthread_create(&h->th, NULL, hub_main, h)) return 0; /* no waiting then */
  h->started = 1;
  return 0;
}

/* Resumes every suspended connection (their handlers answer, their streams end) and joins the
 * hub's thread; later suspends are refused. Before MHD_stop_daemon, which must find none. */
static void hub_close(struct api_hub *h) {
  if (!h->srv) return;
  pthread_mutex_lock(&h->mu);
  h->closing = 1;
  for (struct waiter *w = h->list, *next; w; w = next) {
    next = w->next;
    MHD_resume_connection(w->conn);
    free(w);
  }
  h->list = NULL;
  pthread_cond_broadcast(&h->cond);
  pthread_mutex_unlock(&h->mu);
  if (h->started) {
    bus_kick(h->srv->bus);
    pthread_join(h->th, NULL);
    h->started = 0;
  }
}

static void hub_free(struct api_hub *h) {
  if (!h->srv) return;
  pthread_cond_destroy(&h->cond);
  pthread_mutex_destroy(&h->mu);
  h->srv = NULL;
}

json_t *api_list_json(json_t *data, int has_more, json_t *next_after) {
  if (!has_more && next_after) json_decref(next_after), next_after = NULL;
  json_t *o = data ? json_pack("{s:s, s:o, s:b, s:o}", "object", "list", "data", data, "has_more",
                               has_more, "next_after", next_after ? next_after : json_null())
                   : NULL;
  if (!data) json_decref(next_after);
  return o;
}

int api_page_params(struct api_req *r, int *limit, const char **after) {
  const char *l = api_query(r, "limit");
  struct dapo_err e = {0};
  *limit = 20;
  *after = api_query(r, "after");
  if (l && parse_int(l, 1, STORE_PAGE_MAX, limit, "limit", &e)) {
    api_reply_errorf(r, API_ERR_INVALID_REQUEST, "limit: '%.64s' is not an integer in [1, %d]", l,
                     STORE_PAGE_MAX);
    return -1;
  }
  if (*after && !**after) {
    api_reply_error(r, API_ERR_INVALID_REQUEST, "after: empty id", NULL);
    return -1;
  }
  return 0;
}

/* ---- routing ---- */

/* Matches the path in buf (a writable copy) against pattern. On success the parameter segments
 * are cut out of buf with NULs, params point at them, and it returns 1; buf is unchanged
 * otherwise. */
static int match(const char *pattern, char *buf, const char **params, int *n_params) {
  const char *p = pattern;
  char *s = buf;
  char *cut[API_MAX_PARAMS];
  int n = 0;
  while (*p || *s) {
    if (*p != '/' || *s != '/') return 0;
    p++, s++;
    size_t pl = strcspn(p, "/"), sl = strcspn(s, "/");
    if (pl >= 2 && p[0] == '{' && p[pl - 1] == '}') {
      if (sl == 0 || n >= API_MAX_PARAMS) return 0;
      params[n] = s;
      cut[n++] = s + sl;
    } else if (pl != sl || memcmp(p, s, pl)) {
      return 0;
    }
    p += pl;
    s += sl;
  }
  for (int i = 0; i < n; i++) *cut[i] = '\0';
  *n_params = n;
  return 1;
}

static const char *const ALLOW_ORDER[] = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"};
#define N_ALLOW ((int)(sizeof ALLOW_ORDER / sizeof ALLOW_ORDER[0]))

/* Finds the route for r's method and path: returns it with r->params set, or NULL with allow
 * holding the methods the path has ("GET, HEAD, DELETE"; empty: unknown path). -1 on OOM. */
static int route_find(struct api_req *r, const struct api_route **out, char *allow, size_t cap) {
  size_t plen = strlen(r->path);
  int seen[N_ALLOW] = {0};
  *out = NULL;
  allow[0] = '\0';
  if (!(r->params_buf = malloc(plen + 1))) return -1;
  const char *m = !strcmp(r->method, "HEAD") ? "GET" : r->method;
  for (int i = 0; i < NROUTES; i++) {
    memcpy(r->params_buf, r->path, plen + 1);
    const char *params[API_MAX_PARAMS];
    int n = 0;
    if (!match(ROUTES[i].pattern, r->params_buf, params, &n)) continue;
    for (int k = 0; k < N_ALLOW; k++)
      if (!strcmp(ROUTES[i].method, ALLOW_ORDER[k])) seen[k] = 1;
    if (!strcmp(ROUTES[i].method, "GET")) seen[1] = 1; /* HEAD */
    if (strcmp(ROUTES[i].method, m)) continue;
    r->n_params = n;
    for (int k = 0; k < n; k++) r->params[k] = params[k];
    *out = &ROUTES[i];
    return 0;
  }
  size_t len = 0;
  for (int k = 0; k < N_ALLOW; k++) {
    if (!seen[k]) continue;
    int w = snprintf(allow + len, cap - len, "%s%s", len ? ", " : "", ALLOW_ORDER[k]);
    if (w < 0 || (size_t)w >= cap - len) break;
    len += (size_t)w;
  }
  return 0;
}

/* ---- JSON bodies ---- */

/* Line and column (1-based) of byte offset at in s. */
static void line_col(const char *s, size_t at, int *line, int *col) {
  int l = 1, c = 1;
  for (size_t i = 0; i < at; i++) {
    if (s[i] == '\n')
      l++, c = 1;
    else
      c++;
  }
  *line = l, *col = c;
}

/* Jansson has no runtime depth limit (only a compile-time 2048), so the nesting of arrays and
 * objects is checked before parsing. Returns the offset of the first bracket beyond max, or
 * (size_t)-1 when the text is within it (strings are skipped; malformed text is left to the
 * parser). */
static size_t json_depth_exceeded(const char *s, size_t n, int max) {
  int depth = 0, in_str = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (in_str) {
      if (c == '\\')
        i++;
      else if (c == '"')
        in_str = 0;
    } else if (c == '"') {
      in_str = 1;
    } else if (c == '[' || c == '{') {
      if (++depth > max) return i;
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
  return (size_t)-1;
}

/* Parses r->body into r->json, or replies 400 invalid_json. */
static void parse_json_body(struct api_req *r) {
  int max = r->srv->cfg.max_json_depth;
  size_t at = json_depth_exceeded(r->body, r->body_len, max);
  if (at != (size_t)-1) {
    int line, col;
    line_col(r->body, at, &line, &col);
    api_reply_errorf(r, API_ERR_INVALID_JSON,
                     "JSON nests deeper than max_json_depth (%d) at line %d, column %d (byte "
                     "%zu)",
                     max, line, col, at);
    return;
  }
  json_error_t je;
  r->json = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, &je);
  if (!r->json)
    api_reply_errorf(r, API_ERR_INVALID_JSON, "invalid JSON at line %d, column %d (byte %d): %s",
                     je.line, je.column, je.position, je.text);
}

/* ---- the request's life ---- */

static uint64_t body_cap(const struct api_req *r) {
  const struct config *c = &r->srv->cfg;
  if (r->route && r->route->body == API_BODY_STREAM) return c->max_upload_bytes + MULTIPART_SLACK;
  return c->max_body_bytes;
}

static int has_body(const struct api_req *r) {
  return r->content_length > 0 || api_header((struct api_req *)r, "Transfer-Encoding") != NULL;
}

static void req_free(struct api_req *r) {
  if (!r) return;
  if (r->ctx_free) r->ctx_free(r->ctx);
  if (r->resp) MHD_destroy_response(r->resp);
  json_decref(r->json);
  free(r->body);
  free(r->params_buf);
  free(r->path);
  free(r);
}

static struct api_req *req_new(struct api_http *h, struct MHD_Connection *conn, const char *url,
                               const char *method) {
  struct api_req *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  clock_gettime(CLOCK_MONOTONIC, &r->start);
  r->srv = h->srv;
  r->hub = &h->hub;
  r->caches = &h->caches;
  r->conn = conn;
  snprintf(r->method_buf, sizeof r->method_buf, "%s", method);
  r->method = r->method_buf;
  if (!(r->path = strdup(url))) {
    free(r);
    return NULL;
  }
  r->content_length = -1;
  return r;
}

/* The first call: headers are known, no body yet. May leave a reply in r. */
static void req_begin(struct api_req *r) {
  char allow[64];
  r->content_type = api_header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
  const char *cl = api_header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
  int64_t v;
  if (cl && !parse_i64(cl, 0, INT64_MAX, &v, "Content-Length", NULL)) r->content_length = v;
  r->owner = api_auth(r);
  if (r->status) return; /* the auth hook replied (401) */
  if (route_find(r, &r->route, allow, sizeof allow)) {
    api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
    return;
  }
  if (!r->route) {
    if (!allow[0]) {
      api_reply_errorf(r, API_ERR_NOT_FOUND, "no such path: %s %.200s", r->method, r->path);
    } else if (!strcmp(r->method, "OPTIONS")) {
      api_reply_text(r, 204, "text/plain", "", 0);
      api_reply_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    } else {
      api_reply_errorf(r, API_ERR_METHOD_NOT_ALLOWED, "%s is not allowed on %.200s (allowed: %s)",
                       r->method, r->path, allow);
      api_reply_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    }
    return;
  }
  uint64_t cap = body_cap(r);
  if (r->content_length > 0 && (uint64_t)r->content_length > cap) {
    if (r->route->body == API_BODY_STREAM)
      api_reply_errorf(r, API_ERR_PAYLOAD_TOO_LARGE,
                       "upload of %lld bytes exceeds max_upload_bytes (%llu bytes)",
                       (long long)r->content_length,
                       (unsigned long long)r->srv->cfg.max_upload_bytes);
    else
      api_reply_errorf(r, API_ERR_PAYLOAD_TOO_LARGE,
                       "request body of %lld bytes exceeds max_body_bytes (%llu bytes)",
                       (long long)r->content_length, (unsigned long long)cap);
    return;
  }
  if (r->route->body == API_BODY_JSON && has_body(r) &&
      !api_content_type_is(r, "application/json")) {
    api_reply_errorf(r, API_ERR_UNSUPPORTED_MEDIA,
                     "this endpoint takes Content-Type: application/json (got %.100s)",
                     r->content_type ? r->content_type : "none");
    return;
  }
  if (r->route->begin && r->route->begin(r) && !r->status)
    api_reply_error(r, API_ERR_INTERNAL, "the request could not be started", NULL);
}

/* A body chunk for a request without a reply yet. */
static void req_chunk(struct api_req *r, const char *data, size_t n) {
  uint64_t cap = body_cap(r);
  if (r->body_bytes > cap) {
    if (r->route->body == API_BODY_STREAM)
      api_reply_errorf(r, API_ERR_PAYLOAD_TOO_LARGE, "upload exceeds max_upload_bytes (%llu bytes)",
                       (unsigned long long)r->srv->cfg.max_upload_bytes);
    else
      api_reply_errorf(r, API_ERR_PAYLOAD_TOO_LARGE,
                       "request body exceeds max_body_bytes (%llu bytes)", (unsigned long long)cap);
    return;
  }
  if (r->route->body == API_BODY_STREAM) {
    if (r->route->chunk(r, data, n) && !r->status)
      api_reply_error(r, API_ERR_INTERNAL, "the upload could not be processed", NULL);
    return;
  }
  /* body_bytes (= body_len + n here) <= cap was checked above, so cap + 1 always fits. */
  if (r->body_len + n + 1 > r->body_cap) {
    size_t want = r->body_cap ? r->body_cap : 4096;
    while (want < r->body_len + n + 1) want *= 2;
    if (want > cap + 1) want = (size_t)cap + 1;
    char *nb = realloc(r->body, want);
    if (!nb) {
      api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory reading the request body", NULL);
      return;
    }
    r->body = nb;
    r->body_cap = want;
  }
  memcpy(r->body + r->body_len, data, n);
  r->body_len += n;
  r->body[r->body_len] = '\0';
}

/* The last call: the whole body is in. */
static void req_finish(struct api_req *r) {
  if (r->route->body == API_BODY_JSON && r->body_len && !r->json) parse_json_body(r);
  if (r->status) return;
  if (r->route->handle(r) && !r->status && !r->suspended)
    api_reply_error(r, API_ERR_INTERNAL, "the request could not be answered", NULL);
  if (!r->status && !r->suspended) {
    LOG(ERROR, "%s %s: the handler gave no reply", r->method, r->path);
    api_reply_error(r, API_ERR_INTERNAL, "the handler gave no reply", NULL);
  }
}

static enum MHD_Result queue(struct api_req *r) {
  if (!r->resp) return MHD_NO;
  /* A refused request's route state goes before the refusal does, so that its side effects (a
   * temporary upload file) are gone when the client reads the error. */
  if (r->status >= 400 && r->ctx_free) {
    r->ctx_free(r->ctx);
    r->ctx = NULL;
    r->ctx_free = NULL;
  }
  enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)r->status, r->resp);
  MHD_destroy_response(r->resp);
  r->resp = NULL;
  if (ret != MHD_YES)
    LOG(WARN, "%s %s: could not queue the %d reply", r->method, r->path, r->status);
  return ret;
}

/* ---- the slow-header guard ---- */

static struct conn_track *track_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* awaiting: 1 when the connection now waits for the next request's headers. */
static void track_set(struct api_http *h, struct MHD_Connection *conn, int awaiting) {
  struct conn_track *t = track_of(conn);
  if (!t) return;
  pthread_mutex_lock(&h->conn_mu);
  t->awaiting = awaiting;
  t->since_ms = api_now_ms();
  pthread_mutex_unlock(&h->conn_mu);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  struct api_http *h = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct conn_track *t = ci ? calloc(1, sizeof *t) : NULL;
    if (!t) return; /* not guarded: the idle timeout still applies */
    t->fd = ci->connect_fd;
    t->awaiting = 1;
    t->since_ms = api_now_ms();
    pthread_mutex_lock(&h->conn_mu);
    t->next = h->conns;
    if (h->conns) h->conns->prev = t;
    h->conns = t;
    pthread_mutex_unlock(&h->conn_mu);
    *socket_context = t;
    return;
  }
  /* closed: libmicrohttpd closes the socket after this returns, so once the track is off the
   * list (under conn_mu) the guard can no longer touch a descriptor that gets reused */
  struct conn_track *t = *socket_context;
  if (!t) return;
  pthread_mutex_lock(&h->conn_mu);
  if (t->prev)
    t->prev->next = t->next;
  else
    h->conns = t->next;
  if (t->next) t->next->prev = t->prev;
  pthread_mutex_unlock(&h->conn_mu);
  free(t);
  *socket_context = NULL;
}

static void *guard_main(void *arg) {
  struct api_http *h = arg;
  int64_t limit_ms = (int64_t)h->srv->cfg.connection_timeout_s * 1000;
  pthread_mutex_lock(&h->conn_mu);
  while (!h->guard_stop) {
    int64_t now = api_now_ms();
    int cut = 0;
    for (struct conn_track *t = h->conns; t; t = t->next) {
      if (!t->awaiting || now - t->since_ms < limit_ms) continue;
      shutdown(t->fd, SHUT_RDWR);
      t->awaiting = 0; /* once */
      cut++;
    }
    if (cut)
      LOG(WARN,
          "http: closed %d connection%s that sent no complete request headers within "
          "connection_timeout_s (%d s)",
          cut, cut == 1 ? "" : "s", h->srv->cfg.connection_timeout_s);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 250 * 1000000L; /* a quarter of a second: the granularity of the cut */
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&h->guard_cond, &h->conn_mu, &until);
  }
  pthread_mutex_unlock(&h->conn_mu);
  return NULL;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls) {
  struct api_http *h = cls;
  struct api_req *r = *con_cls;
  (void)version;
  if (!r) {
    track_set(h, conn, 0); /* the headers are in */
    if (!(r = req_new(h, conn, url, method))) return MHD_NO;
    *con_cls = r;
    req_begin(r);
    /* A reply decided before the body is queued at the last call, after the body (if any) was
     * drained, so that the connection stays usable and a client still sending reads the reply.
     * Only an announced body too large to drain gets the reply at once: libmicrohttpd then
     * sends it without reading the body (an Expect: 100-continue client, such as curl for large
     * uploads, never sends it) and closes the connection. */
    if (r->resp && r->content_length > 0 && (uint64_t)r->content_length > DRAIN_MAX)
      return queue(r);
    return MHD_YES;
  }
  if (*upload_data_size) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    r->body_bytes += n;
    if (r->status) {
      r->drained += n;
      return r->drained > DRAIN_MAX ? MHD_NO : MHD_YES;
    }
    req_chunk(r, upload_data, n);
    return MHD_YES;
  }
  if (!r->status) req_finish(r);
  if (r->suspended) { /* api_wait_event: the handler runs again after the resume */
    r->suspended = 0;
    return MHD_YES;
  }
  return queue(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  struct api_http *h = cls;
  struct api_req *r = *con_cls;
  if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) track_set(h, conn, 1); /* keep-alive: next */
  if (!r) return;
  double ms = api_req_ms(r);
  if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->status)
    LOG(DEBUG, "%s %s: connection ended before the %d reply was sent (%d)", r->method, r->path,
        r->status, (int)toe);
  if (h->srv->cfg.access_log) log_access(r->method, r->path, r->status, ms);
  if (r->status) server_count_request(h->srv, r->method, r->status, ms / 1e3);
  req_free(r);
  *con_cls = NULL;
}

/* libmicrohttpd's unescaping of the path and the query arguments, except that a decoded NUL
 * ("%00") becomes DEL (0x7f) instead of silently cutting the string: "a%00.png" must not be
 * read as "a". No route or name accepts a control character, so such a request fails. */
static size_t unescape_no_nul(void *cls, struct MHD_Connection *c, char *s) {
  (void)cls, (void)c;
  size_t n = MHD_http_unescape(s);
  for (size_t i = 0; i < n; i++)
    if (s[i] == '\0') s[i] = 0x7f;
  return n;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  char buf[512];
  (void)cls;
  vsnprintf(buf, sizeof buf, fmt, ap);
  size_t n = strlen(buf);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = '\0';
  LOG(WARN, "http: %s", buf);
}

/* ---- the daemon ---- */

/* Reads a PEM file (at most 1 MiB) into an owned string; it must hold a "-----BEGIN ...<label>"
 * line (label "CERTIFICATE", or "PRIVATE KEY" which also matches "RSA PRIVATE KEY" and "EC PRIVATE
 * KEY"). Errors name the config key. Whether GnuTLS accepts the content is known only when
 * libmicrohttpd starts. */
static char *read_pem(const char *path, const char *key, const char *label, struct dapo_err *e) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    dapo_errf(e, DAPO_EIO, "%s %s: %s", key, path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 20, len = 0;
  char *buf = malloc(cap + 1);
  ssize_t k = 0;
  while (buf && len < cap && (k = read(fd, buf + len, cap - len)) > 0) len += (size_t)k;
  close(fd);
  if (!buf || k < 0 || len == cap) {
    dapo_errf(e, buf ? DAPO_EIO : DAPO_ENOMEM, "%s %s: %s", key, path,
              !buf    ? "out of memory"
              : k < 0 ? strerror(errno)
                      : "larger than 1 MiB");
    free(buf);
    return NULL;
  }
  buf[len] = '\0';
  const char *b = strstr(buf, "-----BEGIN ");
  const char *eol = b ? strchr(b, '\n') : NULL;
  const char *l = b ? strstr(b, label) : NULL;
  if (!b || !l || (eol && l > eol)) {
    dapo_errf(e, DAPO_EFORMAT,
              "%s %s: not a PEM file with a %s (no \"-----BEGIN ...%s-----\" line)", key, path,
              label, label);
    free(buf);
    return NULL;
  }
  return buf;
}

struct api_http *api_http_start(struct server *srv, struct dapo_err *e) {
  const struct config *c = &srv->cfg;
  struct api_http *h = calloc(1, sizeof *h);
  if (!h) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return NULL;
  }
  h->srv = srv;
  pthread_mutex_init(&h->conn_mu, NULL);
  pthread_cond_init(&h->guard_cond, NULL);
  if (hub_start(&h->hub, srv)) {
    dapo_errf(e, DAPO_ENOMEM, "cannot start the HTTP hub");
    free(h);
    return NULL;
  }
  if (!(h->caches.frames = api_frames_new()) || !(h->caches.metrics = api_metrics_cache_new())) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    api_http_stop(h);
    return NULL;
  }
  char port[16], addr[300];
  snprintf(port, sizeof port, "%d", c->listen.port);
  config_addr_format(&c->listen, addr, sizeof addr);
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int g = getaddrinfo(c->listen.host[0] ? c->listen.host : NULL, port, &hints, &ai);
  if (g || !ai) {
    dapo_errf(e, DAPO_EINVAL, "listen %s: %s", addr, g ? gai_strerror(g) : "no address");
    api_http_stop(h);
    return NULL;
  }
  struct sockaddr_storage ss;
  memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
  int family = ai->ai_family;
  freeaddrinfo(ai);

  unsigned flags =
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
  if (family == AF_INET6) flags |= MHD_USE_IPv6;
  /* optional options: the TLS pair, and a thread pool only beyond one thread (libmicrohttpd
   * warns about a pool of 0 or 1) */
  struct MHD_OptionItem opt[4] = {{MHD_OPTION_END, 0, NULL}};
  int n_opt = 0;
  int use_tls = c->tls_cert && c->tls_cert[0];
  if (use_tls) {
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
      dapo_errf(e, DAPO_EINVAL,
                "tls_cert: this libmicrohttpd was built without TLS (GnuTLS) support; install "
                "one with it or serve plain HTTP behind a TLS proxy");
      api_http_stop(h);
      return NULL;
    }
    if (!(h->tls_cert = read_pem(c->tls_cert, "tls_cert", "CERTIFICATE", e)) ||
        !(h->tls_key = read_pem(c->tls_key, "tls_key", "PRIVATE KEY", e))) {
      api_http_stop(h);
      return NULL;
    }
    flags |= MHD_USE_TLS;
    opt[n_opt++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, h->tls_cert};
    opt[n_opt++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, h->tls_key};
  }
  if (c->http_threads > 1)
    opt[n_opt++] =
        (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, (intptr_t)c->http_threads, NULL};
  opt[n_opt] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
  errno = 0;
  h->d = MHD_start_daemon(
      flags, (uint16_t)c->listen.port, NULL, NULL, on_access, h, MHD_OPTION_EXTERNAL_LOGGER,
      on_mhd_log, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned)c->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned)c->max_connections_per_ip, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned)c->connection_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      (size_t)c->max_header_bytes, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_UNESCAPE_CALLBACK, unescape_no_nul,
      h, MHD_OPTION_ARRAY, opt, MHD_OPTION_END);
  if (!h->d) {
    int err = errno;
    if (use_tls && err != EADDRINUSE && err != EACCES && err != EADDRNOTAVAIL)
      dapo_errf(e, DAPO_EIO,
                "cannot serve HTTPS on %s: libmicrohttpd/GnuTLS refused tls_cert %s or tls_key %s "
                "(a certificate and its matching private key, PEM; see the log above)",
                addr, c->tls_cert, c->tls_key);
    else
      dapo_errf(e, DAPO_EIO, "cannot serve HTTP on %s: %s", addr,
                err ? strerror(err) : "libmicrohttpd refused to start (see the log above)");
    api_http_stop(h);
    return NULL;
  }
  if (pthread_create(&h->guard_th, NULL, guard_main, h)) {
    dapo_errf(e, DAPO_ENOMEM, "cannot start the HTTP connection guard");
    api_http_stop(h);
    return NULL;
  }
  h->guard_started = 1;
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = info && info->port ? info->port : c->listen.port;
  return h;
}

void api_http_stop(struct api_http *h) {
  if (!h) return;
  hub_close(&h->hub); /* no connection may stay suspended when the daemon stops */
  if (h->guard_started) {
    pthread_mutex_lock(&h->conn_mu);
    h->guard_stop = 1;
    pthread_cond_signal(&h->guard_cond);
    pthread_mutex_unlock(&h->conn_mu);
    pthread_join(h->guard_th, NULL);
  }
  if (h->d) MHD_stop_daemon(h->d);
  hub_free(&h->hub);
  api_frames_free(h->caches.frames);
  api_metrics_cache_free(h->caches.metrics);
  pthread_mutex_destroy(&h->conn_mu);
  pthread_cond_destroy(&h->guard_cond);
  free(h->tls_cert);
  free(h->tls_key);
  free(h);
}

int api_http_port(const struct api_http *h) {
  return h->port;
}
