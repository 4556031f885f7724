/* The error registry: one row per problem the API answers with, shared by the handlers, the
 * docs (docs/API_NOTES.md), openapi.yaml and the tests. A row's snake_name and HTTP status never
 * change once shipped; clients branch on the name (the last segment of the problem `type`). */
#ifndef DAPOD_API_ERRORS_H
#define DAPOD_API_ERRORS_H

/* Handlers name a row by its enum value (a typo is a compile error, not a runtime 500). */
enum api_err {
  API_ERR_INVALID_REQUEST = 0,   /* 400 malformed request: query parameter, header, form */
  API_ERR_INVALID_JSON,          /* 400 the body is not JSON, or nests deeper than allowed */
  API_ERR_UNAUTHORIZED,          /* 401 missing or unknown API key */
  API_ERR_FORBIDDEN,             /* 403 the key may not do this */
  API_ERR_NOT_FOUND,             /* 404 no such path, or no such resource (visible to the key) */
  API_ERR_METHOD_NOT_ALLOWED,    /* 405 known path, other method (Allow header lists them) */
  API_ERR_CONFLICT,              /* 409 the resource's state forbids this */
  API_ERR_FILE_IN_USE,           /* 409 a job that has not finished uses the file */
  API_ERR_PAYLOAD_TOO_LARGE,     /* 413 body over max_body_bytes or upload over max_upload_bytes */
  API_ERR_UNSUPPORTED_MEDIA,     /* 415 Content-Type not accepted by this endpoint */
  API_ERR_RANGE_NOT_SATISFIABLE, /* 416 a download's Range lies outside the file */
  API_ERR_VALIDATION_FAILED,     /* 422 well-formed body whose fields break the rules: errors[] */
  API_ERR_TOO_MANY_REQUESTS,     /* 429 a limit on live jobs or queue length is reached */
  API_ERR_INTERNAL,              /* 500 a bug or an I/O failure on our side, never bad input */
  API_ERR_NOT_IMPLEMENTED,       /* 501 known to the contract, not served by this build */
  API_ERR_UNAVAILABLE,           /* 503 not ready (storage closed, shutting down), out of memory */
  API_ERR_COUNT
};

struct api_err_row {
  enum api_err code;
  const char *name;  /* snake_case, stable */
  int http_status;   /* 4xx or 5xx */
  const char *title; /* the problem's `title`: short, the same for every occurrence */
  const char *hint;  /* what a client should do; the docs and the --help of the registry */
};

/* Prefix of every problem `type`: type = API_PROBLEM_BASE + name. */
#define API_PROBLEM_BASE "https://dapod.dev/problems/"

/* The row of code (borrowed, static); the INTERNAL row for a value out of range. */
const struct api_err_row *api_err_row(enum api_err code);

/* The row called name (borrowed, static) or NULL. */
const struct api_err_row *api_err_find(const char *name);

/* Number of rows and the i-th row (NULL out of range); for docs and tests. */
int api_err_count(void);
const struct api_err_row *api_err_get(int i);

#endif
