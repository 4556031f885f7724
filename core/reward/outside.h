/* Internal to core/reward: an outside party over HTTP (a judge, a tool, an environment) and how
 * every request to one is made (an OpenEnv environment's WebSocket party is checked here too,
 * and connected by openenv.h). Its URL is checked against the host policy when the party is
 * built (struct judge_policy, judge.h); every request goes out with one set of hardened curl
 * options (http and https only, no redirects, no proxy from the environment, bounded replies)
 * and every address curl is about to connect to is checked at connect time (the SSRF defence,
 * docs/RELIABILITY.md). A finished attempt is classified once, for every kind of party, with
 * the message the job's error quotes. */
#ifndef DAPO_OUTSIDE_H
#define DAPO_OUTSIDE_H

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <stdint.h>

#include "judge.h"

#define OUTSIDE_MAX_REPLY ((size_t)64 << 20) /* bigger replies are malformed */

struct outside;

/* Builds the party at url (a JSON string; field names it in errors: "judge" gives "judge.url:
 * ...") with extra headers (an object of strings, or NULL), under pol. what ("judge", "tool",
 * "environment") is the party's kind in connect-time refusals. NULL + e on failure. */
struct outside *outside_new(const char *field, const char *what, const json_t *url,
                            const json_t *headers, const struct judge_policy *pol,
                            struct dapo_err *e);
/* The same for a WebSocket party (an OpenEnv environment, openenv.h): a ws:// URL (wss:// is
 * refused: not supported yet) with no query or fragment, whose path defaults to "/ws"; the
 * headers go into the handshake (Upgrade and Sec-WebSocket-* are the client's, refused). It is
 * never requested through curl: outside_ws_address and outside_ws_endpoint say where to
 * connect. */
struct outside *outside_new_ws(const char *field, const char *what, const json_t *url,
                               const json_t *headers, const struct judge_policy *pol,
                               struct dapo_err *e);
void outside_free(struct outside *o);
/* The URL as curl re-serialised it: what was checked is what is requested. */
const char *outside_url(const struct outside *o);

/* One attempt's transfer: the reply and what the connect-time check refused. */
struct outside_xfer {
  const struct outside *o;
  char *reply; /* NUL-terminated, reply_n bytes */
  size_t reply_n, reply_cap;
  int reply_too_big;
  int refused;
  char refused_addr[INET6_ADDRSTRLEN];
  char refused_why[256];
  char errbuf[CURL_ERROR_SIZE];
};

/* A new easy handle that POSTs body[0..len) to o within timeout_ms, its reply into x (reset
 * first), private pointer priv (CURLINFO_PRIVATE). NULL when out of memory. */
CURL *outside_post(const struct outside *o, struct outside_xfer *x, const char *body, size_t len,
                   long timeout_ms, void *priv);
void outside_xfer_free(struct outside_xfer *x);

/* How an attempt ended: a 2xx reply (OUT_OK, the body to be parsed by the caller), another
 * status, a refused address, a timeout, a reply too large, or no connection. */
enum outside_outcome { OUT_OK, OUT_HTTP, OUT_REFUSED, OUT_TIMEOUT, OUT_TOO_LARGE, OUT_CONNECT };

/* Classifies the finished transfer c (not yet cleaned up) of x that ended with cc: *status the
 * HTTP status, *retry whether another attempt may help (429, 5xx, timeouts, connections, a
 * reply too large), what (cap bytes) the message ("HTTP 503", "timed out (timeout_ms 500)"). */
enum outside_outcome outside_classify(CURL *c, CURLcode cc, const struct outside_xfer *x,
                                      long timeout_ms, long *status, int *retry, char *what,
                                      size_t cap);

/* The first 200 bytes of the reply, quoted (valid UTF-8 kept, other bytes as \xNN), into out. */
void outside_quote_reply(const struct outside_xfer *x, char *out, size_t cap);

/* A WebSocket party's host (as the URL names it, without brackets), port and path (borrowed,
 * live with o). */
void outside_ws_endpoint(const struct outside *o, const char **host, int *port,
                         const char **target);
/* The party's extra handshake headers as "Name: value\r\n" lines into buf (NUL-terminated):
 * their length, or -1 when they do not fit in cap bytes. */
int outside_ws_headers(const struct outside *o, char *buf, size_t cap);
/* Resolves a WebSocket party's host (the policy's test entries first) and checks every
 * address in turn as curl's connections are checked: the first one allowed goes into addr (cap
 * >= INET6_ADDRSTRLEN, numeric text: the one to connect to, so that no second lookup can
 * differ), OUT_OK. OUT_REFUSED when none is allowed, OUT_CONNECT when the name does not
 * resolve; what (wcap bytes) says why. Blocks on the resolver. */
enum outside_outcome outside_ws_address(const struct outside *o, char *addr, size_t cap, char *what,
                                        size_t wcap);

/* Retry k waits 200 ms * 2^(k-1), at most 10 s, no jitter. */
int64_t outside_backoff_ms(int attempts);

/* Monotonic milliseconds. */
int64_t outside_now_ms(void);

#endif
