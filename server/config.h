/* The daemon's configuration: struct config and ONE table of rows {name, type, field offset,
 * bounds, default, help} that sets the defaults, parses the JSON config file and the command-line
 * flags, reports bad values by key name, prints the effective config and generates the
 * documented example config (systemd/dapod.example.json).
 *
 * Order of precedence: defaults < config file (--config FILE) < flags. Every key has a flag of the
 * same name with '_' written '-' (max_body_bytes: --max-body-bytes), as `--name value` or
 * `--name=value`. Values in flags use the file's syntax for scalars; lists are a JSON array or a
 * comma-separated list, and api_keys a JSON array or `name:sha256[:admin],...`. A flag replaces
 * the whole value (lists are not appended to).
 *
 * The file is one JSON object. JSON has no comments, so a key that starts with '_' is a comment
 * and ignored: the example file documents each key in a neighbouring "_<key>" string, and a
 * setting is switched off by renaming "workers" to "_workers". Any other unknown key is refused.
 *
 * Value syntax: sizes are a whole number of bytes or a string with a binary suffix ("64K", "1M",
 * "1G", "1T"); workers, blas_threads and http_threads take "auto" (fitted to the machine by
 * config_finish); listen is HOST:PORT with IPv6 in brackets ("[::1]:8080"), port 0 = any free
 * port. Errors name the key: "config.workers: 0 not in [1, 64]" (file), "--workers: ..." (flag). */
#ifndef DAPOD_CONFIG_H
#define DAPOD_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "error.h"

/* A listen address: host without brackets ("::1", "127.0.0.1", "localhost") and port. */
struct config_addr {
  char host[256];
  int port; /* 0..65535; 0 = any free port */
};

/* A list of owned strings. */
struct config_list {
  char **v;
  int n;
};

/* One API key as the config holds it: never the key itself, only its SHA-256. */
struct config_api_key {
  char name[65];   /* [A-Za-z0-9._-], 1..64 bytes; unique */
  char sha256[65]; /* 64 lowercase hex digits; unique */
  int admin;       /* sees every key's files and jobs */
};

struct config_api_keys {
  struct config_api_key *v;
  int n;
};

/* Every daemon setting. Strings and lists are owned (config_deinit frees them). The int fields
 * documented "auto" hold 0 until config_finish resolves them. */
struct config {
  struct config_addr listen;       /* HTTP(S) address */
  char *tls_cert, *tls_key;        /* PEM paths; "" = plain HTTP; both or neither */
  struct config_api_keys api_keys; /* none: unauthenticated, loopback only */
  char *data_dir;                  /* SQLite database, uploads, checkpoints */
  char *models_dir;                /* model folders; a missing folder = presets only */
  char *web_dir;                   /* dashboard files; "auto" until config_finish; "" = off */
  int workers;                     /* job threads; auto */
  int blas_threads;                /* BLAS threads per job; auto */
  int http_threads;                /* HTTP thread pool; auto */
  char *compute_cpus;              /* CPUs reserved for the jobs' compute ("0-3,6"); "" = none */
  uint64_t memory_limit_bytes;     /* jobs' and completions' memory cap; 0 = physical memory */
  int completion_threads;          /* completion sampling threads */
  int completion_queue;            /* completions waiting for a thread or memory */
  int completion_wait_s;           /* longest such wait before a 503 */
  int completion_cache_models;     /* opened models kept between completions; 0 = none */
  int max_jobs_per_key;            /* live (queued, running, paused) jobs per API key */
  int max_queued_jobs;             /* queued jobs in total */
  uint64_t job_check_inline_bytes; /* datasets checked on the request's thread up to this size */
  int progress_every_pass;         /* every pass reports progress events, not only long ones */
  char *launcher;                  /* command template starting a multi-process job's ranks; "" */
  int max_processes;               /* most processes (ranks) a job may ask for */
  int launch_retries;              /* restarts of a multi-process job after its launcher failed */
  uint64_t max_body_bytes;         /* JSON request bodies */
  uint64_t max_upload_bytes;       /* one uploaded file */
  int max_json_depth;              /* nesting of request bodies */
  uint64_t max_header_bytes;       /* request line and headers of one request */
  int max_connections;             /* open HTTP connections in total */
  int max_connections_per_ip;      /* open HTTP connections from one address */
  int connection_timeout_s;        /* idle connection timeout */
  int max_sse_subscribers;         /* open event streams in total */
  int sse_backlog_events;          /* events queued for one slow subscriber */
  int sse_heartbeat_s;             /* comment line on an idle stream */
  struct config_list judge_allowed_hosts; /* hosts an http judge URL may name */
  int judge_allow_private;                /* allowed names may resolve to private addresses */
  json_t *judge_models; /* name -> {"url", "model", "api_key_file", ...}: the judge models of
                           score_model and label_model graders (checked by config_finish) */
  int shutdown_grace_s; /* SIGTERM: time for jobs to reach a safe point */
  int log_level;        /* enum log_level (log.h) */
  int access_log;       /* one log line per HTTP request */
};

/* What the command line asked for besides settings. */
enum config_action {
  CONFIG_RUN = 0,       /* serve with the config */
  CONFIG_HELP,          /* --help / -h: print config_print_help and exit 0 */
  CONFIG_PRINT,         /* --print-config: config_finish, then print config_to_text */
  CONFIG_PRINT_EXAMPLE, /* --print-example-config: print config_example_text */
};

/* Sets every key to its default (auto fields 0). c is caller-placed; config_deinit releases it.
 * Returns 0 or DAPO_ENOMEM. */
int config_init(struct config *c);

/* Frees what c owns and zeroes it. Accepts NULL and a zeroed struct. */
void config_deinit(struct config *c);

/* Applies the keys of obj (borrowed; must be an object) over c. Errors name the key
 * ("config.workers: ..."); on failure c stays valid to free but may hold some new values. */
int config_parse_json(struct config *c, const json_t *obj, struct dapo_err *e);

/* Reads the JSON file at path (at most 1 MiB; duplicate keys refused) and applies it as
 * config_parse_json does. Messages start with the path ("/etc/dapod.json: config.workers: ..."
 * or "/etc/dapod.json:3:5: <JSON syntax error>"). */
int config_load_file(struct config *c, const char *path, struct dapo_err *e);

/* Sets one key from text in the flags' syntax; name is the key ("max_body_bytes"). Errors name
 * `what` when non-NULL, else "config.<name>". Used by the flags and for the defaults. */
int config_set(struct config *c, const char *name, const char *value, const char *what,
               struct dapo_err *e);

/* Parses argv[1..argc-1] (argv[0] is the program or subcommand name and skipped): first the
 * action flags (--help returns at once), then --config FILE (loaded with config_load_file), then
 * every other flag over it. Positional arguments are refused. *action gets the action. */
int config_parse_args(struct config *c, int argc, char **argv, enum config_action *action,
                      struct dapo_err *e);

/* Resolves the auto fields for ncpu cores (0: the cores this process may run on) and checks the
 * rules between keys: tls_cert and tls_key both or neither; max_connections_per_ip <=
 * max_connections; sse_heartbeat_s < connection_timeout_s (else idle streams time out); and a
 * listen address that is not loopback needs api_keys (API.md). auto: workers = max(1, ncpu/2),
 * blas_threads = max(1, ncpu/workers), http_threads = min(8, max(2, ncpu/4)); web_dir "auto"
 * becomes DIR/../share/dapod/web or DIR/../web (DIR: the executable's folder), the first that
 * holds an index.html, else "" (no dashboard). */
int config_finish(struct config *c, int ncpu, struct dapo_err *e);

/* A CPU list ("0-3,6", CPUs below 1024) as flags. */
struct config_cpus {
  unsigned char on[1024]; /* on[i]: CPU i is listed */
  int n;                  /* CPUs listed */
};
/* Parses s into out; 0, or DAPO_EINVAL with a message naming the part at fault. */
int config_parse_cpus(const char *s, struct config_cpus *out, struct dapo_err *e);

/* The cores this process may run on (sched_getaffinity; at least 1). */
int config_cpu_count(void);

/* 1 when host is a loopback name or address: "localhost", 127.0.0.0/8, ::1, ::ffff:127.0.0.0/104.
 */
int config_is_loopback(const char *host);

/* "host:port", with brackets around an IPv6 host, into buf (cap bytes). Returns buf. */
const char *config_addr_format(const struct config_addr *a, char *buf, size_t cap);

/* The effective config as a JSON object in table order (auto fields unresolved print "auto";
 * sizes that are whole K/M/G/T print as "1M"). New reference, owned by the caller; NULL on OOM.
 * config_parse_json of it gives back the same config. */
json_t *config_to_json(const struct config *c);

/* config_to_json as indented text ending in a newline. Owned (free()); NULL on OOM. */
char *config_to_text(const struct config *c);

/* The documented example config: every key with its default, preceded by "_<key>": its help,
 * type and bounds. Independent of the machine (auto stays "auto"). Owned (free()); NULL on OOM.
 * systemd/dapod.example.json is this text, and a test keeps it so. */
char *config_example_text(void);

/* The number of keys of the configuration table (each has a flag, a line of help and a member of
 * the printed and example configurations). */
int config_key_count(void);

/* --help: usage and every flag with its type, bounds, default and help. */
void config_print_help(FILE *f);

#endif
