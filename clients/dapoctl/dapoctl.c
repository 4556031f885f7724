/* dapoctl: dapod's command-line client for people and CI pipelines (issue 6): upload, submit
 * [--wait] (follows the job's Server-Sent Events, reconnecting with Last-Event-ID), logs [-f],
 * status, list, cancel, pause, resume, download (resumes partial files with Range). libcurl for
 * HTTP, jansson for JSON. Exit codes: enum below and clients/dapoctl/README.md. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "parse.h"
#include "sha256.h"
#include "sse.h"

/* Exit codes, distinct so that a CI step can branch on them. */
enum {
  EXIT_OK = 0,        /* done; with --wait: the job succeeded */
  EXIT_FAILED = 1,    /* the job failed (or an uploaded dataset is invalid) */
  EXIT_USAGE = 2,     /* bad command line or input file */
  EXIT_CANCELLED = 3, /* the job was cancelled */
  EXIT_TIMEOUT = 4,   /* --timeout passed first */
  EXIT_CONNECT = 5,   /* the server could not be reached (or the connection kept failing) */
  EXIT_API = 6,       /* the server answered with an error (problem+json printed) */
  EXIT_IO = 7,        /* a local file could not be read or written, or a checksum differs */
};

#define RESP_MAX ((size_t)64 << 20) /* largest reply body held in memory */
#define JOB_FILE_MAX ((size_t)16 << 20)
#define SSE_MAX_FAILURES 20 /* consecutive stream failures without a new event before giving up */

static const char *prog = "dapoctl";

/* ---- options and per-command help ---- */

enum opt_bit {
  O_WAIT = 1 << 0,
  O_TIMEOUT = 1 << 1,
  O_FOLLOW = 1 << 2,
  O_ALL = 1 << 3,
  O_OUTPUT = 1 << 4,
  O_STATUS = 1 << 5,
  O_LIMIT = 1 << 6,
  O_AFTER = 1 << 7,
  O_PURPOSE = 1 << 8,
  O_FILENAME = 1 << 9,
  O_IDEM = 1 << 10,
};

struct opts {
  const char *url, *api_key;
  int json, help, wait, follow;
  unsigned given; /* enum opt_bit of the command options on the line */
  double timeout_s;
  const char *all_dir, *output, *status, *after, *purpose, *filename, *idem;
  int limit;
};

struct command {
  const char *name;
  unsigned allowed;
  int min_args, max_args;
  const char *usage;
  const char *help;
};

static const struct command commands[] = {
    {"upload", O_PURPOSE | O_FILENAME, 1, 1, "upload FILE [--purpose P] [--filename NAME]",
     "Uploads a JSON Lines dataset (streamed from FILE) and prints its file id. Exits 1 when the\n"
     "daemon stored it as invalid (the bad lines are printed)."},
    {"submit", O_WAIT | O_TIMEOUT | O_IDEM, 1, 1,
     "submit JOB.json|- [--wait] [--timeout SECONDS] [--idempotency-key KEY]",
     "Creates a job from the JSON body in JOB.json (or stdin with -) and prints its id. With\n"
     "--wait, follows the job's event stream (reconnecting with Last-Event-ID), prints one\n"
     "progress line per step and exits 0 when it succeeds, 1 when it fails, 3 when it is\n"
     "cancelled, 4 when --timeout SECONDS pass first (the job goes on running)."},
    {"logs", O_FOLLOW | O_TIMEOUT, 1, 1, "logs [-f] ID [--timeout SECONDS]",
     "Prints the job's events. With -f, follows them live until the job ends (exit code as\n"
     "submit --wait)."},
    {"status", 0, 1, 1, "status ID", "Prints the job: status, step, latest metrics, error."},
    {"list", O_STATUS | O_LIMIT | O_AFTER, 0, 0, "list [--status S] [--limit N] [--after ID]",
     "Lists jobs, newest first (one page; --after the last id for the next)."},
    {"cancel", 0, 1, 1, "cancel ID", "Asks the daemon to cancel the job; prints its new status."},
    {"pause", 0, 1, 1, "pause ID",
     "Asks the daemon to pause the job at its next safe point (its state is checkpointed); prints\n"
     "its new status (pausing, then paused)."},
    {"resume", 0, 1, 1, "resume ID",
     "Queues a paused job again; it continues exactly where it stopped. Prints its new status."},
    {"rollouts", O_LIMIT, 1, 2, "rollouts ID [STEP|latest] [--limit N]",
     "Prints a step's samples (the latest step by default; --limit N: the first N groups): each\n"
     "group's prompt and answer, then every response with its reward; an agent's episode as its\n"
     "conversation, turn by turn (the model's turns and tool calls, the tools' answers, the\n"
     "environment's observations and rewards) and how it ended. --json prints the rollouts\n"
     "file's lines as they are."},
    {"download", O_ALL | O_OUTPUT, 2, 3, "download ID STEP|latest FILE [-o PATH] | --all DIR",
     "Downloads one file of a checkpoint (to PATH, default ./FILE) or, with --all, every file of\n"
     "it into DIR. A partial file already there is resumed with an HTTP Range request; every\n"
     "file is checked against the SHA-256 in the checkpoint index (exit 7 on a mismatch)."},
};

static void usage(FILE *f) {
  fprintf(f, "usage: %s [--url URL] [--api-key KEY] [--json] COMMAND [ARGS]\n\ncommands:\n", prog);
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    fprintf(f, "  %s\n", commands[i].usage);
  fprintf(f,
          "\nglobal options:\n"
          "  --url URL       the daemon (default $DAPOD_URL, else http://127.0.0.1:8080)\n"
          "  --api-key KEY   sent as 'Authorization: Bearer KEY' (default $DAPOD_API_KEY)\n"
          "  --json          machine-readable output: one JSON document on stdout\n"
          "  -h, --help      this help; '%s COMMAND --help' for one command\n"
          "\nexit codes: 0 ok (job succeeded), 1 job failed, 2 usage, 3 job cancelled, 4 timeout,\n"
          "5 connection error, 6 API error, 7 local file error or checksum mismatch\n",
          prog);
}

static void command_help(const struct command *c) {
  printf("usage: %s [--url URL] [--api-key KEY] [--json] %s\n\n%s\n", prog, c->usage, c->help);
}

/* ---- messages ---- */

static void msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void msg(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: ", prog);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

/* ---- HTTP ---- */

struct ctl {
  char url[2048];  /* base URL without a trailing '/' */
  char auth[1024]; /* "Authorization: Bearer KEY", or "" */
  int json;        /* --json */
  double deadline; /* now_s() limit of --timeout; 0: none */
  CURL *curl;      /* owned: one handle, so connections are reused */
  int quiet;       /* transfer errors are the caller's to report (a stream's outage) */
};

struct buf {
  char *p;
  size_t n, cap;
  int overflow; /* more than RESP_MAX arrived (the rest was dropped) */
};

static void buf_free(struct buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

static int buf_add(struct buf *b, const char *d, size_t n) {
  if (b->n + n + 1 > RESP_MAX) {
    b->overflow = 1;
    return -1;
  }
  if (b->n + n + 1 > b->cap) {
    size_t c = b->cap ? b->cap : 4096;
    while (c < b->n + n + 1) c *= 2;
    char *p = realloc(b->p, c);
    if (!p) return -1;
    b->p = p;
    b->cap = c;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
  b->p[b->n] = '\0';
  return 0;
}

static size_t write_buf(char *d, size_t sz, size_t nm, void *ud) {
  return buf_add(ud, d, sz * nm) ? 0 : sz * nm;
}

/* Aborts a transfer when the --timeout deadline passes. */
static int xfer_deadline(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
  const struct ctl *c = ud;
  return c->deadline > 0 && now_s() >= c->deadline;
}

/* A request: body from memory (body/len) or a file (upload/upload_len); headers are extra. */
struct req {
  const char *body;
  size_t len;
  FILE *upload;
  curl_off_t upload_len;
  const char *ctype;
  struct curl_slist *headers; /* borrowed */
};

/* Sets the options every request shares on c->curl (after a reset). */
static struct curl_slist *setup(struct ctl *c, const char *method, const char *path,
                                const struct req *q) {
  char url[4096];
  CURL *h = c->curl;
  curl_easy_reset(h);
  snprintf(url, sizeof url, "%s%s", c->url, path);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "dapoctl/" DAPOCTL_VERSION);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
  /* A stalled connection (no byte for 60 s; streams get a heartbeat every 15 s) is an error. */
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, xfer_deadline);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, c);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  struct curl_slist *hl = NULL, *t;
  if (c->auth[0]) hl = curl_slist_append(hl, c->auth);
  if (q && q->ctype) {
    char ct[256];
    snprintf(ct, sizeof ct, "Content-Type: %s", q->ctype);
    t = curl_slist_append(hl, ct);
    hl = t ? t : hl;
  }
  for (const struct curl_slist *e = q ? q->headers : NULL; e; e = e->next) {
    t = curl_slist_append(hl, e->data);
    hl = t ? t : hl;
  }
  if (q && q->upload) {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_READDATA, q->upload);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, q->upload_len);
  } else if (q && q->body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->len);
  } else if (!strcmp(method, "POST")) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
  }
  if (strcmp(method, "GET") && strcmp(method, "POST"))
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
  return hl;
}

/* Maps a curl failure to an exit code, with a message. */
static int transfer_error(struct ctl *c, CURLcode cc, const char *what) {
  if (c->deadline > 0 && now_s() >= c->deadline) {
    msg("%s: timed out (--timeout)", what);
    return EXIT_TIMEOUT;
  }
  if (!c->quiet) msg("%s: %s (%s)", what, curl_easy_strerror(cc), c->url);
  return EXIT_CONNECT;
}

/* Performs a request and collects the reply body in *body (caller frees). Returns EXIT_OK when
 * the server answered, whatever the status (in *status), else EXIT_CONNECT or EXIT_TIMEOUT. */
static int http_call(struct ctl *c, const char *method, const char *path, const struct req *q,
                     long *status, struct buf *body) {
  struct curl_slist *hl = setup(c, method, path, q);
  curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, write_buf);
  curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, body);
  CURLcode cc = curl_easy_perform(c->curl);
  curl_slist_free_all(hl);
  *status = 0;
  if (cc == CURLE_WRITE_ERROR && body->overflow) {
    msg("%s %s: the reply is larger than %zu MiB", method, path, RESP_MAX >> 20);
    return EXIT_API;
  }
  if (cc != CURLE_OK) {
    char what[600];
    snprintf(what, sizeof what, "%s %s", method, path);
    return transfer_error(c, cc, what);
  }
  curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, status);
  return EXIT_OK;
}

/* Reports a non-2xx reply: the problem+json fields on stderr (and the problem itself on stdout
 * with --json). Returns EXIT_API. */
static int api_error(struct ctl *c, const char *what, long status, const struct buf *body) {
  json_t *p = body->p ? json_loads(body->p, 0, NULL) : NULL;
  if (!json_is_object(p)) {
    msg("%s: HTTP %ld%s%.200s", what, status, body->n ? ": " : "", body->p ? body->p : "");
    json_decref(p);
    return EXIT_API;
  }
  const char *type = json_string_value(json_object_get(p, "type"));
  const char *title = json_string_value(json_object_get(p, "title"));
  const char *detail = json_string_value(json_object_get(p, "detail"));
  const char *name = type ? strrchr(type, '/') : NULL;
  msg("%s: HTTP %ld %s: %s%s%s", what, status, name ? name + 1 : (type ? type : "error"),
      title ? title : "", detail ? ": " : "", detail ? detail : "");
  json_t *errs = json_object_get(p, "errors"), *e;
  size_t i;
  json_array_foreach(errs, i, e) {
    const char *field = json_string_value(json_object_get(e, "field"));
    json_t *line = json_object_get(e, "line");
    const char *m = json_string_value(json_object_get(e, "message"));
    if (field)
      fprintf(stderr, "  %s: %s\n", field[0] ? field : "(body)", m ? m : "");
    else if (json_is_integer(line))
      fprintf(stderr, "  line %" JSON_INTEGER_FORMAT ": %s\n", json_integer_value(line),
              m ? m : "");
    else
      fprintf(stderr, "  %s\n", m ? m : "");
  }
  if (c->json) {
    json_dumpf(p, stdout, JSON_COMPACT);
    fputc('\n', stdout);
  }
  json_decref(p);
  return EXIT_API;
}

/* GET/POST path expecting a 2xx JSON object; *out owned by the caller. */
static int call_json(struct ctl *c, const char *method, const char *path, const struct req *q,
                     json_t **out, long *status_out) {
  struct buf b = {0};
  long status;
  char what[600];
  snprintf(what, sizeof what, "%s %s", method, path);
  *out = NULL;
  int rc = http_call(c, method, path, q, &status, &b);
  if (status_out) *status_out = status;
  if (rc) goto out;
  if (status < 200 || status > 299) {
    rc = api_error(c, what, status, &b);
    goto out;
  }
  json_error_t je;
  *out = json_loadb(b.p ? b.p : "", b.n, 0, &je);
  if (!*out) {
    msg("%s: the reply is not JSON: %s", what, je.text);
    rc = EXIT_API;
  }
out:
  buf_free(&b);
  return rc;
}

/* Escapes one path or query component into out. */
static int esc(struct ctl *c, const char *s, char *out, size_t cap) {
  char *e = curl_easy_escape(c->curl, s, 0);
  if (!e) return -1;
  int n = snprintf(out, cap, "%s", e);
  curl_free(e);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static void print_json(const json_t *j) {
  json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  fputc('\n', stdout);
}

static const char *jstr(const json_t *o, const char *k) {
  const char *s = json_string_value(json_object_get(o, k));
  return s ? s : "";
}

/* ---- upload ---- */

static int cmd_upload(struct ctl *c, const struct opts *o, char **args) {
  const char *path = args[0];
  FILE *f = fopen(path, "rb");
  struct stat st;
  if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
    msg("upload: %s: %s", path, f ? "not a regular file" : strerror(errno));
    if (f) fclose(f);
    return EXIT_IO;
  }
  const char *base = strrchr(path, '/');
  base = o->filename ? o->filename : (base ? base + 1 : path);
  char ep[600], eb[900], p[1600];
  if (esc(c, o->purpose ? o->purpose : "fine-tune", ep, sizeof ep) || esc(c, base, eb, sizeof eb)) {
    fclose(f);
    msg("upload: --purpose or the file name is too long");
    return EXIT_USAGE;
  }
  snprintf(p, sizeof p, "/v1/files?purpose=%s&filename=%s", ep, eb);
  struct req q = {
      .upload = f, .upload_len = (curl_off_t)st.st_size, .ctype = "application/x-ndjson"};
  json_t *file;
  int rc = call_json(c, "POST", p, &q, &file, NULL);
  fclose(f);
  if (rc) return rc;
  int invalid = !strcmp(jstr(file, "validation"), "invalid"); /* "status" is OpenAI's */
  if (c->json) {
    print_json(file);
  } else {
    printf("%s\n", jstr(file, "id"));
    fprintf(stderr, "%s: %s, %" JSON_INTEGER_FORMAT " items, %" JSON_INTEGER_FORMAT " bytes, %s\n",
            jstr(file, "id"), base, json_integer_value(json_object_get(file, "n_items")),
            json_integer_value(json_object_get(file, "bytes")), jstr(file, "validation"));
  }
  if (invalid) {
    json_t *e;
    size_t i;
    json_array_foreach(json_object_get(file, "errors"), i, e) {
      json_t *line = json_object_get(e, "line");
      if (json_is_integer(line))
        fprintf(stderr, "  line %" JSON_INTEGER_FORMAT ": %s\n", json_integer_value(line),
                jstr(e, "message"));
      else
        fprintf(stderr, "  %s\n", jstr(e, "message"));
    }
    msg("upload: %s is invalid (stored as %s)", path, jstr(file, "id"));
  }
  json_decref(file);
  return invalid ? EXIT_FAILED : EXIT_OK;
}

/* ---- following a job's events ---- */

struct follow {
  struct ctl *c;
  int all;           /* logs -f: print every event; submit --wait: progress lines */
  FILE *out;         /* where the lines go (stderr with --json for submit --wait) */
  int json_lines;    /* logs -f --json: one event object a line on out */
  long long last_id; /* the newest event id seen (Last-Event-ID of a reconnect) */
  int ended;         /* `end` seen */
  int got_event;     /* this connection delivered an event with an id */
  struct buf err;    /* the body of a non-200 reply */
  long status;       /* HTTP status of the current connection (0 until the headers) */
  struct sse_parser p;
  int bad;         /* a malformed event: stop with EXIT_API */
  long long total; /* the job's total_steps for progress lines; -1 unknown */
};

static double num(const json_t *o, const char *k, int *ok) {
  json_t *v = json_object_get(o, k);
  *ok = json_is_number(v);
  return json_number_value(v);
}

/* "step 3/5  reward -0.5000  accuracy 0.1250  entropy 4.5712  tokens/s 43702" (total < 0: no
 * "/5"; a metric the step lacks is left out). */
static void print_progress(FILE *f, const json_t *d, long long total) {
  int ok1, ok2, ok3, ok4, ok5;
  double step = num(d, "step", &ok1);
  double rw = num(d, "reward/mean", &ok2), acc = num(d, "accuracy", &ok3);
  double ent = num(d, "entropy", &ok4), tps = num(d, "throughput/gen_tokens_per_s", &ok5);
  fprintf(f, "step %.0f", ok1 ? step : -1.0);
  if (total >= 0) fprintf(f, "/%lld", total);
  if (ok2) fprintf(f, "  reward %+.4f", rw);
  if (ok3) fprintf(f, "  accuracy %.4f", acc);
  if (ok4) fprintf(f, "  entropy %.4f", ent);
  if (ok5) fprintf(f, "  tokens/s %.0f", tps);
  fputc('\n', f);
}

/* One line for an event. submit --wait prints metrics as progress, the progress of long
 * passes, status changes, checkpoints, warnings and errors; logs prints every event. */
static void print_event(FILE *f, int all, long long total, long long id, const char *type,
                        const json_t *d) {
  if (!strcmp(type, "metrics")) {
    int is_eval = json_object_get(d, "eval/accuracy") != NULL;
    if (!is_eval) {
      print_progress(f, d, total);
    } else {
      int ok;
      double a = num(d, "eval/accuracy", &ok);
      fprintf(f, "eval step %" JSON_INTEGER_FORMAT "  accuracy %.4f\n",
              json_integer_value(json_object_get(d, "step")), ok ? a : NAN);
    }
    return;
  }
  if (!strcmp(type, "status")) {
    fprintf(f, "status %s", jstr(d, "status"));
    json_t *err = json_object_get(d, "error");
    if (json_is_object(err)) fprintf(f, " (%s: %s)", jstr(err, "code"), jstr(err, "message"));
    fputc('\n', f);
    return;
  }
  if (!strcmp(type, "progress")) { /* a long pass of a step: how far it has got */
    const json_t *rd = json_object_get(d, "round");
    fprintf(f, "step %" JSON_INTEGER_FORMAT "  %s", json_integer_value(json_object_get(d, "step")),
            jstr(d, "pass"));
    if (json_integer_value(rd) > 0)
      fprintf(f, " round %" JSON_INTEGER_FORMAT, json_integer_value(rd));
    fprintf(f,
            "  %" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT " %s  %" JSON_INTEGER_FORMAT
            " tokens\n",
            json_integer_value(json_object_get(d, "done")),
            json_integer_value(json_object_get(d, "total")),
            !strcmp(jstr(d, "unit"), "sequences") ? "sequences" : "micro-batches",
            json_integer_value(json_object_get(d, "tokens")));
    return;
  }
  if (!strcmp(type, "checkpoint")) {
    fprintf(f, "checkpoint step %" JSON_INTEGER_FORMAT " (%s)\n",
            json_integer_value(json_object_get(d, "step")), jstr(d, "model"));
    return;
  }
  if (!strcmp(type, "log")) {
    const char *lv = jstr(d, "level");
    if (all || strcmp(lv, "info")) fprintf(f, "%s: %s\n", lv, jstr(d, "message"));
    return;
  }
  if (all) {
    char *s = json_dumps(d, JSON_COMPACT);
    fprintf(f, "[%lld] %s %s\n", id, type, s ? s : "");
    free(s);
  }
}

static int on_event(const struct sse_event *ev, void *ud) {
  struct follow *fw = ud;
  if (!strcmp(ev->event, "heartbeat")) return 0;
  if (!ev->id) return 0;
  int64_t id;
  if (parse_i64(ev->id, 1, INT64_MAX, &id, "id", NULL)) {
    msg("event stream: bad id '%s'", ev->id);
    fw->bad = 1;
    return 1;
  }
  if (id <= fw->last_id) return 0; /* already seen (never happens with a correct server) */
  json_error_t je;
  json_t *d = json_loadb(ev->data, ev->data_len, 0, &je);
  if (!d) {
    msg("event stream: event %lld: data is not JSON: %s", (long long)id, je.text);
    fw->bad = 1;
    return 1;
  }
  fw->last_id = id;
  fw->got_event = 1;
  if (fw->json_lines) {
    json_t *o = json_pack("{s:I,s:s,s:O}", "id", (json_int_t)id, "type", ev->event, "data", d);
    if (o) json_dumpf(o, fw->out, JSON_COMPACT);
    fputc('\n', fw->out);
    json_decref(o);
  } else {
    print_event(fw->out, fw->all, fw->total, id, ev->event, d);
  }
  fflush(fw->out);
  json_decref(d);
  if (!strcmp(ev->event, "end")) {
    fw->ended = 1;
    return 1; /* stop reading: the server closes the stream after `end` anyway */
  }
  return 0;
}

static size_t write_sse(char *d, size_t sz, size_t nm, void *ud) {
  struct follow *fw = ud;
  size_t n = sz * nm;
  if (!fw->status) curl_easy_getinfo(fw->c->curl, CURLINFO_RESPONSE_CODE, &fw->status);
  if (fw->status != 200) return buf_add(&fw->err, d, n) ? 0 : n;
  int rc = sse_feed(&fw->p, d, n);
  if (rc == -1 || rc == -2) {
    msg("event stream: %s", rc == -1 ? "an event is too large" : "out of memory");
    fw->bad = 1;
  }
  return rc ? 0 : n; /* 0 ends the transfer (end seen, or an error) */
}

static const char *terminal_exit_name(const char *st, int *code) {
  if (!strcmp(st, "succeeded"))
    *code = EXIT_OK;
  else if (!strcmp(st, "failed"))
    *code = EXIT_FAILED;
  else if (!strcmp(st, "cancelled"))
    *code = EXIT_CANCELLED;
  else
    return NULL;
  return st;
}

/* Fetches the job; *terminal set when it has finished. */
static int fetch_job(struct ctl *c, const char *id, json_t **job) {
  char p[600], e[400];
  if (esc(c, id, e, sizeof e)) return EXIT_USAGE;
  snprintf(p, sizeof p, "/v1/jobs/%s", e);
  return call_json(c, "GET", p, NULL, job, NULL);
}

/* The job's outcome after its stream ended: prints the error of a failed job, the final
 * object with --json, and returns the exit code of its status. */
static int finish(struct ctl *c, const char *id, FILE *out) {
  json_t *job;
  int rc = fetch_job(c, id, &job);
  if (rc) return rc;
  const char *st = jstr(job, "status");
  int code = EXIT_FAILED;
  if (!terminal_exit_name(st, &code)) {
    msg("job %s ended its stream in status '%s'", id, st);
    code = EXIT_API;
  }
  json_t *err = json_object_get(job, "error");
  if (json_is_object(err)) {
    const char *param = jstr(err, "param");
    msg("job %s failed: %s (%s%s%s): %s", id, jstr(err, "code"), jstr(err, "category"),
        param[0] ? ", " : "", param, jstr(err, "message"));
  } else if (code == EXIT_OK) {
    fprintf(c->json ? stderr : out, "job %s succeeded: %s\n", id, jstr(job, "fine_tuned_model"));
  } else if (code == EXIT_CANCELLED) {
    msg("job %s was cancelled at step %" JSON_INTEGER_FORMAT, id,
        json_integer_value(json_object_get(job, "step")));
  }
  if (c->json) print_json(job);
  json_decref(job);
  return code;
}

/* Why a stream ended before `end`, for the one line said per outage. */
static void stream_gone(char *buf, size_t cap, CURLcode cc, long status) {
  if (cc == CURLE_COULDNT_CONNECT)
    snprintf(buf, cap, "the daemon cannot be reached (%s)", curl_easy_strerror(cc));
  else if (cc != CURLE_OK)
    snprintf(buf, cap, "the connection was cut (%s)", curl_easy_strerror(cc));
  else if (status == 503)
    snprintf(buf, cap, "the daemon is unavailable (HTTP 503: stopping, or too many streams)");
  else
    snprintf(buf, cap, "the daemon closed the stream before the job ended");
}

/* Follows GET /v1/jobs/{id}/events/stream until `end`, reconnecting with Last-Event-ID after a
 * stream that ended early (backoff 0.25 s doubling to 4 s; SSE_MAX_FAILURES failures in a row
 * without a new event give up). Each outage is said once on stderr, whatever ended it: a cut
 * connection, a 503, or a stream the daemon closed cleanly (as it does when it stops: a restart
 * is an outage like a cut, and saying so must not depend on which of them the client saw first).
 * While the daemon cannot be reached, the job's status is not asked for: the next stream that
 * opens tells. Returns the job's exit code (finish) or an error code. */
static int follow_job(struct ctl *c, const char *id, int all, int json_lines, FILE *out,
                      long long total) {
  struct follow fw = {.c = c, .all = all, .out = out, .json_lines = json_lines, .total = total};
  char p[600], e[400], hdr[64], why[200];
  if (esc(c, id, e, sizeof e)) return EXIT_USAGE;
  snprintf(p, sizeof p, "/v1/jobs/%s/events/stream", e);
  sse_init(&fw.p, on_event, &fw, 0);
  int failures = 0, said = 0, rc = EXIT_OK;
  double backoff = 0.25;
  while (!fw.ended) {
    if (c->deadline > 0 && now_s() >= c->deadline) {
      rc = EXIT_TIMEOUT;
      break;
    }
    struct curl_slist *extra = NULL;
    if (fw.last_id > 0) {
      snprintf(hdr, sizeof hdr, "Last-Event-ID: %lld", fw.last_id);
      extra = curl_slist_append(NULL, hdr);
    }
    struct req q = {.headers = extra};
    struct curl_slist *hl = setup(c, "GET", p, &q);
    curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, write_sse);
    curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &fw);
    fw.status = 0;
    fw.got_event = 0;
    buf_free(&fw.err);
    sse_reset(&fw.p);
    CURLcode cc = curl_easy_perform(c->curl);
    curl_slist_free_all(hl);
    curl_slist_free_all(extra);
    if (fw.ended) break;
    if (fw.bad) {
      rc = EXIT_API;
      break;
    }
    if (c->deadline > 0 && now_s() >= c->deadline) {
      rc = EXIT_TIMEOUT;
      break;
    }
    long status = fw.status;
    if (!status) curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status && status != 200 && status != 503) { /* 503: stopping or too many streams */
      rc = api_error(c, p, status, &fw.err);
      break;
    }
    if (status == 200 && !fw.got_event && cc == CURLE_OK) {
      /* The server closed the stream cleanly with nothing new: it does so at once for a stream
       * opened past the end of a finished job, and when it stops. The job's status decides;
       * a daemon gone between the two is an outage like any other. */
      json_t *job;
      long js = 0;
      struct buf jb = {0};
      char jp[600];
      snprintf(jp, sizeof jp, "/v1/jobs/%s", e);
      c->quiet = 1;
      int trc = http_call(c, "GET", jp, NULL, &js, &jb);
      c->quiet = 0;
      if (!trc && js == 200 && (job = json_loadb(jb.p ? jb.p : "", jb.n, 0, NULL))) {
        int code;
        int done = terminal_exit_name(jstr(job, "status"), &code) != NULL;
        json_decref(job);
        if (done) {
          buf_free(&jb);
          break;
        }
      } else if (!trc && js != 200 && js != 503) {
        rc = api_error(c, jp, js, &jb);
        buf_free(&jb);
        break;
      }
      buf_free(&jb);
    }
    if (fw.got_event) {
      failures = 0;
      backoff = 0.25;
      said = 0;
    } else if (++failures >= SSE_MAX_FAILURES) {
      rc = cc != CURLE_OK ? transfer_error(c, cc, p) : EXIT_CONNECT;
      if (cc == CURLE_OK) msg("%s: the stream keeps ending without events", p);
      break;
    }
    if (!said && cc != CURLE_WRITE_ERROR) {
      stream_gone(why, sizeof why, cc, status);
      fprintf(stderr, "%s: %s; reconnecting after event %lld\n", prog, why, fw.last_id);
      said = 1;
    }
    sleep_s(fw.got_event ? 0.05 : backoff);
    if (!fw.got_event && backoff < 4) backoff *= 2;
  }
  sse_deinit(&fw.p);
  buf_free(&fw.err);
  if (rc == EXIT_TIMEOUT) {
    msg("timed out; job %s goes on (last event %lld)", id, fw.last_id);
    if (c->json) {
      json_t *job;
      if (!fetch_job(c, id, &job)) {
        print_json(job);
        json_decref(job);
      }
    }
    return rc;
  }
  if (rc) return rc;
  return finish(c, id, out);
}

/* ---- submit ---- */

static int read_all(const char *path, struct buf *b) {
  FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
  if (!f) {
    msg("%s: %s", path, strerror(errno));
    return EXIT_IO;
  }
  char tmp[65536];
  size_t n;
  int rc = 0;
  while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) {
    if (b->n + n > JOB_FILE_MAX || buf_add(b, tmp, n)) {
      msg("%s: larger than %zu MiB", path, JOB_FILE_MAX >> 20);
      rc = EXIT_USAGE;
      break;
    }
  }
  if (!rc && ferror(f)) {
    msg("%s: read error", path);
    rc = EXIT_IO;
  }
  if (f != stdin) fclose(f);
  return rc;
}

static int cmd_submit(struct ctl *c, const struct opts *o, char **args) {
  struct buf body = {0};
  int rc = read_all(args[0], &body);
  if (rc) goto out;
  json_error_t je;
  json_t *spec = json_loadb(body.p ? body.p : "", body.n, JSON_REJECT_DUPLICATES, &je);
  if (!json_is_object(spec)) {
    if (spec)
      msg("%s: the job must be a JSON object", args[0]);
    else
      msg("%s: line %d, column %d: %s", args[0], je.line, je.column, je.text);
    json_decref(spec);
    rc = EXIT_USAGE;
    goto out;
  }
  json_decref(spec);
  struct curl_slist *extra = NULL;
  if (o->idem) {
    char h[400];
    snprintf(h, sizeof h, "Idempotency-Key: %s", o->idem);
    extra = curl_slist_append(NULL, h);
  }
  struct req q = {.body = body.p, .len = body.n, .ctype = "application/json", .headers = extra};
  json_t *job;
  rc = call_json(c, "POST", "/v1/jobs", &q, &job, NULL);
  curl_slist_free_all(extra);
  if (rc) goto out;
  char id[300];
  snprintf(id, sizeof id, "%s", jstr(job, "id"));
  if (!o->wait) {
    if (c->json)
      print_json(job);
    else
      printf("%s\n", id);
    json_decref(job);
    goto out;
  }
  FILE *progress = c->json ? stderr : stdout;
  long long total = (long long)json_integer_value(json_object_get(job, "total_steps"));
  fprintf(progress, "job %s %s (%lld steps)\n", id, jstr(job, "status"), total);
  fflush(progress);
  json_decref(job);
  rc = follow_job(c, id, 0, 0, progress, total);
out:
  buf_free(&body);
  return rc;
}

/* ---- logs ---- */

static int cmd_logs(struct ctl *c, const struct opts *o, char **args) {
  if (o->follow) {
    json_t *job; /* for the total in the progress lines (and a clear 404 first) */
    int rc = fetch_job(c, args[0], &job);
    if (rc) return rc;
    long long total = (long long)json_integer_value(json_object_get(job, "total_steps"));
    json_decref(job);
    return follow_job(c, args[0], 1, c->json, stdout, total);
  }
  char e[400], p[800];
  if (esc(c, args[0], e, sizeof e)) return EXIT_USAGE;
  long long after = 0;
  for (;;) {
    if (after)
      snprintf(p, sizeof p, "/v1/jobs/%s/events?limit=100&after=%lld", e, after);
    else
      snprintf(p, sizeof p, "/v1/jobs/%s/events?limit=100", e);
    json_t *page;
    int rc = call_json(c, "GET", p, NULL, &page, NULL);
    if (rc) return rc;
    json_t *ev;
    size_t i;
    json_array_foreach(json_object_get(page, "data"), i, ev) {
      json_int_t id = json_integer_value(json_object_get(ev, "id"));
      if (c->json) {
        json_t *o2 = json_pack("{s:I,s:s,s:O}", "id", id, "type", jstr(ev, "type"), "data",
                               json_object_get(ev, "data"));
        if (o2) json_dumpf(o2, stdout, JSON_COMPACT);
        fputc('\n', stdout);
        json_decref(o2);
      } else {
        print_event(stdout, 1, -1, (long long)id, jstr(ev, "type"), json_object_get(ev, "data"));
      }
      after = (long long)id;
    }
    int more = json_is_true(json_object_get(page, "has_more"));
    json_decref(page);
    if (!more) return EXIT_OK;
  }
}

/* ---- status, list, cancel, pause, resume ---- */

static void print_job(const json_t *j) {
  printf("id          %s\n", jstr(j, "id"));
  printf("status      %s", jstr(j, "status"));
  if (json_is_string(json_object_get(j, "phase"))) printf(" (%s)", jstr(j, "phase"));
  if (json_is_integer(json_object_get(j, "queue_position")))
    printf(" (queue position %" JSON_INTEGER_FORMAT ")",
           json_integer_value(json_object_get(j, "queue_position")));
  printf("\nmodel       %s\n", jstr(j, "model"));
  printf("step        %" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT "\n",
         json_integer_value(json_object_get(j, "step")),
         json_integer_value(json_object_get(j, "total_steps")));
  json_t *m = json_object_get(j, "latest_metrics");
  if (json_is_object(m) && json_object_size(m)) {
    printf("metrics     ");
    print_progress(stdout, m, -1);
  }
  json_t *ck = json_object_get(j, "checkpoints"), *s;
  size_t i;
  if (json_array_size(ck)) {
    printf("checkpoints");
    json_array_foreach(ck, i, s) printf(" %" JSON_INTEGER_FORMAT, json_integer_value(s));
    printf("\n");
  }
  if (json_is_string(json_object_get(j, "fine_tuned_model")))
    printf("fine-tuned  %s\n", jstr(j, "fine_tuned_model"));
  json_t *err = json_object_get(j, "error");
  if (json_is_object(err))
    printf("error       %s (%s): %s\n", jstr(err, "code"), jstr(err, "category"),
           jstr(err, "message"));
}

static int cmd_status(struct ctl *c, const struct opts *o, char **args) {
  json_t *job;
  int rc = fetch_job(c, args[0], &job);
  if (rc) return rc;
  if (c->json)
    print_json(job);
  else
    print_job(job);
  json_decref(job);
  return EXIT_OK;
}

static int cmd_list(struct ctl *c, const struct opts *o, char **args) {
  char p[1200] = "/v1/jobs", e[600];
  char sep = '?';
  size_t n = strlen(p);
  if (o->status) {
    if (esc(c, o->status, e, sizeof e)) return EXIT_USAGE;
    n += (size_t)snprintf(p + n, sizeof p - n, "%cstatus=%s", sep, e), sep = '&';
  }
  if (o->given & O_LIMIT)
    n += (size_t)snprintf(p + n, sizeof p - n, "%climit=%d", sep, o->limit), sep = '&';
  if (o->after) {
    if (esc(c, o->after, e, sizeof e)) return EXIT_USAGE;
    snprintf(p + n, sizeof p - n, "%cafter=%s", sep, e);
  }
  json_t *page;
  int rc = call_json(c, "GET", p, NULL, &page, NULL);
  if (rc) return rc;
  if (c->json) {
    print_json(page);
    json_decref(page);
    return EXIT_OK;
  }
  printf("%-40s %-10s %9s %-12s %9s %9s\n", "ID", "STATUS", "STEP", "MODEL", "REWARD", "ACCURACY");
  json_t *j;
  size_t i;
  json_array_foreach(json_object_get(page, "data"), i, j) {
    char step[48];
    snprintf(step, sizeof step, "%" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT,
             json_integer_value(json_object_get(j, "step")),
             json_integer_value(json_object_get(j, "total_steps")));
    json_t *m = json_object_get(j, "latest_metrics");
    int ok1, ok2;
    double rw = num(m, "reward/mean", &ok1), acc = num(m, "accuracy", &ok2);
    char r1[32] = "-", r2[32] = "-";
    if (ok1) snprintf(r1, sizeof r1, "%+.4f", rw);
    if (ok2) snprintf(r2, sizeof r2, "%.4f", acc);
    printf("%-40s %-10s %9s %-12s %9s %9s\n", jstr(j, "id"), jstr(j, "status"), step,
           jstr(j, "model"), r1, r2);
  }
  if (json_is_true(json_object_get(page, "has_more")))
    printf("(more: --after %s)\n", jstr(page, "next_after"));
  json_decref(page);
  return EXIT_OK;
}

/* A command's STEP argument: a step number of at least min into *step, or "latest" (*step left
 * as it is). 0, or -1 with the usage error said. */
static int parse_step(const char *cmd, const char *arg, int64_t min, long long *step) {
  if (!strcmp(arg, "latest")) return 0;
  int64_t v;
  struct dapo_err e = {0};
  if (parse_i64(arg, min, INT64_MAX, &v, "STEP", &e)) {
    msg("%s: %s (a step number or 'latest')", cmd, e.msg);
    return -1;
  }
  *step = v;
  return 0;
}

/* ---- rollouts ---- */

/* text on one line: newlines shown as \n, cut at 200 bytes */
static void put_text(const char *s) {
  size_t n = 0;
  for (; *s && n < 200; s++, n++) {
    if (*s == '\n')
      fputs("\\n", stdout);
    else
      fputc(*s, stdout);
  }
  if (*s) fputs("...", stdout);
}

/* An episode's turns (docs/AGENTS.md), one line each, indented. */
static void print_turns(const json_t *r) {
  json_t *t;
  size_t i;
  json_array_foreach(json_object_get(r, "turns"), i, t) {
    const char *role = jstr(t, "role");
    if (!strcmp(role, "assistant")) {
      fputs("      model: ", stdout);
      put_text(jstr(t, "content"));
      fputc('\n', stdout);
      json_t *call;
      size_t k;
      json_array_foreach(json_object_get(t, "tool_calls"), k, call) {
        char *a = json_dumps(json_object_get(call, "arguments"), JSON_COMPACT | JSON_ENCODE_ANY);
        printf("        -> %s(%s)\n", jstr(call, "name"), a ? a : "");
        free(a);
      }
      if (json_object_get(t, "malformed"))
        printf("        (not a call: %s)\n", jstr(t, "malformed"));
    } else if (!strcmp(role, "tool")) {
      json_t *a;
      size_t k;
      json_array_foreach(json_object_get(t, "answers"), k, a) {
        printf("      tool %s: ", jstr(a, "name"));
        put_text(jstr(a, "content"));
        if (strcmp(jstr(a, "status"), "ok")) printf(" [%s]", jstr(a, "status"));
        fputc('\n', stdout);
      }
    } else {
      json_t *m;
      size_t k;
      json_array_foreach(json_object_get(t, "messages"), k, m) {
        printf("      world %s: ", jstr(m, "role"));
        put_text(jstr(m, "content"));
        fputc('\n', stdout);
      }
      const json_t *rw = json_object_get(t, "reward");
      int done = json_is_true(json_object_get(t, "done"));
      if (json_is_number(rw))
        printf("        (reward %.4g%s)\n", json_number_value(rw), done ? ", done" : "");
      else if (done)
        puts("        (done)");
      if (json_object_get(t, "error")) printf("        (failed: %s)\n", jstr(t, "error"));
    }
    if (json_is_false(json_object_get(t, "fits"))) puts("        (did not fit the episode)");
  }
  printf("      ended: %s\n", jstr(r, "finish_reason"));
}

static int cmd_rollouts(struct ctl *c, const struct opts *o, char **args) {
  char je[400], p[700];
  if (esc(c, args[0], je, sizeof je)) return EXIT_USAGE;
  long long step = -1;
  if (args[1] && parse_step("rollouts", args[1], 1, &step)) return EXIT_USAGE;
  if (step < 0) {
    json_t *job;
    int rc = fetch_job(c, args[0], &job);
    if (rc) return rc;
    step = (long long)json_integer_value(json_object_get(job, "step"));
    json_decref(job);
    if (step < 1) {
      msg("rollouts: job %s has no step yet", args[0]);
      return EXIT_API;
    }
  }
  snprintf(p, sizeof p, "/v1/jobs/%s/rollouts?step=%lld", je, step);
  struct buf b = {0};
  long status;
  int rc = http_call(c, "GET", p, NULL, &status, &b);
  if (!rc && (status < 200 || status > 299)) {
    char what[760];
    snprintf(what, sizeof what, "GET %s", p);
    rc = api_error(c, what, status, &b);
  }
  if (rc || c->json) {
    if (!rc) fwrite(b.p ? b.p : "", 1, b.n, stdout);
    buf_free(&b);
    return rc;
  }
  long long group = -1;
  int groups = 0;
  char *save = NULL;
  for (char *line = b.p ? strtok_r(b.p, "\n", &save) : NULL; line;
       line = strtok_r(NULL, "\n", &save)) {
    json_t *r = json_loads(line, 0, NULL);
    if (!json_is_object(r)) {
      json_decref(r);
      continue;
    }
    long long g = (long long)json_integer_value(json_object_get(r, "group"));
    if (g != group) {
      if ((o->given & O_LIMIT) && groups == o->limit) {
        json_decref(r);
        break;
      }
      group = g, groups++;
      printf("group %lld%s  prompt: ", g,
             json_is_true(json_object_get(r, "kept")) ? " (kept)" : "");
      put_text(jstr(r, "prompt"));
      fputs("  answer: ", stdout);
      put_text(jstr(r, "answer"));
      fputc('\n', stdout);
    }
    const json_t *rw = json_object_get(r, "reward");
    printf("  #%lld reward %s%.4g  %s  ",
           (long long)json_integer_value(json_object_get(r, "index")),
           json_is_number(rw) ? "" : "(unjudged) ", json_number_value(rw),
           json_is_true(json_object_get(r, "correct")) ? "correct" : "wrong");
    put_text(jstr(r, "response"));
    fputc('\n', stdout);
    if (json_is_array(json_object_get(r, "turns"))) print_turns(r);
    json_decref(r);
  }
  buf_free(&b);
  return EXIT_OK;
}

/* cancel, pause, resume: POST /v1/jobs/{id}/{action}, then the job's id and new status. */
static int cmd_action(struct ctl *c, const char *action, char **args) {
  char p[600], e[400];
  if (esc(c, args[0], e, sizeof e)) return EXIT_USAGE;
  snprintf(p, sizeof p, "/v1/jobs/%s/%s", e, action);
  json_t *job;
  int rc = call_json(c, "POST", p, NULL, &job, NULL);
  if (rc) return rc;
  if (c->json)
    print_json(job);
  else
    printf("%s %s\n", jstr(job, "id"), jstr(job, "status"));
  json_decref(job);
  return EXIT_OK;
}

/* ---- download ---- */

struct dl {
  struct ctl *c;
  FILE *f;        /* the destination, opened for update */
  uint64_t start; /* bytes already there when the request was sent */
  long status;    /* HTTP status (0 until the first body byte) */
  struct buf err; /* the body of an error reply */
  int io_error;
};

static size_t write_dl(char *d, size_t sz, size_t nm, void *ud) {
  struct dl *x = ud;
  size_t n = sz * nm;
  if (!x->status) {
    curl_easy_getinfo(x->c->curl, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->status == 200 && x->start > 0) { /* the server sent the whole file: start over */
      if (ftruncate(fileno(x->f), 0) || fseeko(x->f, 0, SEEK_SET)) x->io_error = errno;
      x->start = 0;
    }
  }
  if (x->status != 200 && x->status != 206) return buf_add(&x->err, d, n) ? 0 : n;
  if (x->io_error || fwrite(d, 1, n, x->f) != n) {
    if (!x->io_error) x->io_error = errno ? errno : EIO;
    return 0;
  }
  return n;
}

static int file_sha256(const char *path, char hex[65], uint64_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  struct dapo_sha256 s;
  dapo_sha256_begin(&s);
  char b[65536];
  size_t n;
  *size = 0;
  while ((n = fread(b, 1, sizeof b, f)) > 0) {
    dapo_sha256_feed(&s, b, n);
    *size += n;
  }
  int bad = ferror(f);
  fclose(f);
  dapo_sha256_end_hex(&s, hex);
  return bad ? -1 : 0;
}

/* Downloads one checkpoint file to dest, resuming a shorter file already there. *resumed_from
 * is the offset the transfer started at (0: whole file; -1: already complete). */
static int download_file(struct ctl *c, const char *job_e, long long step, const json_t *file,
                         const char *dest, long long *resumed_from) {
  const char *name = jstr(file, "name"), *sha = jstr(file, "sha256");
  uint64_t want = (uint64_t)json_integer_value(json_object_get(file, "bytes"));
  char ne[600], p[1400], have_sha[65];
  if (esc(c, name, ne, sizeof ne)) return EXIT_API;
  snprintf(p, sizeof p, "/v1/jobs/%s/checkpoints/%lld/%s", job_e, step, ne);
  struct stat st;
  uint64_t start = 0;
  if (!stat(dest, &st)) {
    if (!S_ISREG(st.st_mode)) {
      msg("%s: exists and is not a regular file", dest);
      return EXIT_IO;
    }
    uint64_t sz;
    if ((uint64_t)st.st_size == want && !file_sha256(dest, have_sha, &sz) &&
        !strcmp(have_sha, sha)) {
      *resumed_from = -1;
      return EXIT_OK;
    }
    if ((uint64_t)st.st_size < want) start = (uint64_t)st.st_size;
  }
  FILE *f = fopen(dest, start ? "r+b" : "w+b");
  if (!f || fseeko(f, (off_t)start, SEEK_SET)) {
    msg("%s: %s", dest, strerror(errno));
    if (f) fclose(f);
    return EXIT_IO;
  }
  struct dl x = {.c = c, .f = f, .start = start};
  struct curl_slist *extra = NULL;
  char range[64], ifr[128];
  if (start) {
    snprintf(range, sizeof range, "Range: bytes=%" PRIu64 "-", start);
    snprintf(ifr, sizeof ifr, "If-Range: \"%s\"", sha); /* a changed file comes whole */
    extra = curl_slist_append(NULL, range);
    struct curl_slist *t = curl_slist_append(extra, ifr);
    extra = t ? t : extra;
  }
  struct req q = {.headers = extra};
  struct curl_slist *hl = setup(c, "GET", p, &q);
  curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, write_dl);
  curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &x);
  CURLcode cc = curl_easy_perform(c->curl);
  curl_slist_free_all(hl);
  curl_slist_free_all(extra);
  int rc = EXIT_OK;
  if (!x.status) curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &x.status);
  if (fflush(f) || fsync(fileno(f))) x.io_error = x.io_error ? x.io_error : errno;
  fclose(f);
  if (x.io_error) {
    msg("%s: %s", dest, strerror(x.io_error));
    rc = EXIT_IO;
  } else if (cc != CURLE_OK) {
    rc = transfer_error(c, cc, p); /* a partial file stays for the next resume */
  } else if (x.status == 416) {
    /* The file there is not a prefix we can extend (a server file shorter than ours). */
    if (truncate(dest, 0)) {
      msg("%s: %s", dest, strerror(errno));
      rc = EXIT_IO;
    } else {
      rc = download_file(c, job_e, step, file, dest, resumed_from);
    }
    buf_free(&x.err);
    return rc;
  } else if (x.status != 200 && x.status != 206) {
    rc = api_error(c, p, x.status, &x.err);
  }
  buf_free(&x.err);
  if (rc) return rc;
  *resumed_from = (long long)x.start;
  uint64_t got;
  if (file_sha256(dest, have_sha, &got)) {
    msg("%s: cannot read back: %s", dest, strerror(errno));
    return EXIT_IO;
  }
  if (got != want || strcmp(have_sha, sha)) {
    msg("%s: %" PRIu64 " bytes with SHA-256 %s, but the checkpoint lists %" PRIu64 " bytes %s",
        dest, got, have_sha, want, sha);
    return EXIT_IO;
  }
  return EXIT_OK;
}

static int mkdir_p(const char *dir) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) return -1;
  for (char *s = tmp + 1; *s; s++) {
    if (*s != '/') continue;
    *s = '\0';
    if (mkdir(tmp, 0777) && errno != EEXIST) return -1;
    *s = '/';
  }
  return mkdir(tmp, 0777) && errno != EEXIST ? -1 : 0;
}

static int cmd_download(struct ctl *c, const struct opts *o, char **args) {
  int nargs = args[1] ? (args[2] ? 3 : 2) : 1;
  if ((o->all_dir != NULL) == (nargs == 3) || (o->all_dir && o->output)) {
    msg("download: give either FILE [-o PATH] or --all DIR");
    return EXIT_USAGE;
  }
  long long step = -1;
  if (parse_step("download", args[1], 0, &step)) return EXIT_USAGE;
  char je[400], p[600];
  if (esc(c, args[0], je, sizeof je)) return EXIT_USAGE;
  snprintf(p, sizeof p, "/v1/jobs/%s/checkpoints", je);
  json_t *list;
  int rc = call_json(c, "GET", p, NULL, &list, NULL);
  if (rc) return rc;
  json_t *ck = NULL, *x;
  size_t i;
  json_array_foreach(json_object_get(list, "data"), i, x) {
    long long s = (long long)json_integer_value(json_object_get(x, "step"));
    if (step >= 0 ? s == step : (!ck || s > json_integer_value(json_object_get(ck, "step"))))
      ck = x;
  }
  if (!ck) {
    msg("download: job %s has no checkpoint %s%s", args[0], step >= 0 ? "of step " : "",
        step >= 0 ? args[1] : "yet");
    json_decref(list);
    return EXIT_API;
  }
  step = (long long)json_integer_value(json_object_get(ck, "step"));
  if (o->all_dir && mkdir_p(o->all_dir)) {
    msg("download: %s: %s", o->all_dir, strerror(errno));
    json_decref(list);
    return EXIT_IO;
  }
  json_t *summary =
      json_pack("{s:s,s:I,s:[]}", "job_id", args[0], "step", (json_int_t)step, "files");
  json_t *files = json_object_get(ck, "files");
  int found = 0;
  json_array_foreach(files, i, x) {
    const char *name = jstr(x, "name");
    if (!o->all_dir && strcmp(name, args[2])) continue;
    found = 1;
    if (!name[0] || strchr(name, '/') || name[0] == '.') {
      msg("download: the server lists a bad file name '%s'", name);
      rc = EXIT_API;
      break;
    }
    char dest[4096];
    if (o->all_dir)
      snprintf(dest, sizeof dest, "%s/%s", o->all_dir, name);
    else
      snprintf(dest, sizeof dest, "%s", o->output ? o->output : name);
    long long from = 0;
    rc = download_file(c, je, step, x, dest, &from);
    if (rc) break;
    FILE *out = c->json ? stderr : stdout;
    if (from < 0)
      fprintf(out, "%s: up to date (%" JSON_INTEGER_FORMAT " bytes)\n", dest,
              json_integer_value(json_object_get(x, "bytes")));
    else if (from > 0)
      fprintf(out, "%s: %" JSON_INTEGER_FORMAT " bytes (resumed at byte %lld), sha256 ok\n", dest,
              json_integer_value(json_object_get(x, "bytes")), from);
    else
      fprintf(out, "%s: %" JSON_INTEGER_FORMAT " bytes, sha256 ok\n", dest,
              json_integer_value(json_object_get(x, "bytes")));
    json_array_append_new(json_object_get(summary, "files"),
                          json_pack("{s:s,s:s,s:O,s:O,s:I}", "name", name, "path", dest, "bytes",
                                    json_object_get(x, "bytes"), "sha256",
                                    json_object_get(x, "sha256"), "resumed_from",
                                    (json_int_t)from));
  }
  if (!rc && !found) {
    msg("download: checkpoint %lld of %s has no file '%s'", step, args[0], args[2]);
    rc = EXIT_API;
  }
  if (!rc && c->json) print_json(summary);
  json_decref(summary);
  json_decref(list);
  return rc;
}

/* ---- main ---- */

static int parse_opts(int argc, char **argv, struct opts *o, char ***pos, int *npos) {
  enum {
    L_URL = 256,
    L_KEY,
    L_JSON,
    L_WAIT,
    L_TIMEOUT,
    L_ALL,
    L_STATUS,
    L_LIMIT,
    L_AFTER,
    L_PURPOSE,
    L_FILENAME,
    L_IDEM,
    L_VERSION
  };
  static const struct option lo[] = {{"url", required_argument, 0, L_URL},
                                     {"api-key", required_argument, 0, L_KEY},
                                     {"json", no_argument, 0, L_JSON},
                                     {"help", no_argument, 0, 'h'},
                                     {"wait", no_argument, 0, L_WAIT},
                                     {"timeout", required_argument, 0, L_TIMEOUT},
                                     {"follow", no_argument, 0, 'f'},
                                     {"all", required_argument, 0, L_ALL},
                                     {"output", required_argument, 0, 'o'},
                                     {"status", required_argument, 0, L_STATUS},
                                     {"limit", required_argument, 0, L_LIMIT},
                                     {"after", required_argument, 0, L_AFTER},
                                     {"purpose", required_argument, 0, L_PURPOSE},
                                     {"filename", required_argument, 0, L_FILENAME},
                                     {"idempotency-key", required_argument, 0, L_IDEM},
                                     {"version", no_argument, 0, L_VERSION},
                                     {0, 0, 0, 0}};
  struct dapo_err e = {0};
  int ch;
  opterr = 0;
  while ((ch = getopt_long(argc, argv, ":hfo:", lo, NULL)) != -1) {
    switch (ch) {
    case L_URL: o->url = optarg; break;
    case L_KEY: o->api_key = optarg; break;
    case L_JSON: o->json = 1; break;
    case 'h': o->help = 1; break;
    case L_WAIT: o->wait = 1, o->given |= O_WAIT; break;
    case 'f': o->follow = 1, o->given |= O_FOLLOW; break;
    case L_ALL: o->all_dir = optarg, o->given |= O_ALL; break;
    case 'o': o->output = optarg, o->given |= O_OUTPUT; break;
    case L_STATUS: o->status = optarg, o->given |= O_STATUS; break;
    case L_AFTER: o->after = optarg, o->given |= O_AFTER; break;
    case L_PURPOSE: o->purpose = optarg, o->given |= O_PURPOSE; break;
    case L_FILENAME: o->filename = optarg, o->given |= O_FILENAME; break;
    case L_IDEM: o->idem = optarg, o->given |= O_IDEM; break;
    case L_TIMEOUT:
      o->given |= O_TIMEOUT;
      if (parse_double(optarg, 0.001, 1e9, &o->timeout_s, "--timeout", &e)) {
        msg("%s (seconds)", e.msg);
        return EXIT_USAGE;
      }
      break;
    case L_LIMIT:
      o->given |= O_LIMIT;
      if (parse_int(optarg, 1, 100, &o->limit, "--limit", &e)) {
        msg("%s", e.msg);
        return EXIT_USAGE;
      }
      break;
    case L_VERSION: printf("dapoctl %s\n", DAPOCTL_VERSION); exit(0);
    case ':': msg("%s needs a value", argv[optind - 1]); return EXIT_USAGE;
    default: msg("unknown option '%s' (see --help)", argv[optind - 1]); return EXIT_USAGE;
    }
  }
  *pos = argv + optind;
  *npos = argc - optind;
  return 0;
}

int main(int argc, char **argv) {
  struct opts o = {0};
  char **pos;
  int npos;
  int rc = parse_opts(argc, argv, &o, &pos, &npos);
  if (rc) return rc;
  if (npos == 0 || (npos >= 1 && !strcmp(pos[0], "help") && npos == 1)) {
    usage(o.help || npos ? stdout : stderr);
    return o.help || npos ? EXIT_OK : EXIT_USAGE;
  }
  const char *name = pos[0];
  int help_of = 0;
  if (!strcmp(name, "help")) name = pos[1], help_of = 1;
  const struct command *cmd = NULL;
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    if (!strcmp(commands[i].name, name)) cmd = &commands[i];
  if (!cmd) {
    msg("unknown command '%s' (see --help)", name);
    return EXIT_USAGE;
  }
  if (o.help || help_of) {
    command_help(cmd);
    return EXIT_OK;
  }
  int nargs = npos - 1;
  if (nargs < cmd->min_args || nargs > cmd->max_args) {
    msg("usage: %s %s", prog, cmd->usage);
    return EXIT_USAGE;
  }
  unsigned extra = o.given & ~cmd->allowed;
  if (extra) {
    static const char *names[] = {
        "--wait",           "--timeout", "-f",      "--all",     "-o",
        "--status",         "--limit",   "--after", "--purpose", "--filename",
        "--idempotency-key"};
    for (unsigned b = 0; b < sizeof names / sizeof *names; b++)
      if (extra & (1u << b)) msg("%s: %s is not an option of this command", cmd->name, names[b]);
    msg("usage: %s %s", prog, cmd->usage);
    return EXIT_USAGE;
  }
  if ((o.given & O_TIMEOUT) && !o.wait && !o.follow) {
    msg("%s: --timeout goes with %s", cmd->name, !strcmp(cmd->name, "logs") ? "-f" : "--wait");
    return EXIT_USAGE;
  }

  struct ctl c = {0};
  const char *url = o.url ? o.url : getenv("DAPOD_URL");
  const char *key = o.api_key ? o.api_key : getenv("DAPOD_API_KEY");
  if (!url || !url[0]) url = "http://127.0.0.1:8080";
  size_t ul = strlen(url);
  while (ul > 0 && url[ul - 1] == '/') ul--;
  if ((strncmp(url, "http://", 7) && strncmp(url, "https://", 8)) || ul >= sizeof c.url) {
    msg("--url / DAPOD_URL: '%s' is not an http:// or https:// URL", url);
    return EXIT_USAGE;
  }
  memcpy(c.url, url, ul);
  c.url[ul] = '\0';
  if (key && key[0]) {
    if (strpbrk(key, "\r\n") ||
        snprintf(c.auth, sizeof c.auth, "Authorization: Bearer %s", key) >= (int)sizeof c.auth) {
      msg("--api-key / DAPOD_API_KEY: too long or has a line break");
      return EXIT_USAGE;
    }
  }
  c.json = o.json;
  if (o.given & O_TIMEOUT) c.deadline = now_s() + o.timeout_s;
  if (curl_global_init(CURL_GLOBAL_DEFAULT) || !(c.curl = curl_easy_init())) {
    msg("cannot initialise libcurl");
    return EXIT_CONNECT;
  }
  char **args = pos + 1;
  if (!strcmp(cmd->name, "upload"))
    rc = cmd_upload(&c, &o, args);
  else if (!strcmp(cmd->name, "submit"))
    rc = cmd_submit(&c, &o, args);
  else if (!strcmp(cmd->name, "logs"))
    rc = cmd_logs(&c, &o, args);
  else if (!strcmp(cmd->name, "status"))
    rc = cmd_status(&c, &o, args);
  else if (!strcmp(cmd->name, "list"))
    rc = cmd_list(&c, &o, args);
  else if (!strcmp(cmd->name, "cancel") || !strcmp(cmd->name, "pause") ||
           !strcmp(cmd->name, "resume"))
    rc = cmd_action(&c, cmd->name, args);
  else if (!strcmp(cmd->name, "rollouts"))
    rc = cmd_rollouts(&c, &o, args);
  else
    rc = cmd_download(&c, &o, args);
  fflush(stdout);
  curl_easy_cleanup(c.curl);
  curl_global_cleanup();
  return rc;
}
