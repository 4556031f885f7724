/* Handlers: POST /v1/files (upload, streamed to disk), POST /v1/files/validate (the same
 * validation, nothing stored), GET /v1/files (list), GET /v1/files/{id} (metadata),
 * GET /v1/files/{id}/content (the original bytes), DELETE /v1/files/{id}.
 *
 * An upload is a raw body (Content-Type application/x-ndjson or application/jsonl, with
 * ?purpose=&filename=) or multipart/form-data with a `file` part and an optional `purpose` field.
 * Either way each chunk is written to data_dir/files/<id>.jsonl.tmp, hashed and fed to the
 * dataset validator (ds_stream_feed) as it arrives; at the end the file is fsynced, renamed to
 * <id>.jsonl and only then inserted into the store. An invalid dataset is stored too, with
 * validation "invalid" (OpenAI's status "error") and its first 100 {line, message} errors, and
 * answered 201 like a valid one (docs/API_NOTES.md). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <microhttpd.h>

#include "dataset.h"
#include "dpo.h"
#include "handlers.h"
#include "http.h"
#include "log.h"
#include "server.h"
#include "sft.h"
#include "sha256.h"
#include "store.h"

#define PURPOSE_DEFAULT "fine-tune"
#define FILENAME_DEFAULT "upload.jsonl"
#define PURPOSE_MAX 64
#define FILENAME_MAX_BYTES 255

/* ---- the file object ---- */

/* OpenAI's status_details of a file that failed the check: its first problem and how many the
 * file object's errors list. */
static json_t *status_details(const json_t *errors) {
  const json_t *first = json_array_get(errors, 0);
  const char *msg = json_string_value(json_object_get(first, "message"));
  json_int_t line = json_integer_value(json_object_get(first, "line"));
  size_t n = json_array_size(errors);
  char where[32] = "", more[96] = "";
  if (line > 0) snprintf(where, sizeof where, "line %" JSON_INTEGER_FORMAT ": ", line);
  if (n > 1) snprintf(more, sizeof more, " (the first of %zu problems listed in errors)", n);
  return json_sprintf("invalid dataset: %s%s%s", where, msg ? msg : "not a dataset", more);
}

/* ---- which methods a file fits (issue 27) ---- */

/* The first problem of the supervised and DPO checks over a file's lines, NULL while none. */
struct fit {
  char *err[2];
  int lines; /* non-blank lines read */
};

static int fit_line(void *ctx, const json_t *line, int lineno, struct dapo_err *e) {
  struct fit *ft = ctx;
  ft->lines++;
  int (*check[2])(const json_t *, int, struct dapo_err *) = {sft_check_line, dpo_check_line};
  for (int k = 0; k < 2; k++)
    if (!ft->err[k] && check[k](line, lineno, e)) ft->err[k] = strdup(e->msg);
  return ft->err[0] && ft->err[1]; /* nothing left to learn */
}

/* {"methods": the training methods the file at path fits ("dapo" when dapo_ok: the dataset
 * check's verdict; "supervised", "dpo" when every line passes sft_check_line, dpo_check_line),
 * "method_errors": {method: the first problem (its line and field)} for the others}; NULL when
 * out of memory. */
static json_t *methods_of_file(const char *path, int dapo_ok) {
  static const char *const NAMES[2] = {"supervised", "dpo"};
  struct fit ft = {{NULL, NULL}, 0};
  struct dapo_err e = {0};
  int rc = sft_each_line(path, fit_line, &ft, &e);
  if (rc && !(ft.err[0] && ft.err[1])) /* the file itself (a line not JSON, too long, I/O) */
    for (int k = 0; k < 2; k++)
      if (!ft.err[k]) ft.err[k] = strdup(e.msg);
  json_t *ms = json_array(), *errs = json_object();
  if (dapo_ok)
    json_array_append_new(ms, json_string("dapo"));
  else
    json_object_set_new(errs, "dapo", json_string("not a DAPO file: see errors"));
  for (int k = 0; k < 2; k++) {
    if (!ft.err[k] && !ft.lines) ft.err[k] = strdup("no lines"); /* an empty file */
    if (ft.err[k])
      json_object_set_new(errs, NAMES[k], json_string(ft.err[k]));
    else
      json_array_append_new(ms, json_string(NAMES[k]));
    free(ft.err[k]);
  }
  if (!ms || !errs) {
    json_decref(ms), json_decref(errs);
    return NULL;
  }
  return json_pack("{s:o, s:o}", "methods", ms, "method_errors", errs); /* stolen either way */
}

/* The file object: OpenAI's FileObject (status "processed", or "error" with status_details)
 * with dapod's own check beside it: validation "valid" | "invalid" (the DAPO check), errors when
 * invalid, methods (the training methods its lines fit) and method_errors (for the others, the
 * first problem by line and field; absent for files stored before dapod knew methods). */
static json_t *file_json(const struct store_file *f) {
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:o, s:s, s:I, s:I, s:I}", "id", f->id,
                        "object", "file", "filename", f->filename, "purpose", f->purpose, "bytes",
                        (json_int_t)f->bytes, "sha256", f->sha256, "status",
                        f->valid ? "processed" : "error", "status_details",
                        f->valid ? json_null() : status_details(f->errors), "validation",
                        f->valid ? "valid" : "invalid", "n_lines", (json_int_t)f->n_lines,
                        "n_items", (json_int_t)f->n_items, "created_at", (json_int_t)f->created_at);
  if (o && !f->valid) json_object_set(o, "errors", f->errors ? f->errors : json_array());
  if (o && f->methods) json_object_update(o, f->methods);
  return o;
}

/* ---- upload state ---- */

struct upload {
  struct api_req *r;            /* borrowed: the request */
  int keep;                     /* 1: POST /v1/files stores it; 0: validate only */
  struct MHD_PostProcessor *pp; /* multipart bodies only */
  int saw_file;                 /* multipart: a `file` part began */
  int in_purpose;               /* multipart: bytes of `purpose` so far */
  struct ds_stream *ds;
  int ds_failed; /* ds_stream_feed failed for good (too many items/lines): stop validating */
  struct dapo_sha256 sha;
  uint64_t bytes; /* of the file (not of the multipart framing) */
  int fd;         /* the temporary file, or -1 */
  char id[STORE_ID_MAX];
  char *tmp_path, *final_path; /* owned; tmp_path is unlinked by upload_free while set */
  char filename[FILENAME_MAX_BYTES + 1];
  char purpose[PURPOSE_MAX + 1];
};

static void upload_free(void *p) {
  struct upload *up = p;
  if (!up) return;
  if (up->pp) MHD_destroy_post_processor(up->pp);
  ds_stream_free(up->ds);
  if (up->fd >= 0) close(up->fd);
  if (up->tmp_path) unlink(up->tmp_path);
  free(up->tmp_path);
  free(up->final_path);
  free(up);
}

/* A purpose: 1..64 characters of [A-Za-z0-9._-]. */
static int purpose_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > PURPOSE_MAX) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return 0;
  }
  return 1;
}

/* Takes a client's file name: the part after the last '/' or '\\' (browsers may send a path),
 * 1..255 bytes of UTF-8 without control characters. Replies 400 and returns -1 otherwise. */
static int set_filename(struct upload *up, const char *name) {
  const char *b = name;
  for (const char *p = name; *p; p++)
    if (*p == '/' || *p == '\\') b = p + 1;
  size_t n = strlen(b);
  json_t *probe = n ? json_stringn(b, n) : NULL; /* jansson checks UTF-8 */
  int ok = probe && n <= FILENAME_MAX_BYTES;
  json_decref(probe);
  for (size_t i = 0; ok && i < n; i++)
    if ((unsigned char)b[i] < 0x20 || b[i] == 0x7f) ok = 0;
  if (!ok)
    return api_reply_error(up->r, API_ERR_INVALID_REQUEST,
                           "filename: must be 1..255 bytes of UTF-8 without control characters "
                           "or only slashes",
                           NULL),
           -1;
  memcpy(up->filename, b, n + 1);
  return 0;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k, n -= (size_t)k;
  }
  return 0;
}

/* One chunk of the file's bytes: size check, hash, validate, write. Replies and returns -1 on a
 * failure that ends the upload. */
static int feed(struct upload *up, const char *data, size_t n) {
  struct api_req *r = up->r;
  uint64_t cap = r->srv->cfg.max_upload_bytes;
  if (up->bytes > cap || n > cap - up->bytes)
    return api_reply_errorf(r, API_ERR_PAYLOAD_TOO_LARGE,
                            "the file exceeds max_upload_bytes (%llu bytes); nothing was stored",
                            (unsigned long long)cap),
           -1;
  up->bytes += n;
  dapo_sha256_feed(&up->sha, data, n);
  if (!up->ds_failed) {
    struct dapo_err e = {0};
    int rc = ds_stream_feed(up->ds, data, n, &e);
    if (rc == DAPO_ENOMEM)
      return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory validating the upload", NULL),
             -1;
    if (rc) up->ds_failed = 1; /* finish reports it; the bytes are still stored */
  }
  if (up->fd >= 0 && write_all(up->fd, data, n)) {
    int err = errno;
    LOG(ERROR, "writing %s: %s", up->tmp_path, strerror(err));
    return api_reply_errorf(r, API_ERR_INTERNAL, "writing the upload failed: %s", strerror(err)),
           -1;
  }
  return 0;
}

static enum MHD_Result on_form(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *filename, const char *content_type,
                               const char *transfer_encoding, const char *data, uint64_t off,
                               size_t size) {
  struct upload *up = cls;
  (void)kind, (void)content_type, (void)transfer_encoding;
  if (up->r->status) return MHD_NO;
  if (!strcmp(key, "file")) {
    if (off == 0 && !up->saw_file) {
      up->saw_file = 1;
      if (filename && filename[0] && set_filename(up, filename)) return MHD_NO;
    } else if (off == 0 && size > 0 && up->bytes > 0) {
      api_reply_error(up->r, API_ERR_INVALID_REQUEST, "form: more than one 'file' part", NULL);
      return MHD_NO;
    }
    return size && feed(up, data, size) ? MHD_NO : MHD_YES;
  }
  if (!strcmp(key, "purpose")) {
    if (off + size > PURPOSE_MAX) {
      api_reply_errorf(up->r, API_ERR_INVALID_REQUEST, "purpose: longer than %d characters",
                       PURPOSE_MAX);
      return MHD_NO;
    }
    memcpy(up->purpose + off, data, size);
    up->purpose[off + size] = '\0';
    up->in_purpose = 1;
    return MHD_YES;
  }
  api_reply_errorf(up->r, API_ERR_INVALID_REQUEST,
                   "form: unknown field '%.64s' (expected 'file' and 'purpose')", key);
  return MHD_NO;
}

/* Opens a new temporary file for up->id in the files folder. */
static int open_tmp(struct upload *up) {
  struct api_req *r = up->r;
  const char *dir = r->srv->files_dir;
  if (store_new_id("file", up->id))
    return api_reply_error(r, API_ERR_INTERNAL, "cannot make a file id", NULL), -1;
  size_t n = strlen(dir) + strlen(up->id) + 16;
  up->tmp_path = malloc(n);
  up->final_path = malloc(n);
  if (!up->tmp_path || !up->final_path)
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL), -1;
  snprintf(up->tmp_path, n, "%s/%s.jsonl.tmp", dir, up->id);
  snprintf(up->final_path, n, "%s/%s.jsonl", dir, up->id);
  up->fd = open(up->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (up->fd < 0) {
    int err = errno;
    free(up->tmp_path);
    up->tmp_path = NULL; /* not ours to unlink */
    LOG(ERROR, "creating an upload in %s: %s", dir, strerror(err));
    return api_reply_errorf(r, API_ERR_INTERNAL, "cannot create the upload file: %s",
                            strerror(err)),
           -1;
  }
  return 0;
}

static int is_raw_type(const struct api_req *r) {
  return api_content_type_is(r, "application/x-ndjson") ||
         api_content_type_is(r, "application/jsonl") ||
         api_content_type_is(r, "application/x-jsonlines") ||
         api_content_type_is(r, "application/jsonlines");
}

static int upload_begin(struct api_req *r, int keep) {
  int multipart = api_content_type_is(r, "multipart/form-data");
  if (!multipart && !is_raw_type(r))
    return api_reply_errorf(r, API_ERR_UNSUPPORTED_MEDIA,
                            "upload a dataset as multipart/form-data (fields 'file', 'purpose') "
                            "or as a raw body with Content-Type application/x-ndjson or "
                            "application/jsonl (got %.100s)",
                            r->content_type ? r->content_type : "no Content-Type");
  uint64_t cap = r->srv->cfg.max_upload_bytes;
  if (!multipart && r->content_length > 0 && (uint64_t)r->content_length > cap)
    return api_reply_errorf(r, API_ERR_PAYLOAD_TOO_LARGE,
                            "the file (%lld bytes) exceeds max_upload_bytes (%llu bytes); "
                            "nothing was stored",
                            (long long)r->content_length, (unsigned long long)cap);
  struct upload *up = calloc(1, sizeof *up);
  if (!up) return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  up->r = r;
  up->keep = keep;
  up->fd = -1;
  r->ctx = up;
  r->ctx_free = upload_free;
  snprintf(up->filename, sizeof up->filename, "%s", FILENAME_DEFAULT);
  const char *purpose = api_query(r, "purpose");
  const char *filename = api_query(r, "filename");
  if (purpose && !purpose_ok(purpose))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                            "purpose: '%.80s' must be 1..%d characters of [A-Za-z0-9._-]", purpose,
                            PURPOSE_MAX);
  snprintf(up->purpose, sizeof up->purpose, "%s", purpose ? purpose : "");
  if (filename && set_filename(up, filename)) return 0;
  dapo_sha256_begin(&up->sha);
  if (!(up->ds = ds_stream_new(NULL, 0)))
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  if (multipart) {
    up->pp = MHD_create_post_processor(r->conn, 64 * 1024, on_form, up);
    if (!up->pp)
      return api_reply_error(r, API_ERR_INVALID_REQUEST,
                             "multipart/form-data without a usable boundary parameter", NULL);
  }
  /* replies itself on failure; a validation writes the file too, for its methods (read again at
   * the end), and removes it before its reply */
  open_tmp(up);
  return 0;
}

int api_files_upload_begin(struct api_req *r) {
  return upload_begin(r, 1);
}

int api_files_validate_begin(struct api_req *r) {
  return upload_begin(r, 0);
}

int api_files_upload_chunk(struct api_req *r, const char *data, size_t n) {
  struct upload *up = r->ctx;
  if (!up->pp) return feed(up, data, n) && !r->status ? -1 : 0;
  if (MHD_post_process(up->pp, data, n) != MHD_YES && !r->status)
    return api_reply_error(r, API_ERR_INVALID_REQUEST, "malformed multipart/form-data body", NULL);
  return 0;
}

/* Ends the body: the multipart checks, then the validator's verdict into *rep and *errors
 * (owned). Returns 0, or -1 after replying. */
static int upload_finish(struct upload *up, struct ds_report *rep, json_t **errors) {
  struct api_req *r = up->r;
  *errors = NULL;
  ds_report_init(rep);
  if (up->pp) {
    int ok = MHD_destroy_post_processor(up->pp) == MHD_YES;
    up->pp = NULL;
    if (r->status) return -1;
    if (!ok)
      return api_reply_error(r, API_ERR_INVALID_REQUEST, "malformed multipart/form-data body",
                             NULL),
             -1;
    if (!up->saw_file)
      return api_reply_error(r, API_ERR_INVALID_REQUEST, "form: the 'file' field is missing", NULL),
             -1;
    if (up->in_purpose && !purpose_ok(up->purpose))
      return api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                              "purpose: '%.80s' must be 1..%d characters of [A-Za-z0-9._-]",
                              up->purpose, PURPOSE_MAX),
             -1;
  }
  if (!up->purpose[0]) snprintf(up->purpose, sizeof up->purpose, "%s", PURPOSE_DEFAULT);
  struct dapo_err e = {0};
  int rc = ds_stream_finish(up->ds, NULL, rep, &e);
  if (rc == DAPO_ENOMEM)
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory validating the upload", NULL), -1;
  if (rc) {
    *errors = ds_report_to_json(rep);
    /* A file-level problem (no items, too many items or lines) has no line of its own. */
    if (*errors && (rc != DAPO_EFORMAT || rep->n_reported == 0))
      json_array_append_new(*errors, json_pack("{s:o}", "message", dapo_json_text(e.msg)));
    if (!*errors) return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL), -1;
  }
  return 0;
}

static int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

int api_files_upload_end(struct api_req *r) {
  struct upload *up = r->ctx;
  struct ds_report rep;
  json_t *errors = NULL;
  if (upload_finish(up, &rep, &errors)) {
    ds_report_deinit(&rep);
    return 0;
  }
  struct store_file f = {0};
  snprintf(f.id, sizeof f.id, "%s", up->id);
  f.owner = (char *)(r->owner ? r->owner : "");
  f.filename = up->filename;
  f.purpose = up->purpose;
  f.bytes = (int64_t)up->bytes;
  dapo_sha256_end_hex(&up->sha, f.sha256);
  f.valid = errors == NULL;
  f.n_lines = rep.n_lines;
  f.n_items = rep.n_items;
  f.errors = errors;
  f.path = up->final_path;
  ds_report_deinit(&rep);
  /* Durable before it is announced: data, then the name, then the row. */
  int err = 0;
  if (fsync(up->fd) || close(up->fd)) err = errno;
  up->fd = -1;
  if (!err && rename(up->tmp_path, up->final_path)) err = errno;
  if (err) {
    json_decref(errors);
    LOG(ERROR, "storing %s: %s", up->final_path, strerror(err));
    return api_reply_errorf(r, API_ERR_INTERNAL, "storing the upload failed: %s", strerror(err));
  }
  free(up->tmp_path);
  up->tmp_path = NULL;
  if (fsync_dir(r->srv->files_dir)) LOG(WARN, "fsync %s: %s", r->srv->files_dir, strerror(errno));
  f.methods = methods_of_file(up->final_path, f.valid);
  struct dapo_err e = {0};
  int rc = store_file_insert(r->srv->store, &f, &e);
  if (rc) {
    json_decref(errors);
    json_decref(f.methods);
    unlink(up->final_path);
    return api_reply_store_error(r, rc, &e);
  }
  json_t *o = file_json(&f);
  json_decref(errors);
  json_decref(f.methods);
  char loc[STORE_ID_MAX + 16];
  snprintf(loc, sizeof loc, "/v1/files/%s", f.id);
  LOG(INFO, "file %s stored: %s, %lld bytes, %s", f.id, f.filename, (long long)f.bytes,
      f.valid ? "valid" : "invalid");
  if (api_reply_json_steal(r, 201, o)) return -1;
  api_reply_header(r, MHD_HTTP_HEADER_LOCATION, loc);
  return 0;
}

int api_files_validate_end(struct api_req *r) {
  struct upload *up = r->ctx;
  struct ds_report rep;
  json_t *errors = NULL;
  if (upload_finish(up, &rep, &errors)) {
    ds_report_deinit(&rep);
    return 0;
  }
  char sha[65];
  dapo_sha256_end_hex(&up->sha, sha);
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:I, s:s, s:I, s:I, s:I}", "object",
                        "file.validation", "status", errors ? "invalid" : "valid", "filename",
                        up->filename, "purpose", up->purpose, "bytes", (json_int_t)up->bytes,
                        "sha256", sha, "n_lines", (json_int_t)rep.n_lines, "n_items",
                        (json_int_t)rep.n_items, "n_errors", (json_int_t)rep.n_errors);
  ds_report_deinit(&rep);
  if (o)
    json_object_set_new(o, "errors", errors ? errors : json_array());
  else
    json_decref(errors);
  json_t *ms = o && up->tmp_path ? methods_of_file(up->tmp_path, !errors) : NULL;
  if (ms) json_object_update(o, ms);
  json_decref(ms);
  if (up->tmp_path) { /* gone before the reply: nothing of a validation outlives it */
    unlink(up->tmp_path);
    free(up->tmp_path);
    up->tmp_path = NULL;
  }
  return api_reply_json_steal(r, 200, o);
}

/* ---- reading and deleting ---- */

int api_files_list(struct api_req *r) {
  int limit;
  const char *after;
  if (api_page_params(r, &limit, &after)) return 0;
  struct store_file_list l = {0};
  struct dapo_err e = {0};
  int rc = store_file_list(r->srv->store, r->owner, limit, after, &l, &e);
  if (rc == STORE_ENOTFOUND) return api_reply_error(r, API_ERR_INVALID_REQUEST, e.msg, NULL);
  if (rc) return api_reply_store_error(r, rc, &e);
  json_t *data = json_array();
  for (size_t i = 0; data && i < l.n; i++)
    if (json_array_append_new(data, file_json(&l.v[i]))) {
      json_decref(data);
      data = NULL;
    }
  json_t *o = api_list_json(data, l.has_more, l.n ? json_string(l.v[l.n - 1].id) : NULL);
  store_file_list_deinit(&l);
  return api_reply_json_steal(r, 200, o);
}

int api_files_get(struct api_req *r) {
  struct store_file f;
  struct dapo_err e = {0};
  int rc = store_file_get(r->srv->store, r->params[0], r->owner, &f, &e);
  if (rc) return api_reply_store_error(r, rc, &e);
  json_t *o = file_json(&f);
  store_file_deinit(&f);
  return api_reply_json_steal(r, 200, o);
}

/* A Content-Disposition file name: printable ASCII without quotes or backslashes ('_' else). */
static void safe_name(const char *in, char *out, size_t cap) {
  size_t n = 0;
  for (; *in && n + 1 < cap; in++)
    out[n++] = (*in >= 0x20 && *in < 0x7f && *in != '"' && *in != '\\') ? *in : '_';
  out[n] = '\0';
}

int api_files_content(struct api_req *r) {
  struct store_file f;
  struct dapo_err e = {0};
  int rc = store_file_get(r->srv->store, r->params[0], r->owner, &f, &e);
  if (rc) return api_reply_store_error(r, rc, &e);
  int fd = open(f.path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    int err = errno;
    if (fd >= 0) close(fd);
    LOG(ERROR, "file %s: %s: %s", f.id, f.path, strerror(err));
    rc = err == ENOENT ? api_reply_errorf(r, API_ERR_NOT_FOUND, "no such file: %s", f.id)
                       : api_reply_errorf(r, API_ERR_INTERNAL, "cannot read file %s: %s", f.id,
                                          strerror(err));
    store_file_deinit(&f);
    return rc;
  }
  char name[FILENAME_MAX_BYTES + 1], disp[FILENAME_MAX_BYTES + 64], etag[70];
  safe_name(f.filename, name, sizeof name);
  snprintf(disp, sizeof disp, "attachment; filename=\"%s\"", name);
  snprintf(etag, sizeof etag, "\"%s\"", f.sha256);
  store_file_deinit(&f);
  if (api_reply_fd(r, 200, "application/x-ndjson", fd, (uint64_t)st.st_size)) return -1;
  api_reply_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disp);
  api_reply_header(r, MHD_HTTP_HEADER_ETAG, etag);
  return 0;
}

int api_files_delete(struct api_req *r) {
  char *path = NULL;
  struct dapo_err e = {0};
  int rc = store_file_delete(r->srv->store, r->params[0], r->owner, &path, &e);
  if (rc) return api_reply_store_error(r, rc, &e);
  if (path && unlink(path) && errno != ENOENT) LOG(WARN, "deleting %s: %s", path, strerror(errno));
  free(path);
  return api_reply_json_steal(
      r, 200, json_pack("{s:s, s:s, s:b}", "id", r->params[0], "object", "file", "deleted", 1));
}
