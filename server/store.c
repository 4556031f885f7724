/* SQLite storage of the daemon (see store.h): schema migrations, a cache of prepared statements
 * over one connection guarded by a mutex, the job status machine, and the row <-> struct
 * mapping. SQL text is static; every value from outside is a bound parameter. */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include <sqlite3.h>
#include <uuid/uuid.h>

#include "sha256.h"

/* ---- migrations ---------------------------------------------------------------------------
 * migrations[i] takes the schema from version i to i + 1, in one transaction. Append only:
 * a shipped entry never changes. */
static const char *const migrations[] = {
    /* 1: the initial schema */
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;"
    "INSERT INTO counters (name, value) VALUES ('queue_seq', 0);"
    "CREATE TABLE files ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " id TEXT NOT NULL UNIQUE,"
    " owner TEXT NOT NULL,"
    " filename TEXT NOT NULL,"
    " purpose TEXT NOT NULL,"
    " bytes INTEGER NOT NULL CHECK (bytes >= 0),"
    " sha256 TEXT NOT NULL,"
    " status TEXT NOT NULL CHECK (status IN ('valid', 'invalid')),"
    " n_lines INTEGER NOT NULL,"
    " n_items INTEGER NOT NULL,"
    " errors TEXT,"
    " path TEXT NOT NULL,"
    " created_at INTEGER NOT NULL);"
    "CREATE INDEX files_owner ON files (owner, seq);"
    "CREATE TABLE jobs ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " id TEXT NOT NULL UNIQUE,"
    " owner TEXT NOT NULL,"
    " status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'pausing', 'paused',"
    "  'cancelling', 'succeeded', 'failed', 'cancelled')),"
    " phase TEXT,"
    " spec TEXT NOT NULL,"
    " resolved TEXT,"
    " metadata TEXT,"
    " suffix TEXT,"
    " training_file TEXT NOT NULL,"
    " validation_file TEXT,"
    " created_at INTEGER NOT NULL,"
    " started_at INTEGER,"
    " finished_at INTEGER,"
    " step INTEGER NOT NULL DEFAULT 0,"
    " total_steps INTEGER NOT NULL DEFAULT 0,"
    " error TEXT,"
    " latest_metrics TEXT,"
    " queue_seq INTEGER NOT NULL,"
    " idempotency_key TEXT,"
    " body_hash TEXT NOT NULL,"
    " cancel_requested INTEGER NOT NULL DEFAULT 0,"
    " pause_requested INTEGER NOT NULL DEFAULT 0);"
    "CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner, idempotency_key)"
    " WHERE idempotency_key IS NOT NULL;"
    "CREATE INDEX jobs_queue ON jobs (status, queue_seq);"
    "CREATE INDEX jobs_owner ON jobs (owner, seq);"
    "CREATE INDEX jobs_training_file ON jobs (training_file);"
    "CREATE INDEX jobs_validation_file ON jobs (validation_file);"
    "CREATE TABLE events ("
    " job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
    " id INTEGER NOT NULL CHECK (id >= 1),"
    " type TEXT NOT NULL,"
    " data TEXT NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " PRIMARY KEY (job_id, id)) WITHOUT ROWID;"
    "CREATE TABLE metrics ("
    " job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
    " step INTEGER NOT NULL,"
    " kind TEXT NOT NULL CHECK (kind IN ('train', 'eval')),"
    " data TEXT NOT NULL,"
    " PRIMARY KEY (job_id, step, kind)) WITHOUT ROWID;"
    "CREATE TABLE checkpoints ("
    " job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
    " step INTEGER NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " path TEXT NOT NULL,"
    " files TEXT NOT NULL,"
    " metrics TEXT,"
    " PRIMARY KEY (job_id, step)) WITHOUT ROWID;",
    /* 2: which training methods a file's lines fit (issue 27): {"methods", "method_errors"} */
    "ALTER TABLE files ADD COLUMN methods TEXT;",
};
#define N_MIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

/* ---- statements ---------------------------------------------------------------------------- */

#define FILE_COLS                                                                                  \
  "id, owner, filename, purpose, bytes, sha256, status, n_lines, n_items, errors, path, "          \
  "created_at, methods"
#define QUEUE_POS                                                                                  \
  "CASE WHEN j.status = 'queued' THEN (SELECT COUNT(*) FROM jobs q WHERE q.status = 'queued' "     \
  "AND q.queue_seq <= j.queue_seq) ELSE 0 END"
#define JOB_COLS                                                                                   \
  "j.id, j.owner, j.status, j.spec, j.resolved, j.metadata, j.suffix, j.training_file, "           \
  "j.validation_file, j.created_at, j.started_at, j.finished_at, j.step, j.total_steps, "          \
  "j.error, j.latest_metrics, j.queue_seq, " QUEUE_POS ", j.cancel_requested, "                    \
  "j.pause_requested, j.idempotency_key, j.body_hash, "                                            \
  "(SELECT group_concat(c.step) FROM checkpoints c WHERE c.job_id = j.id)"
#define TERMINAL_SQL "('succeeded', 'failed', 'cancelled')"

enum stmt_id {
  S_BEGIN,
  S_COMMIT,
  S_ROLLBACK,
  S_VERSION,
  S_SET_VERSION,
  S_COUNTER_NEXT,
  S_FILE_INSERT,
  S_FILE_GET,
  S_FILE_SEQ,
  S_FILE_LIST,
  S_FILE_INUSE,
  S_FILE_DELETE,
  S_FILE_EXISTS,
  S_JOB_BY_IDEM,
  S_COUNT_QUEUED,
  S_COUNT_LIVE_OWNER,
  S_JOB_INSERT,
  S_JOB_GET,
  S_JOB_SEQ,
  S_JOB_LIST,
  S_JOB_HEAD,
  S_JOB_SET_STATUS,
  S_JOB_UPDATE,
  S_JOB_NEXT,
  S_JOB_QPOS,
  S_JOB_LIVE,
  S_JOB_DELETE,
  S_EV_NEXT,
  S_EV_INSERT,
  S_EV_LIST,
  S_EV_LAST,
  S_MET_PUT,
  S_MET_LIST,
  S_CK_PUT,
  S_CK_GET,
  S_CK_LIST,
  S_CK_DELETE,
  S_COUNT
};

static const char *const stmt_sql[S_COUNT] = {
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
    [S_VERSION] = "SELECT MAX(version) FROM schema_version",
    [S_SET_VERSION] = "UPDATE schema_version SET version = ?1",
    [S_COUNTER_NEXT] = "UPDATE counters SET value = value + 1 WHERE name = ?1 RETURNING value",
    [S_FILE_INSERT] = "INSERT INTO files (" FILE_COLS ") VALUES "
                      "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    [S_FILE_GET] = "SELECT " FILE_COLS " FROM files WHERE id = ?1",
    [S_FILE_SEQ] = "SELECT seq FROM files WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)",
    [S_FILE_LIST] = "SELECT " FILE_COLS " FROM files WHERE (?1 IS NULL OR owner = ?1) AND "
                    "seq > ?2 ORDER BY seq LIMIT ?3",
    [S_FILE_INUSE] = "SELECT id FROM jobs WHERE (training_file = ?1 OR validation_file = ?1) "
                     "AND status NOT IN " TERMINAL_SQL " ORDER BY seq LIMIT 1",
    [S_FILE_DELETE] = "DELETE FROM files WHERE id = ?1",
    [S_FILE_EXISTS] = "SELECT 1 FROM files WHERE id = ?1",
    [S_JOB_BY_IDEM] = "SELECT id, body_hash FROM jobs WHERE owner = ?1 AND idempotency_key = ?2",
    [S_COUNT_QUEUED] = "SELECT COUNT(*) FROM jobs WHERE status = 'queued'",
    [S_COUNT_LIVE_OWNER] =
        "SELECT COUNT(*) FROM jobs WHERE owner = ?1 AND status NOT IN " TERMINAL_SQL,
    [S_JOB_INSERT] = "INSERT INTO jobs (id, owner, status, spec, resolved, metadata, suffix, "
                     "training_file, validation_file, created_at, total_steps, queue_seq, "
                     "idempotency_key, body_hash) VALUES "
                     "(?1, ?2, 'queued', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    [S_JOB_GET] = "SELECT " JOB_COLS " FROM jobs j WHERE j.id = ?1",
    [S_JOB_SEQ] = "SELECT seq FROM jobs WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)",
    [S_JOB_LIST] = "SELECT " JOB_COLS " FROM jobs j WHERE (?1 IS NULL OR j.owner = ?1) AND "
                   "(?2 IS NULL OR j.status = ?2) AND j.seq < ?3 ORDER BY j.seq DESC LIMIT ?4",
    [S_JOB_HEAD] = "SELECT status, owner FROM jobs WHERE id = ?1",
    /* ?1 id, ?2 status, ?3 queue_seq or NULL (keep), ?4 started_at if not yet or NULL,
     * ?5 finished_at or NULL (keep), ?6/?7 pause/cancel flag or NULL (keep), ?8 error or NULL
     * (keep) */
    [S_JOB_SET_STATUS] = "UPDATE jobs SET status = ?2, queue_seq = COALESCE(?3, queue_seq), "
                         "started_at = COALESCE(started_at, ?4), "
                         "finished_at = COALESCE(?5, finished_at), "
                         "pause_requested = COALESCE(?6, pause_requested), "
                         "cancel_requested = COALESCE(?7, cancel_requested), "
                         "error = COALESCE(?8, error) WHERE id = ?1",
    /* pairs (?2k, ?2k+1) = (field selected, value) */
    [S_JOB_UPDATE] = "UPDATE jobs SET step = CASE WHEN ?2 THEN ?3 ELSE step END, "
                     "total_steps = CASE WHEN ?4 THEN ?5 ELSE total_steps END, "
                     "latest_metrics = CASE WHEN ?6 THEN ?7 ELSE latest_metrics END, "
                     "error = CASE WHEN ?8 THEN ?9 ELSE error END, "
                     "started_at = CASE WHEN ?10 THEN ?11 ELSE started_at END, "
                     "finished_at = CASE WHEN ?12 THEN ?13 ELSE finished_at END, "
                     "resolved = CASE WHEN ?14 THEN ?15 ELSE resolved END WHERE id = ?1",
    [S_JOB_NEXT] = "SELECT id FROM jobs WHERE status = 'queued' ORDER BY queue_seq LIMIT 1",
    [S_JOB_QPOS] = "SELECT " QUEUE_POS " FROM jobs j WHERE j.id = ?1",
    [S_JOB_LIVE] = "SELECT " JOB_COLS " FROM jobs j WHERE j.status IN "
                   "('running', 'pausing', 'cancelling') ORDER BY j.queue_seq",
    [S_JOB_DELETE] = "DELETE FROM jobs WHERE id = ?1",
    [S_EV_NEXT] = "SELECT COALESCE(MAX(id), 0) + 1 FROM events WHERE job_id = ?1",
    [S_EV_INSERT] = "INSERT INTO events (job_id, id, type, data, created_at) VALUES "
                    "(?1, ?2, ?3, ?4, ?5)",
    [S_EV_LIST] = "SELECT id, type, data, created_at FROM events WHERE job_id = ?1 AND id > ?2 "
                  "ORDER BY id LIMIT ?3",
    [S_EV_LAST] = "SELECT COALESCE(MAX(id), 0) FROM events WHERE job_id = ?1",
    [S_MET_PUT] = "INSERT INTO metrics (job_id, step, kind, data) VALUES (?1, ?2, ?3, ?4) "
                  "ON CONFLICT (job_id, step, kind) DO UPDATE SET data = excluded.data",
    [S_MET_LIST] = "SELECT step, kind, data FROM metrics WHERE job_id = ?1 "
                   "ORDER BY step, kind = 'eval'",
    [S_CK_PUT] = "INSERT INTO checkpoints (job_id, step, created_at, path, files, metrics) "
                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (job_id, step) DO UPDATE SET "
                 "created_at = excluded.created_at, path = excluded.path, "
                 "files = excluded.files, metrics = excluded.metrics",
    [S_CK_GET] = "SELECT step, created_at, path, files, metrics FROM checkpoints "
                 "WHERE job_id = ?1 AND step = ?2",
    [S_CK_LIST] = "SELECT step, created_at, path, files, metrics FROM checkpoints "
                  "WHERE job_id = ?1 ORDER BY step",
    [S_CK_DELETE] = "DELETE FROM checkpoints WHERE job_id = ?1 AND step = ?2",
};

struct store {
  pthread_mutex_t mu;           /* held for every call: one statement or transaction at a time */
  sqlite3 *db;                  /* the one connection */
  sqlite3_stmt *stmts[S_COUNT]; /* prepared on first use, finalized at close */
  int version;                  /* schema version after open */
  uint64_t metrics_gen;         /* store_metrics_gen: bumped under mu, read with __atomic */
  char path[PATH_MAX];          /* the database file, for messages */
};

/* Longest list a single call builds (metrics of a very long job); beyond it, DAPO_ERANGE. */
#define LIST_CAP ((size_t)1 << 22)
#define IDEM_KEY_MAX 255

static int64_t now_s(void) {
  return (int64_t)time(NULL);
}

/* DAPO_EIO with SQLite's message, or the store code a constraint maps to. */
static int sql_fail(struct store *st, struct dapo_err *e, const char *what) {
  int xc = sqlite3_extended_errcode(st->db);
  const char *msg = sqlite3_errmsg(st->db);
  if (xc == SQLITE_CONSTRAINT_FOREIGNKEY)
    return dapo_errf(e, STORE_ENOTFOUND, "%s: no such job", what);
  if (xc == SQLITE_CONSTRAINT_UNIQUE || xc == SQLITE_CONSTRAINT_PRIMARYKEY)
    return dapo_errf(e, STORE_EEXISTS, "%s: already exists (%s)", what, msg);
  return dapo_errf(e, DAPO_EIO, "%s: %s: %s", st->path, what, msg);
}

/* The cached statement id, reset and unbound, or NULL with e set. */
static sqlite3_stmt *stmt(struct store *st, enum stmt_id id, struct dapo_err *e) {
  if (!st->stmts[id]) {
    if (sqlite3_prepare_v3(st->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT, &st->stmts[id],
                           NULL) != SQLITE_OK) {
      sql_fail(st, e, "prepare");
      st->stmts[id] = NULL;
      return NULL;
    }
  }
  sqlite3_reset(st->stmts[id]);
  sqlite3_clear_bindings(st->stmts[id]);
  return st->stmts[id];
}

/* Ends a statement's use: no read transaction stays open, no borrowed text stays bound. */
static void done(sqlite3_stmt *s) {
  if (!s) return;
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
}

/* Runs a statement that returns no rows. */
static int exec_done(struct store *st, sqlite3_stmt *s, const char *what, struct dapo_err *e) {
  int rc = sqlite3_step(s) == SQLITE_DONE ? 0 : sql_fail(st, e, what);
  done(s);
  return rc;
}

static int exec_id(struct store *st, enum stmt_id id, const char *what, struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, id, e);
  return s ? exec_done(st, s, what, e) : e ? e->code : DAPO_EIO;
}

static int tx_begin(struct store *st, struct dapo_err *e) {
  return exec_id(st, S_BEGIN, "begin", e);
}

/* Commits, or rolls back and returns rc when rc is already an error. */
static int tx_end(struct store *st, int rc, struct dapo_err *e) {
  if (rc == 0) {
    rc = exec_id(st, S_COMMIT, "commit", e);
    if (rc == 0) return 0;
  }
  if (!sqlite3_get_autocommit(st->db)) {
    struct dapo_err ignored;
    exec_id(st, S_ROLLBACK, "rollback", &ignored);
  }
  return rc;
}

/* Text binding of borrowed strings (unbound by done() before the caller's data goes away). */
static int bind_text(sqlite3_stmt *s, int i, const char *v) {
  return v ? sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(s, i);
}

/* Binds j's compact text (NULL and JSON null bind SQL NULL). */
static int bind_json(sqlite3_stmt *s, int i, const json_t *j, struct dapo_err *e) {
  if (!j || json_is_null(j)) return sqlite3_bind_null(s, i) == SQLITE_OK ? 0 : DAPO_EIO;
  char *txt = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
  if (!txt) return dapo_errf(e, DAPO_ENOMEM, "encoding JSON");
  /* SQLite frees txt itself, also when binding fails */
  if (sqlite3_bind_text(s, i, txt, -1, free) != SQLITE_OK)
    return dapo_errf(e, DAPO_ENOMEM, "binding JSON");
  return 0;
}

/* Binds j's compact text for a NOT NULL column: JSON null is "null", NULL is "{}". */
static int bind_json_value(sqlite3_stmt *s, int i, const json_t *j, struct dapo_err *e) {
  if (!j) return sqlite3_bind_text(s, i, "{}", -1, SQLITE_STATIC) == SQLITE_OK ? 0 : DAPO_EIO;
  if (json_is_null(j))
    return sqlite3_bind_text(s, i, "null", -1, SQLITE_STATIC) == SQLITE_OK ? 0 : DAPO_EIO;
  return bind_json(s, i, j, e);
}

static int col_strdup(sqlite3_stmt *s, int i, char **out, struct dapo_err *e) {
  const unsigned char *t = sqlite3_column_text(s, i);
  *out = NULL;
  if (!t) return 0;
  *out = strdup((const char *)t);
  return *out ? 0 : dapo_errf(e, DAPO_ENOMEM, "copying a column");
}

static int col_json(sqlite3_stmt *s, int i, json_t **out, const char *what, struct dapo_err *e) {
  const char *t = (const char *)sqlite3_column_text(s, i);
  *out = NULL;
  if (!t) return 0;
  json_error_t je;
  *out = json_loads(t, JSON_DECODE_ANY, &je);
  if (!*out) return dapo_errf(e, DAPO_EFORMAT, "%s: stored JSON unreadable: %s", what, je.text);
  return 0;
}

/* Copies a column into a fixed buffer of n bytes; longer text is corrupt data. */
static int col_fixed(sqlite3_stmt *s, int i, char *dst, size_t n, const char *what,
                     struct dapo_err *e) {
  const char *t = (const char *)sqlite3_column_text(s, i);
  size_t len = t ? strlen(t) : 0;
  if (len >= n) return dapo_errf(e, DAPO_EFORMAT, "%s: stored value too long", what);
  if (t) memcpy(dst, t, len);
  dst[len] = '\0';
  return 0;
}

/* Grows *v (elements of size elem, capacity *cap) to hold n + 1 elements, zeroing new ones. */
static int grow(void **v, size_t *cap, size_t n, size_t elem, struct dapo_err *e) {
  if (n < *cap) return 0;
  if (n >= LIST_CAP) return dapo_errf(e, DAPO_ERANGE, "more than %zu rows", LIST_CAP);
  size_t nc = *cap ? *cap * 2 : 16;
  if (nc > LIST_CAP) nc = LIST_CAP;
  void *p = realloc(*v, nc * elem);
  if (!p) return dapo_errf(e, DAPO_ENOMEM, "growing a list to %zu rows", nc);
  memset((char *)p + *cap * elem, 0, (nc - *cap) * elem);
  *v = p;
  *cap = nc;
  return 0;
}

static int check_limit(int limit, int max, struct dapo_err *e) {
  if (limit < 1 || limit > max)
    return dapo_errf(e, DAPO_EINVAL, "limit: must be between 1 and %d (got %d)", max, limit);
  return 0;
}

/* ---- helpers without the store ------------------------------------------------------------- */

const char *store_strerror(int code) {
  switch (code) {
  case STORE_ENOTFOUND: return "not_found";
  case STORE_ECONFLICT: return "idempotency_conflict";
  case STORE_EINUSE: return "file_in_use";
  case STORE_ETRANSITION: return "illegal_transition";
  case STORE_ESTATE: return "wrong_job_state";
  case STORE_EEXISTS: return "already_exists";
  case STORE_ESCHEMA: return "schema_too_new";
  case STORE_EFULL: return "limit_reached";
  }
  return dapo_strerror(code);
}

int store_new_id(const char *prefix, char out[STORE_ID_MAX]) {
  size_t n = prefix ? strlen(prefix) : 0;
  if (n == 0 || n > 10) return DAPO_EINVAL;
  uuid_t u;
  char text[37];
  uuid_generate_random(u);
  uuid_unparse_lower(u, text);
  memcpy(out, prefix, n);
  out[n] = '-';
  memcpy(out + n + 1, text, 37);
  return 0;
}

int store_body_hash(const json_t *body, char out[65], struct dapo_err *e) {
  char *txt = json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
  if (!txt) return dapo_errf(e, DAPO_ENOMEM, "encoding the job body");
  struct dapo_sha256 c;
  dapo_sha256_begin(&c);
  dapo_sha256_feed(&c, txt, strlen(txt));
  dapo_sha256_end_hex(&c, out);
  free(txt);
  return 0;
}

/* ---- the status machine -------------------------------------------------------------------- */

static const char *const status_names[STORE_JOB_NSTATUS] = {
    "queued", "running", "pausing", "paused", "cancelling", "succeeded", "failed", "cancelled"};

#define B(s) (1u << (s))
/* next_ok[from] = the set of legal targets (store.h draws the same machine). */
static const unsigned next_ok[STORE_JOB_NSTATUS] = {
    [STORE_JOB_QUEUED] = B(STORE_JOB_RUNNING) | B(STORE_JOB_CANCELLED),
    [STORE_JOB_RUNNING] = B(STORE_JOB_SUCCEEDED) | B(STORE_JOB_FAILED) | B(STORE_JOB_CANCELLED) |
                          B(STORE_JOB_PAUSING) | B(STORE_JOB_CANCELLING) | B(STORE_JOB_QUEUED),
    [STORE_JOB_PAUSING] = B(STORE_JOB_PAUSED) | B(STORE_JOB_CANCELLING) | B(STORE_JOB_SUCCEEDED) |
                          B(STORE_JOB_FAILED),
    [STORE_JOB_PAUSED] = B(STORE_JOB_QUEUED) | B(STORE_JOB_CANCELLED),
    [STORE_JOB_CANCELLING] = B(STORE_JOB_CANCELLED) | B(STORE_JOB_SUCCEEDED) | B(STORE_JOB_FAILED),
    [STORE_JOB_SUCCEEDED] = 0,
    [STORE_JOB_FAILED] = 0,
    [STORE_JOB_CANCELLED] = 0,
};
#undef B

const char *store_job_status_name(enum store_job_status s) {
  return (unsigned)s < STORE_JOB_NSTATUS ? status_names[s] : "?";
}

int store_job_status_parse(const char *name, enum store_job_status *out, struct dapo_err *e) {
  for (int i = 0; name && i < STORE_JOB_NSTATUS; i++)
    if (!strcmp(name, status_names[i])) {
      *out = (enum store_job_status)i;
      return 0;
    }
  return dapo_errf(e, DAPO_EINVAL,
                   "status: '%.40s' is not one of queued, running, pausing, paused, cancelling, "
                   "succeeded, failed, cancelled",
                   name ? name : "(null)");
}

int store_job_status_terminal(enum store_job_status s) {
  return s == STORE_JOB_SUCCEEDED || s == STORE_JOB_FAILED || s == STORE_JOB_CANCELLED;
}

int store_job_transition_ok(enum store_job_status from, enum store_job_status to) {
  if ((unsigned)from >= STORE_JOB_NSTATUS || (unsigned)to >= STORE_JOB_NSTATUS) return 0;
  return (next_ok[from] >> to) & 1u;
}

/* ---- open / close -------------------------------------------------------------------------- */

static int exec_static(struct store *st, const char *sql, const char *what, struct dapo_err *e) {
  char *msg = NULL;
  if (sqlite3_exec(st->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
    int rc =
        dapo_errf(e, DAPO_EIO, "%s: %s: %s", st->path, what, msg ? msg : sqlite3_errmsg(st->db));
    sqlite3_free(msg);
    return rc;
  }
  return 0;
}

static int read_version(struct store *st, int *v, struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, S_VERSION, e);
  if (!s) return e ? e->code : DAPO_EIO;
  int rc = 0;
  if (sqlite3_step(s) != SQLITE_ROW)
    rc = sql_fail(st, e, "reading schema_version");
  else if (sqlite3_column_type(s, 0) == SQLITE_NULL)
    *v = -1; /* no row yet */
  else {
    int64_t x = sqlite3_column_int64(s, 0);
    if (x < 0 || x > INT_MAX)
      rc = dapo_errf(e, DAPO_EFORMAT, "%s: schema_version %lld is invalid", st->path, (long long)x);
    else
      *v = (int)x;
  }
  done(s);
  return rc;
}

/* Applies the pending migrations, each in its own transaction; refuses a newer schema. */
static int migrate(struct store *st, struct dapo_err *e) {
  int rc = exec_static(st, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
                       "creating schema_version", e);
  if (rc) return rc;
  for (;;) {
    int v = 0;
    if ((rc = tx_begin(st, e))) return rc;
    rc = read_version(st, &v, e);
    if (!rc && v < 0) {
      rc = exec_static(st, "INSERT INTO schema_version (version) VALUES (0)", "schema_version", e);
      v = 0;
    }
    if (!rc && v > N_MIGRATIONS)
      rc = dapo_errf(e, STORE_ESCHEMA,
                     "%s: database schema version %d is newer than this dapod supports (%d); "
                     "run a newer dapod or use another data directory",
                     st->path, v, N_MIGRATIONS);
    if (!rc && v == N_MIGRATIONS) {
      st->version = v;
      return tx_end(st, 0, e);
    }
    if (!rc) {
      char what[64];
      snprintf(what, sizeof what, "migration to schema version %d", v + 1);
      rc = exec_static(st, migrations[v], what, e);
      sqlite3_stmt *s = rc ? NULL : stmt(st, S_SET_VERSION, e);
      if (s) {
        sqlite3_bind_int(s, 1, v + 1);
        rc = exec_done(st, s, what, e);
      } else if (!rc)
        rc = e ? e->code : DAPO_EIO;
    }
    if ((rc = tx_end(st, rc, e))) return rc;
  }
}

/* Runs a PRAGMA that answers one row and returns its text in out. */
static int pragma(struct store *st, const char *sql, char *out, size_t n, struct dapo_err *e) {
  sqlite3_stmt *s = NULL;
  int rc = 0;
  if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK) return sql_fail(st, e, sql);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW) {
    const char *t = (const char *)sqlite3_column_text(s, 0);
    snprintf(out, n, "%s", t ? t : "");
  } else if (r == SQLITE_DONE)
    out[0] = '\0';
  else
    rc = sql_fail(st, e, sql);
  sqlite3_finalize(s);
  return rc;
}

struct store *store_open(const char *data_dir, struct dapo_err *e) {
  char buf[32];
  if (!data_dir || !*data_dir) {
    dapo_errf(e, DAPO_EINVAL, "store: data directory not set");
    return NULL;
  }
  if (sqlite3_threadsafe() == 0) {
    dapo_errf(e, DAPO_EUNSUPPORTED, "store: SQLite was built without thread support");
    return NULL;
  }
  if (mkdir(data_dir, 0700) != 0 && errno != EEXIST) {
    dapo_errf(e, DAPO_EIO, "%s: cannot create data directory: %s", data_dir, strerror(errno));
    return NULL;
  }
  struct store *st = calloc(1, sizeof *st);
  if (!st) {
    dapo_errf(e, DAPO_ENOMEM, "store: out of memory");
    return NULL;
  }
  int n = snprintf(st->path, sizeof st->path, "%s/dapod.sqlite3", data_dir);
  if (n < 0 || (size_t)n >= sizeof st->path) {
    dapo_errf(e, DAPO_EINVAL, "%s: data directory path too long", data_dir);
    free(st);
    return NULL;
  }
  if (pthread_mutex_init(&st->mu, NULL) != 0) {
    dapo_errf(e, DAPO_ENOMEM, "store: cannot create mutex");
    free(st);
    return NULL;
  }
  /* NOMUTEX: our own mutex spans whole transactions and the sqlite3_errmsg that follows */
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  int rc = 0;
  if (sqlite3_open_v2(st->path, &st->db, flags, NULL) != SQLITE_OK) {
    rc = dapo_errf(e, DAPO_EIO, "%s: %s", st->path,
                   st->db ? sqlite3_errmsg(st->db) : "cannot open database");
    goto out;
  }
  sqlite3_extended_result_codes(st->db, 1);
  sqlite3_busy_timeout(st->db, 5000);
  if ((rc = pragma(st, "PRAGMA journal_mode = WAL", buf, sizeof buf, e))) goto out;
  if (strcasecmp(buf, "wal") != 0) {
    rc = dapo_errf(e, DAPO_EIO, "%s: cannot enable WAL mode (journal_mode is '%s')", st->path, buf);
    goto out;
  }
  /* FULL: a commit is on disk when it returns (an acknowledged event is never lost) */
  if ((rc = exec_static(st, "PRAGMA synchronous = FULL", "synchronous", e))) goto out;
  if ((rc = exec_static(st, "PRAGMA foreign_keys = ON", "foreign_keys", e))) goto out;
  if ((rc = pragma(st, "PRAGMA foreign_keys", buf, sizeof buf, e))) goto out;
  if (strcmp(buf, "1") != 0) {
    rc = dapo_errf(e, DAPO_EUNSUPPORTED, "%s: SQLite without foreign key support", st->path);
    goto out;
  }
  rc = migrate(st, e);
out:
  if (rc) {
    store_close(st);
    return NULL;
  }
  return st;
}

void store_close(struct store *st) {
  if (!st) return;
  for (int i = 0; i < S_COUNT; i++) sqlite3_finalize(st->stmts[i]);
  sqlite3_close(st->db);
  pthread_mutex_destroy(&st->mu);
  free(st);
}

int store_schema_version(struct store *st) {
  return st->version;
}

int store_schema_latest(void) {
  return N_MIGRATIONS;
}

#define LOCK(st) pthread_mutex_lock(&(st)->mu)
#define UNLOCK(st) pthread_mutex_unlock(&(st)->mu)

/* ---- files --------------------------------------------------------------------------------- */

void store_file_deinit(struct store_file *f) {
  if (!f) return;
  free(f->owner);
  free(f->filename);
  free(f->purpose);
  json_decref(f->errors);
  json_decref(f->methods);
  free(f->path);
  memset(f, 0, sizeof *f);
}

void store_file_list_deinit(struct store_file_list *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) store_file_deinit(&l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static int is_sha256_hex(const char *s) {
  for (int i = 0; i < 64; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return s[64] == '\0';
}

static int read_file_row(sqlite3_stmt *s, struct store_file *f, struct dapo_err *e) {
  int rc;
  memset(f, 0, sizeof *f);
  if ((rc = col_fixed(s, 0, f->id, sizeof f->id, "files.id", e))) goto out;
  if ((rc = col_strdup(s, 1, &f->owner, e))) goto out;
  if ((rc = col_strdup(s, 2, &f->filename, e))) goto out;
  if ((rc = col_strdup(s, 3, &f->purpose, e))) goto out;
  f->bytes = sqlite3_column_int64(s, 4);
  if ((rc = col_fixed(s, 5, f->sha256, sizeof f->sha256, "files.sha256", e))) goto out;
  const char *status = (const char *)sqlite3_column_text(s, 6);
  f->valid = status && !strcmp(status, "valid");
  f->n_lines = sqlite3_column_int64(s, 7);
  f->n_items = sqlite3_column_int64(s, 8);
  if ((rc = col_json(s, 9, &f->errors, "files.errors", e))) goto out;
  if ((rc = col_strdup(s, 10, &f->path, e))) goto out;
  f->created_at = sqlite3_column_int64(s, 11);
  if ((rc = col_json(s, 12, &f->methods, "files.methods", e))) goto out;
out:
  if (rc) store_file_deinit(f);
  return rc;
}

static int file_insert_locked(struct store *st, struct store_file *f, struct dapo_err *e) {
  if (!f->owner || !f->filename || !f->purpose || !f->path)
    return dapo_errf(e, DAPO_EINVAL, "store: file needs owner, filename, purpose and path");
  if (!is_sha256_hex(f->sha256))
    return dapo_errf(e, DAPO_EINVAL, "store: file sha256 must be 64 lower-case hex digits");
  if (f->bytes < 0 || f->n_lines < 0 || f->n_items < 0)
    return dapo_errf(e, DAPO_EINVAL, "store: file sizes must not be negative");
  if (!f->id[0] && store_new_id("file", f->id))
    return dapo_errf(e, DAPO_EINVAL, "store: cannot make a file id");
  if (!memchr(f->id, '\0', sizeof f->id))
    return dapo_errf(e, DAPO_EINVAL, "store: file id not terminated");
  if (!f->created_at) f->created_at = now_s();
  sqlite3_stmt *s = stmt(st, S_FILE_INSERT, e);
  if (!s) return e ? e->code : DAPO_EIO;
  int rc = 0;
  bind_text(s, 1, f->id);
  bind_text(s, 2, f->owner);
  bind_text(s, 3, f->filename);
  bind_text(s, 4, f->purpose);
  sqlite3_bind_int64(s, 5, f->bytes);
  bind_text(s, 6, f->sha256);
  bind_text(s, 7, f->valid ? "valid" : "invalid");
  sqlite3_bind_int64(s, 8, f->n_lines);
  sqlite3_bind_int64(s, 9, f->n_items);
  if ((rc = bind_json(s, 10, f->errors, e))) goto out;
  bind_text(s, 11, f->path);
  sqlite3_bind_int64(s, 12, f->created_at);
  if ((rc = bind_json(s, 13, f->methods, e))) goto out;
  if (sqlite3_step(s) != SQLITE_DONE) rc = sql_fail(st, e, f->id);
out:
  done(s);
  return rc;
}

int store_file_insert(struct store *st, struct store_file *f, struct dapo_err *e) {
  LOCK(st);
  int rc = file_insert_locked(st, f, e);
  UNLOCK(st);
  return rc;
}

static int file_get_locked(struct store *st, const char *id, const char *owner,
                           struct store_file *out, struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, S_FILE_GET, e);
  if (!s) return e ? e->code : DAPO_EIO;
  int rc = 0;
  bind_text(s, 1, id);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW) {
    const char *o = (const char *)sqlite3_column_text(s, 1);
    if (owner && (!o || strcmp(o, owner)))
      rc = dapo_errf(e, STORE_ENOTFOUND, "no such file: %.64s", id);
    else
      rc = read_file_row(s, out, e);
  } else if (r == SQLITE_DONE)
    rc = dapo_errf(e, STORE_ENOTFOUND, "no such file: %.64s", id);
  else
    rc = sql_fail(st, e, "reading a file");
  done(s);
  return rc;
}

int store_file_get(struct store *st, const char *id, const char *owner, struct store_file *out,
                   struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  if (!id) return dapo_errf(e, DAPO_EINVAL, "store: file id missing");
  LOCK(st);
  int rc = file_get_locked(st, id, owner, out, e);
  UNLOCK(st);
  return rc;
}

/* seq of row `after` (visible to owner) through statement sid, or STORE_ENOTFOUND. */
static int cursor_seq(struct store *st, enum stmt_id sid, const char *after, const char *owner,
                      int64_t *seq, struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, sid, e);
  if (!s) return e ? e->code : DAPO_EIO;
  int rc = 0;
  bind_text(s, 1, after);
  bind_text(s, 2, owner);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW)
    *seq = sqlite3_column_int64(s, 0);
  else if (r == SQLITE_DONE)
    rc = dapo_errf(e, STORE_ENOTFOUND, "after: no such id '%.64s'", after);
  else
    rc = sql_fail(st, e, "paging");
  done(s);
  return rc;
}

static int file_list_locked(struct store *st, const char *owner, int limit, const char *after,
                            struct store_file_list *out, struct dapo_err *e) {
  int64_t seq = 0;
  size_t cap = 0;
  int rc = 0;
  if (after && (rc = cursor_seq(st, S_FILE_SEQ, after, owner, &seq, e))) return rc;
  sqlite3_stmt *s = stmt(st, S_FILE_LIST, e);
  if (!s) return e ? e->code : DAPO_EIO;
  bind_text(s, 1, owner);
  sqlite3_bind_int64(s, 2, seq);
  sqlite3_bind_int(s, 3, limit + 1);
  int r;
  while ((r = sqlite3_step(s)) == SQLITE_ROW) {
    if (out->n == (size_t)limit) {
      out->has_more = 1;
      break;
    }
    if ((rc = grow((void **)&out->v, &cap, out->n, sizeof *out->v, e))) goto out;
    if ((rc = read_file_row(s, &out->v[out->n], e))) goto out;
    out->n++;
  }
  if (r != SQLITE_ROW && r != SQLITE_DONE) rc = sql_fail(st, e, "listing files");
out:
  done(s);
  return rc;
}

int store_file_list(struct store *st, const char *owner, int limit, const char *after,
                    struct store_file_list *out, struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  int rc = check_limit(limit, STORE_PAGE_MAX, e);
  if (rc) return rc;
  LOCK(st);
  rc = file_list_locked(st, owner, limit, after, out, e);
  UNLOCK(st);
  if (rc) store_file_list_deinit(out);
  return rc;
}

static int file_delete_locked(struct store *st, const char *id, const char *owner, char **path_out,
                              struct dapo_err *e) {
  struct store_file f = {0};
  sqlite3_stmt *s = NULL;
  int rc = tx_begin(st, e);
  if (rc) return rc;
  if ((rc = file_get_locked(st, id, owner, &f, e))) goto out;
  if (!(s = stmt(st, S_FILE_INUSE, e))) {
    rc = e ? e->code : DAPO_EIO;
    goto out;
  }
  bind_text(s, 1, id);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW)
    rc = dapo_errf(e, STORE_EINUSE, "file %s is used by job %s, which has not finished", id,
                   (const char *)sqlite3_column_text(s, 0));
  else if (r != SQLITE_DONE)
    rc = sql_fail(st, e, "checking file use");
  done(s);
  if (rc) goto out;
  if (!(s = stmt(st, S_FILE_DELETE, e))) {
    rc = e ? e->code : DAPO_EIO;
    goto out;
  }
  bind_text(s, 1, id);
  if ((rc = exec_done(st, s, "deleting a file", e))) goto out;
out:
  rc = tx_end(st, rc, e);
  if (!rc && path_out) {
    *path_out = f.path;
    f.path = NULL;
  }
  store_file_deinit(&f);
  return rc;
}

int store_file_delete(struct store *st, const char *id, const char *owner, char **path_out,
                      struct dapo_err *e) {
  if (path_out) *path_out = NULL;
  if (!id) return dapo_errf(e, DAPO_EINVAL, "store: file id missing");
  LOCK(st);
  int rc = file_delete_locked(st, id, owner, path_out, e);
  UNLOCK(st);
  return rc;
}

/* ---- jobs ---------------------------------------------------------------------------------- */

void store_job_deinit(struct store_job *j) {
  if (!j) return;
  free(j->owner);
  json_decref(j->spec);
  json_decref(j->resolved);
  json_decref(j->metadata);
  free(j->suffix);
  free(j->training_file);
  free(j->validation_file);
  json_decref(j->error);
  json_decref(j->latest_metrics);
  free(j->idempotency_key);
  free(j->ckpt_steps);
  memset(j, 0, sizeof *j);
}

void store_job_list_deinit(struct store_job_list *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) store_job_deinit(&l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* The checkpoint steps of a job from group_concat's "10,20,30" (NULL: none), sorted. */
static int col_steps(sqlite3_stmt *s, int i, struct store_job *j, struct dapo_err *e) {
  const char *t = (const char *)sqlite3_column_text(s, i);
  if (!t) return 0;
  size_t n = 1;
  for (const char *p = t; *p; p++) n += *p == ',';
  if (!(j->ckpt_steps = malloc(n * sizeof *j->ckpt_steps)))
    return dapo_errf(e, DAPO_ENOMEM, "reading checkpoint steps");
  for (const char *p = t;; p++) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno || (*end && *end != ',') || j->n_ckpt == n)
      return dapo_errf(e, DAPO_EFORMAT, "job %s: stored checkpoint steps unreadable", j->id);
    j->ckpt_steps[j->n_ckpt++] = v;
    if (!*(p = end)) break;
  }
  qsort(j->ckpt_steps, j->n_ckpt, sizeof *j->ckpt_steps, cmp_i64);
  return 0;
}

/* Reads a row of JOB_COLS. */
static int read_job_row(sqlite3_stmt *s, struct store_job *j, struct dapo_err *e) {
  int rc;
  memset(j, 0, sizeof *j);
  if ((rc = col_fixed(s, 0, j->id, sizeof j->id, "jobs.id", e))) goto out;
  if ((rc = col_strdup(s, 1, &j->owner, e))) goto out;
  if ((rc = store_job_status_parse((const char *)sqlite3_column_text(s, 2), &j->status, e))) {
    rc = dapo_errf(e, DAPO_EFORMAT, "job %s: stored status unknown", j->id);
    goto out;
  }
  if ((rc = col_json(s, 3, &j->spec, "jobs.spec", e))) goto out;
  if ((rc = col_json(s, 4, &j->resolved, "jobs.resolved", e))) goto out;
  if ((rc = col_json(s, 5, &j->metadata, "jobs.metadata", e))) goto out;
  if ((rc = col_strdup(s, 6, &j->suffix, e))) goto out;
  if ((rc = col_strdup(s, 7, &j->training_file, e))) goto out;
  if ((rc = col_strdup(s, 8, &j->validation_file, e))) goto out;
  j->created_at = sqlite3_column_int64(s, 9);
  j->started_at = sqlite3_column_int64(s, 10);
  j->finished_at = sqlite3_column_int64(s, 11);
  j->step = sqlite3_column_int64(s, 12);
  j->total_steps = sqlite3_column_int64(s, 13);
  if ((rc = col_json(s, 14, &j->error, "jobs.error", e))) goto out;
  if ((rc = col_json(s, 15, &j->latest_metrics, "jobs.latest_metrics", e))) goto out;
  j->queue_seq = sqlite3_column_int64(s, 16);
  j->queue_position = sqlite3_column_int64(s, 17);
  j->cancel_requested = sqlite3_column_int(s, 18) != 0;
  j->pause_requested = sqlite3_column_int(s, 19) != 0;
  if ((rc = col_strdup(s, 20, &j->idempotency_key, e))) goto out;
  if ((rc = col_fixed(s, 21, j->body_hash, sizeof j->body_hash, "jobs.body_hash", e))) goto out;
  if ((rc = col_steps(s, 22, j, e))) goto out;
out:
  if (rc) store_job_deinit(j);
  return rc;
}

/* Reads job id; owner NULL: any. out may be NULL (existence and owner check only). */
static int job_get_locked(struct store *st, const char *id, const char *owner,
                          struct store_job *out, struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, S_JOB_GET, e);
  if (!s) return e ? e->code : DAPO_EIO;
  int rc = 0;
  bind_text(s, 1, id);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW) {
    const char *o = (const char *)sqlite3_column_text(s, 1);
    if (owner && (!o || strcmp(o, owner)))
      rc = dapo_errf(e, STORE_ENOTFOUND, "no such job: %.64s", id);
    else if (out)
      rc = read_job_row(s, out, e);
  } else if (r == SQLITE_DONE)
    rc = dapo_errf(e, STORE_ENOTFOUND, "no such job: %.64s", id);
  else
    rc = sql_fail(st, e, "reading a job");
  done(s);
  return rc;
}

int store_job_get(struct store *st, const char *id, const char *owner, struct store_job *out,
                  struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  if (!id) return dapo_errf(e, DAPO_EINVAL, "store: job id missing");
  LOCK(st);
  int rc = job_get_locked(st, id, owner, out, e);
  UNLOCK(st);
  return rc;
}

static int counter_next(struct store *st, const char *name, int64_t *v, struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, S_COUNTER_NEXT, e);
  if (!s) return e ? e->code : DAPO_EIO;
  int rc = 0;
  bind_text(s, 1, name);
  if (sqlite3_step(s) == SQLITE_ROW)
    *v = sqlite3_column_int64(s, 0);
  else
    rc = sql_fail(st, e, "counters");
  done(s);
  return rc;
}

/* Appends an event (no state check) and returns its id. Inside the caller's transaction. */
static int event_append_locked(struct store *st, const char *job_id, const char *type,
                               const json_t *data, int64_t *id_out, struct dapo_err *e) {
  int64_t id = 0;
  int rc = 0;
  sqlite3_stmt *s = stmt(st, S_EV_NEXT, e);
  if (!s) return e ? e->code : DAPO_EIO;
  bind_text(s, 1, job_id);
  if (sqlite3_step(s) == SQLITE_ROW)
    id = sqlite3_column_int64(s, 0);
  else
    rc = sql_fail(st, e, "next event id");
  done(s);
  if (rc) return rc;
  if (!(s = stmt(st, S_EV_INSERT, e))) return e ? e->code : DAPO_EIO;
  bind_text(s, 1, job_id);
  sqlite3_bind_int64(s, 2, id);
  bind_text(s, 3, type);
  sqlite3_bind_int64(s, 5, now_s());
  if ((rc = bind_json_value(s, 4, data, e))) {
    done(s);
    return rc;
  }
  char what[96];
  snprintf(what, sizeof what, "event of job %.60s", job_id);
  if ((rc = exec_done(st, s, what, e))) return rc;
  if (id_out) *id_out = id;
  return 0;
}

/* Reads the status and checks the owner of job id. */
static int job_head(struct store *st, const char *id, const char *owner,
                    enum store_job_status *status, struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, S_JOB_HEAD, e);
  if (!s) return e ? e->code : DAPO_EIO;
  int rc = 0;
  bind_text(s, 1, id);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW) {
    const char *o = (const char *)sqlite3_column_text(s, 1);
    if (owner && (!o || strcmp(o, owner)))
      rc = dapo_errf(e, STORE_ENOTFOUND, "no such job: %.64s", id);
    else if (store_job_status_parse((const char *)sqlite3_column_text(s, 0), status, e))
      rc = dapo_errf(e, DAPO_EFORMAT, "job %.64s: stored status unknown", id);
  } else if (r == SQLITE_DONE)
    rc = dapo_errf(e, STORE_ENOTFOUND, "no such job: %.64s", id);
  else
    rc = sql_fail(st, e, "reading a job");
  done(s);
  return rc;
}

/* The one place a status changes: checks the machine, applies the side effects of store.h and
 * appends the status (and end) events. Inside the caller's transaction. */
static int transition(struct store *st, const char *id, enum store_job_status from,
                      enum store_job_status to, const json_t *error, const json_t *extra,
                      struct dapo_err *e) {
  if (!store_job_transition_ok(from, to))
    return dapo_errf(e, STORE_ETRANSITION, "job %.64s: cannot go from %s to %s", id,
                     store_job_status_name(from), store_job_status_name(to));
  if (extra && !json_is_object(extra))
    return dapo_errf(e, DAPO_EINVAL, "store: status event extra must be an object");
  int64_t t = now_s(), qseq = 0;
  int rc = 0;
  if (to == STORE_JOB_QUEUED && from == STORE_JOB_PAUSED &&
      (rc = counter_next(st, "queue_seq", &qseq, e)))
    return rc;
  sqlite3_stmt *s = stmt(st, S_JOB_SET_STATUS, e);
  if (!s) return e ? e->code : DAPO_EIO;
  bind_text(s, 1, id);
  bind_text(s, 2, status_names[to]);
  if (qseq) sqlite3_bind_int64(s, 3, qseq);
  if (to == STORE_JOB_RUNNING) sqlite3_bind_int64(s, 4, t);
  if (store_job_status_terminal(to)) sqlite3_bind_int64(s, 5, t);
  if (to == STORE_JOB_PAUSING) sqlite3_bind_int(s, 6, 1);
  if (to == STORE_JOB_PAUSED || to == STORE_JOB_QUEUED) sqlite3_bind_int(s, 6, 0);
  if (to == STORE_JOB_CANCELLING || to == STORE_JOB_CANCELLED) sqlite3_bind_int(s, 7, 1);
  if (to == STORE_JOB_QUEUED) sqlite3_bind_int(s, 7, 0);
  if ((rc = bind_json(s, 8, error, e))) {
    done(s);
    return rc;
  }
  if ((rc = exec_done(st, s, "changing a job's status", e))) return rc;

  json_t *data = extra ? json_deep_copy(extra) : json_object();
  if (!data) return dapo_errf(e, DAPO_ENOMEM, "status event");
  int bad = json_object_set_new(data, "status", json_string(status_names[to]));
  bad |= json_object_set_new(data, "previous", json_string(status_names[from]));
  if (error && !json_is_null(error))
    bad |= json_object_set_new(data, "error", json_deep_copy(error));
  if (bad) rc = dapo_errf(e, DAPO_ENOMEM, "status event");
  if (!rc) rc = event_append_locked(st, id, "status", data, NULL, e);
  json_decref(data);
  if (rc || !store_job_status_terminal(to)) return rc;
  data = json_pack("{s:s}", "status", status_names[to]);
  if (!data) return dapo_errf(e, DAPO_ENOMEM, "end event");
  rc = event_append_locked(st, id, "end", data, NULL, e);
  json_decref(data);
  return rc;
}

static int job_insert_locked(struct store *st, const struct store_job_new *nj, const char *hash,
                             struct store_job *out, int *existed, struct dapo_err *e) {
  char id[STORE_ID_MAX];
  int64_t qseq = 0;
  sqlite3_stmt *s = NULL;
  int rc = tx_begin(st, e);
  if (rc) return rc;
  if (nj->idempotency_key) {
    if (!(s = stmt(st, S_JOB_BY_IDEM, e))) {
      rc = e ? e->code : DAPO_EIO;
      goto out;
    }
    bind_text(s, 1, nj->owner);
    bind_text(s, 2, nj->idempotency_key);
    int r = sqlite3_step(s);
    if (r == SQLITE_ROW) {
      const char *h = (const char *)sqlite3_column_text(s, 1);
      rc = col_fixed(s, 0, id, sizeof id, "jobs.id", e);
      if (!rc && (!h || strcmp(h, hash)))
        rc = dapo_errf(e, STORE_ECONFLICT,
                       "Idempotency-Key '%.64s' was used for job %s with a different body",
                       nj->idempotency_key, id);
      done(s);
      if (rc) goto out;
      if ((rc = job_get_locked(st, id, NULL, out, e))) goto out;
      if (existed) *existed = 1;
      goto out;
    }
    if (r != SQLITE_DONE) rc = sql_fail(st, e, "idempotency lookup");
    done(s);
    if (rc) goto out;
  }
  for (int k = 0; k < 2; k++) {
    int lim = k ? nj->max_live_owner : nj->max_queued;
    if (lim <= 0) continue;
    if (!(s = stmt(st, k ? S_COUNT_LIVE_OWNER : S_COUNT_QUEUED, e))) {
      rc = e ? e->code : DAPO_EIO;
      goto out;
    }
    if (k) bind_text(s, 1, nj->owner);
    int r = sqlite3_step(s);
    int64_t n = r == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    done(s);
    if (n < 0) {
      rc = sql_fail(st, e, "counting jobs");
      goto out;
    }
    if (n >= lim) {
      rc = dapo_errf(e, STORE_EFULL,
                     k ? "this key has %lld unfinished jobs (max_jobs_per_key %d); retry later"
                       : "the queue holds %lld jobs (max_queued_jobs %d); retry later",
                     (long long)n, lim);
      goto out;
    }
  }
  const char *files[2] = {nj->training_file, nj->validation_file};
  const char *fields[2] = {"training_file", "validation_file"};
  for (int i = 0; i < 2; i++) {
    if (!files[i]) continue;
    if (!(s = stmt(st, S_FILE_EXISTS, e))) {
      rc = e ? e->code : DAPO_EIO;
      goto out;
    }
    bind_text(s, 1, files[i]);
    int r = sqlite3_step(s);
    if (r == SQLITE_DONE)
      rc = dapo_errf(e, STORE_ENOTFOUND, "%s: no such file '%.64s'", fields[i], files[i]);
    else if (r != SQLITE_ROW)
      rc = sql_fail(st, e, "checking files");
    done(s);
    if (rc) goto out;
  }
  if (store_new_id("job", id)) {
    rc = dapo_errf(e, DAPO_EINVAL, "store: cannot make a job id");
    goto out;
  }
  if ((rc = counter_next(st, "queue_seq", &qseq, e))) goto out;
  if (!(s = stmt(st, S_JOB_INSERT, e))) {
    rc = e ? e->code : DAPO_EIO;
    goto out;
  }
  bind_text(s, 1, id);
  bind_text(s, 2, nj->owner);
  if ((rc = bind_json(s, 3, nj->spec, e)) || (rc = bind_json(s, 4, nj->resolved, e)) ||
      (rc = bind_json(s, 5, nj->metadata, e))) {
    done(s);
    goto out;
  }
  bind_text(s, 6, nj->suffix);
  bind_text(s, 7, nj->training_file);
  bind_text(s, 8, nj->validation_file);
  sqlite3_bind_int64(s, 9, now_s());
  sqlite3_bind_int64(s, 10, nj->total_steps);
  sqlite3_bind_int64(s, 11, qseq);
  bind_text(s, 12, nj->idempotency_key);
  bind_text(s, 13, hash);
  if ((rc = exec_done(st, s, "inserting a job", e))) goto out;
  json_t *ev = json_pack("{s:s}", "status", "queued");
  rc = ev ? event_append_locked(st, id, "status", ev, NULL, e)
          : dapo_errf(e, DAPO_ENOMEM, "status event");
  json_decref(ev);
  if (rc) goto out;
  rc = job_get_locked(st, id, NULL, out, e);
out:
  rc = tx_end(st, rc, e);
  if (rc) store_job_deinit(out);
  return rc;
}

int store_job_insert(struct store *st, const struct store_job_new *nj, struct store_job *out,
                     int *existed, struct dapo_err *e) {
  char hash[65];
  memset(out, 0, sizeof *out);
  if (existed) *existed = 0;
  if (!nj || !nj->owner || !nj->spec || !nj->training_file)
    return dapo_errf(e, DAPO_EINVAL, "store: job needs owner, spec and training_file");
  if (nj->idempotency_key &&
      (!nj->idempotency_key[0] || strlen(nj->idempotency_key) > IDEM_KEY_MAX))
    return dapo_errf(e, DAPO_EINVAL, "Idempotency-Key: must be 1 to %d bytes", IDEM_KEY_MAX);
  if (nj->metadata && !json_is_object(nj->metadata) && !json_is_null(nj->metadata))
    return dapo_errf(e, DAPO_EINVAL, "metadata: must be an object");
  int rc = store_body_hash(nj->spec, hash, e);
  if (rc) return rc;
  LOCK(st);
  rc = job_insert_locked(st, nj, hash, out, existed, e);
  UNLOCK(st);
  return rc;
}

static int job_list_locked(struct store *st, enum stmt_id sid, const char *owner,
                           const char *status, int limit, const char *after,
                           struct store_job_list *out, struct dapo_err *e) {
  int64_t seq = INT64_MAX;
  size_t cap = 0;
  int rc = 0;
  if (after && (rc = cursor_seq(st, S_JOB_SEQ, after, owner, &seq, e))) return rc;
  sqlite3_stmt *s = stmt(st, sid, e);
  if (!s) return e ? e->code : DAPO_EIO;
  if (sid == S_JOB_LIST) {
    bind_text(s, 1, owner);
    bind_text(s, 2, status);
    sqlite3_bind_int64(s, 3, seq);
    sqlite3_bind_int(s, 4, limit + 1);
  }
  int r;
  while ((r = sqlite3_step(s)) == SQLITE_ROW) {
    if (limit > 0 && out->n == (size_t)limit) {
      out->has_more = 1;
      break;
    }
    if ((rc = grow((void **)&out->v, &cap, out->n, sizeof *out->v, e))) goto out;
    if ((rc = read_job_row(s, &out->v[out->n], e))) goto out;
    out->n++;
  }
  if (r != SQLITE_ROW && r != SQLITE_DONE) rc = sql_fail(st, e, "listing jobs");
out:
  done(s);
  return rc;
}

int store_job_list(struct store *st, const char *owner, const char *status, int limit,
                   const char *after, struct store_job_list *out, struct dapo_err *e) {
  enum store_job_status ignored;
  memset(out, 0, sizeof *out);
  int rc = check_limit(limit, STORE_PAGE_MAX, e);
  if (rc) return rc;
  if (status && (rc = store_job_status_parse(status, &ignored, e))) return rc;
  LOCK(st);
  rc = job_list_locked(st, S_JOB_LIST, owner, status, limit, after, out, e);
  UNLOCK(st);
  if (rc) store_job_list_deinit(out);
  return rc;
}

int store_job_list_live(struct store *st, struct store_job_list *out, struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  LOCK(st);
  int rc = job_list_locked(st, S_JOB_LIVE, NULL, NULL, 0, NULL, out, e);
  UNLOCK(st);
  if (rc) store_job_list_deinit(out);
  return rc;
}

/* What a status request does, for the three request_* functions and set_status. */
enum req { REQ_SET, REQ_CANCEL, REQ_PAUSE, REQ_RESUME };

static int job_change_locked(struct store *st, const char *id, const char *owner, enum req req,
                             enum store_job_status to, const json_t *error, const json_t *extra,
                             struct store_job *out, struct dapo_err *e) {
  enum store_job_status from;
  int rc = tx_begin(st, e);
  if (rc) return rc;
  if ((rc = job_head(st, id, owner, &from, e))) goto out;
  int noop = 0;
  switch (req) {
  case REQ_SET: break;
  case REQ_CANCEL:
    if (from == STORE_JOB_CANCELLING)
      noop = 1;
    else if (from == STORE_JOB_QUEUED || from == STORE_JOB_PAUSED)
      to = STORE_JOB_CANCELLED;
    else
      to = STORE_JOB_CANCELLING; /* running, pausing; terminal ones fail in transition() */
    break;
  case REQ_PAUSE:
    noop = from == STORE_JOB_PAUSING || from == STORE_JOB_PAUSED;
    to = STORE_JOB_PAUSING;
    break;
  case REQ_RESUME:
    noop = from == STORE_JOB_QUEUED;
    to = STORE_JOB_QUEUED;
    if (from == STORE_JOB_RUNNING) /* legal for recovery, not a user's resume */
      rc = dapo_errf(e, STORE_ETRANSITION, "job %.64s: cannot resume a running job", id);
    break;
  }
  if (!rc && !noop) rc = transition(st, id, from, to, error, extra, e);
  if (!rc && out) rc = job_get_locked(st, id, NULL, out, e);
out:
  rc = tx_end(st, rc, e);
  if (rc && out) store_job_deinit(out);
  return rc;
}

static int job_change(struct store *st, const char *id, const char *owner, enum req req,
                      enum store_job_status to, const json_t *error, const json_t *extra,
                      struct store_job *out, struct dapo_err *e) {
  if (out) memset(out, 0, sizeof *out);
  if (!id) return dapo_errf(e, DAPO_EINVAL, "store: job id missing");
  LOCK(st);
  int rc = job_change_locked(st, id, owner, req, to, error, extra, out, e);
  UNLOCK(st);
  return rc;
}

int store_job_set_status(struct store *st, const char *id, enum store_job_status to,
                         const json_t *error, const json_t *extra, struct store_job *out,
                         struct dapo_err *e) {
  return job_change(st, id, NULL, REQ_SET, to, error, extra, out, e);
}

int store_job_request_cancel(struct store *st, const char *id, const char *owner,
                             struct store_job *out, struct dapo_err *e) {
  return job_change(st, id, owner, REQ_CANCEL, STORE_JOB_CANCELLED, NULL, NULL, out, e);
}

int store_job_request_pause(struct store *st, const char *id, const char *owner,
                            struct store_job *out, struct dapo_err *e) {
  return job_change(st, id, owner, REQ_PAUSE, STORE_JOB_PAUSING, NULL, NULL, out, e);
}

int store_job_request_resume(struct store *st, const char *id, const char *owner,
                             struct store_job *out, struct dapo_err *e) {
  return job_change(st, id, owner, REQ_RESUME, STORE_JOB_QUEUED, NULL, NULL, out, e);
}

/* The caller holds the lock. */
static int job_update_locked(struct store *st, const char *id, const struct store_job_patch *p,
                             struct dapo_err *e) {
  int rc = 0;
  sqlite3_stmt *s = stmt(st, S_JOB_UPDATE, e);
  if (!s) return e ? e->code : DAPO_EIO;
  bind_text(s, 1, id);
  sqlite3_bind_int(s, 2, !!(p->set & STORE_SET_STEP));
  sqlite3_bind_int64(s, 3, p->step);
  sqlite3_bind_int(s, 4, !!(p->set & STORE_SET_TOTAL_STEPS));
  sqlite3_bind_int64(s, 5, p->total_steps);
  sqlite3_bind_int(s, 6, !!(p->set & STORE_SET_METRICS));
  sqlite3_bind_int(s, 8, !!(p->set & STORE_SET_ERROR));
  sqlite3_bind_int(s, 10, !!(p->set & STORE_SET_STARTED_AT));
  if (p->started_at) sqlite3_bind_int64(s, 11, p->started_at);
  sqlite3_bind_int(s, 12, !!(p->set & STORE_SET_FINISHED_AT));
  if (p->finished_at) sqlite3_bind_int64(s, 13, p->finished_at);
  sqlite3_bind_int(s, 14, !!(p->set & STORE_SET_RESOLVED));
  if ((p->set & STORE_SET_METRICS) && (rc = bind_json(s, 7, p->latest_metrics, e))) goto out;
  if ((p->set & STORE_SET_ERROR) && (rc = bind_json(s, 9, p->error, e))) goto out;
  if ((p->set & STORE_SET_RESOLVED) && (rc = bind_json(s, 15, p->resolved, e))) goto out;
  if (sqlite3_step(s) != SQLITE_DONE)
    rc = sql_fail(st, e, "updating a job");
  else if (sqlite3_changes(st->db) == 0)
    rc = dapo_errf(e, STORE_ENOTFOUND, "no such job: %.64s", id);
out:
  done(s);
  return rc;
}

int store_job_update(struct store *st, const char *id, const struct store_job_patch *p,
                     struct dapo_err *e) {
  if (!id || !p) return dapo_errf(e, DAPO_EINVAL, "store: job id or patch missing");
  LOCK(st);
  int rc = job_update_locked(st, id, p, e);
  UNLOCK(st);
  return rc;
}

static int next_queued_locked(struct store *st, char id_out[STORE_ID_MAX], struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, S_JOB_NEXT, e);
  if (!s) return e ? e->code : DAPO_EIO;
  int rc = 0;
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW)
    rc = col_fixed(s, 0, id_out, STORE_ID_MAX, "jobs.id", e);
  else if (r == SQLITE_DONE)
    rc = dapo_errf(e, STORE_ENOTFOUND, "no queued job");
  else
    rc = sql_fail(st, e, "reading the queue");
  done(s);
  return rc;
}

int store_job_next_queued(struct store *st, char id_out[STORE_ID_MAX], struct dapo_err *e) {
  id_out[0] = '\0';
  LOCK(st);
  int rc = next_queued_locked(st, id_out, e);
  UNLOCK(st);
  return rc;
}

uint64_t store_job_memory(const struct store_job *j) {
  json_t *t = json_object_get(json_object_get(j->resolved, "memory"), "total_bytes");
  return json_is_integer(t) && json_integer_value(t) > 0 ? (uint64_t)json_integer_value(t) : 0;
}

int store_job_claim_within(struct store *st, uint64_t budget, struct store_job *out,
                           struct dapo_err *e) {
  char id[STORE_ID_MAX];
  memset(out, 0, sizeof *out);
  LOCK(st);
  int rc = tx_begin(st, e);
  if (rc) goto out;
  rc = next_queued_locked(st, id, e);
  if (!rc && budget != UINT64_MAX) {
    struct store_job peek;
    if (!(rc = job_get_locked(st, id, NULL, &peek, e))) {
      uint64_t need = store_job_memory(&peek);
      if (need > budget)
        rc = dapo_errf(e, STORE_EFULL, "job %s needs %" PRIu64 " bytes; %" PRIu64 " are free", id,
                       need, budget);
      store_job_deinit(&peek);
    }
  }
  if (!rc) rc = transition(st, id, STORE_JOB_QUEUED, STORE_JOB_RUNNING, NULL, NULL, e);
  if (!rc) rc = job_get_locked(st, id, NULL, out, e);
  rc = tx_end(st, rc, e);
  if (rc) store_job_deinit(out);
out:
  UNLOCK(st);
  return rc;
}

int store_job_claim_next(struct store *st, struct store_job *out, struct dapo_err *e) {
  return store_job_claim_within(st, UINT64_MAX, out, e);
}

int store_job_queue_position(struct store *st, const char *id, int64_t *pos, struct dapo_err *e) {
  *pos = 0;
  if (!id) return dapo_errf(e, DAPO_EINVAL, "store: job id missing");
  LOCK(st);
  int rc = 0;
  sqlite3_stmt *s = stmt(st, S_JOB_QPOS, e);
  if (!s) {
    rc = e ? e->code : DAPO_EIO;
    goto out;
  }
  bind_text(s, 1, id);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW)
    *pos = sqlite3_column_int64(s, 0);
  else if (r == SQLITE_DONE)
    rc = dapo_errf(e, STORE_ENOTFOUND, "no such job: %.64s", id);
  else
    rc = sql_fail(st, e, "queue position");
  done(s);
out:
  UNLOCK(st);
  return rc;
}

static int job_delete_locked(struct store *st, const char *id, const char *owner,
                             struct dapo_err *e) {
  enum store_job_status status;
  int rc = tx_begin(st, e);
  if (rc) return rc;
  if ((rc = job_head(st, id, owner, &status, e))) goto out;
  if (!store_job_status_terminal(status)) {
    rc = dapo_errf(e, STORE_ESTATE, "job %.64s is %s; only a finished job can be deleted", id,
                   status_names[status]);
    goto out;
  }
  sqlite3_stmt *s = stmt(st, S_JOB_DELETE, e);
  if (!s) {
    rc = e ? e->code : DAPO_EIO;
    goto out;
  }
  bind_text(s, 1, id);
  rc = exec_done(st, s, "deleting a job", e); /* events, metrics, checkpoints: ON DELETE CASCADE */
out:
  return tx_end(st, rc, e);
}

int store_job_delete(struct store *st, const char *id, const char *owner, struct dapo_err *e) {
  if (!id) return dapo_errf(e, DAPO_EINVAL, "store: job id missing");
  LOCK(st);
  int rc = job_delete_locked(st, id, owner, e);
  if (!rc) __atomic_add_fetch(&st->metrics_gen, 1, __ATOMIC_RELEASE); /* its rows are gone */
  UNLOCK(st);
  return rc;
}

/* ---- events -------------------------------------------------------------------------------- */

void store_event_list_deinit(struct store_event_list *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) json_decref(l->v[i].data);
  free(l->v);
  memset(l, 0, sizeof *l);
}

/* 0 where the job exists and has not finished (STORE_ESTATE: it has); the caller holds the lock,
 * in a transaction with the events it appends. */
static int job_takes_events_locked(struct store *st, const char *job_id, struct dapo_err *e) {
  enum store_job_status status;
  int rc = job_head(st, job_id, NULL, &status, e);
  if (!rc && store_job_status_terminal(status))
    rc = dapo_errf(e, STORE_ESTATE, "job %.64s has finished (%s): no more events", job_id,
                   status_names[status]);
  return rc;
}

int store_event_append(struct store *st, const char *job_id, const char *type, const json_t *data,
                       int64_t *id_out, struct dapo_err *e) {
  if (id_out) *id_out = 0;
  if (!job_id || !type || !*type || strlen(type) >= STORE_EVENT_TYPE_MAX)
    return dapo_errf(e, DAPO_EINVAL, "store: event needs a job id and a type of 1 to %d bytes",
                     STORE_EVENT_TYPE_MAX - 1);
  LOCK(st);
  int rc = tx_begin(st, e);
  if (rc) goto out;
  rc = job_takes_events_locked(st, job_id, e);
  if (!rc) rc = event_append_locked(st, job_id, type, data, id_out, e);
  rc = tx_end(st, rc, e);
  if (rc && id_out) *id_out = 0;
out:
  UNLOCK(st);
  return rc;
}

static int event_list_locked(struct store *st, const char *job_id, int64_t after_id, int limit,
                             struct store_event_list *out, struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, S_EV_LIST, e);
  if (!s) return e ? e->code : DAPO_EIO;
  size_t cap = 0;
  int rc = 0, r;
  bind_text(s, 1, job_id);
  sqlite3_bind_int64(s, 2, after_id);
  sqlite3_bind_int(s, 3, limit + 1);
  while ((r = sqlite3_step(s)) == SQLITE_ROW) {
    if (out->n == (size_t)limit) {
      out->has_more = 1;
      break;
    }
    if ((rc = grow((void **)&out->v, &cap, out->n, sizeof *out->v, e))) goto out;
    struct store_event *ev = &out->v[out->n];
    ev->id = sqlite3_column_int64(s, 0);
    if ((rc = col_fixed(s, 1, ev->type, sizeof ev->type, "events.type", e))) goto out;
    if ((rc = col_json(s, 2, &ev->data, "events.data", e))) goto out;
    ev->created_at = sqlite3_column_int64(s, 3);
    out->n++;
  }
  if (r != SQLITE_ROW && r != SQLITE_DONE) rc = sql_fail(st, e, "listing events");
out:
  done(s);
  return rc;
}

int store_event_list(struct store *st, const char *job_id, int64_t after_id, int limit,
                     struct store_event_list *out, struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  int rc = check_limit(limit, STORE_EVENTS_MAX, e);
  if (rc) return rc;
  if (!job_id) return dapo_errf(e, DAPO_EINVAL, "store: job id missing");
  LOCK(st);
  rc = event_list_locked(st, job_id, after_id < 0 ? 0 : after_id, limit, out, e);
  UNLOCK(st);
  if (rc) store_event_list_deinit(out); /* a half-read row owns nothing */
  return rc;
}

int store_event_last_id(struct store *st, const char *job_id, int64_t *id, struct dapo_err *e) {
  *id = 0;
  if (!job_id) return dapo_errf(e, DAPO_EINVAL, "store: job id missing");
  LOCK(st);
  int rc = 0;
  sqlite3_stmt *s = stmt(st, S_EV_LAST, e);
  if (!s) {
    rc = e ? e->code : DAPO_EIO;
    goto out;
  }
  bind_text(s, 1, job_id);
  if (sqlite3_step(s) == SQLITE_ROW)
    *id = sqlite3_column_int64(s, 0);
  else
    rc = sql_fail(st, e, "last event id");
  done(s);
out:
  UNLOCK(st);
  return rc;
}

/* ---- metrics ------------------------------------------------------------------------------- */

void store_metric_list_deinit(struct store_metric_list *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) json_decref(l->v[i].data);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static int metrics_args_ok(const char *job_id, const char *kind, const json_t *data,
                           struct dapo_err *e) {
  if (!job_id || !data) return dapo_errf(e, DAPO_EINVAL, "store: metrics need a job and data");
  if (!kind || (strcmp(kind, "train") && strcmp(kind, "eval")))
    return dapo_errf(e, DAPO_EINVAL, "store: metrics kind must be \"train\" or \"eval\"");
  return 0;
}

/* The caller holds the lock (and bumps metrics_gen once what it wrote is committed). */
static int metrics_put_locked(struct store *st, const char *job_id, int64_t step, const char *kind,
                              const json_t *data, struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, S_MET_PUT, e);
  if (!s) return e ? e->code : DAPO_EIO;
  bind_text(s, 1, job_id);
  sqlite3_bind_int64(s, 2, step);
  bind_text(s, 3, kind);
  int rc = bind_json_value(s, 4, data, e);
  if (rc) {
    done(s);
    return rc;
  }
  return exec_done(st, s, job_id, e);
}

int store_metrics_put(struct store *st, const char *job_id, int64_t step, const char *kind,
                      const json_t *data, struct dapo_err *e) {
  int rc = metrics_args_ok(job_id, kind, data, e);
  if (rc) return rc;
  LOCK(st);
  rc = metrics_put_locked(st, job_id, step, kind, data, e);
  if (!rc) __atomic_add_fetch(&st->metrics_gen, 1, __ATOMIC_RELEASE);
  UNLOCK(st);
  return rc;
}

int store_metrics_record(struct store *st, const char *job_id, int64_t step, const char *kind,
                         const json_t *data, const struct store_job_patch *p, int64_t *event_id,
                         struct dapo_err *e) {
  if (event_id) *event_id = 0;
  int rc = metrics_args_ok(job_id, kind, data, e);
  if (rc) return rc;
  LOCK(st);
  if ((rc = tx_begin(st, e))) goto out;
  rc = job_takes_events_locked(st, job_id, e);
  if (!rc) rc = metrics_put_locked(st, job_id, step, kind, data, e);
  if (!rc && p && p->set) rc = job_update_locked(st, job_id, p, e);
  if (!rc) rc = event_append_locked(st, job_id, "metrics", data, event_id, e);
  rc = tx_end(st, rc, e);
  if (rc && event_id) *event_id = 0;
  if (!rc) __atomic_add_fetch(&st->metrics_gen, 1, __ATOMIC_RELEASE);
out:
  UNLOCK(st);
  return rc;
}

uint64_t store_metrics_gen(struct store *st) {
  return __atomic_load_n(&st->metrics_gen, __ATOMIC_ACQUIRE);
}

int store_metrics_list(struct store *st, const char *job_id, struct store_metric_list *out,
                       struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  if (!job_id) return dapo_errf(e, DAPO_EINVAL, "store: job id missing");
  LOCK(st);
  size_t cap = 0;
  int rc = 0, r;
  sqlite3_stmt *s = stmt(st, S_MET_LIST, e);
  if (!s) {
    rc = e ? e->code : DAPO_EIO;
    goto out;
  }
  bind_text(s, 1, job_id);
  out->gen = __atomic_load_n(&st->metrics_gen, __ATOMIC_ACQUIRE);
  while ((r = sqlite3_step(s)) == SQLITE_ROW) {
    if ((rc = grow((void **)&out->v, &cap, out->n, sizeof *out->v, e))) break;
    struct store_metric *m = &out->v[out->n];
    m->step = sqlite3_column_int64(s, 0);
    if ((rc = col_fixed(s, 1, m->kind, sizeof m->kind, "metrics.kind", e))) break;
    if ((rc = col_json(s, 2, &m->data, "metrics.data", e))) break;
    out->n++;
  }
  if (!rc && r != SQLITE_DONE) rc = sql_fail(st, e, "listing metrics");
  done(s);
out:
  UNLOCK(st);
  if (rc) store_metric_list_deinit(out);
  return rc;
}

/* ---- checkpoints --------------------------------------------------------------------------- */

void store_ckpt_deinit(struct store_ckpt *c) {
  if (!c) return;
  free(c->path);
  json_decref(c->files);
  json_decref(c->metrics);
  memset(c, 0, sizeof *c);
}

void store_ckpt_list_deinit(struct store_ckpt_list *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) store_ckpt_deinit(&l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static int read_ckpt_row(sqlite3_stmt *s, struct store_ckpt *c, struct dapo_err *e) {
  int rc;
  memset(c, 0, sizeof *c);
  c->step = sqlite3_column_int64(s, 0);
  c->created_at = sqlite3_column_int64(s, 1);
  if ((rc = col_strdup(s, 2, &c->path, e))) goto out;
  if ((rc = col_json(s, 3, &c->files, "checkpoints.files", e))) goto out;
  if ((rc = col_json(s, 4, &c->metrics, "checkpoints.metrics", e))) goto out;
out:
  if (rc) store_ckpt_deinit(c);
  return rc;
}

static int check_ckpt_files(const json_t *files, struct dapo_err *e) {
  if (!json_is_array(files)) return dapo_errf(e, DAPO_EINVAL, "checkpoint files: must be an array");
  for (size_t i = 0; i < json_array_size(files); i++) {
    const json_t *f = json_array_get(files, i);
    if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")) ||
        !json_is_integer(json_object_get(f, "bytes")) ||
        !json_is_string(json_object_get(f, "sha256")))
      return dapo_errf(e, DAPO_EINVAL,
                       "checkpoint files[%zu]: must be {name: string, bytes: integer, sha256: "
                       "string}",
                       i);
  }
  return 0;
}

/* The caller holds the lock. */
static int ckpt_put_locked(struct store *st, const char *job_id, int64_t step, const char *path,
                           const json_t *files, const json_t *metrics, struct dapo_err *e) {
  sqlite3_stmt *s = stmt(st, S_CK_PUT, e);
  if (!s) return e ? e->code : DAPO_EIO;
  bind_text(s, 1, job_id);
  sqlite3_bind_int64(s, 2, step);
  sqlite3_bind_int64(s, 3, now_s());
  bind_text(s, 4, path);
  int rc;
  if ((rc = bind_json(s, 5, files, e)) || (rc = bind_json(s, 6, metrics, e))) {
    done(s);
    return rc;
  }
  return exec_done(st, s, job_id, e);
}

static int ckpt_args_ok(const char *job_id, const char *path, const json_t *files,
                        struct dapo_err *e) {
  if (!job_id || !path) return dapo_errf(e, DAPO_EINVAL, "store: checkpoint needs job and path");
  return check_ckpt_files(files, e);
}

int store_ckpt_put(struct store *st, const char *job_id, int64_t step, const char *path,
                   const json_t *files, const json_t *metrics, struct dapo_err *e) {
  int rc = ckpt_args_ok(job_id, path, files, e);
  if (rc) return rc;
  LOCK(st);
  rc = ckpt_put_locked(st, job_id, step, path, files, metrics, e);
  UNLOCK(st);
  return rc;
}

int store_ckpt_record(struct store *st, const char *job_id, int64_t step, const char *path,
                      const json_t *files, const json_t *metrics, const json_t *event,
                      int64_t *event_id, struct dapo_err *e) {
  if (event_id) *event_id = 0;
  int rc = ckpt_args_ok(job_id, path, files, e);
  if (rc) return rc;
  LOCK(st);
  if ((rc = tx_begin(st, e))) goto out;
  rc = job_takes_events_locked(st, job_id, e);
  if (!rc) rc = ckpt_put_locked(st, job_id, step, path, files, metrics, e);
  if (!rc) rc = event_append_locked(st, job_id, "checkpoint", event, event_id, e);
  rc = tx_end(st, rc, e);
  if (rc && event_id) *event_id = 0;
out:
  UNLOCK(st);
  return rc;
}

int store_ckpt_get(struct store *st, const char *job_id, int64_t step, struct store_ckpt *out,
                   struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  if (!job_id) return dapo_errf(e, DAPO_EINVAL, "store: job id missing");
  LOCK(st);
  int rc = 0;
  sqlite3_stmt *s = stmt(st, S_CK_GET, e);
  if (!s) {
    rc = e ? e->code : DAPO_EIO;
    goto out;
  }
  bind_text(s, 1, job_id);
  sqlite3_bind_int64(s, 2, step);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW)
    rc = read_ckpt_row(s, out, e);
  else if (r == SQLITE_DONE)
    rc = dapo_errf(e, STORE_ENOTFOUND, "job %.64s has no checkpoint at step %lld", job_id,
                   (long long)step);
  else
    rc = sql_fail(st, e, "reading a checkpoint");
  done(s);
out:
  UNLOCK(st);
  return rc;
}

int store_ckpt_list(struct store *st, const char *job_id, struct store_ckpt_list *out,
                    struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  if (!job_id) return dapo_errf(e, DAPO_EINVAL, "store: job id missing");
  LOCK(st);
  size_t cap = 0;
  int rc = 0, r;
  sqlite3_stmt *s = stmt(st, S_CK_LIST, e);
  if (!s) {
    rc = e ? e->code : DAPO_EIO;
    goto out;
  }
  bind_text(s, 1, job_id);
  while ((r = sqlite3_step(s)) == SQLITE_ROW) {
    if ((rc = grow((void **)&out->v, &cap, out->n, sizeof *out->v, e))) break;
    if ((rc = read_ckpt_row(s, &out->v[out->n], e))) break;
    out->n++;
  }
  if (!rc && r != SQLITE_DONE) rc = sql_fail(st, e, "listing checkpoints");
  done(s);
out:
  UNLOCK(st);
  if (rc) store_ckpt_list_deinit(out);
  return rc;
}

int store_ckpt_delete(struct store *st, const char *job_id, int64_t step, struct dapo_err *e) {
  if (!job_id) return dapo_errf(e, DAPO_EINVAL, "store: job id missing");
  LOCK(st);
  int rc = 0;
  sqlite3_stmt *s = stmt(st, S_CK_DELETE, e);
  if (!s) {
    rc = e ? e->code : DAPO_EIO;
    goto out;
  }
  bind_text(s, 1, job_id);
  sqlite3_bind_int64(s, 2, step);
  if ((rc = exec_done(st, s, "deleting a checkpoint", e))) goto out;
  if (sqlite3_changes(st->db) == 0)
    rc = dapo_errf(e, STORE_ENOTFOUND, "job %.64s has no checkpoint at step %lld", job_id,
                   (long long)step);
out:
  UNLOCK(st);
  return rc;
}
