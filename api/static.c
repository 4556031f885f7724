/* The web dashboard's static files (clients/web, copied to the build's web/ and installed to
 * share/dapod/web): GET / and GET /ui redirect to /ui/; GET /ui/ and GET /ui/{file} send a file
 * of the folder `web_dir` (no API key needed: the files hold no data; the page's API calls send
 * the key). Flat folder, names [A-Za-z0-9][A-Za-z0-9._-]*, known extensions only, so no path
 * ever leaves the folder; ETag/Last-Modified with Cache-Control: no-cache (revalidated: 304 on
 * If-None-Match, or on If-Modified-Since without it). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "handlers.h"
#include "hparams.h"
#include "http.h"
#include "server.h"

/* The only extensions served, and their types. Anything else is 404: a stray file dropped into
 * the folder (an editor's backup, a key) is never sent. */
static const struct {
  const char *ext, *type;
} TYPES[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".mjs", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".json", "application/json; charset=utf-8"},
    {".svg", "image/svg+xml"},
    {".png", "image/png"},
    {".ico", "image/x-icon"},
    {".txt", "text/plain; charset=utf-8"},
    {".woff2", "font/woff2"},
};

/* The page may load only its own files and talk only to its own origin; it is never framed. */
#define CSP                                                                                        \
  "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; connect-src 'self'; "         \
  "frame-ancestors 'none'; base-uri 'none'; form-action 'none'; object-src 'none'"

/* Generated at request time from the daemon's own table, so the form's defaults and bounds are
 * always those of this build (core/rl/hparams.c). */
#define HPARAMS_FILE "hyperparameters.json"

#define NAME_MAX_LEN 128

/* 1 when name is one file of a flat folder: [A-Za-z0-9][A-Za-z0-9._-]{0,127} without "..". */
static int name_ok(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > NAME_MAX_LEN || strstr(name, "..")) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) return 0;
  }
  return 1;
}

static const char *type_of(const char *name) {
  const char *dot = strrchr(name, '.');
  if (!dot) return NULL;
  for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
    if (!strcmp(dot, TYPES[i].ext)) return TYPES[i].type;
  return NULL;
}

/* Headers of every file reply. */
static void common_headers(struct api_req *r, const char *type) {
  api_reply_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  api_reply_header(r, "X-Content-Type-Options", "nosniff");
  api_reply_header(r, "Referrer-Policy", "no-referrer");
  if (!strncmp(type, "text/html", 9)) api_reply_header(r, "Content-Security-Policy", CSP);
}

static int not_found(struct api_req *r, const char *name) {
  return api_reply_errorf(r, API_ERR_NOT_FOUND, "no such file of the web dashboard: %.200s", name);
}

int api_static_root(struct api_req *r) {
  static const char body[] = "The dashboard is at /ui/\n";
  if (!r->srv->cfg.web_dir[0])
    return api_reply_error(r, API_ERR_NOT_FOUND,
                           "the web dashboard is off (web_dir is empty or was not found)", NULL);
  api_reply_text(r, 302, "text/plain; charset=utf-8", body, sizeof body - 1);
  api_reply_header(r, MHD_HTTP_HEADER_LOCATION, "/ui/");
  return 0;
}

/* "<size hex>-<mtime ns hex>": changes whenever the file is rewritten (copied by a build). */
static void make_etag(const struct stat *st, char *buf, size_t cap) {
  uint64_t ns = (uint64_t)st->st_mtim.tv_sec * 1000000000u + (uint64_t)st->st_mtim.tv_nsec;
  snprintf(buf, cap, "\"%" PRIx64 "-%" PRIx64 "\"", (uint64_t)st->st_size, ns);
}

/* 1 when If-None-Match lists etag (or is "*"); weak comparison, as RFC 9110 asks for GET. */
static int inm_matches(const char *inm, const char *etag) {
  if (!inm) return 0;
  size_t n = strlen(etag);
  for (const char *p = inm; *p;) {
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    if (*p == '*') return 1;
    if (!strncmp(p, "W/", 2)) p += 2;
    if (!strncmp(p, etag, n) && (p[n] == '\0' || p[n] == ',' || p[n] == ' ')) return 1;
    while (*p && *p != ',') p++;
  }
  return 0;
}

/* 1 when If-Modified-Since (an IMF-fixdate; other forms are ignored, as RFC 9110 allows for an
 * invalid date) is not before the file's mtime in whole seconds. Only asked without
 * If-None-Match, which takes precedence. */
static int not_modified_since(const char *ims, const struct stat *st) {
  if (!ims) return 0;
  struct tm tm = {0};
  const char *end = strptime(ims, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (!end || *end) return 0;
  time_t t = timegm(&tm);
  return t != (time_t)-1 && st->st_mtim.tv_sec <= t;
}

static int reply_hparams(struct api_req *r) {
  json_t *d = hparams_describe();
  if (!d) return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  json_t *o = json_pack("{s:s, s:o}", "object", "hyperparameters.table", "data", d);
  api_reply_json_steal(r, 200, o);
  common_headers(r, "application/json");
  return 0;
}

int api_static_file(struct api_req *r) {
  const char *dir = r->srv->cfg.web_dir;
  const char *name = r->n_params ? r->params[0] : "index.html";
  if (!dir[0])
    return api_reply_error(r, API_ERR_NOT_FOUND,
                           "the web dashboard is off (web_dir is empty or was not found)", NULL);
  const char *type = type_of(name);
  if (!name_ok(name) || !type) return not_found(r, name);
  if (!strcmp(name, HPARAMS_FILE)) return reply_hparams(r);

  char path[4096 + NAME_MAX_LEN + 2];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR || errno == EACCES) return not_found(r, name);
    return api_reply_errorf(r, API_ERR_INTERNAL, "%s: %s", name, strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    close(fd);
    return not_found(r, name);
  }
  char etag[64], lm[64];
  make_etag(&st, etag, sizeof etag);
  struct tm tm;
  gmtime_r(&st.st_mtim.tv_sec, &tm);
  strftime(lm, sizeof lm, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  const char *inm = api_header(r, MHD_HTTP_HEADER_IF_NONE_MATCH);
  if (inm ? inm_matches(inm, etag)
          : not_modified_since(api_header(r, MHD_HTTP_HEADER_IF_MODIFIED_SINCE), &st)) {
    close(fd);
    api_reply_text(r, 304, type, "", 0);
  } else {
    api_reply_fd(r, 200, type, fd, (uint64_t)st.st_size); /* fd stolen */
  }
  api_reply_header(r, MHD_HTTP_HEADER_ETAG, etag);
  api_reply_header(r, MHD_HTTP_HEADER_LAST_MODIFIED, lm);
  common_headers(r, type);
  return 0;
}
