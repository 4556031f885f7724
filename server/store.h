/* The daemon's storage: one SQLite database <data_dir>/dapod.sqlite3 (WAL, synchronous=FULL,
 * foreign keys on) holding files, jobs with their status machine and queue, per-job events,
 * step metrics and the checkpoint index. Storage is the truth: a function that returns 0 has
 * committed its change durably; an event is stored before anyone is told about it.
 *
 * Thread-safety: one connection guarded by a mutex inside struct store; every function may be
 * called from any thread, and each call is atomic (one transaction where it writes).
 * Errors: 0 or a negative code, DAPO_E* (core/base/error.h) or STORE_E* below, with a message in e.
 * SQLite failures are DAPO_EIO with sqlite3_errmsg's text. Ownership: records returned in
 * caller-placed structs own their strings and JSON references; release them with the matching
 * _deinit (which accepts a zeroed struct). JSON arguments are borrowed (the store keeps text).
 *
 * Tables (schema version 1):
 *   files        id "file-<uuid>", owner, filename, purpose, bytes, sha256, status, n_lines,
 *                n_items, errors (JSON), path, created_at; seq orders them by creation
 *   jobs         id "job-<uuid>", owner, status, spec (request body), resolved, metadata,
 *                suffix, training_file, validation_file, created/started/finished_at, step,
 *                total_steps, error, latest_metrics, queue_seq, idempotency_key, body_hash,
 *                cancel_requested, pause_requested; seq orders them by creation; phase is
 *                unused (a running job's phase is kept in memory: workers_phase)
 *   events       (job_id, id) id = 1, 2, 3 ... per job; type, data (JSON), created_at
 *   metrics      (job_id, step, kind "train"|"eval") data (JSON); upserted
 *   checkpoints  (job_id, step) created_at, path, files (JSON [{name, bytes, sha256}]), metrics
 *   counters     named monotonic counters (queue_seq)
 *   schema_version  one row: the migration level of the file
 * Events, metrics and checkpoints rows go with their job (ON DELETE CASCADE). */
#ifndef DAPOD_STORE_H
#define DAPOD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "error.h"

/* Store-specific codes, below -100 so they never meet core/base/error.h's. */
enum {
  STORE_ENOTFOUND = -100,   /* no such row (or not visible to this owner; queue empty) */
  STORE_ECONFLICT = -101,   /* Idempotency-Key reused with a different body */
  STORE_EINUSE = -102,      /* file referenced by a job that has not finished */
  STORE_ETRANSITION = -103, /* the status machine forbids this change */
  STORE_ESTATE = -104,      /* the job's state forbids this operation (delete a live job,
                               append an event to a finished job) */
  STORE_EEXISTS = -105,     /* a row with this id already exists */
  STORE_ESCHEMA = -106,     /* the database was written by a newer dapod */
  STORE_EFULL = -107,       /* a limit on queued or live jobs is reached */
};

/* Stable snake_case name of a STORE_E* or DAPO_E* code ("not_found", "illegal_transition",
 * ...). Borrowed static string. */
const char *store_strerror(int code);

/* "file-" + 36-character UUID + NUL fits; prefixes are at most 10 characters. */
#define STORE_ID_MAX 48

/* Writes prefix + "-" + a random (v4) UUID in lower case into out, e.g. "job-3f2c...".
 * Returns 0, or DAPO_EINVAL when prefix is NULL, empty or longer than 10 characters.
 * Thread-safe. */
int store_new_id(const char *prefix, char out[STORE_ID_MAX]);

/* SHA-256 (lower-case hex) of body's canonical text: compact, keys sorted. The idempotency
 * hash of a job body. Returns 0 or DAPO_ENOMEM. */
int store_body_hash(const json_t *body, char out[65], struct dapo_err *e);

struct store;

/* Opens (creating when missing) <data_dir>/dapod.sqlite3 and brings its schema up to date:
 * each pending migration runs in its own transaction. data_dir is created (mode 0700) when it
 * does not exist; its parent must. Returns the handle (owned; store_close) or NULL with e set:
 * STORE_ESCHEMA when the file's schema version is newer than this program's, DAPO_EIO for
 * SQLite or file-system failures. */
struct store *store_open(const char *data_dir, struct dapo_err *e);
/* Closes the database and frees st (NULL is fine). No other call may be in flight. */
void store_close(struct store *st);
/* The database's schema version after open, and the newest this program knows. */
int store_schema_version(struct store *st);
int store_schema_latest(void);

/* Paging: limit 1..STORE_PAGE_MAX (DAPO_EINVAL otherwise), after = the id of the last row of the
 * previous page or NULL (an id that does not exist or is not visible: STORE_ENOTFOUND). */
#define STORE_PAGE_MAX 100

/* ---- files ------------------------------------------------------------------------------- */

struct store_file {
  char id[STORE_ID_MAX];
  char *owner;    /* API key name ("" without auth) (owned) */
  char *filename; /* (owned) */
  char *purpose;  /* (owned) */
  int64_t bytes;
  char sha256[65]; /* lower-case hex of the content */
  int valid;       /* status: 1 "valid", 0 "invalid" */
  int64_t n_lines, n_items;
  json_t *errors;  /* [{line, message}] or NULL (owned reference) */
  json_t *methods; /* {"methods": [names the lines fit], "method_errors": {name: first problem}}
                      or NULL (files stored before schema 2) (owned reference) */
  char *path;      /* content on disk (owned) */
  int64_t created_at;
};
void store_file_deinit(struct store_file *f);

/* Inserts f (borrowed; owner, filename, purpose, path required, sha256 64 hex digits).
 * When f->id is empty a new "file-<uuid>" is generated and written into f->id; when
 * f->created_at is 0 it is set to now. STORE_EEXISTS when the id exists. */
int store_file_insert(struct store *st, struct store_file *f, struct dapo_err *e);
/* Reads file id into out (owned fields; store_file_deinit). owner NULL: any owner (admin);
 * otherwise a file of another owner is STORE_ENOTFOUND. */
int store_file_get(struct store *st, const char *id, const char *owner, struct store_file *out,
                   struct dapo_err *e);

struct store_file_list {
  struct store_file *v; /* n items (owned) */
  size_t n;
  int has_more; /* more rows after v[n-1] */
};
void store_file_list_deinit(struct store_file_list *l);
/* Files of owner (NULL: all owners) in creation order (oldest first), after the file id
 * `after`, at most limit of them. */
int store_file_list(struct store *st, const char *owner, int limit, const char *after,
                    struct store_file_list *out, struct dapo_err *e);
/* Deletes the row of file id (owner as in store_file_get). STORE_EINUSE when a job that has not
 * reached a terminal status names it as training_file or validation_file. On success, when
 * path_out is non-NULL, *path_out is the file's path on disk (owned, free()) for the caller to
 * unlink. */
int store_file_delete(struct store *st, const char *id, const char *owner, char **path_out,
                      struct dapo_err *e);

/* ---- jobs -------------------------------------------------------------------------------- */

/* The status machine (API.md), enforced by store_job_transition_ok and nowhere else:
 *   queued     -> running (a worker takes it), cancelled (cancel before it starts)
 *   running    -> succeeded | failed | cancelled, pausing, cancelling,
 *                 queued (requeue at startup recovery: keeps its place in the queue)
 *   pausing    -> paused, cancelling, succeeded | failed
 *   paused     -> queued (resume: to the back of the queue), cancelled
 *   cancelling -> cancelled, succeeded | failed (the job ended before the cancel took effect)
 *   succeeded, failed, cancelled: terminal, final. */
enum store_job_status {
  STORE_JOB_QUEUED,
  STORE_JOB_RUNNING,
  STORE_JOB_PAUSING,
  STORE_JOB_PAUSED,
  STORE_JOB_CANCELLING,
  STORE_JOB_SUCCEEDED,
  STORE_JOB_FAILED,
  STORE_JOB_CANCELLED,
  STORE_JOB_NSTATUS
};
/* "queued", "running", ... (borrowed static string; "?" out of range). */
const char *store_job_status_name(enum store_job_status s);
/* name -> status; DAPO_EINVAL naming the accepted values when unknown. */
int store_job_status_parse(const char *name, enum store_job_status *out, struct dapo_err *e);
int store_job_status_terminal(enum store_job_status s);
/* 1 when from -> to is a legal transition (see above), else 0. */
int store_job_transition_ok(enum store_job_status from, enum store_job_status to);

struct store_job {
  char id[STORE_ID_MAX];
  char *owner; /* (owned) */
  enum store_job_status status;
  json_t *spec;           /* the create request body (owned reference) */
  json_t *resolved;       /* the job object's resolved fields (hyperparameters ...) or NULL */
  json_t *metadata;       /* or NULL */
  char *suffix;           /* or NULL (owned) */
  char *training_file;    /* file id (owned) */
  char *validation_file;  /* file id or NULL (owned) */
  int64_t created_at;     /* Unix seconds; started_at/finished_at 0 = not yet */
  int64_t started_at;     /* the first start; kept across pause/resume */
  int64_t finished_at;    /* set when a terminal status is reached */
  int64_t step;           /* last completed step */
  int64_t total_steps;    /* 0 = unknown */
  json_t *error;          /* {code, message, param, category} or NULL */
  json_t *latest_metrics; /* or NULL */
  int64_t queue_seq;      /* order in the queue (strictly increasing as jobs are queued) */
  int64_t queue_position; /* queued: 1 = next to run; otherwise 0 */
  int cancel_requested, pause_requested;
  char *idempotency_key; /* or NULL (owned) */
  char body_hash[65];    /* store_body_hash of spec */
  int64_t *ckpt_steps;   /* steps of its indexed checkpoints, ascending (owned; NULL: none) */
  size_t n_ckpt;
};
void store_job_deinit(struct store_job *j);

/* What POST /v1/jobs stores; all borrowed. */
struct store_job_new {
  const char *owner;           /* required ("" without auth) */
  const json_t *spec;          /* required: the request body */
  const json_t *resolved;      /* or NULL */
  const json_t *metadata;      /* or NULL */
  const char *suffix;          /* or NULL */
  const char *training_file;   /* required: an existing file id */
  const char *validation_file; /* or NULL */
  int64_t total_steps;
  const char *idempotency_key; /* or NULL; at most 255 bytes */
  int max_queued;              /* > 0: STORE_EFULL when this many jobs are queued */
  int max_live_owner;          /* > 0: STORE_EFULL when this owner has this many unfinished jobs */
};
/* Creates a queued job at the back of the queue, with event 1 {"status": "queued"}, and reads it
 * back into out (owned fields). The files named must exist (STORE_ENOTFOUND naming the field);
 * checking that the caller may use them is the caller's job. With an idempotency key: when this
 * owner already created a job with that key, the same body (store_body_hash of spec) gives that
 * job back in out with *existed = 1 and stores nothing; a different body is STORE_ECONFLICT.
 * The limits (max_queued, max_live_owner) are checked after that lookup, in the same
 * transaction, so a retried request still gets its job when the queue is full. existed may be
 * NULL. */
int store_job_insert(struct store *st, const struct store_job_new *nj, struct store_job *out,
                     int *existed, struct dapo_err *e);
/* Reads job id (owner as in store_file_get). */
int store_job_get(struct store *st, const char *id, const char *owner, struct store_job *out,
                  struct dapo_err *e);

struct store_job_list {
  struct store_job *v; /* n items (owned) */
  size_t n;
  int has_more;
};
void store_job_list_deinit(struct store_job_list *l);
/* Jobs of owner (NULL: all), with status `status` (a name; NULL: any; unknown: DAPO_EINVAL),
 * newest first, after the job id `after`, at most limit of them. */
int store_job_list(struct store *st, const char *owner, const char *status, int limit,
                   const char *after, struct store_job_list *out, struct dapo_err *e);

/* Changes job id's status to `to` when store_job_transition_ok allows it (else
 * STORE_ETRANSITION naming both states), in one transaction with its side effects:
 *   -> queued      from paused: a new queue_seq (back of the queue); from running: keeps it;
 *                  both request flags cleared
 *   -> running     started_at set if not yet
 *   -> pausing     pause_requested = 1;  -> cancelling or cancelled: cancel_requested = 1
 *   -> paused      pause_requested = 0
 *   -> terminal    finished_at = now
 *   error (borrowed, or NULL to leave it) is stored as the job's error object
 * and it appends a "status" event {"status": to, "previous": from, "error": error if any, plus
 * the members of extra (borrowed object or NULL), e.g. a "message"}; a terminal status also
 * appends an "end" event {"status": to} after it. out (may be NULL) receives the job after. */
int store_job_set_status(struct store *st, const char *id, enum store_job_status to,
                         const json_t *error, const json_t *extra, struct store_job *out,
                         struct dapo_err *e);

/* Cancel request (owner as in store_file_get), one transaction: queued or paused -> cancelled;
 * running or pausing -> cancelling (the worker finishes it); cancelling: nothing to do, success;
 * terminal: STORE_ETRANSITION. Events as store_job_set_status. out (may be NULL): the job after. */
int store_job_request_cancel(struct store *st, const char *id, const char *owner,
                             struct store_job *out, struct dapo_err *e);
/* Pause request: running -> pausing; pausing or paused: success, nothing to do; otherwise
 * STORE_ETRANSITION. */
int store_job_request_pause(struct store *st, const char *id, const char *owner,
                            struct store_job *out, struct dapo_err *e);
/* Resume: paused -> queued (back of the queue); queued: success, nothing to do; otherwise
 * STORE_ETRANSITION. */
int store_job_request_resume(struct store *st, const char *id, const char *owner,
                             struct store_job *out, struct dapo_err *e);

/* Fields a worker updates while a job runs; only those whose STORE_SET_* bit is in `set`. */
enum {
  STORE_SET_STEP = 1 << 0,
  STORE_SET_TOTAL_STEPS = 1 << 1,
  STORE_SET_METRICS = 1 << 2,
  STORE_SET_ERROR = 1 << 3,
  STORE_SET_STARTED_AT = 1 << 4,
  STORE_SET_FINISHED_AT = 1 << 5,
  STORE_SET_RESOLVED = 1 << 6,
};
struct store_job_patch {
  unsigned set;
  int64_t step, total_steps;
  const json_t *latest_metrics, *error, *resolved; /* borrowed; NULL clears */
  int64_t started_at, finished_at;                 /* 0 clears */
};
/* Applies p to job id (any status; status itself changes only through store_job_set_status). */
int store_job_update(struct store *st, const char *id, const struct store_job_patch *p,
                     struct dapo_err *e);

/* The queued job with the lowest queue_seq: its id into id_out. STORE_ENOTFOUND: queue empty. */
int store_job_next_queued(struct store *st, char id_out[STORE_ID_MAX], struct dapo_err *e);
/* Atomically takes the next queued job and makes it running (as store_job_set_status), reading
 * it into out. STORE_ENOTFOUND: queue empty. What a worker calls. */
int store_job_claim_next(struct store *st, struct store_job *out, struct dapo_err *e);
/* The memory plan of a job (resolved.memory.total_bytes; 0 when it has none). */
uint64_t store_job_memory(const struct store_job *j);
/* As store_job_claim_next, but only when the next job's memory plan is at most budget bytes:
 * STORE_EFULL (nothing claimed, the job keeps its place) when it is larger. */
int store_job_claim_within(struct store *st, uint64_t budget, struct store_job *out,
                           struct dapo_err *e);
/* *pos = the job's queue position (1 = next to run), 0 when it is not queued. */
int store_job_queue_position(struct store *st, const char *id, int64_t *pos, struct dapo_err *e);
/* Jobs a previous process left running, pausing or cancelling (startup recovery), in queue
 * order. */
int store_job_list_live(struct store *st, struct store_job_list *out, struct dapo_err *e);
/* Deletes a job in a terminal status with its events, metrics and checkpoint rows (owner as in
 * store_file_get); STORE_ESTATE when it has not finished. Files on disk are the caller's. */
int store_job_delete(struct store *st, const char *id, const char *owner, struct dapo_err *e);

/* ---- events ------------------------------------------------------------------------------ */

#define STORE_EVENT_TYPE_MAX 32 /* type names are 1..31 bytes */
#define STORE_EVENTS_MAX 1000   /* most events one store_event_list returns */

struct store_event {
  int64_t id; /* per job: 1, 2, 3 ... without gaps */
  char type[STORE_EVENT_TYPE_MAX];
  json_t *data; /* (owned reference) */
  int64_t created_at;
};
struct store_event_list {
  struct store_event *v; /* n items (owned) */
  size_t n;
  int has_more;
};
void store_event_list_deinit(struct store_event_list *l);
/* Appends an event (type "metrics", "log", "checkpoint", ...; data borrowed, NULL stores {}) to
 * job id and stores its id (the job's last id + 1) in *id_out (may be NULL). Committed before
 * it returns.
 * STORE_ENOTFOUND for an unknown job, STORE_ESTATE for a finished one (its "end" is last). */
int store_event_append(struct store *st, const char *job_id, const char *type, const json_t *data,
                       int64_t *id_out, struct dapo_err *e);
/* Events of job_id with id > after_id (0: from the start), in id order, at most limit
 * (1..STORE_EVENTS_MAX). An unknown job gives an empty list. */
int store_event_list(struct store *st, const char *job_id, int64_t after_id, int limit,
                     struct store_event_list *out, struct dapo_err *e);
/* *id = the job's last event id (0 when none). */
int store_event_last_id(struct store *st, const char *job_id, int64_t *id, struct dapo_err *e);

/* ---- metrics ----------------------------------------------------------------------------- */

struct store_metric {
  int64_t step;
  char kind[8]; /* "train" or "eval" */
  json_t *data; /* (owned reference) */
};
struct store_metric_list {
  struct store_metric *v; /* n items (owned) */
  size_t n;
  uint64_t gen; /* store_metrics_gen when the rows were read */
};
void store_metric_list_deinit(struct store_metric_list *l);
/* Stores (replacing) the metrics row (job_id, step, kind). kind "train" or "eval". */
int store_metrics_put(struct store *st, const char *job_id, int64_t step, const char *kind,
                      const json_t *data, struct dapo_err *e);
/* A step's metrics recorded at once, in one transaction: the row (as store_metrics_put), the
 * job's patch p (may be NULL: its step and latest_metrics, say) and a "metrics" event with data,
 * whose id goes to *event_id (0 on failure). A crash leaves all three or none, so a job never
 * shows a step whose metrics event is missing. STORE_ESTATE when the job has finished. */
int store_metrics_record(struct store *st, const char *job_id, int64_t step, const char *kind,
                         const json_t *data, const struct store_job_patch *p, int64_t *event_id,
                         struct dapo_err *e);
/* The job's metrics rows in step order, "train" before "eval" at the same step, with the
 * generation they were read at (out->gen). */
int store_metrics_list(struct store *st, const char *job_id, struct store_metric_list *out,
                       struct dapo_err *e);
/* A number that changes whenever any job's metrics rows change (store_metrics_put, a job's
 * deletion), read without the store's lock: a rendering of a list read at generation g is
 * still current while this returns g (what caches of rendered metrics check). */
uint64_t store_metrics_gen(struct store *st);

/* ---- checkpoints ------------------------------------------------------------------------- */

struct store_ckpt {
  int64_t step;
  int64_t created_at;
  char *path;      /* the checkpoint folder (owned) */
  json_t *files;   /* [{name, bytes, sha256}] (owned reference) */
  json_t *metrics; /* metrics at that step or NULL (owned reference) */
};
void store_ckpt_deinit(struct store_ckpt *c);
struct store_ckpt_list {
  struct store_ckpt *v; /* n items (owned) */
  size_t n;
};
void store_ckpt_list_deinit(struct store_ckpt_list *l);
/* Records (replacing) the complete checkpoint of job_id at step; files must be an array of
 * {name: string, bytes: integer, sha256: string} (DAPO_EINVAL otherwise); created_at = now. */
int store_ckpt_put(struct store *st, const char *job_id, int64_t step, const char *path,
                   const json_t *files, const json_t *metrics, struct dapo_err *e);
/* A checkpoint recorded and announced at once, in one transaction: the row (as store_ckpt_put)
 * and a "checkpoint" event with data event, whose id goes to *event_id (0 on failure). A crash
 * leaves both or neither, so the index never lists a checkpoint whose event is missing.
 * STORE_ESTATE when the job has finished. */
int store_ckpt_record(struct store *st, const char *job_id, int64_t step, const char *path,
                      const json_t *files, const json_t *metrics, const json_t *event,
                      int64_t *event_id, struct dapo_err *e);
int store_ckpt_get(struct store *st, const char *job_id, int64_t step, struct store_ckpt *out,
                   struct dapo_err *e);
/* The job's checkpoints in step order. */
int store_ckpt_list(struct store *st, const char *job_id, struct store_ckpt_list *out,
                    struct dapo_err *e);
/* Removes the row (job_id, step); STORE_ENOTFOUND when there is none. */
int store_ckpt_delete(struct store *st, const char *job_id, int64_t step, struct dapo_err *e);

#endif
