/* OpenEnv's WebSocket sessions through libwebsockets (openenv.h). One mutex (recursive: lws
 * calls the callback, which takes it, from inside calls the service thread makes holding it)
 * guards the sessions; one condition variable tells the waiting callers that something changed.
 * A session is freed once its caller has released it and lws has destroyed its socket. */
#include "openenv.h"

#include <arpa/inet.h>
#include <libwebsockets.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SOCKETS_MAX 1024     /* open sessions of one client (one an episode) */
#define HEADERS_BYTES 16384  /* the handshake's extra headers */
#define LWS_TIMEOUT_SECS 700 /* lws's own waits: longer than any timeout_ms (ours rule) */
#define ID_BYTES 96

struct session {
  struct session *next;      /* oe->sessions */
  struct session *todo_next; /* oe->todo, while queued */
  char id[ID_BYTES];
  char addr[INET6_ADDRSTRLEN]; /* the checked address to connect to */
  struct lws *wsi;             /* lws's socket; NULL before connecting and once destroyed */
  int queued;                  /* in oe->todo: the service thread has something to do */
  int connect;                 /* ... connect it */
  int open;                    /* the handshake is done */
  int closing;                 /* close the socket once the message is written */
  int kill;                    /* drop the socket */
  int ended;                   /* failed or closed: no more exchanges (fail, why) */
  int released;                /* the caller is done with it */
  unsigned char *out;          /* the message to write, LWS_PRE bytes before it (owned) */
  size_t out_n;
  int awaiting; /* a reply is awaited */
  int replied;  /* rx holds a whole message */
  char *rx;     /* the reply so far (owned) */
  size_t rx_n, rx_cap, max_reply;
  enum outside_outcome fail;
  char why[240];
};

struct openenv {
  struct outside *party; /* the URL, headers and host policy */
  char host_header[300]; /* "host[:port]", brackets around an IPv6 address */
  char headers[HEADERS_BYTES];
  int headers_n;
  struct lws_context *ctx;
  pthread_t th;
  int started;
  pthread_mutex_t mu; /* recursive */
  pthread_cond_t changed;
  struct session *sessions, *todo, *todo_tail;
  int stop, aborted;
};

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

/* lws's own log: errors only, on stderr, marked. */
static void log_line(int level, const char *line) {
  (void)level;
  fprintf(stderr, "dapod: libwebsockets: %s", line);
}

static void quiet_lws(void) {
  lws_set_log_level(LLL_ERR, log_line);
}

/* Ends s (the mutex held): exchanges fail with how and why from now on. */
static void end(struct openenv *oe, struct session *s, enum outside_outcome how, const char *fmt,
                ...) __attribute__((format(printf, 4, 5)));
static void end(struct openenv *oe, struct session *s, enum outside_outcome how, const char *fmt,
                ...) {
  if (!s->ended) {
    s->ended = 1;
    s->fail = how;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->why, sizeof s->why, fmt, ap);
    va_end(ap);
  }
  pthread_cond_broadcast(&oe->changed);
}

/* Queues s for the service thread (the mutex held; wake it after unlocking). */
static void enqueue(struct openenv *oe, struct session *s) {
  if (s->queued) return;
  s->queued = 1;
  s->todo_next = NULL;
  if (oe->todo_tail)
    oe->todo_tail->todo_next = s;
  else
    oe->todo = s;
  oe->todo_tail = s;
}

static void session_free(struct session *s) {
  free(s->out);
  free(s->rx);
  free(s);
}

/* Frees the sessions nobody needs any more: released, their socket gone, not queued. The mutex
 * held; never from inside an lws callback that may concern them. */
static void reap(struct openenv *oe) {
  for (struct session **at = &oe->sessions; *at;) {
    struct session *s = *at;
    if (s->released && !s->wsi && !s->queued) {
      *at = s->next;
      session_free(s);
    } else {
      at = &s->next;
    }
  }
}

/* The service thread's connect of s: to the checked numeric address, the Host header the URL's. */
static void connect_session(struct openenv *oe, struct session *s) {
  const char *host, *target;
  int port;
  outside_ws_endpoint(oe->party, &host, &port, &target);
  struct lws_client_connect_info i = {0};
  i.context = oe->ctx;
  i.address = s->addr;
  i.port = port;
  i.path = target;
  i.host = oe->host_header;
  i.ietf_version_or_minus_one = -1;
  i.userdata = s;
  i.local_protocol_name = "dapod-openenv";
  i.pwsi = &s->wsi;
  if (!lws_client_connect_via_info(&i)) {
    s->wsi = NULL;
    end(oe, s, OUT_CONNECT, "could not connect to %s port %d", s->addr, port);
  }
}

/* What the callers queued (the service thread, the mutex held). */
static void drain(struct openenv *oe) {
  struct session *s;
  while ((s = oe->todo)) {
    oe->todo = s->todo_next;
    if (!oe->todo) oe->todo_tail = NULL;
    s->queued = 0;
    if (s->connect) {
      s->connect = 0;
      if (!s->ended && !s->kill) connect_session(oe, s);
    }
    if (!s->wsi) continue;
    if (s->kill)
      lws_set_timeout(s->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
    else if (s->open && (s->out || s->closing))
      lws_callback_on_writable(s->wsi);
  }
}

/* Appends a received piece of a message to s's reply (the mutex held): 0, or -1 when it is too
 * large (s ended). */
static int receive(struct openenv *oe, struct session *s, const void *in, size_t len) {
  if (s->rx_n + len > s->max_reply) {
    end(oe, s, OUT_TOO_LARGE, "malformed reply (larger than max_answer_bytes %zu)", s->max_reply);
    return -1;
  }
  if (s->rx_n + len + 1 > s->rx_cap) {
    size_t cap = s->rx_cap ? s->rx_cap : 4096;
    while (cap < s->rx_n + len + 1) cap *= 2;
    char *p = realloc(s->rx, cap);
    if (!p) {
      end(oe, s, OUT_CONNECT, "out of memory reading the reply");
      return -1;
    }
    s->rx = p;
    s->rx_cap = cap;
  }
  memcpy(s->rx + s->rx_n, in, len);
  s->rx_n += len;
  s->rx[s->rx_n] = '\0';
  return 0;
}

static int on_event(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                    size_t len) {
  struct lws_context *ctx = lws_get_context(wsi);
  struct openenv *oe = ctx ? lws_context_user(ctx) : NULL;
  struct session *s = user;
  if (!oe) return 0;
  int rc = 0;
  pthread_mutex_lock(&oe->mu);
  switch (reason) {
  case LWS_CALLBACK_EVENT_WAIT_CANCELLED: drain(oe); break;
  case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
    unsigned char **p = in, *end_at = *p + len;
    if (oe->headers_n >= end_at - *p) {
      if (s) end(oe, s, OUT_CONNECT, "the headers do not fit in the handshake");
      rc = -1;
    } else {
      memcpy(*p, oe->headers, (size_t)oe->headers_n);
      *p += oe->headers_n;
    }
    break;
  }
  case LWS_CALLBACK_CLIENT_ESTABLISHED:
    if (!s) break;
    s->open = 1;
    if (s->kill)
      rc = -1;
    else if (s->out)
      lws_callback_on_writable(wsi);
    break;
  case LWS_CALLBACK_CLIENT_WRITEABLE:
    if (!s || s->kill) {
      rc = -1;
    } else if (s->out) {
      int w = lws_write(wsi, s->out + LWS_PRE, s->out_n, LWS_WRITE_TEXT);
      free(s->out);
      s->out = NULL;
      if (w < (int)s->out_n) {
        end(oe, s, OUT_CONNECT, "the socket failed while sending");
        rc = -1;
      }
    }
    if (!rc && s && s->closing) {
      lws_close_reason(wsi, LWS_CLOSE_STATUS_NORMAL, NULL, 0);
      rc = -1;
    }
    break;
  case LWS_CALLBACK_CLIENT_RECEIVE:
    if (!s) break;
    if (!s->awaiting) {
      end(oe, s, OUT_CONNECT, "the environment sent a message nobody asked for");
      rc = -1;
    } else if (receive(oe, s, in, len)) {
      rc = -1;
    } else if (lws_is_final_fragment(wsi) && !lws_remaining_packet_payload(wsi)) {
      s->awaiting = 0;
      s->replied = 1;
      pthread_cond_broadcast(&oe->changed);
    }
    break;
  case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
    if (s)
      end(oe, s, OUT_CONNECT, "could not open the session (%.160s)",
          in && len ? (const char *)in : "no detail");
    break;
  case LWS_CALLBACK_CLIENT_CLOSED:
    if (s) end(oe, s, OUT_CONNECT, "the environment closed the socket");
    break;
  case LWS_CALLBACK_WSI_DESTROY:
    if (s) {
      s->wsi = NULL;
      end(oe, s, OUT_CONNECT, "the socket was closed");
    }
    break;
  default: break;
  }
  pthread_mutex_unlock(&oe->mu);
  return rc;
}

static const struct lws_protocols PROTOCOLS[] = {
    {"dapod-openenv", on_event, 0, 0, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

static void *service_main(void *p) {
  struct openenv *oe = p;
  for (;;) {
    pthread_mutex_lock(&oe->mu);
    reap(oe);
    int stop = oe->stop;
    pthread_mutex_unlock(&oe->mu);
    if (stop) break;
    lws_service(oe->ctx, 0);
  }
  return NULL;
}

struct openenv *openenv_new(const char *field, const json_t *url, const json_t *headers,
                            const struct judge_policy *pol, struct dapo_err *e) {
  pthread_once(&log_once, quiet_lws);
  struct openenv *oe = calloc(1, sizeof *oe);
  if (!oe) {
    dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
    return NULL;
  }
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&oe->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_cond_init(&oe->changed, NULL);
  if (!(oe->party = outside_new_ws(field, "environment", url, headers, pol, e))) {
    openenv_free(oe);
    return NULL;
  }
  const char *host, *target;
  int port;
  outside_ws_endpoint(oe->party, &host, &port, &target);
  int v6 = strchr(host, ':') != NULL;
  char portpart[16] = "";
  if (port != 80) snprintf(portpart, sizeof portpart, ":%d", port);
  snprintf(oe->host_header, sizeof oe->host_header, "%s%s%s%s", v6 ? "[" : "", host, v6 ? "]" : "",
           portpart);
  if ((oe->headers_n = outside_ws_headers(oe->party, oe->headers, sizeof oe->headers)) < 0) {
    dapo_errf(e, DAPO_EINVAL, "%s.headers: more than %d bytes", field, HEADERS_BYTES);
    openenv_free(oe);
    return NULL;
  }
  struct lws_context_creation_info info = {0};
  info.port = CONTEXT_PORT_NO_LISTEN;
  info.protocols = PROTOCOLS;
  info.gid = -1;
  info.uid = -1;
  info.user = oe;
  info.fd_limit_per_thread = SOCKETS_MAX + 16;
  info.timeout_secs = LWS_TIMEOUT_SECS;
  info.pt_serv_buf_size = HEADERS_BYTES + 4096;
  if (!(oe->ctx = lws_create_context(&info))) {
    dapo_errf(e, DAPO_EIO, "%s: libwebsockets could not start", field);
    openenv_free(oe);
    return NULL;
  }
  if (pthread_create(&oe->th, NULL, service_main, oe)) {
    dapo_errf(e, DAPO_EIO, "%s: cannot start the environment's socket thread", field);
    openenv_free(oe);
    return NULL;
  }
  oe->started = 1;
  return oe;
}

void openenv_abort(struct openenv *oe) {
  if (!oe) return;
  pthread_mutex_lock(&oe->mu);
  oe->aborted = 1;
  pthread_cond_broadcast(&oe->changed);
  pthread_mutex_unlock(&oe->mu);
}

void openenv_free(struct openenv *oe) {
  if (!oe) return;
  if (oe->started) {
    pthread_mutex_lock(&oe->mu);
    oe->stop = 1;
    pthread_mutex_unlock(&oe->mu);
    lws_cancel_service(oe->ctx);
    pthread_join(oe->th, NULL);
  }
  /* closes every socket (their callbacks run here, on this thread) */
  if (oe->ctx) lws_context_destroy(oe->ctx);
  for (struct session *s = oe->sessions, *n; s; s = n) {
    n = s->next;
    session_free(s);
  }
  outside_free(oe->party);
  pthread_mutex_destroy(&oe->mu);
  pthread_cond_destroy(&oe->changed);
  free(oe);
}

/* The open session `id` (the mutex held), or NULL. */
static struct session *find(struct openenv *oe, const char *id) {
  for (struct session *s = oe->sessions; s; s = s->next)
    if (!s->released && !strcmp(s->id, id)) return s;
  return NULL;
}

/* The caller is done with s (the mutex held): its socket dropped, unless it is already gone
 * (then it is freed at the service thread's next turn). */
static void release(struct openenv *oe, struct session *s) {
  s->released = 1;
  if (s->wsi || s->connect) {
    s->kill = 1;
    enqueue(oe, s);
  }
}

/* Waits (the mutex held) until done(s) or the deadline; 0 when done, 1 at the deadline, 2
 * when the client is aborted. */
static int wait_for(struct openenv *oe, struct session *s, int (*done)(const struct session *),
                    int64_t deadline) {
  while (!done(s)) {
    if (oe->aborted) return 2;
    int64_t now = outside_now_ms();
    if (now >= deadline) return 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ms = deadline - now < 100 ? deadline - now : 100;
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&oe->changed, &oe->mu, &ts);
  }
  return 0;
}

static int answered(const struct session *s) {
  return s->replied || s->ended;
}

static int gone(const struct session *s) {
  return !s->wsi && !s->connect && !s->queued;
}

/* A message of n bytes with the room lws_write needs before it: owned; NULL out of memory. */
static unsigned char *frame(const char *text, size_t n) {
  unsigned char *m = malloc(LWS_PRE + n + 1);
  if (m) memcpy(m + LWS_PRE, text, n);
  return m;
}

enum outside_outcome openenv_call(struct openenv *oe, const char *id, enum openenv_op op,
                                  const char *text, size_t n, long timeout_ms, size_t max_reply,
                                  char **reply, size_t *reply_n, char *what, size_t cap) {
  int64_t deadline = outside_now_ms() + timeout_ms;
  if (reply) *reply = NULL;
  if (reply_n) *reply_n = 0;
  what[0] = '\0';
  char addr[INET6_ADDRSTRLEN] = "";
  /* every connect is checked again (a name rebound after validation is caught) */
  if (op == OPENENV_OPEN) {
    enum outside_outcome o = outside_ws_address(oe->party, addr, sizeof addr, what, cap);
    if (o != OUT_OK) return o;
  }
  unsigned char *m = frame(text, n);
  if (!m) {
    snprintf(what, cap, "out of memory");
    return OUT_CONNECT;
  }
  enum outside_outcome out = OUT_OK;
  pthread_mutex_lock(&oe->mu);
  struct session *s = find(oe, id);
  if (op == OPENENV_OPEN) {
    if (s) release(oe, s);
    int live = 0;
    for (const struct session *o = oe->sessions; o; o = o->next) live += o->wsi || o->connect;
    s = live < SOCKETS_MAX ? calloc(1, sizeof *s) : NULL;
    if (!s) {
      free(m);
      if (live < SOCKETS_MAX)
        snprintf(what, cap, "out of memory");
      else
        snprintf(what, cap, "%d sessions are open already (lower gen_batch_size)", SOCKETS_MAX);
      pthread_mutex_unlock(&oe->mu);
      return OUT_CONNECT;
    }
    snprintf(s->id, sizeof s->id, "%s", id);
    snprintf(s->addr, sizeof s->addr, "%s", addr);
    s->connect = 1;
    s->next = oe->sessions;
    oe->sessions = s;
  } else if (!s || s->ended) {
    free(m);
    if (s && op == OPENENV_CLOSE) release(oe, s);
    if (op == OPENENV_SEND) snprintf(what, cap, "%s", s ? s->why : "the session is not open");
    pthread_mutex_unlock(&oe->mu);
    if (s && op == OPENENV_CLOSE) lws_cancel_service(oe->ctx);
    return op == OPENENV_CLOSE ? OUT_OK : OUT_CONNECT;
  }
  free(s->out);
  s->out = m;
  s->out_n = n;
  s->closing = op == OPENENV_CLOSE;
  s->awaiting = op != OPENENV_CLOSE;
  s->replied = 0;
  s->rx_n = 0;
  s->max_reply = max_reply;
  enqueue(oe, s);
  pthread_mutex_unlock(&oe->mu);
  lws_cancel_service(oe->ctx);

  pthread_mutex_lock(&oe->mu);
  int w = wait_for(oe, s, op == OPENENV_CLOSE ? gone : answered, deadline);
  if (op == OPENENV_CLOSE) {
    release(oe, s);
  } else if (w == 0 && s->replied) {
    *reply = s->rx ? s->rx : strdup("");
    *reply_n = s->rx_n;
    s->rx = NULL;
    s->rx_n = s->rx_cap = 0;
    s->replied = 0;
    if (!*reply) out = OUT_CONNECT, snprintf(what, cap, "out of memory");
  } else {
    out = w == 1 ? OUT_TIMEOUT : w == 2 ? OUT_CONNECT : s->fail;
    if (w == 1)
      snprintf(what, cap, "timed out (timeout_ms %ld)", timeout_ms);
    else if (w == 2)
      snprintf(what, cap, "the job is stopping");
    else
      snprintf(what, cap, "%s", s->why);
    /* the socket's state is unknown: nothing more goes over it */
    end(oe, s, out, "%s", what);
    if (op == OPENENV_OPEN)
      release(oe, s);
    else if (s->wsi)
      s->kill = 1, enqueue(oe, s);
  }
  pthread_mutex_unlock(&oe->mu);
  if (out != OUT_OK || op == OPENENV_CLOSE) lws_cancel_service(oe->ctx);
  return out;
}
