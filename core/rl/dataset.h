/* dataset: the JSON Lines training and validation files of API.md ("Datasets"): per-line
 * validation that names the line and the field, a bounded streaming reader (also fed chunk by
 * chunk while an upload is written to disk), and the deterministic, exactly resumable
 * epoch-shuffled order in which a job draws prompts (DAPO.md step 1). */
#ifndef DAPO_DATASET_H
#define DAPO_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "error.h"

#define DS_DEFAULT_MAX_LINE_BYTES ((size_t)1 << 20) /* 1 MiB per line */
#define DS_DEFAULT_MAX_ITEMS 1000000
#define DS_DEFAULT_MAX_ERRORS 100 /* the API lists the first 100 invalid lines */
#define DS_MAX_METADATA_DEPTH 64  /* metadata {} is depth 1, each nested container one more */

/* One dataset line. Every pointer is owned by whoever holds the item: the dataset for items of
 * a loaded dataset, the caller (release with ds_item_deinit) for ds_check_line's out. */
struct ds_item {
  char *id;         /* the given id ("7" for an integer id) or "line-N"; never NULL */
  char *prompt;     /* NULL when the line gives messages */
  json_t *messages; /* array of {"role", "content"} objects, or NULL when the line gives prompt */
  char *answer;     /* never NULL */
  json_t *metadata; /* object, or NULL when absent */
  json_t *tools;    /* the line's tools: a non-empty array of OpenAI's function shapes
                       {"type": "function", "function": {"name", ...}} as given (checked: names
                       unique, at most TOOLS_MAX), or NULL when absent, null or [] */
  int line;         /* 1-based physical line number in the file */
};

/* Bounds for reading a file. A zero field takes its default (DS_DEFAULT_*); NULL limits mean
 * all defaults. */
struct ds_limits {
  size_t max_line_bytes;   /* longest line, without its "\n" or "\r\n" */
  int max_items;           /* more items than this fail the whole file with DAPO_ERANGE */
  int max_errors_reported; /* invalid lines listed in the report; all of them are counted */
};

/* One invalid line; message has no "line N: " prefix (the API gives line separately). */
struct ds_line_error {
  int line;
  char message[512];
};

/* What reading a file found. Initialise with ds_report_init, release with ds_report_deinit. */
struct ds_report {
  int64_t n_lines;              /* physical lines read, blank ones included */
  int64_t n_items;              /* valid non-blank lines */
  int64_t n_errors;             /* invalid lines, all of them */
  int n_reported;               /* entries in errors, at most max_errors_reported */
  struct ds_line_error *errors; /* owned; the first n_reported invalid lines in file order */
};

struct dataset;   /* opaque: the items of a loaded file plus a permutation cache */
struct ds_stream; /* opaque: a push-style reader fed with chunks of a file */

/* Validates one line of a dataset. line[0..len) is one line; a trailing "\n" or "\r\n" may be
 * included, any other line break is an error. lineno (1-based) appears in messages
 * ("line 7: field 'answer': expected a string") and lets line 1 start with a UTF-8 byte-order
 * mark. The length cap is not checked here: the caller bounds its line buffer (ds_stream does).
 * Returns 0 for an item, and then fills *out (when non-NULL; the caller owns the fields and
 * releases them with ds_item_deinit); 1 for a blank line (only spaces, tabs and CR), *out
 * untouched; DAPO_EFORMAT for an invalid line; DAPO_ENOMEM. Thread-safe. */
int ds_check_line(const char *line, size_t len, int lineno, struct ds_item *out,
                  struct dapo_err *e);

/* The names of the item's tools (borrowed from it) into names[0..cap); returns how many (0 when
 * it has none). */
int ds_item_tool_names(const struct ds_item *it, const char **names, int cap);

/* Releases the fields of an item filled by ds_check_line and zeroes it; NULL is fine. */
void ds_item_deinit(struct ds_item *it);

void ds_report_init(struct ds_report *rep);
/* Frees rep->errors and zeroes rep; NULL is fine. */
void ds_report_deinit(struct ds_report *rep);

/* The API's `errors` array, [{"line": N, "message": "..."}], for the reported lines: a new
 * reference, NULL when out of memory. */
json_t *ds_report_to_json(const struct ds_report *rep);

/* A push-style reader: feed the bytes of a file in chunks of any size (as an upload arrives),
 * then finish. Lines are split and validated as they complete; a line never takes more than
 * max_line_bytes + 2 bytes of memory (the rest of an overlong line is skipped and reported).
 * keep_items: nonzero keeps the items so that finish can return a dataset.
 * ds_stream_new returns NULL when out of memory. One stream belongs to one thread at a time. */
struct ds_stream *ds_stream_new(const struct ds_limits *lim, int keep_items);

/* Feeds n bytes. Invalid lines are recorded in the stream's report and do not fail this call;
 * it fails (and the stream is then finished for good) only for DAPO_ENOMEM or DAPO_ERANGE (more
 * than max_items items, more than INT_MAX lines). */
int ds_stream_feed(struct ds_stream *s, const void *buf, size_t n, struct dapo_err *e);

/* Ends the input (a last line without "\n" counts) and decides. Returns 0 when the file has at
 * least one item and no invalid line; DAPO_EFORMAT "dataset invalid: 3 errors, first: line 7:
 * ..." or "dataset has no items ..." otherwise; or the error of a failed feed. rep (may be NULL)
 * receives the report in every case (the caller deinits it; pass an initialised or zeroed one,
 * its old contents are released). out (may be NULL; requires keep_items) receives the dataset
 * on success (owned by the caller: ds_free), NULL otherwise. */
int ds_stream_finish(struct ds_stream *s, struct dataset **out, struct ds_report *rep,
                     struct dapo_err *e);

/* Frees a stream (finished or not); NULL is fine. */
void ds_stream_free(struct ds_stream *s);

/* Reads the file at path in bounded chunks (never whole, never an unbounded line) through a
 * ds_stream. Returns 0 and *out (owned by the caller: ds_free); DAPO_EIO for open/read errors,
 * DAPO_EFORMAT for an invalid or empty file, DAPO_ERANGE, DAPO_ENOMEM, with *out NULL. rep (may
 * be NULL) receives the report as in ds_stream_finish. Thread-safe. */
int ds_load(const char *path, const struct ds_limits *lim, struct dataset **out,
            struct ds_report *rep, struct dapo_err *e);

/* ds_load without keeping the items (POST /v1/files/validate): same checks, same report, same
 * return values. Thread-safe. */
int ds_validate_file(const char *path, const struct ds_limits *lim, struct ds_report *rep,
                     struct dapo_err *e);

/* Frees a dataset and its items; NULL is fine. */
void ds_free(struct dataset *d);

/* Number of items (>= 1 for a loaded dataset). */
int ds_count(const struct dataset *d);

/* The i-th item in file order, borrowed: lives as long as d. NULL when i is out of range. */
const struct ds_item *ds_get(const struct dataset *d, int i);

/* Where a job is in its walk over the training file; three integers that a checkpoint saves.
 * Start with {seed, 0, 0}. pos counts the items already drawn in epoch `epoch` (0..n). */
struct ds_cursor {
  uint64_t seed;
  int64_t epoch;
  int64_t pos;
};

/* The RNG stream of epoch k's permutation is DS_RNG_STREAM_TAG ^ k, seeded with the cursor's
 * seed: other users of the job seed must pick other streams. */
#define DS_RNG_STREAM_TAG 0x6473657400000000ULL /* "dset" */

/* Returns the index of the next item and advances c. Epoch k visits 0..n-1 once each, in the
 * order of a Fisher-Yates shuffle (rng_shuffle_int) of the identity drawn from
 * rng_seed(seed, DS_RNG_STREAM_TAG ^ k); when pos reaches n the next call starts epoch k+1 at
 * pos 0. The cursor alone determines the sequence, so a copy (say, from a checkpoint) continues
 * exactly like the original, also when copied at an epoch boundary (pos == n). Returns
 * DAPO_EINVAL when the cursor does not fit d (negative fields, pos > n).
 * Not thread-safe per dataset handle: it caches the current epoch's permutation in d (computed
 * again when the seed or epoch changes, O(n)). Use one handle per thread. */
int ds_next(const struct dataset *d, struct ds_cursor *c);

#endif
