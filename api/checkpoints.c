/* Handlers: GET /v1/jobs/{id}/checkpoints (the complete checkpoints of a job: step, created_at,
 * metrics, files [{name, bytes, sha256}], and the model id to sample from) and
 * GET /v1/jobs/{id}/checkpoints/{step}/{file} (one file, sent from disk with Content-Length,
 * ETag "<sha256>", If-None-Match -> 304, Range -> 206 / 416).
 *
 * Only names listed in the checkpoint's index row are served, and a name with '/', "..", a
 * control character or a leading '.' is refused before the row is even read, so no path outside
 * the checkpoint folder is reachable by any name. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <microhttpd.h>

#include "handlers.h"
#include "http.h"
#include "log.h"
#include "registry.h"
#include "parse.h"
#include "server.h"
#include "store.h"

static json_t *ckpt_json(const char *job_id, const struct store_ckpt *c) {
  char model[STORE_ID_MAX + 32];
  registry_ckpt_id(job_id, (long long)c->step, model, sizeof model);
  return json_pack("{s:s, s:I, s:s, s:I, s:O, s:O}", "object", "checkpoint", "step",
                   (json_int_t)c->step, "model", model, "created_at", (json_int_t)c->created_at,
                   "metrics", c->metrics ? c->metrics : json_null(), "files",
                   c->files ? c->files : json_array());
}

int api_checkpoints_list(struct api_req *r) {
  const char *id = r->params[0];
  struct store_job job;
  if (api_job_load(r, id, &job)) return 0;
  store_job_deinit(&job);
  struct store_ckpt_list l = {0};
  struct dapo_err e = {0};
  int rc = store_ckpt_list(r->srv->store, id, &l, &e);
  if (rc) return api_reply_store_error(r, rc, &e);
  json_t *data = json_array();
  for (size_t i = 0; data && i < l.n; i++)
    if (json_array_append_new(data, ckpt_json(id, &l.v[i]))) {
      json_decref(data);
      data = NULL;
    }
  store_ckpt_list_deinit(&l);
  json_t *o = api_list_json(data, 0, NULL);
  return api_reply_json_steal(r, 200, o);
}

/* A file name that can only name an entry of the folder itself. */
static int name_ok(const char *name) {
  if (!name[0] || name[0] == '.' || strlen(name) > 255) return 0;
  for (const char *p = name; *p; p++)
    if (*p == '/' || *p == '\\' || (unsigned char)*p < 0x20 || *p == 0x7f) return 0;
  return strstr(name, "..") == NULL;
}

/* Parses a single "bytes=a-b" / "bytes=a-" / "bytes=-n" range against size. Returns 1 with
 * [*first, *last] set, 0 when the header is to be ignored (not a single byte range: the whole
 * file is sent), -1 when it is unsatisfiable (416). */
static int parse_range(const char *h, uint64_t size, uint64_t *first, uint64_t *last) {
  while (*h == ' ') h++;
  if (strncmp(h, "bytes=", 6)) return 0;
  h += 6;
  if (strchr(h, ',')) return 0; /* several ranges: served whole (RFC 9110 allows it) */
  const char *dash = strchr(h, '-');
  if (!dash) return 0;
  char a[32], b[32];
  size_t na = (size_t)(dash - h), nb = strlen(dash + 1);
  if (na >= sizeof a || nb >= sizeof b) return 0;
  memcpy(a, h, na);
  a[na] = '\0';
  memcpy(b, dash + 1, nb + 1);
  while (nb && b[nb - 1] == ' ') b[--nb] = '\0';
  uint64_t x, y;
  if (!na) { /* suffix: the last y bytes */
    if (!nb || parse_u64(b, &y, "range", NULL)) return 0;
    if (y == 0 || size == 0) return -1;
    *first = y >= size ? 0 : size - y;
    *last = size - 1;
    return 1;
  }
  if (parse_u64(a, &x, "range", NULL)) return 0;
  if (nb && parse_u64(b, &y, "range", NULL)) return 0;
  if (nb && y < x) return 0; /* invalid: ignored */
  if (x >= size) return -1;
  *first = x;
  *last = !nb || y >= size ? size - 1 : y;
  return 1;
}

/* 1 when an If-None-Match list names etag (or is "*"). */
static int etag_matches(const char *inm, const char *etag) {
  if (!inm) return 0;
  if (!strcmp(inm, "*")) return 1;
  size_t n = strlen(etag);
  for (const char *p = inm; (p = strstr(p, etag)); p += n) {
    char before = p == inm ? ',' : p[-1];
    if (before == ',' || before == ' ' || before == '/') return 1; /* W/"..." counts too */
  }
  return 0;
}

int api_checkpoints_file(struct api_req *r) {
  const char *id = r->params[0], *step_s = r->params[1], *name = r->params[2];
  int64_t step;
  if (parse_i64(step_s, 0, INT64_MAX, &step, "step", NULL))
    return api_reply_errorf(r, API_ERR_NOT_FOUND, "no such checkpoint: step '%.32s'", step_s);
  if (!name_ok(name))
    return api_reply_errorf(r, API_ERR_NOT_FOUND, "no such file in a checkpoint: '%.100s'", name);
  struct store_job job;
  if (api_job_load(r, id, &job)) return 0;
  store_job_deinit(&job);
  struct store_ckpt c;
  struct dapo_err e = {0};
  int rc = store_ckpt_get(r->srv->store, id, step, &c, &e);
  if (rc == STORE_ENOTFOUND)
    return api_reply_errorf(r, API_ERR_NOT_FOUND, "job %.64s has no checkpoint of step %lld", id,
                            (long long)step);
  if (rc) return api_reply_store_error(r, rc, &e);
  const char *sha = NULL;
  size_t i;
  json_t *f;
  json_array_foreach(c.files, i, f) {
    if (!strcmp(json_string_value(json_object_get(f, "name"))
                    ? json_string_value(json_object_get(f, "name"))
                    : "",
                name))
      sha = json_string_value(json_object_get(f, "sha256"));
  }
  if (!sha) {
    store_ckpt_deinit(&c);
    return api_reply_errorf(r, API_ERR_NOT_FOUND,
                            "the checkpoint of step %lld has no file '%.100s'", (long long)step,
                            name);
  }
  char etag[80], path[4096];
  snprintf(etag, sizeof etag, "\"%.64s\"", sha);
  int too_long = (size_t)snprintf(path, sizeof path, "%s/%s", c.path, name) >= sizeof path;
  store_ckpt_deinit(&c);
  if (too_long) return api_reply_error(r, API_ERR_INTERNAL, "checkpoint path too long", NULL);
  const char *ctype = strstr(name, ".json") ? "application/json" : "application/octet-stream";
  if (etag_matches(api_header(r, MHD_HTTP_HEADER_IF_NONE_MATCH), etag)) {
    if (api_reply_text(r, 304, ctype, "", 0)) return -1;
    api_reply_header(r, MHD_HTTP_HEADER_ETAG, etag);
    return 0;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    int err = errno;
    if (fd >= 0) close(fd);
    LOG(WARN, "checkpoint file %s: %s", path, strerror(err));
    return api_reply_errorf(r, API_ERR_NOT_FOUND,
                            "the file '%.100s' of step %lld is gone (pruned or deleted)", name,
                            (long long)step);
  }
  uint64_t size = (uint64_t)st.st_size, first = 0, last = size ? size - 1 : 0;
  const char *range = api_header(r, MHD_HTTP_HEADER_RANGE);
  const char *if_range = api_header(r, MHD_HTTP_HEADER_IF_RANGE);
  int pr =
      range && (!if_range || !strcmp(if_range, etag)) ? parse_range(range, size, &first, &last) : 0;
  char cr[96];
  if (pr < 0) {
    close(fd);
    snprintf(cr, sizeof cr, "bytes */%" PRIu64, size);
    rc = api_reply_errorf(r, API_ERR_RANGE_NOT_SATISFIABLE,
                          "range '%.64s' is outside the file's %" PRIu64 " bytes", range, size);
    api_reply_header(r, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
    return rc;
  }
  if (pr > 0) {
    if (api_reply_fd_range(r, 206, ctype, fd, first, last - first + 1)) return -1;
    snprintf(cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, first, last, size);
    api_reply_header(r, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
  } else if (api_reply_fd(r, 200, ctype, fd, size)) {
    return -1;
  }
  api_reply_header(r, MHD_HTTP_HEADER_ETAG, etag);
  api_reply_header(r, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
  char disp[320];
  snprintf(disp, sizeof disp, "attachment; filename=\"%s\"", name);
  api_reply_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disp);
  return 0;
}
