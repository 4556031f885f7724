/* An outside party over HTTP (outside.h): the URL and header checks, the hardened transfer, the
 * connect-time address check (netaddr.h) and the classification of a finished attempt. */
#include "outside.h"

#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "netaddr.h"
#include "utf8.h"

#define QUOTE_BYTES 200 /* of a reply body, in error messages */
#define BACKOFF_BASE_MS 200
#define BACKOFF_CAP_MS 10000
#define CONNECT_TIMEOUT_CAP_MS 10000
#define MAX_HEADERS 64

struct outside {
  char *url;
  const char *what;           /* "judge", "tool", "environment" (static) */
  char user_agent[32];        /* "dapod-judge/0.1" */
  struct curl_slist *headers; /* read-only once built: shared by every transfer */
  /* the connect-time address check (judge_policy) */
  char *host;         /* the URL's host as curl parsed it, without brackets */
  int host_localhost; /* host is "localhost": only loopback addresses */
  char **literals;    /* owned: the allowlist's entries that are IP addresses */
  int n_literals;
  int allow_private;
  struct curl_slist *resolve; /* tests: CURLOPT_RESOLVE entries (judge_policy.resolve) */
  /* a WebSocket party's (outside_new_ws) */
  int ws;       /* the headers are the handshake's: no fixed ones */
  int port;     /* the URL's, or 80 */
  char *target; /* the path to request ("/ws" when the URL has none) */
};

/* ---- libcurl's global state ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;
static int curl_inited;

static void curl_init_once(void) {
  curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  curl_inited = curl_init_rc == CURLE_OK;
}

void judge_global_cleanup(void) {
  if (curl_inited) curl_global_cleanup();
  curl_inited = 0;
}

int64_t outside_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t outside_backoff_ms(int attempts) {
  int64_t d = BACKOFF_BASE_MS;
  for (int k = 1; k < attempts && d < BACKOFF_CAP_MS; k++) d *= 2;
  return d < BACKOFF_CAP_MS ? d : BACKOFF_CAP_MS;
}

/* ---- building ---- */

/* RFC 9110 token characters. */
static int is_tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int build_headers(struct outside *o, const char *field, const json_t *hdrs,
                         struct dapo_err *e) {
  int has_ctype = 0;
  if (hdrs && !json_is_null(hdrs)) {
    if (!json_is_object(hdrs))
      return dapo_errf(e, DAPO_EINVAL, "%s.headers: expected an object of strings", field);
    if (json_object_size(hdrs) > MAX_HEADERS)
      return dapo_errf(e, DAPO_EINVAL, "%s.headers: more than %d headers", field, MAX_HEADERS);
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)hdrs, name, v) {
      size_t nl = strlen(name);
      if (nl == 0 || nl > 256)
        return dapo_errf(e, DAPO_EINVAL, "%s.headers: a header name must have 1 to 256 bytes",
                         field);
      for (size_t i = 0; i < nl; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == '\r' || c == '\n')
          return dapo_errf(e, DAPO_EINVAL, "%s.headers: header names cannot contain CR or LF",
                           field);
        if (!is_tchar(c))
          return dapo_errf(e, DAPO_EINVAL, "%s.headers.%.64s: not a valid header name", field,
                           name);
      }
      if (!json_is_string(v))
        return dapo_errf(e, DAPO_EINVAL, "%s.headers.%.64s: expected a string", field, name);
      const char *val = json_string_value(v);
      size_t vl = json_string_length(v);
      if (vl > 8192)
        return dapo_errf(e, DAPO_EINVAL, "%s.headers.%.64s: longer than 8192 bytes", field, name);
      if (strlen(val) != vl || strpbrk(val, "\r\n"))
        return dapo_errf(e, DAPO_EINVAL,
                         "%s.headers.%.64s: header values cannot contain CR, LF or NUL", field,
                         name);
      if (!strcasecmp(name, "content-length") || !strcasecmp(name, "transfer-encoding") ||
          !strcasecmp(name, "host") || !strcasecmp(name, "connection") ||
          (o->ws && (!strcasecmp(name, "upgrade") || !strncasecmp(name, "sec-websocket-", 14))))
        return dapo_errf(e, DAPO_EINVAL, "%s.headers.%.64s: set by the daemon, not the spec", field,
                         name);
      if (!strcasecmp(name, "content-type")) has_ctype = 1;
      size_t len = nl + vl + 3;
      char *line = malloc(len);
      if (!line) return dapo_errf(e, DAPO_ENOMEM, "%s.headers: out of memory", field);
      /* "Name;" is curl's way to send a header with an empty value. */
      if (vl || o->ws)
        snprintf(line, len, "%s: %s", name, val);
      else
        snprintf(line, len, "%s;", name);
      struct curl_slist *l = curl_slist_append(o->headers, line);
      free(line);
      if (!l) return dapo_errf(e, DAPO_ENOMEM, "%s.headers: out of memory", field);
      o->headers = l;
    }
  }
  if (o->ws) return 0; /* a handshake takes no body headers */
  static const char *const fixed[] = {"Accept: application/json", "Expect:"};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) {
    struct curl_slist *l = curl_slist_append(o->headers, fixed[i]);
    if (!l) return dapo_errf(e, DAPO_ENOMEM, "%s.headers: out of memory", field);
    o->headers = l;
  }
  if (!has_ctype) {
    struct curl_slist *l = curl_slist_append(o->headers, "Content-Type: application/json");
    if (!l) return dapo_errf(e, DAPO_ENOMEM, "%s.headers: out of memory", field);
    o->headers = l;
  }
  return 0;
}

/* host without IPv6 brackets, compared case-insensitively with one allowlist entry. */
static int host_matches(const char *host, const char *allowed) {
  size_t hl = strlen(host), al = strlen(allowed);
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') host++, hl -= 2;
  if (al >= 2 && allowed[0] == '[' && allowed[al - 1] == ']') allowed++, al -= 2;
  return hl == al && !strncasecmp(host, allowed, hl);
}

/* 1 when s is an IPv4 or IPv6 address (brackets allowed). */
static int is_ip_literal(const char *s) {
  char t[INET6_ADDRSTRLEN + 2];
  unsigned char buf[sizeof(struct in6_addr)];
  size_t n = strlen(s);
  if (n >= 2 && s[0] == '[' && s[n - 1] == ']') s++, n -= 2;
  if (n >= sizeof t) return 0;
  memcpy(t, s, n);
  t[n] = '\0';
  return inet_pton(AF_INET, t, buf) == 1 || inet_pton(AF_INET6, t, buf) == 1;
}

/* A WebSocket URL's port (80 when it names none) and the path to request: the URL's, or "/ws"
 * (OpenEnv's endpoint) when it has none; no query or fragment. */
static int ws_target(struct outside *o, const char *field, CURLU *u, struct dapo_err *e) {
  char *port = NULL, *path = NULL, *query = NULL, *frag = NULL;
  int rc = 0;
  curl_url_get(u, CURLUPART_QUERY, &query, 0);
  curl_url_get(u, CURLUPART_FRAGMENT, &frag, 0);
  if (query || frag) {
    rc = dapo_errf(e, DAPO_EINVAL, "%s.url: no query or fragment", field);
  } else if (!curl_url_get(u, CURLUPART_PORT, &port, 0)) {
    o->port = (int)strtol(port, NULL, 10); /* digits, 0 to 65535: curl checked them */
  } else {
    o->port = 80;
  }
  if (!rc && curl_url_get(u, CURLUPART_PATH, &path, 0))
    rc = dapo_errf(e, DAPO_ENOMEM, "%s.url: out of memory", field);
  if (!rc && !(o->target = strdup(!path[0] || !strcmp(path, "/") ? "/ws" : path)))
    rc = dapo_errf(e, DAPO_ENOMEM, "%s.url: out of memory", field);
  curl_free(port);
  curl_free(path);
  curl_free(query);
  curl_free(frag);
  return rc;
}

static int check_url(struct outside *o, const char *field, const char *url,
                     const struct judge_policy *pol, struct dapo_err *e) {
  static const char *const loopback[] = {"127.0.0.1", "localhost", "::1"};
  const char *const *allowed = loopback;
  int n_allowed = 3;
  if (pol && pol->allowed_hosts && pol->n_allowed > 0) {
    allowed = pol->allowed_hosts;
    n_allowed = pol->n_allowed;
  }
  o->allow_private = pol && pol->allow_private;
  if (!(o->literals = calloc((size_t)n_allowed, sizeof *o->literals)))
    return dapo_errf(e, DAPO_ENOMEM, "%s.url: out of memory", field);
  for (int i = 0; i < n_allowed; i++) {
    if (!allowed[i] || !is_ip_literal(allowed[i])) continue;
    if (!(o->literals[o->n_literals] = strdup(allowed[i])))
      return dapo_errf(e, DAPO_ENOMEM, "%s.url: out of memory", field);
    o->n_literals++;
  }
  int rc = 0;
  char *scheme = NULL, *host = NULL, *full = NULL;
  CURLU *u = curl_url();
  if (!u) return dapo_errf(e, DAPO_ENOMEM, "%s.url: out of memory", field);
  /* curl knows no ws:// (Debian 12's is built without WebSockets): parsed as any scheme */
  CURLUcode uc = curl_url_set(u, CURLUPART_URL, url, o->ws ? CURLU_NON_SUPPORT_SCHEME : 0);
  if (uc) {
    rc = dapo_errf(e, DAPO_EINVAL, "%s.url: '%.200s' is not a valid URL (%s)", field, url,
                   curl_url_strerror(uc));
    goto out;
  }
  if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) ||
      (o->ws ? strcasecmp(scheme, "ws") != 0
             : strcasecmp(scheme, "http") && strcasecmp(scheme, "https"))) {
    rc = dapo_errf(e, DAPO_EINVAL, "%s.url: scheme '%.20s' is not %s", field, scheme ? scheme : "",
                   !o->ws                                 ? "http or https"
                   : scheme && !strcasecmp(scheme, "wss") ? "ws (wss:// is not supported yet)"
                                                          : "ws");
    goto out;
  }
  if (o->ws && (rc = ws_target(o, field, u, e))) goto out;
  if (curl_url_get(u, CURLUPART_HOST, &host, 0) || !host || !*host) {
    rc = dapo_errf(e, DAPO_EINVAL, "%s.url: '%.200s' names no host", field, url);
    goto out;
  }
  int ok = 0;
  for (int i = 0; i < n_allowed && !ok; i++) ok = allowed[i] && host_matches(host, allowed[i]);
  if (!ok) {
    rc = dapo_errf(e, DAPO_EINVAL,
                   "%s.url: host '%.100s' is not in the judge host allowlist (server "
                   "configuration; default: 127.0.0.1, localhost, ::1)",
                   field, host);
    goto out;
  }
  {
    size_t hl = strlen(host);
    const char *hs = host;
    if (hl >= 2 && hs[0] == '[' && hs[hl - 1] == ']') hs++, hl -= 2;
    if (!(o->host = strndup(hs, hl))) {
      rc = dapo_errf(e, DAPO_ENOMEM, "%s.url: out of memory", field);
      goto out;
    }
    o->host_localhost = !strcasecmp(o->host, "localhost");
  }
  if (curl_url_get(u, CURLUPART_URL, &full, 0)) {
    rc = dapo_errf(e, DAPO_EINVAL, "%s.url: '%.200s' is not a valid URL", field, url);
    goto out;
  }
  o->url = strdup(full);
  if (!o->url) rc = dapo_errf(e, DAPO_ENOMEM, "%s.url: out of memory", field);
out:
  curl_free(scheme);
  curl_free(host);
  curl_free(full);
  curl_url_cleanup(u);
  return rc;
}

void outside_free(struct outside *o) {
  if (!o) return;
  curl_slist_free_all(o->headers);
  curl_slist_free_all(o->resolve);
  for (int i = 0; i < o->n_literals; i++) free(o->literals[i]);
  free(o->literals);
  free(o->host);
  free(o->url);
  free(o->target);
  free(o);
}

/* An outside party of either kind (ws: a WebSocket party), built as outside_new says. */
static struct outside *build(const char *field, const char *what, int ws, const json_t *url,
                             const json_t *headers, const struct judge_policy *pol,
                             struct dapo_err *e) {
  pthread_once(&curl_once, curl_init_once);
  if (curl_init_rc != CURLE_OK) {
    dapo_errf(e, DAPO_EIO, "%s: libcurl failed to initialise (%s)", field,
              curl_easy_strerror(curl_init_rc));
    return NULL;
  }
  struct outside *o = calloc(1, sizeof *o);
  if (!o) {
    dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
    return NULL;
  }
  o->what = what;
  o->ws = ws;
  snprintf(o->user_agent, sizeof o->user_agent, "dapod-%s/0.1", what);
  int rc = 0;
  if (!json_is_string(url))
    rc = dapo_errf(e, DAPO_EINVAL, "%s.url: required, %s", field,
                   ws ? "a ws:// URL" : "an http:// or https:// URL");
  if (!rc) rc = check_url(o, field, json_string_value(url), pol, e);
  if (!rc) rc = build_headers(o, field, headers, e);
  for (int i = 0; !rc && pol && pol->resolve && i < pol->n_resolve; i++) {
    struct curl_slist *l = curl_slist_append(o->resolve, pol->resolve[i]);
    if (l)
      o->resolve = l;
    else
      rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
  }
  if (rc) {
    outside_free(o);
    return NULL;
  }
  return o;
}

struct outside *outside_new(const char *field, const char *what, const json_t *url,
                            const json_t *headers, const struct judge_policy *pol,
                            struct dapo_err *e) {
  return build(field, what, 0, url, headers, pol, e);
}

struct outside *outside_new_ws(const char *field, const char *what, const json_t *url,
                               const json_t *headers, const struct judge_policy *pol,
                               struct dapo_err *e) {
  return build(field, what, 1, url, headers, pol, e);
}

const char *outside_url(const struct outside *o) {
  return o->url;
}

/* ---- one transfer ---- */

static size_t on_write(char *data, size_t size, size_t nmemb, void *userp) {
  struct outside_xfer *x = userp;
  size_t n = size * nmemb;
  if (x->reply_n + n > OUTSIDE_MAX_REPLY) {
    x->reply_too_big = 1;
    return 0; /* CURLE_WRITE_ERROR */
  }
  if (x->reply_n + n + 1 > x->reply_cap) {
    size_t cap = x->reply_cap ? x->reply_cap : 4096;
    while (cap < x->reply_n + n + 1) cap *= 2;
    if (cap > OUTSIDE_MAX_REPLY + 1) cap = OUTSIDE_MAX_REPLY + 1;
    char *p = realloc(x->reply, cap);
    if (!p) return 0;
    x->reply = p;
    x->reply_cap = cap;
  }
  memcpy(x->reply + x->reply_n, data, n);
  x->reply_n += n;
  x->reply[x->reply_n] = '\0';
  return n;
}

/* Why the address curl is about to connect to is refused (into why), or NULL when allowed: the
 * rule of judge_policy.allow_private's comment. */
static const char *address_refusal(const struct outside *o, const struct sockaddr *sa, char *why,
                                   size_t cap) {
  enum netaddr_class c = netaddr_classify(sa);
  const char *name = netaddr_class_name(c);
  if (c == NETADDR_UNSPECIFIED || c == NETADDR_MULTICAST || c == NETADDR_RESERVED) {
    snprintf(why, cap, "%s %s address is never a%s %s", c == NETADDR_UNSPECIFIED ? "an" : "a", name,
             strchr("aeiou", o->what[0]) ? "n" : "", o->what);
    return why;
  }
  if (o->host_localhost) {
    if (c == NETADDR_LOOPBACK) return NULL;
    snprintf(why, cap, "'localhost' resolved to a %s address, not a loopback one", name);
    return why;
  }
  if (c == NETADDR_PUBLIC) return NULL;
  if (netaddr_equals_literal(sa, o->host)) return NULL; /* the allowed URL names the address */
  for (int i = 0; i < o->n_literals; i++)
    if (netaddr_equals_literal(sa, o->literals[i])) return NULL;
  if (c == NETADDR_PRIVATE && o->allow_private) return NULL;
  snprintf(why, cap,
           "'%.80s' resolved to a %s address, which needs the address itself in "
           "judge_allowed_hosts%s",
           o->host, name, c == NETADDR_PRIVATE ? " (or judge_allow_private)" : "");
  return why;
}

/* Every address curl is about to connect to passes here first (address_refusal). */
static curl_socket_t open_socket(void *clientp, curlsocktype purpose, struct curl_sockaddr *addr) {
  struct outside_xfer *x = clientp;
  const char *why = NULL;
  if (purpose != CURLSOCKTYPE_IPCXN)
    why = "not an IP connection";
  else
    why = address_refusal(x->o, &addr->addr, x->refused_why, sizeof x->refused_why);
  if (why) {
    x->refused = 1;
    if (why != x->refused_why) snprintf(x->refused_why, sizeof x->refused_why, "%s", why);
    netaddr_format(&addr->addr, x->refused_addr, sizeof x->refused_addr);
    return CURL_SOCKET_BAD;
  }
  return socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
}

/* ---- a WebSocket party's connection (outside_new_ws) ---- */

void outside_ws_endpoint(const struct outside *o, const char **host, int *port,
                         const char **target) {
  *host = o->host;
  *port = o->port;
  *target = o->target;
}

int outside_ws_headers(const struct outside *o, char *buf, size_t cap) {
  size_t n = 0;
  for (const struct curl_slist *l = o->headers; l; l = l->next) {
    size_t k = strlen(l->data);
    if (n + k + 3 > cap) return -1;
    memcpy(buf + n, l->data, k);
    memcpy(buf + n + k, "\r\n", 2);
    n += k + 2;
  }
  if (cap) buf[n] = '\0';
  return (int)n;
}

/* The address a test's "HOST:PORT:ADDRESS" entry gives o's host and port, into out; 0 when
 * none does. */
static int resolve_entry(const struct outside *o, char *out, size_t cap) {
  for (const struct curl_slist *l = o->resolve; l; l = l->next) {
    const char *c1 = strchr(l->data, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2 || (size_t)(c1 - l->data) != strlen(o->host) ||
        strncasecmp(l->data, o->host, (size_t)(c1 - l->data)) ||
        strtol(c1 + 1, NULL, 10) != o->port)
      continue;
    snprintf(out, cap, "%s", c2 + 1);
    return 1;
  }
  return 0;
}

enum outside_outcome outside_ws_address(const struct outside *o, char *addr, size_t cap, char *what,
                                        size_t wcap) {
  char name[300], port[16];
  if (!resolve_entry(o, name, sizeof name)) snprintf(name, sizeof name, "%s", o->host);
  snprintf(port, sizeof port, "%d", o->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV},
                  *res = NULL;
  int gai = getaddrinfo(name, port, &hints, &res);
  if (gai) {
    snprintf(what, wcap, "could not resolve '%.100s' (%s)", o->host, gai_strerror(gai));
    return OUT_CONNECT;
  }
  enum outside_outcome out = OUT_REFUSED;
  char why[256] = "", first[INET6_ADDRSTRLEN] = "";
  for (const struct addrinfo *a = res; a && out != OUT_OK; a = a->ai_next) {
    char w[256];
    if (!address_refusal(o, a->ai_addr, w, sizeof w)) {
      netaddr_format(a->ai_addr, addr, cap);
      out = OUT_OK;
    } else if (!first[0]) {
      netaddr_format(a->ai_addr, first, sizeof first);
      snprintf(why, sizeof why, "%s", w);
    }
  }
  freeaddrinfo(res);
  if (out != OUT_OK) snprintf(what, wcap, "refused to connect to %s: %s", first, why);
  return out;
}

void outside_xfer_free(struct outside_xfer *x) {
  free(x->reply);
  x->reply = NULL;
  x->reply_n = x->reply_cap = 0;
}

CURL *outside_post(const struct outside *o, struct outside_xfer *x, const char *body, size_t len,
                   long timeout_ms, void *priv) {
  CURL *c = curl_easy_init();
  if (!c) return NULL;
  x->o = o;
  x->reply_n = 0;
  if (x->reply) x->reply[0] = '\0';
  x->reply_too_big = 0;
  x->refused = 0;
  x->errbuf[0] = '\0';
  int bad = 0;
  bad |= curl_easy_setopt(c, CURLOPT_URL, o->url) != CURLE_OK;
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85: the string form; the bitmask is deprecated */
  bad |= curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") != CURLE_OK;
#else
  bad |=
      curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS)) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS)) !=
         CURLE_OK;
#endif
  bad |= curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_PROXY, "") != CURLE_OK; /* never http_proxy from env */
  bad |= curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_POST, 1L) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_POSTFIELDS, body) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_HTTPHEADER, o->headers) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_USERAGENT, o->user_agent) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms) != CURLE_OK;
  long ct = timeout_ms < CONNECT_TIMEOUT_CAP_MS ? timeout_ms : CONNECT_TIMEOUT_CAP_MS;
  bad |= curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ct) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)OUTSIDE_MAX_REPLY) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_WRITEDATA, x) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_ERRORBUFFER, x->errbuf) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_PRIVATE, priv) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_socket) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, x) != CURLE_OK;
  if (o->resolve) bad |= curl_easy_setopt(c, CURLOPT_RESOLVE, o->resolve) != CURLE_OK;
  if (bad) {
    curl_easy_cleanup(c);
    return NULL;
  }
  return c;
}

enum outside_outcome outside_classify(CURL *c, CURLcode cc, const struct outside_xfer *x,
                                      long timeout_ms, long *status, int *retry, char *what,
                                      size_t cap) {
  *status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
  *retry = 0;
  what[0] = '\0';
  if (cc == CURLE_OK && *status >= 200 && *status < 300) return OUT_OK;
  if (cc == CURLE_OK) {
    *retry = *status == 429 || *status >= 500;
    snprintf(what, cap, "HTTP %ld", *status);
    return OUT_HTTP;
  }
  if (x->refused) {
    snprintf(what, cap, "refused to connect to %s: %s", x->refused_addr, x->refused_why);
    return OUT_REFUSED;
  }
  if (cc == CURLE_OPERATION_TIMEDOUT) {
    *retry = 1;
    snprintf(what, cap, "timed out (timeout_ms %ld)", timeout_ms);
    return OUT_TIMEOUT;
  }
  if ((cc == CURLE_WRITE_ERROR && x->reply_too_big) || cc == CURLE_FILESIZE_EXCEEDED) {
    *retry = 1;
    snprintf(what, cap, "malformed reply (larger than %zu MiB)", OUTSIDE_MAX_REPLY >> 20);
    return OUT_TOO_LARGE;
  }
  *retry = !(cc == CURLE_UNSUPPORTED_PROTOCOL || cc == CURLE_URL_MALFORMAT ||
             cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE ||
             cc == CURLE_OUT_OF_MEMORY);
  snprintf(what, cap, "%s (%.180s)", curl_easy_strerror(cc),
           x->errbuf[0] ? x->errbuf : "no detail");
  return OUT_CONNECT;
}

void outside_quote_reply(const struct outside_xfer *x, char *out, size_t cap) {
  const char *p = x->reply ? x->reply : "";
  size_t n = x->reply_n, w = 0, i = 0;
  int cut = 0;
  if (cap < 8) {
    if (cap) out[0] = '\0';
    return;
  }
  out[w++] = '"';
  while (i < n) {
    if (i >= QUOTE_BYTES) {
      cut = 1;
      break;
    }
    unsigned char c = (unsigned char)p[i];
    char tmp[8];
    size_t tl;
    if (c == '"' || c == '\\') {
      tmp[0] = '\\';
      tmp[1] = (char)c;
      tl = 2;
    } else if (c == '\n') {
      memcpy(tmp, "\\n", 2);
      tl = 2;
    } else if (c < 0x20 || c == 0x7F) {
      tl = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
    } else if (c < 0x80) {
      tmp[0] = (char)c;
      tl = 1;
    } else {
      size_t l = utf8_next((const unsigned char *)p + i, n - i, NULL);
      if (l) {
        if (w + l + 5 > cap) {
          cut = 1;
          break;
        }
        memcpy(out + w, p + i, l);
        w += l;
        i += l;
        continue;
      }
      tl = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
    }
    if (w + tl + 5 > cap) {
      cut = 1;
      break;
    }
    memcpy(out + w, tmp, tl);
    w += tl;
    i++;
  }
  out[w++] = '"';
  if (cut) {
    memcpy(out + w, "...", 3);
    w += 3;
  }
  out[w] = '\0';
}
