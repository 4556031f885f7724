/* The error registry's rows (api/errors.h). Titles are fixed per row; the per-occurrence text
 * goes into the problem's `detail`. */
#include "errors.h"

#include <string.h>

static const struct api_err_row ROWS[API_ERR_COUNT] = {
    {API_ERR_INVALID_REQUEST, "invalid_request", 400, "Invalid request",
     "fix the query parameter, header or form field named in detail"},
    {API_ERR_INVALID_JSON, "invalid_json", 400, "Malformed JSON body",
     "send one JSON value that parses (detail gives line, column and byte position) and nests "
     "no deeper than max_json_depth"},
    {API_ERR_UNAUTHORIZED, "unauthorized", 401, "Authentication required",
     "send Authorization: Bearer <key> with a key the server knows"},
    {API_ERR_FORBIDDEN, "forbidden", 403, "Forbidden", "use a key that may do this"},
    {API_ERR_NOT_FOUND, "not_found", 404, "Not found",
     "check the path, or the id: it may not exist or belong to another key"},
    {API_ERR_METHOD_NOT_ALLOWED, "method_not_allowed", 405, "Method not allowed",
     "use one of the methods in the Allow header"},
    {API_ERR_CONFLICT, "conflict", 409, "Conflict",
     "the resource's current state forbids this; read it again and retry when it changed"},
    {API_ERR_FILE_IN_USE, "file_in_use", 409, "File in use",
     "a job that has not finished uses the file; cancel it or wait until it ends"},
    {API_ERR_PAYLOAD_TOO_LARGE, "payload_too_large", 413, "Payload too large",
     "send a smaller body: JSON bodies up to max_body_bytes, uploads up to max_upload_bytes"},
    {API_ERR_UNSUPPORTED_MEDIA, "unsupported_media_type", 415, "Unsupported media type",
     "send the Content-Type that the endpoint accepts (detail lists them)"},
    {API_ERR_RANGE_NOT_SATISFIABLE, "range_not_satisfiable", 416, "Range not satisfiable",
     "ask for bytes within the file: Content-Range gives its size"},
    {API_ERR_VALIDATION_FAILED, "validation_failed", 422, "Validation failed",
     "fix every entry of errors[]: each names the field or line at fault"},
    {API_ERR_TOO_MANY_REQUESTS, "too_many_requests", 429, "Too many requests",
     "a limit on live or queued jobs is reached; retry later"},
    {API_ERR_INTERNAL, "internal", 500, "Internal server error",
     "a bug or an I/O failure in the server; the server log has the details"},
    {API_ERR_NOT_IMPLEMENTED, "not_implemented", 501, "Not implemented",
     "this build does not serve the endpoint yet"},
    {API_ERR_UNAVAILABLE, "unavailable", 503, "Service unavailable",
     "the server is starting, stopping or out of resources; retry later"},
};

const struct api_err_row *api_err_row(enum api_err code) {
  if ((int)code < 0 || code >= API_ERR_COUNT) return &ROWS[API_ERR_INTERNAL];
  return &ROWS[code];
}

const struct api_err_row *api_err_find(const char *name) {
  for (int i = 0; i < API_ERR_COUNT; i++)
    if (!strcmp(ROWS[i].name, name)) return &ROWS[i];
  return NULL;
}

int api_err_count(void) {
  return API_ERR_COUNT;
}

const struct api_err_row *api_err_get(int i) {
  return i >= 0 && i < API_ERR_COUNT ? &ROWS[i] : NULL;
}
