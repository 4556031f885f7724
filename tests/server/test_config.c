/* The daemon's config table (server/config.c) and logging (server/log.c): defaults, file, flags,
 * every error kind by key, sizes, addresses, the loopback rule, --print-config round trip, the
 * committed example config, and log lines (format, level filter, escaping, threads).
 * `test_config --write-example PATH` regenerates systemd/dapod.example.json. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "log.h"

#ifndef DAPO_EXAMPLE_CONFIG
#error "DAPO_EXAMPLE_CONFIG (path of systemd/dapod.example.json) must be defined"
#endif

static const char SHA_A[] = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
static const char SHA_B[] = "60303AE22B998861BCE3B28F33EEC1BE758A213C86C93C076DBE9F558C11C752";

static char tmpdir[64];

/* Writes text to tmpdir/name; returns the path (static buffer, valid until the next call). */
static const char *write_tmp(const char *name, const char *text) {
  static char path[256];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
  return path;
}

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (size_t k; (k = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
    n += k;
    if (n + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  buf[n] = 0;
  fclose(f);
  return buf;
}

static const char *str_of(const json_t *j) {
  return json_is_string(j) ? json_string_value(j) : "(not a string)";
}

/* Parses text as a config file over defaults; returns rc, message in e. */
static int parse_text(struct config *c, const char *text, struct dapo_err *e) {
  json_error_t jerr;
  json_t *j = json_loads(text, JSON_ALLOW_NUL, &jerr);
  if (!j) {
    fprintf(stderr, "bad test JSON %s: %s\n", text, jerr.text);
    exit(1);
  }
  int rc = config_parse_json(c, j, e);
  json_decref(j);
  return rc;
}

/* The file text must be refused with exactly msg. */
static void json_error_is(const char *text, const char *msg) {
  struct config c;
  struct dapo_err e = {0};
  CHECK(config_init(&c) == 0);
  int rc = parse_text(&c, text, &e);
  CHECK_MSG(rc != 0 && !strcmp(e.msg, msg), "%s -> rc %d '%s', want '%s'", text, rc, e.msg, msg);
  config_deinit(&c);
}

/* The file text must be refused with a message starting with prefix. */
static void json_error_starts(const char *text, const char *prefix) {
  struct config c;
  struct dapo_err e = {0};
  CHECK(config_init(&c) == 0);
  int rc = parse_text(&c, text, &e);
  CHECK_MSG(rc != 0 && !strncmp(e.msg, prefix, strlen(prefix)), "%s -> rc %d '%s', want '%s...'",
            text, rc, e.msg, prefix);
  config_deinit(&c);
}

/* Parses a NULL-terminated argv (argv[0] added) over c. */
static int args(struct config *c, enum config_action *act, struct dapo_err *e, ...) {
  char *argv[32] = {"serve"};
  int argc = 1;
  va_list ap;
  va_start(ap, e);
  for (char *a; argc < 31 && (a = va_arg(ap, char *));) argv[argc++] = a;
  va_end(ap);
  return config_parse_args(c, argc, argv, act, e);
}

static void flag_error_is(const char *flag, const char *value, const char *msg) {
  struct config c;
  struct dapo_err e = {0};
  enum config_action act;
  CHECK(config_init(&c) == 0);
  int rc = value ? args(&c, &act, &e, flag, value, NULL) : args(&c, &act, &e, flag, NULL);
  CHECK_MSG(rc != 0 && !strcmp(e.msg, msg), "%s %s -> rc %d '%s', want '%s'", flag,
            value ? value : "", rc, e.msg, msg);
  config_deinit(&c);
}

static void test_defaults(void) {
  struct config c;
  struct dapo_err e = {0};
  CHECK(config_init(&c) == 0);
  CHECK(!strcmp(c.listen.host, "127.0.0.1") && c.listen.port == 8080);
  CHECK(!strcmp(c.data_dir, "./var"));
  CHECK(!strcmp(c.models_dir, "./models"));
  CHECK(!strcmp(c.tls_cert, "") && !strcmp(c.tls_key, ""));
  CHECK(c.api_keys.n == 0);
  CHECK(c.workers == 0 && c.blas_threads == 0 && c.http_threads == 0); /* auto */
  CHECK(c.max_body_bytes == (1u << 20));
  CHECK(c.max_upload_bytes == (1u << 30));
  CHECK(c.max_json_depth == 64);
  CHECK(c.max_header_bytes == 32 * 1024);
  CHECK(c.max_connections == 256 && c.max_connections_per_ip == 64);
  CHECK(c.connection_timeout_s == 30);
  CHECK(c.max_sse_subscribers == 1000 && c.sse_backlog_events == 1000);
  CHECK(c.sse_heartbeat_s == 15);
  CHECK(c.max_jobs_per_key == 16 && c.max_queued_jobs == 1000);
  CHECK(c.shutdown_grace_s == 30);
  CHECK(c.judge_allowed_hosts.n == 3);
  if (c.judge_allowed_hosts.n == 3) {
    CHECK(!strcmp(c.judge_allowed_hosts.v[0], "127.0.0.1"));
    CHECK(!strcmp(c.judge_allowed_hosts.v[1], "localhost"));
    CHECK(!strcmp(c.judge_allowed_hosts.v[2], "::1"));
  }
  CHECK(c.log_level == LOG_LEVEL_INFO);
  CHECK(c.access_log == 1);
  CHECK(c.memory_limit_bytes == 0);
  CHECK(c.completion_threads == 1 && c.completion_queue == 8 && c.completion_wait_s == 60 &&
        c.completion_cache_models == 2);
  CHECK(c.job_check_inline_bytes == (uint64_t)1 << 20);

  /* no file, no flags: the defaults are valid as they are */
  CHECK(!strcmp(c.web_dir, "auto"));
  CHECK_MSG(config_finish(&c, 8, &e) == 0, "%s", e.msg);
  CHECK(c.workers == 4 && c.blas_threads == 2 && c.http_threads == 2);
  {
    /* web_dir auto: this binary is BUILD/tests/test_config, so BUILD/web (the dashboard the
     * build copies there) when it exists, else nothing; an explicit value is kept as it is */
    char exe[4096], want[8192], real[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(n > 0);
    exe[n > 0 ? n : 0] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(want, sizeof want, "%s/../web/index.html", exe);
    int have = access(want, R_OK) == 0;
    want[strlen(want) - strlen("/index.html")] = '\0';
    const char *w = have && realpath(want, real) ? real : "";
    CHECK_MSG(!strcmp(c.web_dir, w), "web_dir auto gave '%s', want '%s'", c.web_dir, w);
  }
  config_deinit(&c);
  CHECK(config_init(&c) == 0);
  CHECK(config_set(&c, "web_dir", "", NULL, &e) == 0);
  CHECK(config_finish(&c, 8, &e) == 0 && !strcmp(c.web_dir, ""));
  config_deinit(&c);

  /* compute_cpus: lists and ranges; each refusal names the part; one CPU must stay free */
  {
    struct config_cpus cpus;
    CHECK(config_parse_cpus("0-2,5,5,7", &cpus, &e) == 0 && cpus.n == 5);
    CHECK(cpus.on[0] && cpus.on[2] && !cpus.on[3] && cpus.on[5] && cpus.on[7] && !cpus.on[6]);
    CHECK(config_parse_cpus("3-1", &cpus, &e) != 0 && strstr(e.msg, "LOW <= HIGH"));
    CHECK(config_parse_cpus("0;1", &cpus, &e) != 0 && strstr(e.msg, "expected ','"));
    CHECK(config_parse_cpus("x", &cpus, &e) != 0 && strstr(e.msg, "'x'"));
    CHECK(config_parse_cpus("1024", &cpus, &e) != 0);
    CHECK(config_init(&c) == 0);
    CHECK(config_set(&c, "compute_cpus", "0-1", NULL, &e) == 0);
    CHECK(config_set(&c, "compute_cpus", "0-1023", NULL, &e) == 0);
    CHECK(config_finish(&c, 2, &e) != 0 && strstr(e.msg, "compute_cpus: lists 1024 CPUs of"));
    CHECK(config_set(&c, "compute_cpus", "0", NULL, &e) == 0);
    CHECK(config_finish(&c, 4, &e) == 0);
    config_deinit(&c);
    CHECK(config_init(&c) == 0);
    CHECK(config_set(&c, "compute_cpus", "1-", NULL, &e) == 0);
    CHECK(config_finish(&c, 4, &e) != 0 && strstr(e.msg, "compute_cpus: '1-'"));
    config_deinit(&c);
  }

  static const struct {
    int ncpu, workers, blas, http;
  } fits[] = {{1, 1, 1, 2},  {2, 1, 2, 2},   {3, 1, 3, 2},
              {16, 8, 2, 4}, {64, 32, 2, 8}, {256, 64, 4, 8}};
  for (size_t i = 0; i < sizeof fits / sizeof fits[0]; i++) {
    CHECK(config_init(&c) == 0);
    CHECK(config_finish(&c, fits[i].ncpu, &e) == 0);
    CHECK_MSG(c.workers == fits[i].workers && c.blas_threads == fits[i].blas &&
                  c.http_threads == fits[i].http,
              "ncpu %d: workers %d blas %d http %d", fits[i].ncpu, c.workers, c.blas_threads,
              c.http_threads);
    config_deinit(&c);
  }
  /* blas_threads follows explicit workers; explicit values stay */
  CHECK(config_init(&c) == 0);
  CHECK(config_set(&c, "workers", "3", NULL, &e) == 0);
  CHECK(config_finish(&c, 8, &e) == 0);
  CHECK(c.workers == 3 && c.blas_threads == 2);
  config_deinit(&c);
  CHECK(config_init(&c) == 0);
  CHECK(config_set(&c, "blas_threads", "5", NULL, &e) == 0);
  CHECK(config_finish(&c, 0, &e) == 0); /* the machine's cores */
  CHECK(c.blas_threads == 5 && c.workers >= 1 && c.workers <= 64);
  config_deinit(&c);
  CHECK(config_cpu_count() >= 1);
  config_deinit(NULL);
}

static void test_file(void) {
  struct config c;
  struct dapo_err e = {0};
  char text[2048];
  snprintf(text, sizeof text,
           "{\n"
           "  \"_comment\": \"comments are keys that start with _\",\n"
           "  \"listen\": \"[::1]:9090\",\n"
           "  \"data_dir\": \"/srv/dapod\",\n"
           "  \"models_dir\": \"/srv/models\",\n"
           "  \"workers\": 3,\n"
           "  \"_blas_threads\": 99,\n"
           "  \"http_threads\": \"auto\",\n"
           "  \"max_body_bytes\": \"2M\",\n"
           "  \"max_upload_bytes\": 5000000,\n"
           "  \"memory_limit_bytes\": \"16G\",\n"
           "  \"max_json_depth\": 10,\n"
           "  \"judge_allowed_hosts\": [\"judge.internal\", \"10.0.0.7\", \"fd00::7\"],\n"
           "  \"api_keys\": [{\"name\": \"ci\", \"sha256\": \"%s\"},\n"
           "               {\"name\": \"ops\", \"sha256\": \"%s\", \"admin\": true}],\n"
           "  \"tls_cert\": \"/etc/dapod/cert.pem\",\n"
           "  \"tls_key\": \"/etc/dapod/key.pem\",\n"
           "  \"log_level\": \"debug\",\n"
           "  \"access_log\": false\n"
           "}\n",
           SHA_A, SHA_B);
  const char *path = write_tmp("file.json", text);
  CHECK(config_init(&c) == 0);
  CHECK_MSG(config_load_file(&c, path, &e) == 0, "%s", e.msg);
  CHECK(!strcmp(c.listen.host, "::1") && c.listen.port == 9090);
  CHECK(!strcmp(c.data_dir, "/srv/dapod") && !strcmp(c.models_dir, "/srv/models"));
  CHECK(c.workers == 3 && c.blas_threads == 0 && c.http_threads == 0);
  CHECK(c.max_body_bytes == 2u << 20 && c.max_upload_bytes == 5000000);
  CHECK(c.memory_limit_bytes == (uint64_t)16 << 30);
  CHECK(c.max_json_depth == 10);
  CHECK(c.judge_allowed_hosts.n == 3 && !strcmp(c.judge_allowed_hosts.v[2], "fd00::7"));
  CHECK(c.api_keys.n == 2);
  if (c.api_keys.n == 2) {
    CHECK(!strcmp(c.api_keys.v[0].name, "ci") && !strcmp(c.api_keys.v[0].sha256, SHA_A));
    CHECK(c.api_keys.v[0].admin == 0 && c.api_keys.v[1].admin == 1);
    /* hashes are stored in lowercase */
    CHECK(!strcmp(c.api_keys.v[1].sha256,
                  "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"));
  }
  CHECK(c.log_level == LOG_LEVEL_DEBUG && c.access_log == 0);
  CHECK_MSG(config_finish(&c, 8, &e) == 0, "%s", e.msg);
  CHECK(c.blas_threads == 2);
  config_deinit(&c);

  /* file-level errors name the file, then the key or the JSON position */
  CHECK(config_init(&c) == 0);
  path = write_tmp("bad.json", "{\"workers\": 0}");
  CHECK(config_load_file(&c, path, &e) == DAPO_EINVAL);
  char want[512];
  snprintf(want, sizeof want, "%s: config.workers: 0 not in [1, 64]", path);
  CHECK_MSG(!strcmp(e.msg, want), "'%s'", e.msg);
  path = write_tmp("syntax.json", "{\n  \"workers\": 3,\n}\n");
  CHECK(config_load_file(&c, path, &e) == DAPO_EFORMAT);
  snprintf(want, sizeof want, "%s:3:", path);
  CHECK_MSG(!strncmp(e.msg, want, strlen(want)), "'%s'", e.msg);
  path = write_tmp("dup.json", "{\"workers\": 3, \"workers\": 4}");
  CHECK(config_load_file(&c, path, &e) == DAPO_EFORMAT);
  CHECK_MSG(strstr(e.msg, "duplicate") != NULL, "'%s'", e.msg);
  path = write_tmp("array.json", "[1, 2]");
  CHECK(config_load_file(&c, path, &e) == DAPO_EINVAL);
  snprintf(want, sizeof want, "%s: config: expected a JSON object of settings", path);
  CHECK_MSG(!strcmp(e.msg, want), "'%s'", e.msg);
  snprintf(want, sizeof want, "%s/missing.json", tmpdir);
  CHECK(config_load_file(&c, want, &e) == DAPO_EIO);
  CHECK_MSG(strstr(e.msg, "missing.json: No such file") != NULL, "'%s'", e.msg);
  CHECK(config_load_file(&c, tmpdir, &e) != 0); /* a directory */
  /* over 1 MiB */
  char *big = malloc((1 << 20) + 64);
  memset(big, ' ', (1 << 20) + 32);
  big[0] = '{';
  memcpy(big + (1 << 20) + 30, "}", 2);
  path = write_tmp("big.json", big);
  free(big);
  CHECK(config_load_file(&c, path, &e) == DAPO_ERANGE);
  config_deinit(&c);
}

static void test_flags(void) {
  struct config c;
  struct dapo_err e = {0};
  enum config_action act;
  const char *path = write_tmp("base.json", "{\"workers\": 3, \"max_body_bytes\": \"4M\", "
                                            "\"data_dir\": \"/from/file\", \"access_log\": false}");
  char keyarg[200];
  snprintf(keyarg, sizeof keyarg, "ci:%s:admin,bot:%s", SHA_A, SHA_B);

  /* flags win over the file wherever --config stands; both --k v and --k=v */
  CHECK(config_init(&c) == 0);
  int rc = args(&c, &act, &e, "--workers", "5", "--config", path, "--max-body-bytes=2M", "--listen",
                "[::1]:0", "--access-log", "--log-level=warn", "--judge-allowed-hosts",
                "a.example,b.example", "--api-keys", keyarg, "--blas-threads=auto", NULL);
  CHECK_MSG(rc == 0, "%s", e.msg);
  CHECK(act == CONFIG_RUN);
  CHECK(c.workers == 5);
  CHECK(c.max_body_bytes == 2u << 20);
  CHECK(!strcmp(c.data_dir, "/from/file")); /* from the file, no flag */
  CHECK(!strcmp(c.listen.host, "::1") && c.listen.port == 0);
  CHECK(c.access_log == 1);
  CHECK(c.log_level == LOG_LEVEL_WARN);
  CHECK(c.judge_allowed_hosts.n == 2 && !strcmp(c.judge_allowed_hosts.v[1], "b.example"));
  CHECK(c.api_keys.n == 2 && c.api_keys.v[0].admin == 1 && c.api_keys.v[1].admin == 0);
  CHECK(c.blas_threads == 0);
  config_deinit(&c);

  /* bool flag with a value word; JSON forms of lists and keys; --config=FILE */
  char keyjson[300];
  snprintf(keyjson, sizeof keyjson, "[{\"name\":\"x\",\"sha256\":\"%s\",\"admin\":true}]", SHA_A);
  CHECK(config_init(&c) == 0);
  rc = args(&c, &act, &e, "--access-log", "true", "--config=" /* below */, NULL);
  CHECK(rc != 0 && !strcmp(e.msg, "--config: missing FILE"));
  char cfgarg[300];
  snprintf(cfgarg, sizeof cfgarg, "--config=%s", path);
  rc = args(&c, &act, &e, "--access-log", "true", cfgarg, "--judge-allowed-hosts",
            "[\"h1\", \"::1\"]", "--api-keys", keyjson, "--print-config", NULL);
  CHECK_MSG(rc == 0, "%s", e.msg);
  CHECK(act == CONFIG_PRINT);
  CHECK(c.access_log == 1 && c.workers == 3);
  CHECK(c.judge_allowed_hosts.n == 2 && c.api_keys.n == 1 && c.api_keys.v[0].admin == 1);
  rc = args(&c, &act, &e, "--access-log=false", "--api-keys", "", NULL);
  CHECK(rc == 0 && c.access_log == 0 && c.api_keys.n == 0);
  config_deinit(&c);

  /* actions: --help wins over anything; the example needs no file */
  CHECK(config_init(&c) == 0);
  CHECK(args(&c, &act, &e, "--bogus", "--help", NULL) == 0 && act == CONFIG_HELP);
  CHECK(args(&c, &act, &e, "-h", NULL) == 0 && act == CONFIG_HELP);
  CHECK(args(&c, &act, &e, "--config", "/nonexistent/x.json", "--print-example-config", NULL) ==
            0 &&
        act == CONFIG_PRINT_EXAMPLE);
  CHECK(args(&c, &act, &e, "--config", "/nonexistent/x.json", NULL) == DAPO_EIO);
  CHECK_MSG(strstr(e.msg, "/nonexistent/x.json") != NULL, "'%s'", e.msg);
  /* a bad flag is reported before the file is read */
  CHECK(args(&c, &act, &e, "--config", "/nonexistent/x.json", "--nope", "1", NULL) != 0);
  CHECK_MSG(!strcmp(e.msg, "--nope: unknown flag (see --help)"), "'%s'", e.msg);
  config_deinit(&c);

  flag_error_is("--workers", "0", "--workers: 0 not in [1, 64]");
  flag_error_is("--completion-threads", "0", "--completion-threads: 0 not in [1, 64]");
  flag_error_is("--job-check-inline-bytes", "2x",
                "--job-check-inline-bytes: '2x' is not a size (whole bytes, optionally with a K, "
                "M, G or T suffix)");
  flag_error_is("--completion-queue", "auto", "--completion-queue: 'auto' is not an integer");
  flag_error_is("--completion-cache-models", "-1", "--completion-cache-models: -1 not in [0, 64]");
  flag_error_is("--workers=x", NULL, "--workers: 'x' is not an integer or \"auto\"");
  flag_error_is("--max-json-depth", "auto", "--max-json-depth: 'auto' is not an integer");
  flag_error_is("--workers", NULL, "--workers: missing value");
  flag_error_is("--max_body_bytes", "1M",
                "--max_body_bytes: unknown flag (flags write '_' as '-': --max-body-bytes)");
  flag_error_is("--frobnicate", "1", "--frobnicate: unknown flag (see --help)");
  flag_error_is("serve", NULL, "unexpected argument 'serve' (see --help)");
  flag_error_is("--", NULL, "unexpected argument '--' (see --help)");
  flag_error_is("--access-log=maybe", NULL, "--access-log: 'maybe' is not true or false");
  flag_error_is("--max-body-bytes", "1.5M",
                "--max-body-bytes: '1.5M' is not a size (whole bytes, optionally with a K, M, G "
                "or T suffix)");
  flag_error_is("--log-level", "loud",
                "--log-level: 'loud' is not one of debug, info, warn, error");
  flag_error_is("--listen", "8080", "--listen: '8080' is not HOST:PORT (missing port)");
  flag_error_is("--judge-allowed-hosts", "a,,b", "--judge-allowed-hosts[1]: empty host");
  flag_error_is("--judge-allowed-hosts", "a,", "--judge-allowed-hosts[1]: empty host");
  flag_error_is("--judge-allowed-hosts", "", "--judge-allowed-hosts: needs at least 1 entry");
  flag_error_is("--judge-allowed-hosts", "[1]", "--judge-allowed-hosts[0]: expected a string");
  flag_error_is("--api-keys", "ci", "--api-keys[0]: expected NAME:SHA256 or NAME:SHA256:admin");
  flag_error_is("--api-keys", "ci:abc",
                "--api-keys[0].sha256: expected 64 hex digits, the SHA-256 of the key (never the "
                "key itself)");
  char bad[200];
  snprintf(bad, sizeof bad, "ci:%s:root", SHA_A);
  flag_error_is("--api-keys", bad, "--api-keys[0]: expected NAME:SHA256 or NAME:SHA256:admin");
  snprintf(bad, sizeof bad, "ci:%s,", SHA_A);
  flag_error_is("--api-keys", bad, "--api-keys: trailing ','");
  /* a JSON value that does not parse names the flag */
  struct config c2;
  CHECK(config_init(&c2) == 0);
  CHECK(args(&c2, &act, &e, "--api-keys", "[{\"name\": ", NULL) == DAPO_EINVAL);
  CHECK_MSG(!strncmp(e.msg, "--api-keys: ", 12), "'%s'", e.msg);
  config_deinit(&c2);
}

static void test_errors(void) {
  /* the brief's example, verbatim */
  json_error_is("{\"workers\": 0}", "config.workers: 0 not in [1, 64]");
  json_error_is("{\"workers\": 65}", "config.workers: 65 not in [1, 64]");
  json_error_is("{\"workers\": \"4\"}", "config.workers: expected an integer or \"auto\"");
  json_error_is("{\"workers\": 1.5}", "config.workers: expected an integer or \"auto\"");
  json_error_is("{\"workers\": null}", "config.workers: expected an integer or \"auto\"");
  json_error_is("{\"max_json_depth\": \"auto\"}", "config.max_json_depth: expected an integer");
  json_error_is("{\"shutdown_grace_s\": -1}", "config.shutdown_grace_s: -1 not in [0, 3600]");
  json_error_is("{\"workerz\": 4}", "config.workerz: unknown key");
  json_error_is("{\"max_body_bytes\": \"12X\"}",
                "config.max_body_bytes: '12X' is not a size (whole bytes, optionally with a K, "
                "M, G or T suffix)");
  json_error_is("{\"max_body_bytes\": 512}", "config.max_body_bytes: 512 not in [1K, 1G]");
  json_error_is("{\"max_body_bytes\": \"2G\"}", "config.max_body_bytes: 2G not in [1K, 1G]");
  json_error_is("{\"max_body_bytes\": -1}", "config.max_body_bytes: -1 is negative");
  json_error_is("{\"max_body_bytes\": true}",
                "config.max_body_bytes: expected a size: a whole number of bytes or a string "
                "such as \"1M\"");
  json_error_is("{\"access_log\": 1}", "config.access_log: expected true or false");
  json_error_is("{\"log_level\": \"loud\"}",
                "config.log_level: 'loud' is not one of debug, info, warn, error");
  json_error_is("{\"log_level\": 1}", "config.log_level: expected a string");
  json_error_is("{\"data_dir\": \"\"}", "config.data_dir: must not be empty");
  json_error_is("{\"data_dir\": 5}", "config.data_dir: expected a string");
  json_error_is("{\"data_dir\": \"a\\u0000b\"}", "config.data_dir: contains a NUL character");
  json_error_is("{\"listen\": 8080}", "config.listen: expected a string \"HOST:PORT\"");
  json_error_is("{\"listen\": \"localhost\"}",
                "config.listen: 'localhost' is not HOST:PORT (missing port)");
  json_error_is("{\"judge_allowed_hosts\": \"x\"}",
                "config.judge_allowed_hosts: expected an array of strings");
  json_error_is("{\"judge_allowed_hosts\": [1]}",
                "config.judge_allowed_hosts[0]: expected a string");
  json_error_is("{\"judge_allowed_hosts\": [\"ok\", \"bad host\"]}",
                "config.judge_allowed_hosts[1]: 'bad host' is not a host name or address");
  json_error_is("{\"judge_allowed_hosts\": [\"[::1]\"]}",
                "config.judge_allowed_hosts[0]: '[::1]': write IPv6 addresses without brackets");
  json_error_is("{\"judge_allowed_hosts\": [\"1::2::3\"]}",
                "config.judge_allowed_hosts[0]: '1::2::3' is not an IPv6 address");
  json_error_is("{\"judge_allowed_hosts\": [\"300.1.1.1\"]}",
                "config.judge_allowed_hosts[0]: '300.1.1.1' is not an IPv4 address");
  json_error_is("{\"judge_allowed_hosts\": []}",
                "config.judge_allowed_hosts: needs at least 1 entry");
  json_error_is("[]", "config: expected a JSON object of settings");

  /* api_keys: each field named with the entry's index */
  char t[512];
  json_error_is("{\"api_keys\": {}}",
                "config.api_keys: expected an array of {\"name\", \"sha256\", \"admin\"} objects");
  json_error_is("{\"api_keys\": [\"k\"]}",
                "config.api_keys[0]: expected an object {\"name\", \"sha256\", \"admin\"}");
  snprintf(t, sizeof t, "{\"api_keys\": [{\"sha256\": \"%s\"}]}", SHA_A);
  json_error_is(t, "config.api_keys[0].name: missing");
  json_error_is("{\"api_keys\": [{\"name\": \"ci\"}]}", "config.api_keys[0].sha256: missing");
  json_error_is("{\"api_keys\": [{\"name\": \"ci\", \"sha256\": \"secret-key\"}]}",
                "config.api_keys[0].sha256: expected 64 hex digits, the SHA-256 of the key (never "
                "the key itself)");
  json_error_is("{\"api_keys\": [{\"name\": \"ci\", \"key\": \"secret\"}]}",
                "config.api_keys[0].key: unknown field (give the key's SHA-256 as sha256, never "
                "the key)");
  snprintf(t, sizeof t, "{\"api_keys\": [{\"name\": \"ci\", \"sha256\": \"%s\", \"admin\": 1}]}",
           SHA_A);
  json_error_is(t, "config.api_keys[0].admin: expected true or false");
  snprintf(t, sizeof t, "{\"api_keys\": [{\"name\": \"c i\", \"sha256\": \"%s\"}]}", SHA_A);
  json_error_is(t, "config.api_keys[0].name: only letters, digits, '.', '_' and '-'");
  snprintf(t, sizeof t, "{\"api_keys\": [{\"name\": \"\", \"sha256\": \"%s\"}]}", SHA_A);
  json_error_is(t, "config.api_keys[0].name: expected 1 to 64 characters");
  snprintf(t, sizeof t,
           "{\"api_keys\": [{\"name\": \"a\", \"sha256\": \"%s\"}, {\"name\": \"a\", \"sha256\": "
           "\"%s\"}]}",
           SHA_A, SHA_B);
  json_error_is(t, "config.api_keys[1].name: 'a' is used twice");
  snprintf(t, sizeof t,
           "{\"api_keys\": [{\"name\": \"a\", \"sha256\": \"%s\"}, {\"name\": \"b\", \"sha256\": "
           "\"%s\"}]}",
           SHA_B, SHA_B);
  json_error_is(t, "config.api_keys[1].sha256: the same hash as key 'a'");

  /* '_' keys are comments, of any type */
  struct config c;
  struct dapo_err e = {0};
  CHECK(config_init(&c) == 0);
  CHECK(parse_text(&c, "{\"_workers\": 0, \"_x\": {\"y\": [1]}, \"_\": null}", &e) == 0);
  CHECK(c.workers == 0);
  /* config_set names its key, or `what` when given */
  CHECK(config_set(&c, "nope", "1", NULL, &e) == DAPO_EINVAL);
  CHECK(!strcmp(e.msg, "config.nope: unknown key"));
  CHECK(config_set(&c, "workers", "99", "WORKERS", &e) == DAPO_EINVAL);
  CHECK(!strcmp(e.msg, "WORKERS: 99 not in [1, 64]"));
  config_deinit(&c);
  json_error_starts("{\"tls_cert\": \"x\", \"workers\": -3}", "config.workers: -3 not in");
}

static void test_sizes(void) {
  static const struct {
    const char *text;
    uint64_t want;
  } ok[] = {{"0", 0},
            {"1", 1},
            {"1K", 1024},
            {"1k", 1024},
            {"3M", 3u << 20},
            {"1m", 1u << 20},
            {"2G", (uint64_t)2 << 30},
            {"1g", (uint64_t)1 << 30},
            {"1T", (uint64_t)1 << 40},
            {"1048576", 1 << 20},
            {"1024T", (uint64_t)1 << 50}};
  struct config c;
  struct dapo_err e = {0};
  CHECK(config_init(&c) == 0);
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    int rc = config_set(&c, "memory_limit_bytes", ok[i].text, NULL, &e);
    CHECK_MSG(rc == 0 && c.memory_limit_bytes == ok[i].want, "%s -> %d %llu '%s'", ok[i].text, rc,
              (unsigned long long)c.memory_limit_bytes, e.msg);
  }
  static const char *const bad[] = {"",    "K",  "1.5M", "-1",  " 1M", "1M ",
                                    "1KB", "1E", "0x10", "1 K", "+1K", "1MiB"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = config_set(&c, "memory_limit_bytes", bad[i], NULL, &e);
    CHECK_MSG(rc == DAPO_EINVAL && strstr(e.msg, "is not a size"), "'%s' -> %d '%s'", bad[i], rc,
              e.msg);
  }
  CHECK(config_set(&c, "memory_limit_bytes", "99999999999999G", NULL, &e) == DAPO_EINVAL);
  CHECK_MSG(!strcmp(e.msg, "config.memory_limit_bytes: '99999999999999G' is too large"), "'%s'",
            e.msg);
  CHECK(config_set(&c, "memory_limit_bytes", "99999999999999999999", NULL, &e) == DAPO_EINVAL);
  CHECK(config_set(&c, "memory_limit_bytes", "1025T", NULL, &e) == DAPO_EINVAL);
  CHECK_MSG(!strcmp(e.msg, "config.memory_limit_bytes: 1025T not in [0, 1024T]"), "'%s'", e.msg);
  CHECK(config_set(&c, "max_upload_bytes", "1000", NULL, &e) == DAPO_EINVAL);
  CHECK_MSG(!strcmp(e.msg, "config.max_upload_bytes: 1000 not in [1K, 1T]"), "'%s'", e.msg);
  CHECK(config_set(&c, "max_upload_bytes", "1025", NULL, &e) == 0);
  CHECK(c.max_upload_bytes == 1025);
  /* JSON integers and strings alike */
  CHECK(parse_text(&c, "{\"max_body_bytes\": 65536, \"max_header_bytes\": \"8K\"}", &e) == 0);
  CHECK(c.max_body_bytes == 65536 && c.max_header_bytes == 8192);
  config_deinit(&c);
}

static void test_addresses(void) {
  static const struct {
    const char *text, *host;
    int port;
    const char *formatted;
  } ok[] = {{"127.0.0.1:8080", "127.0.0.1", 8080, "127.0.0.1:8080"},
            {"[::1]:8080", "::1", 8080, "[::1]:8080"},
            {"[::]:0", "::", 0, "[::]:0"},
            {"[fe80::1:2]:65535", "fe80::1:2", 65535, "[fe80::1:2]:65535"},
            {"0.0.0.0:80", "0.0.0.0", 80, "0.0.0.0:80"},
            {"localhost:1", "localhost", 1, "localhost:1"},
            {"api.example.com:443", "api.example.com", 443, "api.example.com:443"},
            {"h:007", "h", 7, "h:7"}};
  struct config c;
  struct dapo_err e = {0};
  CHECK(config_init(&c) == 0);
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    int rc = config_set(&c, "listen", ok[i].text, NULL, &e);
    char buf[300];
    CHECK_MSG(rc == 0 && !strcmp(c.listen.host, ok[i].host) && c.listen.port == ok[i].port &&
                  !strcmp(config_addr_format(&c.listen, buf, sizeof buf), ok[i].formatted),
              "%s -> %d '%s' %s:%d", ok[i].text, rc, e.msg, c.listen.host, c.listen.port);
  }
  static const struct {
    const char *text, *msg;
  } bad[] = {
      {"::1:8080", "config.listen: '::1:8080': an IPv6 address goes in brackets, as in [::1]:8080"},
      {"[::1]", "config.listen: '[::1]' is not [IPV6]:PORT (missing port)"},
      {"[::1]8080", "config.listen: '[::1]8080' is not [IPV6]:PORT (missing port)"},
      {"[::1:8080", "config.listen: missing ']' in '[::1:8080'"},
      {"[zz]:80", "config.listen: 'zz' is not an IPv6 address"},
      {"[127.0.0.1]:80", "config.listen: '127.0.0.1' is not an IPv6 address"},
      {"[::1]:", "config.listen: missing port in '[::1]:'"},
      {"host:", "config.listen: missing port in 'host:'"},
      {":80", "config.listen: missing host in ':80'"},
      {"h:65536", "config.listen: port 65536 not in [0, 65535]"},
      {"h:99999999999999999999", "config.listen: port '99999999999999999999' is not a number"},
      {"h:-1", "config.listen: port '-1' is not a number"},
      {"h:+80", "config.listen: port '+80' is not a number"},
      {"h:80x", "config.listen: port '80x' is not a number"},
      {"h: 80", "config.listen: port ' 80' is not a number"},
      {"999.1.1.1:80", "config.listen: '999.1.1.1' is not an IPv4 address"},
      {"bad host:80", "config.listen: 'bad host' is not a host name or address"},
      {"-h:80", "config.listen: '-h' is not a host name or address"},
      {"", "config.listen: '' is not HOST:PORT (missing port)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = config_set(&c, "listen", bad[i].text, NULL, &e);
    CHECK_MSG(rc == DAPO_EINVAL && !strcmp(e.msg, bad[i].msg), "'%s' -> %d '%s', want '%s'",
              bad[i].text, rc, e.msg, bad[i].msg);
  }
  config_deinit(&c);

  static const struct {
    const char *host;
    int loop;
  } loops[] = {{"localhost", 1},
               {"LocalHost", 1},
               {"127.0.0.1", 1},
               {"127.255.0.9", 1},
               {"::1", 1},
               {"::ffff:127.0.0.1", 1},
               {"0.0.0.0", 0},
               {"::", 0},
               {"128.0.0.1", 0},
               {"10.0.0.1", 0},
               {"example.com", 0},
               {"::2", 0},
               {"::ffff:10.0.0.1", 0},
               {"localhost.example.com", 0}};
  for (size_t i = 0; i < sizeof loops / sizeof loops[0]; i++)
    CHECK_MSG(config_is_loopback(loops[i].host) == loops[i].loop, "%s", loops[i].host);
}

/* listen text + extra flags -> config_finish rc and message */
static int finish_with(const char *listen, const char *keys, struct dapo_err *e) {
  struct config c;
  CHECK(config_init(&c) == 0);
  int rc = config_set(&c, "listen", listen, NULL, e);
  if (!rc && keys) rc = config_set(&c, "api_keys", keys, NULL, e);
  if (!rc) rc = config_finish(&c, 4, e);
  config_deinit(&c);
  return rc;
}

static void test_cross_field(void) {
  struct dapo_err e = {0};
  CHECK(finish_with("0.0.0.0:8080", NULL, &e) == DAPO_EINVAL);
  CHECK_MSG(!strcmp(e.msg, "listen 0.0.0.0:8080 is not a loopback address and no api_keys are "
                           "configured: refusing to serve unauthenticated"),
            "'%s'", e.msg);
  CHECK(finish_with("[::]:8080", NULL, &e) == DAPO_EINVAL);
  CHECK_MSG(!strcmp(e.msg, "listen [::]:8080 is not a loopback address and no api_keys are "
                           "configured: refusing to serve unauthenticated"),
            "'%s'", e.msg);
  CHECK(finish_with("192.168.1.5:80", NULL, &e) == DAPO_EINVAL);
  CHECK(finish_with("dapod.example.com:80", NULL, &e) == DAPO_EINVAL);
  static const char *const loop[] = {"127.0.0.1:8080", "127.1.2.3:1", "localhost:8080",
                                     "[::1]:8080", "[::ffff:127.0.0.1]:9"};
  for (size_t i = 0; i < sizeof loop / sizeof loop[0]; i++)
    CHECK_MSG(finish_with(loop[i], NULL, &e) == 0, "%s: %s", loop[i], e.msg);
  /* with a key, any address */
  char key[128];
  snprintf(key, sizeof key, "ci:%s", SHA_A);
  CHECK_MSG(finish_with("0.0.0.0:8080", key, &e) == 0, "%s", e.msg);
  CHECK_MSG(finish_with("[::]:8080", key, &e) == 0, "%s", e.msg);

  struct config c;
  CHECK(config_init(&c) == 0);
  CHECK(config_set(&c, "tls_cert", "/c.pem", NULL, &e) == 0);
  CHECK(config_finish(&c, 4, &e) == DAPO_EINVAL);
  CHECK_MSG(!strcmp(e.msg, "tls_cert and tls_key go together: tls_cert is set, tls_key is empty"),
            "'%s'", e.msg);
  CHECK(config_set(&c, "tls_key", "/k.pem", NULL, &e) == 0);
  CHECK(config_finish(&c, 4, &e) == 0);
  CHECK(config_set(&c, "tls_cert", "", NULL, &e) == 0);
  CHECK(config_finish(&c, 4, &e) == DAPO_EINVAL);
  CHECK_MSG(!strcmp(e.msg, "tls_cert and tls_key go together: tls_key is set, tls_cert is empty"),
            "'%s'", e.msg);
  CHECK(config_set(&c, "tls_key", "", NULL, &e) == 0);
  CHECK(config_set(&c, "max_connections_per_ip", "300", NULL, &e) == 0);
  CHECK(config_finish(&c, 4, &e) == DAPO_EINVAL);
  CHECK_MSG(!strcmp(e.msg, "max_connections_per_ip (300) is more than max_connections (256)"),
            "'%s'", e.msg);
  CHECK(config_set(&c, "max_connections", "300", NULL, &e) == 0);
  CHECK(config_finish(&c, 4, &e) == 0);
  CHECK(config_set(&c, "sse_heartbeat_s", "30", NULL, &e) == 0);
  CHECK(config_finish(&c, 4, &e) == DAPO_EINVAL);
  CHECK_MSG(!strcmp(e.msg, "sse_heartbeat_s (30) must be less than connection_timeout_s (30): idle "
                           "event streams would time out"),
            "'%s'", e.msg);
  config_deinit(&c);
}

/* c -> --print-config text -> parsed over fresh defaults -> the same JSON */
static void round_trip(const struct config *c, const char *label) {
  char *text = config_to_text(c);
  CHECK(text && text[strlen(text) - 1] == '\n');
  const char *path = write_tmp("printed.json", text ? text : "");
  struct config d;
  struct dapo_err e = {0};
  CHECK(config_init(&d) == 0);
  CHECK_MSG(config_load_file(&d, path, &e) == 0, "%s: %s", label, e.msg);
  json_t *a = config_to_json(c), *b = config_to_json(&d);
  CHECK_MSG(a && b && json_equal(a, b), "%s: round trip differs:\n%s", label, text);
  json_decref(a);
  json_decref(b);
  config_deinit(&d);
  free(text);
}

static void test_print_round_trip(void) {
  struct config c;
  struct dapo_err e = {0};
  enum config_action act;
  CHECK(config_init(&c) == 0);
  round_trip(&c, "defaults, auto unresolved");
  char keys[300];
  snprintf(keys, sizeof keys, "ci:%s,root:%s:admin", SHA_A, SHA_B);
  int rc = args(&c, &act, &e, "--listen", "[::]:9000", "--api-keys", keys, "--max-body-bytes",
                "1500", "--max-upload-bytes", "3G", "--memory-limit-bytes", "1536M",
                "--judge-allowed-hosts", "j1,10.1.2.3,fd00::1", "--tls-cert", "/a b/c.pem",
                "--tls-key", "/a \"b\"/k.pem", "--log-level", "error", "--access-log", "false",
                "--data-dir", "/var/lib/dapod", "--http-threads", "3", NULL);
  CHECK_MSG(rc == 0, "%s", e.msg);
  CHECK_MSG(config_finish(&c, 12, &e) == 0, "%s", e.msg);
  round_trip(&c, "non-defaults, resolved");
  json_t *j = config_to_json(&c);
  /* the printed form: sizes with exact suffixes, addresses with brackets, resolved threads */
  CHECK(!strcmp(str_of(json_object_get(j, "listen")), "[::]:9000"));
  CHECK(json_integer_value(json_object_get(j, "max_body_bytes")) == 1500);
  CHECK(!strcmp(str_of(json_object_get(j, "max_upload_bytes")), "3G"));
  CHECK(!strcmp(str_of(json_object_get(j, "memory_limit_bytes")), "1536M"));
  CHECK(json_integer_value(json_object_get(j, "workers")) == 6);
  CHECK(json_integer_value(json_object_get(j, "blas_threads")) == 2);
  CHECK(json_integer_value(json_object_get(j, "http_threads")) == 3);
  CHECK(json_is_true(json_object_get(json_array_get(json_object_get(j, "api_keys"), 1), "admin")));
  /* every key is printed, nothing else */
  CHECK((int)json_object_size(j) == config_key_count());

  /* every printed key has a flag of the same name ('_' as '-') that takes the printed value */
  struct config d;
  CHECK(config_init(&d) == 0);
  const char *k;
  json_t *v;
  json_object_foreach(j, k, v) {
    char flag[96], *text;
    snprintf(flag, sizeof flag, "--%s", k);
    for (char *p = flag; *p; p++)
      if (*p == '_') *p = '-';
    if (json_is_string(v))
      text = strdup(json_string_value(v));
    else
      text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    rc = args(&d, &act, &e, flag, text, NULL);
    CHECK_MSG(rc == 0, "%s %s: %s", flag, text, e.msg);
    free(text);
  }
  json_t *jd = config_to_json(&d);
  CHECK_MSG(json_equal(j, jd), "flags built from --print-config give another config");
  json_decref(jd);
  config_deinit(&d);
  json_decref(j);
  config_deinit(&c);
}

static void test_example(void) {
  char *text = config_example_text();
  CHECK(text != NULL);
  char *committed = read_all(DAPO_EXAMPLE_CONFIG);
  CHECK_MSG(committed != NULL, "cannot read %s", DAPO_EXAMPLE_CONFIG);
  CHECK_MSG(text && committed && !strcmp(text, committed),
            "%s is stale; regenerate it with: tests/test_config --write-example %s",
            DAPO_EXAMPLE_CONFIG, DAPO_EXAMPLE_CONFIG);
  free(committed);

  /* the example parses to exactly the defaults, and documents every key beside it */
  struct config c, d;
  struct dapo_err e = {0};
  CHECK(config_init(&c) == 0 && config_init(&d) == 0);
  CHECK_MSG(config_load_file(&c, DAPO_EXAMPLE_CONFIG, &e) == 0, "%s", e.msg);
  json_t *a = config_to_json(&c), *b = config_to_json(&d);
  CHECK(json_equal(a, b));
  json_error_t jerr;
  json_t *ex = json_loads(text ? text : "{}", 0, &jerr);
  const char *k;
  json_t *v;
  int n = 0;
  json_object_foreach(b, k, v) {
    char ck[96];
    snprintf(ck, sizeof ck, "_%s", k);
    CHECK_MSG(json_is_string(json_object_get(ex, ck)), "%s lacks its %s comment", k, ck);
    n++;
  }
  CHECK(n == config_key_count());
  CHECK(json_is_string(json_object_get(ex, "_comment")));
  CHECK(!strcmp(str_of(json_object_get(ex, "workers")), "auto"));
  json_decref(ex);
  json_decref(a);
  json_decref(b);
  config_deinit(&c);
  config_deinit(&d);
  free(text);
}

static void test_help(void) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  config_print_help(f);
  fclose(f);
  static const char *const want[] = {
      "--listen HOST:PORT (default: 127.0.0.1:8080)",
      "--data-dir PATH (default: ./var)",
      "--models-dir PATH (default: ./models)",
      "--workers N|auto (default: auto)",
      "--blas-threads N|auto (default: auto)",
      "--max-body-bytes BYTES (default: 1M)",
      "--max-upload-bytes BYTES (default: 1G)",
      "--max-connections-per-ip N (default: 64)",
      "--judge-allowed-hosts HOST,... (default: 127.0.0.1,localhost,::1)",
      "--api-keys NAME:SHA256[:admin],... (default: none)",
      "--log-level LEVEL (default: info)",
      "--access-log [true|false] (default: true)",
      "--config FILE",
      "--print-config",
      "--print-example-config",
      "HTTP server threads; auto: min(8, max(2, cores / 4)). (integer in [1, 1024], or \"auto\")",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    CHECK_MSG(strstr(buf, want[i]) != NULL, "help lacks '%s'", want[i]);
  /* one flag line per key: count "(default: " */
  int lines = 0;
  for (const char *p = buf; (p = strstr(p, "(default: ")); p++) lines++;
  CHECK(lines == config_key_count());
  /* nothing wider than 100 columns */
  for (const char *p = buf; *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    CHECK_MSG(len <= 100, "help line too wide: %.*s", (int)len, p);
    p += len + (nl != NULL);
  }
  free(buf);
}

/* ---- logging ---- */

static int evaluated;
static int touch(void) {
  return ++evaluated;
}

/* A well-formed line: "YYYY-MM-DDTHH:MM:SS.mmmZ LEVEL " then the message. */
static int line_ok(const char *line, size_t len, const char *level) {
  static const char pat[] = "dddd-dd-ddTdd:dd:dd.dddZ ";
  if (len < sizeof pat) return 0;
  for (size_t i = 0; i < sizeof pat - 1; i++)
    if (pat[i] == 'd' ? (line[i] < '0' || line[i] > '9') : line[i] != pat[i]) return 0;
  size_t ll = strlen(level);
  return !strncmp(line + sizeof pat - 1, level, ll) && line[sizeof pat - 1 + ll] == ' ';
}

struct writer {
  int id;
};

static void *log_thread(void *arg) {
  int id = ((struct writer *)arg)->id;
  char pad[301];
  memset(pad, 'a' + id, 300);
  pad[300] = 0;
  for (int i = 0; i < 300; i++) LOG(INFO, "thread %d line %d %s end", id, i, pad);
  return NULL;
}

static void test_log(void) {
  enum log_level l = LOG_LEVEL_ERROR;
  CHECK(log_level_parse("debug", &l) == 0 && l == LOG_LEVEL_DEBUG);
  CHECK(log_level_parse("warn", &l) == 0 && l == LOG_LEVEL_WARN);
  CHECK(log_level_parse("WARN", &l) == DAPO_EINVAL && l == LOG_LEVEL_WARN);
  CHECK(log_level_parse("warning", &l) == DAPO_EINVAL);
  CHECK(log_level_parse(NULL, &l) == DAPO_EINVAL);
  CHECK(!strcmp(log_level_name(LOG_LEVEL_ERROR), "error"));
  CHECK(!strcmp(log_level_name((enum log_level)9), "?"));

  char path[256];
  snprintf(path, sizeof path, "%s/log.txt", tmpdir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
  CHECK(fd >= 0);
  int old = log_set_fd(fd);
  CHECK(old == 2);
  log_set_level(LOG_LEVEL_INFO);
  CHECK(log_get_level() == LOG_LEVEL_INFO);
  CHECK(!log_enabled(LOG_LEVEL_DEBUG) && log_enabled(LOG_LEVEL_INFO));

  evaluated = 0;
  LOG(DEBUG, "hidden %d", touch()); /* below the threshold: arguments not evaluated */
  CHECK(evaluated == 0);
  LOG(WARN, "shown %d", touch());
  CHECK(evaluated == 1);
  LOG(INFO, "two\nlines\r and a \x01 tab\there");
  LOG(ERROR, "no arguments");
  log_access("GET", "/v1/jobs?limit=5", 200, 3.25);
  log_access(NULL, NULL, 500, 0);
  log_set_level(LOG_LEVEL_ERROR);
  log_access("GET", "/hidden", 200, 1); /* access lines are INFO */
  LOG(WARN, "hidden too");
  log_set_level(LOG_LEVEL_DEBUG);
  LOG(DEBUG, "debug %s", "now");
  char *big = malloc(3 * LOG_LINE_MAX);
  memset(big, 'x', 3 * LOG_LINE_MAX - 1);
  big[3 * LOG_LINE_MAX - 1] = 0;
  LOG(INFO, "%s", big);
  memset(big, '\n', LOG_LINE_MAX - 1); /* every byte escapes to two */
  big[LOG_LINE_MAX - 1] = 0;
  LOG(INFO, "%s", big);
  free(big);
  log_set_level(LOG_LEVEL_INFO);

  char *text = read_all(path);
  const char *want_msgs[] = {"shown 1",
                             "two\\nlines\\r and a \\x01 tab\there",
                             "no arguments",
                             "access GET /v1/jobs?limit=5 200 3.2ms",
                             "access - - 500 0.0ms",
                             "debug now"};
  const char *want_levels[] = {"WARN", "INFO", "ERROR", "INFO", "INFO", "DEBUG"};
  const char *p = text;
  for (int i = 0; i < 6 && p; i++) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    CHECK_MSG(line_ok(p, len, want_levels[i]), "line %d: %.*s", i, (int)len, p);
    size_t off = 25 + strlen(want_levels[i]) + 1;
    CHECK_MSG(len >= off && len - off == strlen(want_msgs[i]) &&
                  !strncmp(p + off, want_msgs[i], len - off),
              "line %d: '%.*s' want '%s'", i, (int)len, p, want_msgs[i]);
    p = nl ? nl + 1 : NULL;
  }
  /* the two long lines: cut to LOG_LINE_MAX bytes with "..." */
  for (int i = 0; i < 2 && p; i++) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    CHECK_MSG(line_ok(p, len, "INFO"), "long line %d", i);
    CHECK_MSG(len + 1 <= LOG_LINE_MAX && len > LOG_LINE_MAX - 40, "long line %d: %zu bytes", i,
              len);
    CHECK(len >= 3 && !strncmp(p + len - 3, "...", 3));
    p = nl ? nl + 1 : NULL;
  }
  CHECK(p && *p == 0);
  free(text);

  /* threads: every line whole, none interleaved */
  CHECK(ftruncate(fd, 0) == 0);
  pthread_t th[8];
  struct writer w[8];
  for (int i = 0; i < 8; i++) {
    w[i].id = i;
    pthread_create(&th[i], NULL, log_thread, &w[i]);
  }
  for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
  text = read_all(path);
  int lines = 0, good = 0, per[8] = {0};
  for (p = text; p && *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    int id, n, consumed = 0;
    lines++;
    if (line_ok(p, len, "INFO") &&
        sscanf(p + 30, "thread %d line %d %n", &id, &n, &consumed) == 2 && id >= 0 && id < 8 &&
        consumed > 0) {
      const char *pad = p + 30 + consumed;
      int whole = (size_t)(pad - p) + 304 == len && !strncmp(pad + 300, " end", 4);
      for (int k = 0; whole && k < 300; k++) whole = pad[k] == 'a' + id;
      if (whole) good++, per[id]++;
    }
    p = nl ? nl + 1 : NULL;
  }
  CHECK_MSG(lines == 2400 && good == 2400, "%d lines, %d whole", lines, good);
  for (int i = 0; i < 8; i++) CHECK(per[i] == 300);
  free(text);

  log_set_fd(old);
  close(fd);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--write-example")) {
    char *text = config_example_text();
    FILE *f = text ? fopen(argv[2], "wb") : NULL;
    if (!f || fputs(text, f) < 0 || fclose(f)) {
      perror(argv[2]);
      return 1;
    }
    free(text);
    return 0;
  }
  snprintf(tmpdir, sizeof tmpdir, "/tmp/test_config.XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_defaults();
  test_file();
  test_flags();
  test_errors();
  test_sizes();
  test_addresses();
  test_cross_field();
  test_print_round_trip();
  test_example();
  test_help();
  test_log();
  DIR *d = opendir(tmpdir);
  for (struct dirent *de; d && (de = readdir(d));) {
    char p[320];
    snprintf(p, sizeof p, "%s/%s", tmpdir, de->d_name);
    if (de->d_name[0] != '.') unlink(p);
  }
  if (d) closedir(d);
  rmdir(tmpdir);
  return check_done("test_config");
}
