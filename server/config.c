/* The config table (config.h): one row per key drives the defaults, the JSON file, the flags,
 * --print-config, --help and the example config. Each type has a text parser (flags, defaults)
 * and a JSON reader that both end in the same store function, so bounds and messages agree. */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "grader.h"
#include "judge.h"
#include "log.h"
#include "parse.h"

enum ctype {
  C_STR,  /* owned char *; min..max = length bounds */
  C_INT,  /* int; min..max; default "auto" allows "auto" (stored 0) */
  C_SIZE, /* uint64_t bytes with optional K/M/G/T suffix; min..max */
  C_BOOL, /* int 0/1 */
  C_ADDR, /* struct config_addr */
  C_LIST, /* struct config_list of host names; min..max = entry count */
  C_ENUM, /* int index into choices */
  C_KEYS, /* struct config_api_keys; min..max = entry count */
  C_JSON, /* owned json_t * object; min..max = entry count; checked by config_finish */
};

struct crow {
  const char *name;
  enum ctype type;
  size_t off;
  int64_t min, max;
  const char *dflt; /* in the flags' syntax, parsed by config_set */
  const char *const *choices;
  const char *help;
};

#define KiB (INT64_C(1) << 10)
#define MiB (INT64_C(1) << 20)
#define GiB (INT64_C(1) << 30)
#define TiB (INT64_C(1) << 40)
#define PATHMAX 4095

static const char *const LEVELS[] = {"debug", "info", "warn", "error", NULL};
_Static_assert(LOG_LEVEL_DEBUG == 0 && LOG_LEVEL_INFO == 1 && LOG_LEVEL_WARN == 2 &&
                   LOG_LEVEL_ERROR == 3,
               "LEVELS follows enum log_level");

#define F(x) offsetof(struct config, x)
static const struct crow ROWS[] = {
    {"listen", C_ADDR, F(listen), 0, 0, "127.0.0.1:8080", NULL,
     "address to serve on; IPv6 in brackets ([::1]:8080); port 0 picks a free port. An address "
     "that is not loopback needs api_keys"},
    {"tls_cert", C_STR, F(tls_cert), 0, PATHMAX, "", NULL,
     "PEM certificate (chain) file for HTTPS; empty: plain HTTP. Set together with tls_key"},
    {"tls_key", C_STR, F(tls_key), 0, PATHMAX, "", NULL, "PEM private key file of tls_cert"},
    {"api_keys", C_KEYS, F(api_keys), 0, 4096, "", NULL,
     "API keys for 'Authorization: Bearer <key>', as [{\"name\": \"ci\", \"sha256\": \"<64 hex "
     "digits>\", \"admin\": false}]: the SHA-256 of the key, never the key itself (printf %s "
     "\"$KEY\" | sha256sum). A key sees only what it created; an admin key sees everything. None: "
     "no authentication, and only a loopback listen address is allowed"},
    {"data_dir", C_STR, F(data_dir), 1, PATHMAX, "./var", NULL,
     "where the SQLite database, uploads, checkpoints and rollouts live"},
    {"models_dir", C_STR, F(models_dir), 1, PATHMAX, "./models", NULL,
     "folder of Hugging Face model folders offered as base models beside the presets; a missing "
     "folder means presets only"},
    {"web_dir", C_STR, F(web_dir), 0, PATHMAX, "auto", NULL,
     "folder of the web dashboard's static files, served at /ui/; auto: share/dapod/web beside "
     "the installed binary (PREFIX/bin/dapod), else web/ of the build tree; empty: no dashboard"},
    {"workers", C_INT, F(workers), 1, 64, "auto", NULL,
     "job threads, i.e. jobs training at once; auto: max(1, cores / 2)"},
    {"blas_threads", C_INT, F(blas_threads), 1, 1024, "auto", NULL,
     "BLAS threads of each job; auto: max(1, cores / workers), so that jobs side by side do not "
     "oversubscribe the cores"},
    {"compute_cpus", C_STR, F(compute_cpus), 0, 256, "", NULL,
     "CPUs reserved for training (\"0-3,6\"): job threads and their compute pools run there, "
     "HTTP and everything else on the other CPUs, so that readers and streams never take a "
     "training core; empty: no pinning"},
    {"http_threads", C_INT, F(http_threads), 1, 1024, "auto", NULL,
     "HTTP server threads; auto: min(8, max(2, cores / 4))"},
    {"memory_limit_bytes", C_SIZE, F(memory_limit_bytes), 0, TiB * 1024, "0", NULL,
     "memory that running jobs and completions (with the models kept open for them) may use "
     "together, by their memory plans; a job or completion that would pass it waits at the head "
     "of its queue, one that can never fit is refused; 0: the machine's physical memory"},
    {"completion_threads", C_INT, F(completion_threads), 1, 64, "1", NULL,
     "threads sampling POST /v1/completions, i.e. completions computed at once; each runs on "
     "compute_cpus beside the jobs"},
    {"completion_queue", C_INT, F(completion_queue), 1, 100000, "8", NULL,
     "completions waiting for a sampling thread or for memory; beyond it a completion is "
     "answered 503 with Retry-After at once"},
    {"completion_wait_s", C_INT, F(completion_wait_s), 1, 3600, "60", NULL,
     "seconds a completion may wait for a sampling thread or for memory before it is answered "
     "503 with Retry-After (sampling itself is bounded by max_tokens and n)"},
    {"completion_cache_models", C_INT, F(completion_cache_models), 0, 64, "2", NULL,
     "opened models kept for the next completion (least recently used first out; closed at once "
     "when a job or completion needs their memory); 0: every completion opens its model"},
    {"max_jobs_per_key", C_INT, F(max_jobs_per_key), 1, 1000000, "16", NULL,
     "live jobs (queued, running, pausing, paused) one API key may have"},
    {"max_queued_jobs", C_INT, F(max_queued_jobs), 1, 1000000, "1000", NULL,
     "queued jobs in total; beyond it new jobs are refused"},
    {"job_check_inline_bytes", C_SIZE, F(job_check_inline_bytes), 0, TiB, "1M", NULL,
     "a new job's datasets (training and validation together) up to this size are checked "
     "against its model (every prompt rendered and tokenized) on the request's own thread; larger "
     "ones on the job checker thread while the request waits without holding an HTTP thread. A "
     "check is kept for the next job on the same model, data, template and max_new_tokens; 0: "
     "always the checker thread"},
    {"progress_every_pass", C_BOOL, F(progress_every_pass), 0, 1, "false", NULL,
     "every pass of a job's step (a generation round, the old-log-prob and update passes) "
     "reports its progress as stored `progress` events, however short (tests, demos); false: "
     "only passes of at least 2e11 parameter-tokens (the model's parameters times the pass's "
     "tokens: a few seconds of work), so that a small model's job does not pay a store write "
     "many times a second"},
    {"launcher", C_STR, F(launcher), 0, 4096, "", NULL,
     "command that starts the ranks of a job asking for \"resources\": {\"processes\": N}, "
     "words separated by spaces, {processes} replaced by N, e.g. \"mpirun -np {processes} "
     "--hostfile /etc/dapod/hosts\" or \"srun -n {processes}\"; the daemon appends its own "
     "`dapod train` command line, runs it with the job's folder as working directory and "
     "relays its events. Every machine must see the job's folder, model and data at the same "
     "paths. Empty: jobs run in the daemon's process only (processes 1)"},
    {"max_processes", C_INT, F(max_processes), 1, 4096, "64", NULL,
     "most processes (ranks) a job may ask for in resources.processes"},
    {"launch_retries", C_INT, F(launch_retries), 0, 1000, "2", NULL,
     "times a multi-process job is started again from its last checkpoint after its launcher "
     "exited before the job ended (a rank died, a machine went away); then the job fails "
     "with launch_failed"},
    {"max_body_bytes", C_SIZE, F(max_body_bytes), KiB, GiB, "1M", NULL,
     "largest JSON request body"},
    {"max_upload_bytes", C_SIZE, F(max_upload_bytes), KiB, TiB, "1G", NULL,
     "largest uploaded dataset file (streamed to disk)"},
    {"max_json_depth", C_INT, F(max_json_depth), 1, 1024, "64", NULL,
     "deepest nesting of arrays and objects in a JSON request body"},
    {"max_header_bytes", C_SIZE, F(max_header_bytes), 4 * KiB, MiB, "32K", NULL,
     "request line and headers of one request (libmicrohttpd's memory per connection)"},
    {"max_connections", C_INT, F(max_connections), 1, 1000000, "256", NULL,
     "open HTTP connections in total, event streams included"},
    {"max_connections_per_ip", C_INT, F(max_connections_per_ip), 1, 1000000, "64", NULL,
     "open HTTP connections from one client address"},
    {"connection_timeout_s", C_INT, F(connection_timeout_s), 1, 86400, "30", NULL,
     "seconds an idle connection is kept, so that slow clients cannot pin threads"},
    {"max_sse_subscribers", C_INT, F(max_sse_subscribers), 1, 1000000, "1000", NULL,
     "open event streams (GET /v1/jobs/{id}/events/stream) in total"},
    {"sse_backlog_events", C_INT, F(sse_backlog_events), 1, 1000000, "1000", NULL,
     "events held for one slow stream subscriber; beyond it the stream is closed and the client "
     "resumes with Last-Event-ID"},
    {"sse_heartbeat_s", C_INT, F(sse_heartbeat_s), 1, 3600, "15", NULL,
     "seconds between heartbeat comments on an idle event stream; less than "
     "connection_timeout_s"},
    {"judge_allowed_hosts", C_LIST, F(judge_allowed_hosts), 1, 1024, "127.0.0.1,localhost,::1",
     NULL,
     "hosts an http judge URL may name: exact host names or IP addresses (IPv6 without "
     "brackets), compared case-insensitively. Every address a judge connects to is checked at "
     "connect time: loopback, link-local and private addresses only when written literally "
     "here (or 'localhost' for loopback); unspecified and multicast never"},
    {"judge_allow_private", C_BOOL, F(judge_allow_private), 0, 1, "false", NULL,
     "let allowed judge host names resolve to private addresses (10/8, 172.16/12, 192.168/16, "
     "100.64/10, fc00::/7), e.g. an internal judge service; loopback and link-local still need "
     "the address in judge_allowed_hosts"},
    {"judge_models", C_JSON, F(judge_models), 0, 64, "{}", NULL,
     "the judge models that score_model and label_model graders name: an object name -> "
     "{\"url\": an OpenAI-compatible upstream's base URL (\"http://127.0.0.1:8000/v1\", under "
     "judge_allowed_hosts), \"model\", \"api_key_file\" (optional: its content is sent as "
     "Authorization: Bearer), \"timeout_ms\" (default 60000), \"concurrency\" (4), "
     "\"max_retries\" (2)}; a model dapod serves itself (\"serve\") is not supported yet"},
    {"shutdown_grace_s", C_INT, F(shutdown_grace_s), 0, 3600, "30", NULL,
     "on SIGTERM or SIGINT, seconds that running jobs get to reach a safe point before exit"},
    {"log_level", C_ENUM, F(log_level), 0, 0, "info", LEVELS, "least severe level that is logged"},
    {"access_log", C_BOOL, F(access_log), 0, 1, "true", NULL,
     "one log line per HTTP request (method, path, status, milliseconds)"},
};
#define NROWS ((int)(sizeof ROWS / sizeof ROWS[0]))

int config_key_count(void) {
  return NROWS;
}

static const struct crow *find_row(const char *name) {
  for (int i = 0; i < NROWS; i++)
    if (!strcmp(ROWS[i].name, name)) return &ROWS[i];
  return NULL;
}

static void *field(struct config *c, const struct crow *r) {
  return (char *)c + r->off;
}

static const void *cfield(const struct config *c, const struct crow *r) {
  return (const char *)c + r->off;
}

static int is_auto_row(const struct crow *r) {
  return r->type == C_INT && !strcmp(r->dflt, "auto");
}

/* ---- sizes ---- */

/* "1M", "1024" or "0": the largest binary suffix that is exact. */
static const char *fmt_size(uint64_t v, char *buf, size_t cap) {
  static const char SUF[] = "KMGT";
  int k = 0;
  while (v && k < 4 && v % 1024 == 0) v /= 1024, k++;
  if (k)
    snprintf(buf, cap, "%" PRIu64 "%c", v, SUF[k - 1]);
  else
    snprintf(buf, cap, "%" PRIu64, v);
  return buf;
}

static int parse_size(const char *s, uint64_t *out, const char *what, struct dapo_err *e) {
  char digits[32];
  size_t n = strlen(s);
  uint64_t mul = 1;
  if (n > 0) {
    switch (s[n - 1]) {
    case 'K':
    case 'k': mul = (uint64_t)KiB; break;
    case 'M':
    case 'm': mul = (uint64_t)MiB; break;
    case 'G':
    case 'g': mul = (uint64_t)GiB; break;
    case 'T':
    case 't': mul = (uint64_t)TiB; break;
    default: break;
    }
    if (mul > 1) n--;
  }
  uint64_t v;
  struct dapo_err sub;
  if (n == 0 || n >= sizeof digits) goto bad;
  memcpy(digits, s, n);
  digits[n] = 0;
  if (parse_u64(digits, &v, what, &sub)) goto bad;
  if (v > UINT64_MAX / mul) return dapo_errf(e, DAPO_EINVAL, "%s: '%.40s' is too large", what, s);
  *out = v * mul;
  return 0;
bad:
  return dapo_errf(e, DAPO_EINVAL,
                   "%s: '%.40s' is not a size (whole bytes, optionally with a K, M, G or T "
                   "suffix)",
                   what, s);
}

/* ---- host names and addresses ---- */

static int is_ipv4(const char *s) {
  struct in_addr a;
  return inet_pton(AF_INET, s, &a) == 1;
}

static int is_ipv6(const char *s) {
  struct in6_addr a;
  return inet_pton(AF_INET6, s, &a) == 1;
}

int config_is_loopback(const char *host) {
  struct in_addr a4;
  struct in6_addr a6;
  if (!strcasecmp(host, "localhost")) return 1;
  if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, host, &a6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return 1;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
  }
  return 0;
}

/* A host name ([A-Za-z0-9._-], no leading dot or dash), an IPv4 address, or with allow_v6 an IPv6
 * address without brackets. */
static int check_host(const char *h, int allow_v6, const char *what, struct dapo_err *e) {
  size_t n = strlen(h);
  if (n == 0) return dapo_errf(e, DAPO_EINVAL, "%s: empty host", what);
  if (n > 253) return dapo_errf(e, DAPO_EINVAL, "%s: host longer than 253 bytes", what);
  if (h[0] == '[')
    return dapo_errf(e, DAPO_EINVAL, "%s: '%.64s': write IPv6 addresses without brackets", what, h);
  if (strchr(h, ':')) {
    if (allow_v6 && is_ipv6(h)) return 0;
    return dapo_errf(e, DAPO_EINVAL, "%s: '%.64s' is not an IPv6 address", what, h);
  }
  int numeric = 1;
  for (const char *p = h; *p; p++) {
    unsigned char ch = (unsigned char)*p;
    if (!isalnum(ch) && ch != '.' && ch != '-' && ch != '_')
      return dapo_errf(e, DAPO_EINVAL, "%s: '%.64s' is not a host name or address", what, h);
    if (!isdigit(ch) && ch != '.') numeric = 0;
  }
  if (h[0] == '.' || h[0] == '-')
    return dapo_errf(e, DAPO_EINVAL, "%s: '%.64s' is not a host name or address", what, h);
  if (numeric && !is_ipv4(h))
    return dapo_errf(e, DAPO_EINVAL, "%s: '%.64s' is not an IPv4 address", what, h);
  return 0;
}

static int parse_addr(const char *s, struct config_addr *out, const char *what,
                      struct dapo_err *e) {
  char host[256];
  const char *port_s;
  size_t hlen;
  if (s[0] == '[') {
    const char *rb = strchr(s, ']');
    if (!rb) return dapo_errf(e, DAPO_EINVAL, "%s: missing ']' in '%.80s'", what, s);
    if (rb[1] != ':')
      return dapo_errf(e, DAPO_EINVAL, "%s: '%.80s' is not [IPV6]:PORT (missing port)", what, s);
    hlen = (size_t)(rb - s - 1);
    if (hlen >= sizeof host) return dapo_errf(e, DAPO_EINVAL, "%s: host too long", what);
    memcpy(host, s + 1, hlen);
    host[hlen] = 0;
    if (!is_ipv6(host))
      return dapo_errf(e, DAPO_EINVAL, "%s: '%s' is not an IPv6 address", what, host);
    port_s = rb + 2;
  } else {
    const char *colon = strrchr(s, ':');
    if (!colon)
      return dapo_errf(e, DAPO_EINVAL, "%s: '%.80s' is not HOST:PORT (missing port)", what, s);
    if (memchr(s, ':', (size_t)(colon - s)))
      return dapo_errf(e, DAPO_EINVAL,
                       "%s: '%.80s': an IPv6 address goes in brackets, as in [::1]:8080", what, s);
    hlen = (size_t)(colon - s);
    if (hlen == 0) return dapo_errf(e, DAPO_EINVAL, "%s: missing host in '%.80s'", what, s);
    if (hlen >= sizeof host) return dapo_errf(e, DAPO_EINVAL, "%s: host too long", what);
    memcpy(host, s, hlen);
    host[hlen] = 0;
    int rc = check_host(host, 0, what, e);
    if (rc) return rc;
    port_s = colon + 1;
  }
  if (!*port_s) return dapo_errf(e, DAPO_EINVAL, "%s: missing port in '%.80s'", what, s);
  int64_t port;
  struct dapo_err sub;
  if (!isdigit((unsigned char)*port_s) || parse_i64(port_s, 0, INT64_MAX, &port, what, &sub))
    return dapo_errf(e, DAPO_EINVAL, "%s: port '%.20s' is not a number", what, port_s);
  if (port > 65535)
    return dapo_errf(e, DAPO_EINVAL, "%s: port %" PRId64 " not in [0, 65535]", what, port);
  memcpy(out->host, host, hlen + 1);
  out->port = (int)port;
  return 0;
}

const char *config_addr_format(const struct config_addr *a, char *buf, size_t cap) {
  if (strchr(a->host, ':'))
    snprintf(buf, cap, "[%s]:%d", a->host, a->port);
  else
    snprintf(buf, cap, "%s:%d", a->host, a->port);
  return buf;
}

/* ---- lists and keys ---- */

static void list_free(struct config_list *l) {
  for (int i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  l->v = NULL;
  l->n = 0;
}

static int list_push(struct config_list *l, const char *s, size_t n) {
  char **v = realloc(l->v, (size_t)(l->n + 1) * sizeof *v);
  if (!v) return DAPO_ENOMEM;
  l->v = v;
  if (!(v[l->n] = strndup(s, n))) return DAPO_ENOMEM;
  l->n++;
  return 0;
}

static int keys_push(struct config_api_keys *k, const struct config_api_key *key) {
  struct config_api_key *v = realloc(k->v, (size_t)(k->n + 1) * sizeof *v);
  if (!v) return DAPO_ENOMEM;
  k->v = v;
  v[k->n++] = *key;
  return 0;
}

/* Checks and normalises (lowercase hex) one key given as text; `what` names the entry
 * ("config.api_keys[0]"). */
static int make_key(struct config_api_key *k, const char *name, size_t name_len, const char *sha,
                    size_t sha_len, int admin, const char *what, struct dapo_err *e) {
  if (name_len == 0 || name_len > 64)
    return dapo_errf(e, DAPO_EINVAL, "%s.name: expected 1 to 64 characters", what);
  for (size_t i = 0; i < name_len; i++) {
    unsigned char ch = (unsigned char)name[i];
    if (!isalnum(ch) && ch != '.' && ch != '_' && ch != '-')
      return dapo_errf(e, DAPO_EINVAL, "%s.name: only letters, digits, '.', '_' and '-'", what);
  }
  int hex = sha_len == 64;
  for (size_t i = 0; hex && i < 64; i++) hex = isxdigit((unsigned char)sha[i]) != 0;
  if (!hex)
    return dapo_errf(e, DAPO_EINVAL,
                     "%s.sha256: expected 64 hex digits, the SHA-256 of the key (never the key "
                     "itself)",
                     what);
  memcpy(k->name, name, name_len);
  k->name[name_len] = 0;
  for (int i = 0; i < 64; i++) k->sha256[i] = (char)tolower((unsigned char)sha[i]);
  k->sha256[64] = 0;
  k->admin = admin;
  return 0;
}

/* Appends k to keys, refusing a repeated name or hash. */
static int add_key(struct config_api_keys *keys, const struct config_api_key *k, const char *what,
                   struct dapo_err *e) {
  for (int i = 0; i < keys->n; i++) {
    if (!strcmp(keys->v[i].name, k->name))
      return dapo_errf(e, DAPO_EINVAL, "%s.name: '%s' is used twice", what, k->name);
    if (!strcmp(keys->v[i].sha256, k->sha256))
      return dapo_errf(e, DAPO_EINVAL, "%s.sha256: the same hash as key '%s'", what,
                       keys->v[i].name);
  }
  if (keys_push(keys, k)) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", what);
  return 0;
}

/* ---- storing a value: the one place where bounds are checked ---- */

static int store_str(struct config *c, const struct crow *r, const char *s, size_t n,
                     const char *what, struct dapo_err *e) {
  if (memchr(s, 0, n)) return dapo_errf(e, DAPO_EINVAL, "%s: contains a NUL character", what);
  if ((int64_t)n < r->min) return dapo_errf(e, DAPO_EINVAL, "%s: must not be empty", what);
  if ((int64_t)n > r->max)
    return dapo_errf(e, DAPO_EINVAL, "%s: longer than %" PRId64 " bytes", what, r->max);
  char *dup = strndup(s, n);
  if (!dup) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", what);
  char **slot = field(c, r);
  free(*slot);
  *slot = dup;
  return 0;
}

static int store_int(struct config *c, const struct crow *r, int64_t v, const char *what,
                     struct dapo_err *e) {
  if (v < r->min || v > r->max)
    return dapo_errf(e, DAPO_EINVAL, "%s: %" PRId64 " not in [%" PRId64 ", %" PRId64 "]", what, v,
                     r->min, r->max);
  *(int *)field(c, r) = (int)v;
  return 0;
}

static int store_size(struct config *c, const struct crow *r, uint64_t v, const char *what,
                      struct dapo_err *e) {
  if (v < (uint64_t)r->min || v > (uint64_t)r->max) {
    char a[32], lo[32], hi[32];
    return dapo_errf(e, DAPO_EINVAL, "%s: %s not in [%s, %s]", what, fmt_size(v, a, sizeof a),
                     fmt_size((uint64_t)r->min, lo, sizeof lo),
                     fmt_size((uint64_t)r->max, hi, sizeof hi));
  }
  *(uint64_t *)field(c, r) = v;
  return 0;
}

static int store_enum(struct config *c, const struct crow *r, const char *s, const char *what,
                      struct dapo_err *e) {
  for (int i = 0; r->choices[i]; i++)
    if (!strcmp(s, r->choices[i])) {
      *(int *)field(c, r) = i;
      return 0;
    }
  char list[256] = "";
  size_t n = 0;
  for (int i = 0; r->choices[i]; i++) {
    int w = snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", r->choices[i]);
    if (w < 0 || (size_t)w >= sizeof list - n) break;
    n += (size_t)w;
  }
  return dapo_errf(e, DAPO_EINVAL, "%s: '%.40s' is not one of %s", what, s, list);
}

/* Takes ownership of *l (emptied) after checking its entries. */
static int store_list(struct config *c, const struct crow *r, struct config_list *l,
                      const char *what, struct dapo_err *e) {
  if (l->n < r->min)
    return dapo_errf(e, DAPO_EINVAL, "%s: needs at least %" PRId64 " entr%s", what, r->min,
                     r->min == 1 ? "y" : "ies");
  if (l->n > r->max)
    return dapo_errf(e, DAPO_EINVAL, "%s: more than %" PRId64 " entries", what, r->max);
  for (int i = 0; i < l->n; i++) {
    char sub[160];
    snprintf(sub, sizeof sub, "%s[%d]", what, i);
    int rc = check_host(l->v[i], 1, sub, e);
    if (rc) return rc;
  }
  struct config_list *slot = field(c, r);
  list_free(slot);
  *slot = *l;
  l->v = NULL;
  l->n = 0;
  return 0;
}

/* Takes ownership of *k (emptied); entries were checked as they were added. */
static int store_keys(struct config *c, const struct crow *r, struct config_api_keys *k,
                      const char *what, struct dapo_err *e) {
  if (k->n > r->max)
    return dapo_errf(e, DAPO_EINVAL, "%s: more than %" PRId64 " keys", what, r->max);
  struct config_api_keys *slot = field(c, r);
  free(slot->v);
  *slot = *k;
  k->v = NULL;
  k->n = 0;
  return 0;
}

/* ---- text (flags and defaults) ---- */

static int parse_bool_text(const char *s, int *out) {
  if (!strcmp(s, "true")) return *out = 1, 0;
  if (!strcmp(s, "false")) return *out = 0, 0;
  return DAPO_EINVAL;
}

static int list_from_json(const json_t *j, struct config_list *l, const char *what,
                          struct dapo_err *e);
static int keys_from_json(const json_t *j, struct config_api_keys *k, const char *what,
                          struct dapo_err *e);

/* Parses s as JSON for a flag whose value starts with '['. New reference or NULL with e set. */
static json_t *json_flag_value(const char *s, const char *what, struct dapo_err *e) {
  json_error_t jerr;
  json_t *j = json_loads(s, JSON_REJECT_DUPLICATES, &jerr);
  if (!j) dapo_errf(e, DAPO_EINVAL, "%s: %s (column %d)", what, jerr.text, jerr.column);
  return j;
}

static int list_from_text(const char *s, struct config_list *l, const char *what,
                          struct dapo_err *e) {
  if (s[0] == '[') {
    json_t *j = json_flag_value(s, what, e);
    if (!j) return DAPO_EINVAL;
    int rc = list_from_json(j, l, what, e);
    json_decref(j);
    return rc;
  }
  while (*s) {
    const char *comma = strchr(s, ',');
    size_t n = comma ? (size_t)(comma - s) : strlen(s);
    if (list_push(l, s, n)) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", what);
    if (!comma) break;
    s = comma + 1;
    if (!*s && list_push(l, "", 0)) /* "a," has an empty last entry, refused by check_host */
      return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", what);
  }
  return 0;
}

/* "name:sha256[:admin],..." or a JSON array. */
static int keys_from_text(const char *s, struct config_api_keys *k, const char *what,
                          struct dapo_err *e) {
  if (s[0] == '[') {
    json_t *j = json_flag_value(s, what, e);
    if (!j) return DAPO_EINVAL;
    int rc = keys_from_json(j, k, what, e);
    json_decref(j);
    return rc;
  }
  for (int i = 0; *s; i++) {
    char sub[160];
    snprintf(sub, sizeof sub, "%s[%d]", what, i);
    const char *end = strchr(s, ',');
    size_t n = end ? (size_t)(end - s) : strlen(s);
    const char *c1 = memchr(s, ':', n);
    if (!c1) return dapo_errf(e, DAPO_EINVAL, "%s: expected NAME:SHA256 or NAME:SHA256:admin", sub);
    const char *sha = c1 + 1;
    const char *c2 = memchr(sha, ':', (size_t)(s + n - sha));
    size_t sha_len = c2 ? (size_t)(c2 - sha) : (size_t)(s + n - sha);
    int admin = 0;
    if (c2) {
      if ((size_t)(s + n - c2 - 1) != 5 || strncmp(c2 + 1, "admin", 5))
        return dapo_errf(e, DAPO_EINVAL, "%s: expected NAME:SHA256 or NAME:SHA256:admin", sub);
      admin = 1;
    }
    struct config_api_key key;
    int rc = make_key(&key, s, (size_t)(c1 - s), sha, sha_len, admin, sub, e);
    if (!rc) rc = add_key(k, &key, sub, e);
    if (rc) return rc;
    if (!end) break;
    s = end + 1;
    if (!*s) return dapo_errf(e, DAPO_EINVAL, "%s: trailing ','", what);
  }
  return 0;
}

/* A list or key setting, from a flag's text (json NULL) or from the file's JSON: parsed into a
 * new value that store_list or store_keys takes over, or that is freed when it is refused. */
static int set_list(struct config *c, const struct crow *r, const char *text, const json_t *json,
                    const char *what, struct dapo_err *e) {
  struct config_list l = {0};
  int rc = json ? list_from_json(json, &l, what, e) : list_from_text(text, &l, what, e);
  if (!rc) rc = store_list(c, r, &l, what, e);
  list_free(&l);
  return rc;
}

static int set_keys(struct config *c, const struct crow *r, const char *text, const json_t *json,
                    const char *what, struct dapo_err *e) {
  struct config_api_keys k = {0};
  int rc = json ? keys_from_json(json, &k, what, e) : keys_from_text(text, &k, what, e);
  if (!rc) rc = store_keys(c, r, &k, what, e);
  free(k.v);
  return rc;
}

static int set_json(struct config *c, const struct crow *r, const json_t *v, const char *what,
                    struct dapo_err *e);

static int set_text(struct config *c, const struct crow *r, const char *s, const char *what,
                    struct dapo_err *e) {
  switch (r->type) {
  case C_STR: return store_str(c, r, s, strlen(s), what, e);
  case C_INT: {
    if (is_auto_row(r) && !strcmp(s, "auto")) {
      *(int *)field(c, r) = 0;
      return 0;
    }
    int64_t v;
    struct dapo_err sub;
    if (parse_i64(s, INT64_MIN, INT64_MAX, &v, what, &sub))
      return dapo_errf(e, DAPO_EINVAL, "%s: '%.40s' is not an integer%s", what, s,
                       is_auto_row(r) ? " or \"auto\"" : "");
    return store_int(c, r, v, what, e);
  }
  case C_SIZE: {
    uint64_t v;
    int rc = parse_size(s, &v, what, e);
    return rc ? rc : store_size(c, r, v, what, e);
  }
  case C_BOOL: {
    int b;
    if (parse_bool_text(s, &b))
      return dapo_errf(e, DAPO_EINVAL, "%s: '%.40s' is not true or false", what, s);
    *(int *)field(c, r) = b;
    return 0;
  }
  case C_ADDR: return parse_addr(s, field(c, r), what, e);
  case C_ENUM: return store_enum(c, r, s, what, e);
  case C_LIST: return set_list(c, r, s, NULL, what, e);
  case C_KEYS: return set_keys(c, r, s, NULL, what, e);
  case C_JSON: {
    json_error_t je;
    json_t *v = json_loads(s, 0, &je);
    if (!v) return dapo_errf(e, DAPO_EINVAL, "%s: not JSON: %.120s", what, je.text);
    int rc = set_json(c, r, v, what, e);
    json_decref(v);
    return rc;
  }
  }
  return dapo_errf(e, DAPO_EINVAL, "%s: unknown type", what);
}

int config_set(struct config *c, const char *name, const char *value, const char *what,
               struct dapo_err *e) {
  char buf[96];
  if (!what) {
    snprintf(buf, sizeof buf, "config.%s", name);
    what = buf;
  }
  const struct crow *r = find_row(name);
  if (!r) return dapo_errf(e, DAPO_EINVAL, "%s: unknown key", what);
  return set_text(c, r, value, what, e);
}

/* ---- JSON (the file) ---- */

static int list_from_json(const json_t *j, struct config_list *l, const char *what,
                          struct dapo_err *e) {
  if (!json_is_array(j)) return dapo_errf(e, DAPO_EINVAL, "%s: expected an array of strings", what);
  size_t i;
  json_t *v;
  json_array_foreach(j, i, v) {
    if (!json_is_string(v)) return dapo_errf(e, DAPO_EINVAL, "%s[%zu]: expected a string", what, i);
    const char *s = json_string_value(v);
    if (memchr(s, 0, json_string_length(v)))
      return dapo_errf(e, DAPO_EINVAL, "%s[%zu]: contains a NUL character", what, i);
    if (list_push(l, s, json_string_length(v)))
      return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", what);
  }
  return 0;
}

static int keys_from_json(const json_t *j, struct config_api_keys *k, const char *what,
                          struct dapo_err *e) {
  if (!json_is_array(j))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s: expected an array of {\"name\", \"sha256\", \"admin\"} objects", what);
  size_t i;
  json_t *v;
  json_array_foreach(j, i, v) {
    char sub[160];
    snprintf(sub, sizeof sub, "%s[%zu]", what, i);
    if (!json_is_object(v))
      return dapo_errf(e, DAPO_EINVAL, "%s: expected an object {\"name\", \"sha256\", \"admin\"}",
                       sub);
    const char *fk;
    json_t *fv;
    json_object_foreach((json_t *)v, fk, fv) {
      if (strcmp(fk, "name") && strcmp(fk, "sha256") && strcmp(fk, "admin"))
        return dapo_errf(e, DAPO_EINVAL, "%s.%.40s: unknown field%s", sub, fk,
                         !strcmp(fk, "key") ? " (give the key's SHA-256 as sha256, never the key)"
                                            : "");
    }
    const json_t *name = json_object_get(v, "name"), *sha = json_object_get(v, "sha256"),
                 *admin = json_object_get(v, "admin");
    if (!name) return dapo_errf(e, DAPO_EINVAL, "%s.name: missing", sub);
    if (!json_is_string(name)) return dapo_errf(e, DAPO_EINVAL, "%s.name: expected a string", sub);
    if (!sha) return dapo_errf(e, DAPO_EINVAL, "%s.sha256: missing", sub);
    if (!json_is_string(sha)) return dapo_errf(e, DAPO_EINVAL, "%s.sha256: expected a string", sub);
    if (admin && !json_is_boolean(admin))
      return dapo_errf(e, DAPO_EINVAL, "%s.admin: expected true or false", sub);
    struct config_api_key key;
    int rc =
        make_key(&key, json_string_value(name), json_string_length(name), json_string_value(sha),
                 json_string_length(sha), admin && json_is_true(admin), sub, e);
    if (!rc) rc = add_key(k, &key, sub, e);
    if (rc) return rc;
  }
  return 0;
}

static int set_json(struct config *c, const struct crow *r, const json_t *v, const char *what,
                    struct dapo_err *e) {
  switch (r->type) {
  case C_STR:
    if (!json_is_string(v)) return dapo_errf(e, DAPO_EINVAL, "%s: expected a string", what);
    return store_str(c, r, json_string_value(v), json_string_length(v), what, e);
  case C_INT:
    if (json_is_integer(v)) return store_int(c, r, json_integer_value(v), what, e);
    if (is_auto_row(r) && json_is_string(v) && !strcmp(json_string_value(v), "auto")) {
      *(int *)field(c, r) = 0;
      return 0;
    }
    return dapo_errf(e, DAPO_EINVAL, "%s: expected an integer%s", what,
                     is_auto_row(r) ? " or \"auto\"" : "");
  case C_SIZE:
    if (json_is_integer(v)) {
      if (json_integer_value(v) < 0)
        return dapo_errf(e, DAPO_EINVAL, "%s: %" JSON_INTEGER_FORMAT " is negative", what,
                         json_integer_value(v));
      return store_size(c, r, (uint64_t)json_integer_value(v), what, e);
    }
    if (json_is_string(v)) {
      uint64_t n;
      int rc = parse_size(json_string_value(v), &n, what, e);
      return rc ? rc : store_size(c, r, n, what, e);
    }
    return dapo_errf(e, DAPO_EINVAL,
                     "%s: expected a size: a whole number of bytes or a string such as \"1M\"",
                     what);
  case C_BOOL:
    if (!json_is_boolean(v)) return dapo_errf(e, DAPO_EINVAL, "%s: expected true or false", what);
    *(int *)field(c, r) = json_is_true(v);
    return 0;
  case C_ADDR:
    if (!json_is_string(v))
      return dapo_errf(e, DAPO_EINVAL, "%s: expected a string \"HOST:PORT\"", what);
    return parse_addr(json_string_value(v), field(c, r), what, e);
  case C_ENUM:
    if (!json_is_string(v)) return dapo_errf(e, DAPO_EINVAL, "%s: expected a string", what);
    return store_enum(c, r, json_string_value(v), what, e);
  case C_LIST: return set_list(c, r, NULL, v, what, e);
  case C_KEYS: return set_keys(c, r, NULL, v, what, e);
  case C_JSON: {
    if (!json_is_object(v)) return dapo_errf(e, DAPO_EINVAL, "%s: expected an object", what);
    if ((int64_t)json_object_size(v) > r->max)
      return dapo_errf(e, DAPO_EINVAL, "%s: more than %" PRId64 " entries", what, r->max);
    json_t *copy = json_deep_copy(v);
    if (!copy) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", what);
    json_t **slot = field(c, r);
    json_decref(*slot);
    *slot = copy;
    return 0;
  }
  }
  return dapo_errf(e, DAPO_EINVAL, "%s: unknown type", what);
}

int config_parse_json(struct config *c, const json_t *obj, struct dapo_err *e) {
  if (!json_is_object(obj))
    return dapo_errf(e, DAPO_EINVAL, "config: expected a JSON object of settings");
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)obj, k, v) {
    if (k[0] == '_') continue; /* a comment, or a key switched off */
    char what[96];
    snprintf(what, sizeof what, "config.%.80s", k);
    const struct crow *r = find_row(k);
    if (!r) return dapo_errf(e, DAPO_EINVAL, "%s: unknown key", what);
    int rc = set_json(c, r, v, what, e);
    if (rc) return rc;
  }
  return 0;
}

int config_load_file(struct config *c, const char *path, struct dapo_err *e) {
  enum { CAP = 1 << 20 };
  FILE *f = fopen(path, "rb");
  if (!f) return dapo_errf(e, DAPO_EIO, "%s: %s", path, strerror(errno));
  char *buf = malloc(CAP + 1);
  if (!buf) {
    fclose(f);
    return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", path);
  }
  size_t n = fread(buf, 1, CAP + 1, f);
  int rd_err = ferror(f) ? errno : 0;
  fclose(f);
  int rc = 0;
  json_t *j = NULL;
  if (rd_err) {
    rc = dapo_errf(e, DAPO_EIO, "%s: %s", path, strerror(rd_err));
    goto out;
  }
  if (n > CAP) {
    rc = dapo_errf(e, DAPO_ERANGE, "%s: larger than 1 MiB", path);
    goto out;
  }
  json_error_t jerr;
  j = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &jerr);
  if (!j) {
    rc = dapo_errf(e, DAPO_EFORMAT, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    goto out;
  }
  rc = config_parse_json(c, j, e);
  if (rc) dapo_err_prefix(e, "%s: ", path);
out:
  json_decref(j);
  free(buf);
  return rc;
}

/* ---- command line ---- */

/* "--max-body-bytes" -> its row, NULL when unknown (e says why). */
static const struct crow *flag_row(const char *flag, size_t n, struct dapo_err *e) {
  char key[80], dashed[80];
  if (n >= sizeof key) {
    dapo_errf(e, DAPO_EINVAL, "--%.40s...: unknown flag (see --help)", flag);
    return NULL;
  }
  int underscore = 0;
  for (size_t i = 0; i < n; i++) {
    underscore |= flag[i] == '_';
    key[i] = flag[i] == '-' ? '_' : flag[i];
    dashed[i] = flag[i] == '_' ? '-' : flag[i];
  }
  key[n] = dashed[n] = 0;
  const struct crow *r = find_row(key);
  if (r && !underscore) return r;
  if (r)
    dapo_errf(e, DAPO_EINVAL, "--%.*s: unknown flag (flags write '_' as '-': --%s)", (int)n, flag,
              dashed);
  else
    dapo_errf(e, DAPO_EINVAL, "--%.*s: unknown flag (see --help)", (int)n, flag);
  return NULL;
}

/* One walk over argv: with apply = 0 it checks the syntax and finds --config and the actions;
 * with apply = 1 it sets the settings. */
static int walk_args(struct config *c, int argc, char **argv, int apply, const char **file,
                     enum config_action *action, struct dapo_err *e) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) || !a[2])
      return dapo_errf(e, DAPO_EINVAL, "unexpected argument '%.80s' (see --help)", a);
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t n = eq ? (size_t)(eq - name) : strlen(name);
    if (n == 12 && !strncmp(name, "print-config", n) && !eq) {
      *action = CONFIG_PRINT;
      continue;
    }
    if (n == 20 && !strncmp(name, "print-example-config", n) && !eq) {
      *action = CONFIG_PRINT_EXAMPLE;
      continue;
    }
    const char *value = eq ? eq + 1 : NULL;
    if (n == 6 && !strncmp(name, "config", n)) {
      if (!value && i + 1 < argc) value = argv[++i];
      if (!value || !*value) return dapo_errf(e, DAPO_EINVAL, "--config: missing FILE");
      *file = value;
      continue;
    }
    const struct crow *r = flag_row(name, n, e);
    if (!r) return DAPO_EINVAL;
    char what[96];
    snprintf(what, sizeof what, "--%.*s", (int)n, name);
    if (!value) {
      int b;
      if (r->type == C_BOOL)
        value = i + 1 < argc && !parse_bool_text(argv[i + 1], &b) ? argv[++i] : "true";
      else if (i + 1 < argc)
        value = argv[++i];
      else
        return dapo_errf(e, DAPO_EINVAL, "%s: missing value", what);
    }
    if (apply) {
      int rc = set_text(c, r, value, what, e);
      if (rc) return rc;
    }
  }
  return 0;
}

int config_parse_args(struct config *c, int argc, char **argv, enum config_action *action,
                      struct dapo_err *e) {
  *action = CONFIG_RUN;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      *action = CONFIG_HELP;
      return 0;
    }
  const char *file = NULL;
  int rc = walk_args(c, argc, argv, 0, &file, action, e);
  if (rc || *action == CONFIG_PRINT_EXAMPLE) return rc;
  if (file && (rc = config_load_file(c, file, e))) return rc;
  return walk_args(c, argc, argv, 1, &file, action, e);
}

/* ---- defaults, finishing, lifetime ---- */

int config_init(struct config *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < NROWS; i++) {
    int rc = set_text(c, &ROWS[i], ROWS[i].dflt, ROWS[i].name, NULL);
    if (rc) {
      config_deinit(c);
      return rc;
    }
  }
  return 0;
}

void config_deinit(struct config *c) {
  if (!c) return;
  for (int i = 0; i < NROWS; i++) {
    const struct crow *r = &ROWS[i];
    if (r->type == C_STR) free(*(char **)field(c, r));
    if (r->type == C_LIST) list_free(field(c, r));
    if (r->type == C_KEYS) free(((struct config_api_keys *)field(c, r))->v);
    if (r->type == C_JSON) json_decref(*(json_t **)field(c, r));
  }
  memset(c, 0, sizeof *c);
}

int config_cpu_count(void) {
  cpu_set_t set;
  if (!sched_getaffinity(0, sizeof set, &set)) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static int imax(int a, int b) {
  return a > b ? a : b;
}

static int imin(int a, int b) {
  return a < b ? a : b;
}

/* web_dir "auto": the dashboard beside the executable, installed (PREFIX/bin/dapod ->
 * PREFIX/share/dapod/web) or in the build tree (BUILD/server/dapod -> BUILD/web); "" when neither
 * holds an index.html. Returns 0 or DAPO_ENOMEM. */
static int resolve_web_dir(struct config *c) {
  static const char *const REL[] = {"/../share/dapod/web", "/../web"};
  char exe[PATHMAX + 1], path[PATHMAX + 64], real[PATH_MAX];
  const char *found = "";
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    for (size_t i = 0; i < sizeof REL / sizeof REL[0] && !*found; i++) {
      snprintf(path, sizeof path, "%s%s/index.html", exe, REL[i]);
      if (access(path, R_OK) == 0) {
        path[strlen(path) - strlen("/index.html")] = '\0';
        found = realpath(path, real) ? real : path; /* "/usr/share/dapod/web", not "bin/.." */
      }
    }
  }
  char *v = strdup(found);
  if (!v) return DAPO_ENOMEM;
  free(c->web_dir);
  c->web_dir = v;
  return 0;
}

int config_finish(struct config *c, int ncpu, struct dapo_err *e) {
  if (ncpu <= 0) ncpu = config_cpu_count();
  if (!strcmp(c->web_dir, "auto") && resolve_web_dir(c))
    return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  if (!c->workers) c->workers = imin(64, imax(1, ncpu / 2));
  if (!c->blas_threads) c->blas_threads = imax(1, ncpu / c->workers);
  if (!c->http_threads) c->http_threads = imin(8, imax(2, ncpu / 4));

  if (*c->compute_cpus) {
    struct config_cpus cpus;
    if (config_parse_cpus(c->compute_cpus, &cpus, e)) return dapo_err_prefix(e, "compute_cpus: ");
    /* the machine's CPUs, not the ones this process started on: it may move itself */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online <= 0) online = ncpu;
    if (cpus.n >= online)
      return dapo_errf(e, DAPO_EINVAL,
                       "compute_cpus: lists %d CPUs of %ld: leave at least one for the rest",
                       cpus.n, online);
  }
  if (!*c->tls_cert != !*c->tls_key)
    return dapo_errf(e, DAPO_EINVAL, "tls_cert and tls_key go together: %s is set, %s is empty",
                     *c->tls_cert ? "tls_cert" : "tls_key", *c->tls_cert ? "tls_key" : "tls_cert");
  if (c->max_connections_per_ip > c->max_connections)
    return dapo_errf(e, DAPO_EINVAL,
                     "max_connections_per_ip (%d) is more than max_connections (%d)",
                     c->max_connections_per_ip, c->max_connections);
  if (c->sse_heartbeat_s >= c->connection_timeout_s)
    return dapo_errf(e, DAPO_EINVAL,
                     "sse_heartbeat_s (%d) must be less than connection_timeout_s (%d): idle "
                     "event streams would time out",
                     c->sse_heartbeat_s, c->connection_timeout_s);
  struct judge_policy pol = {.allowed_hosts = (const char *const *)c->judge_allowed_hosts.v,
                             .n_allowed = c->judge_allowed_hosts.n,
                             .allow_private = c->judge_allow_private};
  if (grader_models_check(c->judge_models, &pol, "judge_models", e)) return e ? e->code : 1;
  if (!c->api_keys.n && !config_is_loopback(c->listen.host)) {
    char a[300];
    return dapo_errf(e, DAPO_EINVAL,
                     "listen %s is not a loopback address and no api_keys are configured: "
                     "refusing to serve unauthenticated",
                     config_addr_format(&c->listen, a, sizeof a));
  }
  return 0;
}

int config_parse_cpus(const char *s, struct config_cpus *out, struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    long a = strtol(p, &end, 10), b;
    if (end == p || errno || a < 0 || a >= 1024)
      return dapo_errf(e, DAPO_EINVAL, "'%.40s': expected CPU numbers 0..1023 like 0-3,6", p);
    b = a;
    if (*end == '-') {
      const char *q = end + 1;
      b = strtol(q, &end, 10);
      if (end == q || b < a || b >= 1024)
        return dapo_errf(e, DAPO_EINVAL, "'%.40s': a range is LOW-HIGH with LOW <= HIGH < 1024", p);
    }
    for (long i = a; i <= b; i++) out->n += !out->on[i], out->on[i] = 1;
    if (*end == ',')
      end++;
    else if (*end)
      return dapo_errf(e, DAPO_EINVAL, "'%.40s': expected ',' between CPUs", end);
    p = end;
  }
  if (!out->n) return dapo_errf(e, DAPO_EINVAL, "no CPU listed");
  return 0;
}

/* ---- output ---- */

static json_t *value_json(const struct config *c, const struct crow *r) {
  const void *p = cfield(c, r);
  switch (r->type) {
  case C_STR: return json_string(*(char *const *)p);
  case C_INT:
    if (is_auto_row(r) && *(const int *)p == 0) return json_string("auto");
    return json_integer(*(const int *)p);
  case C_SIZE: {
    uint64_t v = *(const uint64_t *)p;
    char buf[32];
    fmt_size(v, buf, sizeof buf);
    if (isdigit((unsigned char)buf[strlen(buf) - 1])) return json_integer((json_int_t)v);
    return json_string(buf);
  }
  case C_BOOL: return json_boolean(*(const int *)p);
  case C_ADDR: {
    char buf[300];
    return json_string(config_addr_format(p, buf, sizeof buf));
  }
  case C_ENUM: return json_string(r->choices[*(const int *)p]);
  case C_LIST: {
    const struct config_list *l = p;
    json_t *a = json_array();
    for (int i = 0; a && i < l->n; i++)
      if (json_array_append_new(a, json_string(l->v[i]))) {
        json_decref(a);
        return NULL;
      }
    return a;
  }
  case C_KEYS: {
    const struct config_api_keys *k = p;
    json_t *a = json_array();
    for (int i = 0; a && i < k->n; i++)
      if (json_array_append_new(a, json_pack("{s:s,s:s,s:b}", "name", k->v[i].name, "sha256",
                                             k->v[i].sha256, "admin", k->v[i].admin))) {
        json_decref(a);
        return NULL;
      }
    return a;
  }
  case C_JSON: return json_deep_copy(*(json_t *const *)p); /* paths, never a key's content */
  }
  return NULL;
}

json_t *config_to_json(const struct config *c) {
  json_t *o = json_object();
  for (int i = 0; o && i < NROWS; i++)
    if (json_object_set_new(o, ROWS[i].name, value_json(c, &ROWS[i]))) {
      json_decref(o);
      return NULL;
    }
  return o;
}

static char *dump_text(json_t *o) {
  if (!o) return NULL;
  char *s = json_dumps(o, JSON_INDENT(2));
  json_decref(o);
  if (!s) return NULL;
  size_t n = strlen(s);
  char *t = realloc(s, n + 2);
  if (!t) {
    free(s);
    return NULL;
  }
  t[n] = '\n';
  t[n + 1] = 0;
  return t;
}

char *config_to_text(const struct config *c) {
  return dump_text(config_to_json(c));
}

/* The type and bounds of a row, for --help and the example ("integer in [1, 64], or auto"). */
static void describe_type(const struct crow *r, char *buf, size_t cap) {
  char lo[32], hi[32];
  switch (r->type) {
  case C_STR: snprintf(buf, cap, "%s", r->min ? "path" : "path, or empty"); break;
  case C_INT:
    snprintf(buf, cap, "integer in [%" PRId64 ", %" PRId64 "]%s", r->min, r->max,
             is_auto_row(r) ? ", or \"auto\"" : "");
    break;
  case C_SIZE:
    snprintf(buf, cap, "bytes in [%s, %s]; suffixes K, M, G, T are powers of 1024",
             fmt_size((uint64_t)r->min, lo, sizeof lo), fmt_size((uint64_t)r->max, hi, sizeof hi));
    break;
  case C_BOOL: snprintf(buf, cap, "true or false"); break;
  case C_ADDR: snprintf(buf, cap, "\"HOST:PORT\""); break;
  case C_ENUM: {
    size_t n = (size_t)snprintf(buf, cap, "one of");
    for (int i = 0; r->choices[i] && n < cap; i++)
      n += (size_t)snprintf(buf + n, cap - n, "%s %s", i ? "," : "", r->choices[i]);
    break;
  }
  case C_LIST: snprintf(buf, cap, "array of host names or addresses"); break;
  case C_KEYS: snprintf(buf, cap, "array of {\"name\", \"sha256\", \"admin\"}"); break;
  case C_JSON: snprintf(buf, cap, "JSON object of at most %" PRId64 " entries", r->max); break;
  }
}

static const char EXAMPLE_HEAD[] =
    "dapod configuration, generated by `dapod --print-example-config` from the config table "
    "(server/config.c); every key is shown with its default. JSON has no comments: keys that "
    "start with '_' are comments and ignored, so '_<key>' documents <key>, and renaming a key to "
    "'_<key>' switches it back to its default. Use with `dapod --config FILE`; every key is also "
    "a flag (--max-body-bytes for max_body_bytes), and flags win over the file.";

char *config_example_text(void) {
  struct config c;
  if (config_init(&c)) return NULL;
  json_t *o = json_object();
  if (o && json_object_set_new(o, "_comment", json_string(EXAMPLE_HEAD))) goto oom;
  for (int i = 0; o && i < NROWS; i++) {
    const struct crow *r = &ROWS[i];
    char key[96], type[160], text[1024];
    snprintf(key, sizeof key, "_%s", r->name);
    describe_type(r, type, sizeof type);
    snprintf(text, sizeof text, "%s. (%s)", r->help, type);
    if (json_object_set_new(o, key, json_string(text)) ||
        json_object_set_new(o, r->name, value_json(&c, r)))
      goto oom;
  }
  config_deinit(&c);
  return dump_text(o);
oom:
  json_decref(o);
  config_deinit(&c);
  return NULL;
}

static const char *metavar(const struct crow *r) {
  switch (r->type) {
  case C_STR: return "PATH";
  case C_INT: return is_auto_row(r) ? "N|auto" : "N";
  case C_SIZE: return "BYTES";
  case C_BOOL: return "[true|false]";
  case C_ADDR: return "HOST:PORT";
  case C_ENUM: return "LEVEL";
  case C_LIST: return "HOST,...";
  case C_KEYS: return "NAME:SHA256[:admin],...";
  case C_JSON: return "JSON";
  }
  return "VALUE";
}

/* Writes text wrapped at 100 columns, each line indented by `indent` spaces. */
static void wrap(FILE *f, const char *text, int indent) {
  const int width = 100 - indent;
  while (*text) {
    int n = (int)strlen(text);
    if (n > width) {
      n = width;
      while (n > 0 && text[n] != ' ') n--;
      if (n == 0) n = width;
    }
    fprintf(f, "%*s%.*s\n", indent, "", n, text);
    text += n;
    while (*text == ' ') text++;
  }
}

void config_print_help(FILE *f) {
  fprintf(f, "usage: dapod [serve] [--config FILE] [--KEY VALUE | --KEY=VALUE]...\n"
             "       dapod [serve] [--config FILE] [flags] --print-config\n"
             "       dapod --print-example-config\n"
             "\n"
             "Every key of the config file (JSON, see systemd/dapod.example.json) has a flag of "
             "the\nsame name with '_' written '-'; flags win over the file, and a flag replaces a "
             "list\nwhole. Lists take a JSON array or a comma-separated list.\n"
             "\n"
             "  --config FILE\n      read settings from FILE (JSON)\n"
             "  --print-config\n      print the effective config as JSON and exit\n"
             "  --print-example-config\n      print the documented example config and exit\n"
             "  --help\n      print this help and exit\n");
  for (int i = 0; i < NROWS; i++) {
    const struct crow *r = &ROWS[i];
    char flag[80], type[160], text[1024];
    size_t n = strlen(r->name);
    for (size_t k = 0; k <= n; k++) flag[k] = r->name[k] == '_' ? '-' : r->name[k];
    describe_type(r, type, sizeof type);
    snprintf(text, sizeof text, "%s. (%s)", r->help, type);
    fprintf(f, "  --%s %s (default: %s)\n", flag, metavar(r), *r->dflt ? r->dflt : "none");
    wrap(f, text, 6);
  }
}
