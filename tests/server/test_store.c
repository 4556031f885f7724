/* Tests of the daemon's SQLite store (server/store.h) in a scratch data directory: migrations
 * and a refused future schema, files CRUD and paging with owner isolation, idempotent job
 * creation, every pair of the status machine, queue order, gap-free event ids under concurrent
 * appends, metrics upsert and order, checkpoints, file-in-use refusal, restart durability and
 * job deletion with its rows. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "check.h"
#include "store.h"

static char dir[64];
static char db_path[128];

static void rm_data_dir(void) {
  const char *suffix[] = {"", "-wal", "-shm", "-journal"};
  char p[160];
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s%s", db_path, suffix[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* Runs one SQL statement with an optional text parameter on a separate connection, returning
 * the first column of the first row as an integer (or -1 when none / error). */
static long long sql_int(const char *sql, const char *param) {
  sqlite3 *db = NULL;
  sqlite3_stmt *s = NULL;
  long long v = -1;
  if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) goto out;
  sqlite3_busy_timeout(db, 5000);
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) {
    fprintf(stderr, "sql_int: %s\n", sqlite3_errmsg(db));
    goto out;
  }
  if (param) sqlite3_bind_text(s, 1, param, -1, SQLITE_STATIC);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW)
    v = sqlite3_column_int64(s, 0);
  else if (r == SQLITE_DONE)
    v = 0;
out:
  sqlite3_finalize(s);
  sqlite3_close(db);
  return v;
}

static struct store *open_store(void) {
  struct dapo_err e = {0};
  struct store *st = store_open(dir, &e);
  CHECK_MSG(st != NULL, "store_open: %s", e.msg);
  return st;
}

/* ---- ids and hashes ------------------------------------------------------------------------ */

static void test_ids(void) {
  char a[STORE_ID_MAX], b[STORE_ID_MAX];
  CHECK(store_new_id("file", a) == 0);
  CHECK(store_new_id("file", b) == 0);
  CHECK(strlen(a) == 5 + 36);
  CHECK(strncmp(a, "file-", 5) == 0);
  CHECK(strcmp(a, b) != 0);
  int ok = 1;
  for (int i = 0; i < 36; i++) {
    char c = a[5 + i];
    if (i == 8 || i == 13 || i == 18 || i == 23)
      ok &= c == '-';
    else
      ok &= (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  }
  CHECK_MSG(ok, "id %s is not prefix-uuid in lower case", a);
  CHECK_MSG(a[5 + 14] == '4', "UUID version of %s is not 4", a);
  CHECK(store_new_id("", a) == DAPO_EINVAL);
  CHECK(store_new_id("toolongprefix", a) == DAPO_EINVAL);

  /* SHA-256 of the canonical text, against Python's hashlib */
  char h[65], h2[65];
  json_t *j = json_object();
  CHECK(store_body_hash(j, h, NULL) == 0);
  CHECK_MSG(!strcmp(h, "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"),
            "sha256({}) = %s", h);
  json_decref(j);
  j = json_loads("{\"c\":{\"d\":null},\"b\":[1,2,\"x\"],\"a\":1}", 0, NULL);
  json_t *j2 = json_loads("{\"a\":1,\"b\":[1,2,\"x\"],\"c\":{\"d\":null}}", 0, NULL);
  CHECK(store_body_hash(j, h, NULL) == 0 && store_body_hash(j2, h2, NULL) == 0);
  CHECK_MSG(!strcmp(h, "ec2a668121f19efdf0edee027b01826fd65967c4624bac2da1c27700c3369d3b"),
            "hash = %s", h);
  CHECK(!strcmp(h, h2));
  json_decref(j);
  json_decref(j2);
  char s100[101], s48[49];
  memset(s100, 'x', 100), s100[100] = '\0';
  memset(s48, 'y', 48), s48[48] = '\0';
  j = json_pack("{s:s}", "k", s100); /* 108 bytes: two blocks */
  CHECK(store_body_hash(j, h, NULL) == 0);
  CHECK_MSG(!strcmp(h, "c654592cd08b9945bce1335bf1745b880a6faa7268c91eb7e94f2927ff6c6401"),
            "hash(108 bytes) = %s", h);
  json_decref(j);
  j = json_pack("{s:s}", "k", s48); /* 56 bytes: the length spills into a second block */
  CHECK(store_body_hash(j, h, NULL) == 0);
  CHECK_MSG(!strcmp(h, "08c4304dc7bf2542e54e0670eea59f742f2899d25764c8b5c525bbd750ea4a32"),
            "hash(56 bytes) = %s", h);
  json_decref(j);

  CHECK(!strcmp(store_strerror(STORE_ETRANSITION), "illegal_transition"));
  CHECK(!strcmp(store_strerror(DAPO_EIO), dapo_strerror(DAPO_EIO)));
}

/* ---- migrations ---------------------------------------------------------------------------- */

static void test_migrations(void) {
  struct dapo_err e = {0};
  /* an old database (version 0: only the version table) is migrated at open */
  sqlite3 *db = NULL;
  CHECK(sqlite3_open(db_path, &db) == SQLITE_OK);
  CHECK(sqlite3_exec(db,
                     "CREATE TABLE schema_version (version INTEGER NOT NULL);"
                     "INSERT INTO schema_version VALUES (0);",
                     NULL, NULL, NULL) == SQLITE_OK);
  sqlite3_close(db);

  struct store *st = open_store();
  if (!st) return;
  CHECK(store_schema_latest() >= 1);
  CHECK(store_schema_version(st) == store_schema_latest());
  store_close(st);
  CHECK(sql_int("SELECT version FROM schema_version", NULL) == store_schema_latest());
  CHECK(sql_int("SELECT COUNT(*) FROM schema_version", NULL) == 1);
  CHECK(sql_int("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                "('files', 'jobs', 'events', 'metrics', 'checkpoints')",
                NULL) == 5);

  /* reopen: nothing to do, same version */
  st = open_store();
  if (!st) return;
  CHECK(store_schema_version(st) == store_schema_latest());
  store_close(st);
  CHECK(sql_int("SELECT COUNT(*) FROM schema_version", NULL) == 1);

  /* WAL is persistent in the file */
  db = NULL;
  CHECK(sqlite3_open(db_path, &db) == SQLITE_OK);
  sqlite3_stmt *s = NULL;
  CHECK(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL) == SQLITE_OK);
  CHECK(sqlite3_step(s) == SQLITE_ROW);
  CHECK(!strcmp((const char *)sqlite3_column_text(s, 0), "wal"));
  sqlite3_finalize(s);

  /* a database from the future is refused with a clear error, and left as it is */
  CHECK(sqlite3_exec(db, "UPDATE schema_version SET version = 999", NULL, NULL, NULL) == SQLITE_OK);
  st = store_open(dir, &e);
  CHECK(st == NULL);
  CHECK(e.code == STORE_ESCHEMA);
  CHECK_MSG(strstr(e.msg, "999") && strstr(e.msg, "newer"), "message: %s", e.msg);
  store_close(st);
  CHECK(sql_int("SELECT version FROM schema_version", NULL) == 999);
  char fix[64];
  snprintf(fix, sizeof fix, "UPDATE schema_version SET version = %d", store_schema_latest());
  CHECK(sqlite3_exec(db, fix, NULL, NULL, NULL) == SQLITE_OK);
  sqlite3_close(db);
  st = open_store();
  store_close(st);
}

/* ---- files --------------------------------------------------------------------------------- */

static const char *HEX64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

static int add_file(struct store *st, const char *owner, const char *name, char id[STORE_ID_MAX]) {
  struct store_file f = {0};
  struct dapo_err e = {0};
  f.owner = (char *)owner;
  f.filename = (char *)name;
  f.purpose = "fine-tune";
  f.path = "/data/files/x.jsonl";
  f.bytes = 123;
  memcpy(f.sha256, HEX64, 65);
  f.valid = 1;
  f.n_lines = 4;
  f.n_items = 3;
  int rc = store_file_insert(st, &f, &e);
  CHECK_MSG(rc == 0, "insert %s: %s", name, e.msg);
  memcpy(id, f.id, STORE_ID_MAX);
  return rc;
}

static void test_files(struct store *st) {
  struct dapo_err e = {0};
  char a[5][STORE_ID_MAX], b[2][STORE_ID_MAX];
  for (int i = 0; i < 5; i++) {
    char name[32];
    snprintf(name, sizeof name, "a%d.jsonl", i);
    add_file(st, "alice", name, a[i]);
    if (i < 2) {
      snprintf(name, sizeof name, "b%d.jsonl", i);
      add_file(st, "bob", name, b[i]);
    }
  }
  CHECK(strncmp(a[0], "file-", 5) == 0);

  /* an invalid file with its errors, a caller-chosen id */
  struct store_file f = {0};
  memcpy(f.id, "file-fixed", 11);
  f.owner = "alice";
  f.filename = "bad.jsonl";
  f.purpose = "fine-tune";
  f.path = "/data/files/bad.jsonl";
  memcpy(f.sha256, HEX64, 65);
  f.valid = 0;
  f.errors = json_pack("[{s:i,s:s}]", "line", 3, "message", "not JSON");
  CHECK(store_file_insert(st, &f, &e) == 0);
  CHECK(f.created_at > 0);
  CHECK(store_file_insert(st, &f, &e) == STORE_EEXISTS);
  json_decref(f.errors);
  f.errors = NULL;
  memcpy(f.sha256, "XYZ", 4);
  f.id[0] = '\0';
  CHECK(store_file_insert(st, &f, &e) == DAPO_EINVAL);

  struct store_file g;
  CHECK(store_file_get(st, "file-fixed", "alice", &g, &e) == 0);
  CHECK(g.valid == 0 && !strcmp(g.filename, "bad.jsonl") && !strcmp(g.sha256, HEX64));
  CHECK(json_is_array(g.errors) && json_array_size(g.errors) == 1 &&
        json_integer_value(json_object_get(json_array_get(g.errors, 0), "line")) == 3);
  store_file_deinit(&g);
  CHECK(store_file_get(st, a[1], "alice", &g, &e) == 0);
  CHECK(!strcmp(g.id, a[1]) && !strcmp(g.owner, "alice") && !strcmp(g.filename, "a1.jsonl"));
  CHECK(g.bytes == 123 && g.n_lines == 4 && g.n_items == 3 && g.valid == 1 && g.errors == NULL);
  CHECK(!strcmp(g.purpose, "fine-tune") && !strcmp(g.path, "/data/files/x.jsonl"));
  store_file_deinit(&g);
  /* owner isolation: bob does not see alice's file; admin (NULL) does */
  CHECK(store_file_get(st, a[1], "bob", &g, &e) == STORE_ENOTFOUND);
  CHECK(store_file_get(st, a[1], NULL, &g, &e) == 0);
  store_file_deinit(&g);
  CHECK(store_file_get(st, "file-nope", NULL, &g, &e) == STORE_ENOTFOUND);

  /* paging in creation order: alice has a0..a4 and file-fixed */
  const char *want[6] = {a[0], a[1], a[2], a[3], a[4], "file-fixed"};
  struct store_file_list l;
  const char *after = NULL;
  char cursor[STORE_ID_MAX];
  int seen = 0, pages = 0;
  for (;;) {
    CHECK(store_file_list(st, "alice", 4, after, &l, &e) == 0);
    pages++;
    for (size_t i = 0; i < l.n; i++, seen++)
      CHECK_MSG(seen < 6 && !strcmp(l.v[i].id, want[seen]), "page item %d", seen);
    int more = l.has_more;
    if (l.n) memcpy(cursor, l.v[l.n - 1].id, STORE_ID_MAX);
    store_file_list_deinit(&l);
    if (!more) break;
    after = cursor;
  }
  CHECK(seen == 6 && pages == 2);
  CHECK(store_file_list(st, "alice", 6, NULL, &l, &e) == 0);
  CHECK(l.n == 6 && l.has_more == 0);
  store_file_list_deinit(&l);
  CHECK(store_file_list(st, "alice", 5, NULL, &l, &e) == 0);
  CHECK(l.n == 5 && l.has_more == 1);
  store_file_list_deinit(&l);
  CHECK(store_file_list(st, "bob", 100, NULL, &l, &e) == 0);
  CHECK(l.n == 2 && !strcmp(l.v[0].id, b[0]) && !strcmp(l.v[1].id, b[1]) && !l.has_more);
  store_file_list_deinit(&l);
  CHECK(store_file_list(st, NULL, 100, NULL, &l, &e) == 0);
  CHECK(l.n == 8);
  store_file_list_deinit(&l);
  CHECK(store_file_list(st, "carol", 10, NULL, &l, &e) == 0);
  CHECK(l.n == 0 && !l.has_more);
  store_file_list_deinit(&l);
  /* a cursor of another owner's file is not visible */
  CHECK(store_file_list(st, "alice", 10, b[0], &l, &e) == STORE_ENOTFOUND);
  CHECK(store_file_list(st, "alice", 0, NULL, &l, &e) == DAPO_EINVAL);
  CHECK(store_file_list(st, "alice", 101, NULL, &l, &e) == DAPO_EINVAL);

  /* delete: owner checked, path handed back */
  char *path = NULL;
  CHECK(store_file_delete(st, b[1], "alice", &path, &e) == STORE_ENOTFOUND);
  CHECK(store_file_delete(st, b[1], "bob", &path, &e) == 0);
  CHECK(path && !strcmp(path, "/data/files/x.jsonl"));
  free(path);
  CHECK(store_file_get(st, b[1], NULL, &g, &e) == STORE_ENOTFOUND);
  CHECK(store_file_delete(st, b[1], NULL, NULL, &e) == STORE_ENOTFOUND);
}

/* ---- jobs ---------------------------------------------------------------------------------- */

static char train_file[STORE_ID_MAX];

static int new_job(struct store *st, const char *owner, const char *key, json_t *spec,
                   struct store_job *out, int *existed, struct dapo_err *e) {
  struct store_job_new nj = {0};
  nj.owner = owner;
  nj.spec = spec;
  nj.training_file = train_file;
  nj.idempotency_key = key;
  nj.total_steps = 10;
  return store_job_insert(st, &nj, out, existed, e);
}

/* A queued job with a throw-away spec; its id into id. */
static void quick_job(struct store *st, char id[STORE_ID_MAX]) {
  struct dapo_err e = {0};
  struct store_job j;
  json_t *spec = json_pack("{s:s}", "model", "tiny");
  int rc = new_job(st, "alice", NULL, spec, &j, NULL, &e);
  CHECK_MSG(rc == 0, "insert: %s", e.msg);
  memcpy(id, j.id, STORE_ID_MAX);
  store_job_deinit(&j);
  json_decref(spec);
}

static void test_job_insert(struct store *st) {
  struct dapo_err e = {0};
  struct store_job j1, j2;
  int existed = -1;
  add_file(st, "alice", "train.jsonl", train_file);
  char val_file[STORE_ID_MAX];
  add_file(st, "alice", "val.jsonl", val_file);

  json_t *spec = json_pack("{s:s,s:s,s:{s:i,s:f}}", "model", "tiny", "training_file", train_file,
                           "hyperparameters", "group_size", 8, "lr", 1e-5);
  struct store_job_new nj = {0};
  nj.owner = "alice";
  nj.spec = spec;
  nj.resolved = json_pack("{s:{s:i}}", "hyperparameters", "group_size", 8);
  nj.metadata = json_pack("{s:s}", "team", "math");
  nj.suffix = "v1";
  nj.training_file = train_file;
  nj.validation_file = val_file;
  nj.total_steps = 50;
  nj.idempotency_key = "key-1";
  int rc1 = store_job_insert(st, &nj, &j1, &existed, &e);
  CHECK_MSG(rc1 == 0, "insert: %s", e.msg);
  if (rc1) return;
  CHECK(existed == 0);
  CHECK(!strncmp(j1.id, "job-", 4) && strlen(j1.id) == 40);
  CHECK(j1.status == STORE_JOB_QUEUED && !strcmp(j1.owner, "alice"));
  CHECK(json_equal(j1.spec, spec) && json_equal(j1.resolved, nj.resolved) &&
        json_equal(j1.metadata, nj.metadata));
  CHECK(j1.suffix && !strcmp(j1.suffix, "v1") && !strcmp(j1.training_file, train_file) &&
        j1.validation_file && !strcmp(j1.validation_file, val_file));
  CHECK(j1.total_steps == 50 && j1.step == 0 && j1.created_at > 0 && j1.started_at == 0 &&
        j1.finished_at == 0 && j1.error == NULL && j1.latest_metrics == NULL && j1.n_ckpt == 0 &&
        !j1.ckpt_steps);
  CHECK(j1.queue_seq > 0 && j1.queue_position >= 1);
  CHECK(j1.idempotency_key && !strcmp(j1.idempotency_key, "key-1"));
  char h[65];
  store_body_hash(spec, h, NULL);
  CHECK(!strcmp(j1.body_hash, h));

  /* the same key and body (keys in another order) gives the same job back */
  json_t *same = json_pack("{s:{s:f,s:i},s:s,s:s}", "hyperparameters", "lr", 1e-5, "group_size", 8,
                           "training_file", train_file, "model", "tiny");
  nj.spec = same;
  CHECK(store_job_insert(st, &nj, &j2, &existed, &e) == 0);
  CHECK(existed == 1 && !strcmp(j1.id, j2.id));
  store_job_deinit(&j2);
  /* same key, different body: conflict */
  json_t *other = json_pack("{s:s,s:s}", "model", "small", "training_file", train_file);
  nj.spec = other;
  CHECK(store_job_insert(st, &nj, &j2, &existed, &e) == STORE_ECONFLICT);
  CHECK_MSG(strstr(e.msg, j1.id) != NULL, "conflict message: %s", e.msg);
  CHECK(j2.spec == NULL);
  /* keys are per owner */
  nj.owner = "bob";
  CHECK(store_job_insert(st, &nj, &j2, &existed, &e) == 0);
  CHECK(existed == 0 && strcmp(j2.id, j1.id));
  store_job_deinit(&j2);
  /* no key: a new job each time */
  nj.owner = "alice";
  nj.idempotency_key = NULL;
  nj.spec = spec;
  CHECK(store_job_insert(st, &nj, &j2, &existed, &e) == 0);
  CHECK(existed == 0 && strcmp(j2.id, j1.id) && j2.queue_seq > j1.queue_seq);
  store_job_deinit(&j2);
  /* unknown files are refused, naming the field */
  nj.training_file = "file-missing";
  CHECK(store_job_insert(st, &nj, &j2, &existed, &e) == STORE_ENOTFOUND);
  CHECK(strstr(e.msg, "training_file") != NULL);
  nj.training_file = train_file;
  nj.validation_file = "file-missing";
  CHECK(store_job_insert(st, &nj, &j2, &existed, &e) == STORE_ENOTFOUND);
  CHECK(strstr(e.msg, "validation_file") != NULL);
  nj.validation_file = NULL;
  nj.owner = NULL;
  CHECK(store_job_insert(st, &nj, &j2, &existed, &e) == DAPO_EINVAL);

  /* get with owner isolation; event 1 is the queued status */
  CHECK(store_job_get(st, j1.id, "bob", &j2, &e) == STORE_ENOTFOUND);
  CHECK(store_job_get(st, j1.id, "alice", &j2, &e) == 0);
  CHECK(json_equal(j2.spec, spec));
  store_job_deinit(&j2);
  struct store_event_list ev;
  CHECK(store_event_list(st, j1.id, 0, 10, &ev, &e) == 0);
  CHECK(ev.n == 1 && ev.v[0].id == 1 && !strcmp(ev.v[0].type, "status") &&
        !strcmp(json_string_value(json_object_get(ev.v[0].data, "status")), "queued"));
  store_event_list_deinit(&ev);

  /* the patch */
  struct store_job_patch p = {0};
  json_t *m = json_pack("{s:f}", "reward_mean", 0.25);
  p.set = STORE_SET_STEP | STORE_SET_METRICS;
  p.step = 7;
  p.latest_metrics = m;
  CHECK(store_job_update(st, j1.id, &p, &e) == 0);
  CHECK(store_job_get(st, j1.id, NULL, &j2, &e) == 0);
  CHECK(j2.step == 7 && json_equal(j2.latest_metrics, m) && j2.total_steps == 50);
  store_job_deinit(&j2);
  p.set = STORE_SET_TOTAL_STEPS | STORE_SET_STARTED_AT;
  p.total_steps = 60;
  p.started_at = 1234;
  CHECK(store_job_update(st, j1.id, &p, &e) == 0);
  CHECK(store_job_get(st, j1.id, NULL, &j2, &e) == 0);
  CHECK(j2.step == 7 && j2.total_steps == 60 && j2.started_at == 1234 &&
        json_equal(j2.latest_metrics, m));
  store_job_deinit(&j2);
  CHECK(store_job_update(st, "job-missing", &p, &e) == STORE_ENOTFOUND);
  json_decref(m);

  json_decref(spec);
  json_decref(same);
  json_decref(other);
  json_decref((json_t *)nj.resolved);
  json_decref((json_t *)nj.metadata);
  store_job_deinit(&j1);
}

/* The legal transitions, written out from API.md independently of store.c's table. */
static int expected_legal(enum store_job_status f, enum store_job_status t) {
  static const struct {
    enum store_job_status f, t;
  } legal[] = {
      {STORE_JOB_QUEUED, STORE_JOB_RUNNING},       {STORE_JOB_QUEUED, STORE_JOB_CANCELLED},
      {STORE_JOB_RUNNING, STORE_JOB_SUCCEEDED},    {STORE_JOB_RUNNING, STORE_JOB_FAILED},
      {STORE_JOB_RUNNING, STORE_JOB_CANCELLED},    {STORE_JOB_RUNNING, STORE_JOB_PAUSING},
      {STORE_JOB_RUNNING, STORE_JOB_CANCELLING},   {STORE_JOB_RUNNING, STORE_JOB_QUEUED},
      {STORE_JOB_PAUSING, STORE_JOB_PAUSED},       {STORE_JOB_PAUSING, STORE_JOB_CANCELLING},
      {STORE_JOB_PAUSING, STORE_JOB_SUCCEEDED},    {STORE_JOB_PAUSING, STORE_JOB_FAILED},
      {STORE_JOB_PAUSED, STORE_JOB_QUEUED},        {STORE_JOB_PAUSED, STORE_JOB_CANCELLED},
      {STORE_JOB_CANCELLING, STORE_JOB_CANCELLED}, {STORE_JOB_CANCELLING, STORE_JOB_SUCCEEDED},
      {STORE_JOB_CANCELLING, STORE_JOB_FAILED},
  };
  for (size_t i = 0; i < sizeof legal / sizeof legal[0]; i++)
    if (legal[i].f == f && legal[i].t == t) return 1;
  return 0;
}

/* A legal path from queued to each status. */
static const enum store_job_status path_to[STORE_JOB_NSTATUS][4] = {
    [STORE_JOB_QUEUED] = {STORE_JOB_QUEUED},
    [STORE_JOB_RUNNING] = {STORE_JOB_RUNNING},
    [STORE_JOB_PAUSING] = {STORE_JOB_RUNNING, STORE_JOB_PAUSING},
    [STORE_JOB_PAUSED] = {STORE_JOB_RUNNING, STORE_JOB_PAUSING, STORE_JOB_PAUSED},
    [STORE_JOB_CANCELLING] = {STORE_JOB_RUNNING, STORE_JOB_CANCELLING},
    [STORE_JOB_SUCCEEDED] = {STORE_JOB_RUNNING, STORE_JOB_SUCCEEDED},
    [STORE_JOB_FAILED] = {STORE_JOB_RUNNING, STORE_JOB_FAILED},
    [STORE_JOB_CANCELLED] = {STORE_JOB_CANCELLED},
};

static void drive(struct store *st, const char *id, enum store_job_status to) {
  struct dapo_err e = {0};
  for (int i = 0; i < 4 && path_to[to][i] != STORE_JOB_QUEUED; i++) {
    int rc = store_job_set_status(st, id, path_to[to][i], NULL, NULL, NULL, &e);
    CHECK_MSG(rc == 0, "driving to %s: %s", store_job_status_name(to), e.msg);
    if (path_to[to][i] == to) break;
  }
}

static enum store_job_status status_of(struct store *st, const char *id) {
  struct store_job j;
  struct dapo_err e = {0};
  enum store_job_status s = STORE_JOB_NSTATUS;
  if (store_job_get(st, id, NULL, &j, &e) == 0) s = j.status;
  store_job_deinit(&j);
  return s;
}

static void test_status_machine(struct store *st) {
  struct dapo_err e = {0};
  int n_legal = 0;
  for (int f = 0; f < STORE_JOB_NSTATUS; f++)
    for (int t = 0; t < STORE_JOB_NSTATUS; t++) {
      enum store_job_status from = (enum store_job_status)f, to = (enum store_job_status)t;
      int want = expected_legal(from, to);
      n_legal += want;
      CHECK_MSG(store_job_transition_ok(from, to) == want, "table %s -> %s",
                store_job_status_name(from), store_job_status_name(to));
      char id[STORE_ID_MAX];
      quick_job(st, id);
      drive(st, id, from);
      CHECK_MSG(status_of(st, id) == from, "reached %s", store_job_status_name(from));
      int rc = store_job_set_status(st, id, to, NULL, NULL, NULL, &e);
      CHECK_MSG(rc == (want ? 0 : STORE_ETRANSITION), "%s -> %s gave %d (%s)",
                store_job_status_name(from), store_job_status_name(to), rc, e.msg);
      CHECK(status_of(st, id) == (want ? to : from));
    }
  CHECK(n_legal == 17);
  for (int s = 0; s < STORE_JOB_NSTATUS; s++) {
    enum store_job_status x;
    CHECK(store_job_status_parse(store_job_status_name((enum store_job_status)s), &x, &e) == 0 &&
          (int)x == s);
  }
  enum store_job_status x;
  CHECK(store_job_status_parse("done", &x, &e) == DAPO_EINVAL);
  CHECK(store_job_set_status(st, "job-missing", STORE_JOB_RUNNING, NULL, NULL, NULL, &e) ==
        STORE_ENOTFOUND);

  /* side effects and events along queued -> running -> failed */
  char id[STORE_ID_MAX];
  struct store_job j;
  quick_job(st, id);
  CHECK(store_job_set_status(st, id, STORE_JOB_RUNNING, NULL, NULL, &j, &e) == 0);
  CHECK(j.status == STORE_JOB_RUNNING && j.started_at > 0 && j.finished_at == 0 &&
        j.queue_position == 0);
  int64_t started = j.started_at;
  store_job_deinit(&j);
  struct store_job_patch p = {.set = STORE_SET_STEP, .step = 3};
  CHECK(store_job_update(st, id, &p, &e) == 0);
  json_t *err = json_pack("{s:s,s:s,s:n,s:s}", "code", "judge_error", "message", "judge down",
                          "param", "category", "user");
  json_t *extra = json_pack("{s:s}", "message", "the judge stopped answering");
  CHECK(store_job_set_status(st, id, STORE_JOB_FAILED, err, extra, &j, &e) == 0);
  CHECK(j.status == STORE_JOB_FAILED && j.finished_at > 0 && j.started_at == started &&
        j.step == 3 && json_equal(j.error, err));
  store_job_deinit(&j);
  struct store_event_list ev;
  CHECK(store_event_list(st, id, 0, 100, &ev, &e) == 0);
  CHECK(ev.n == 4);
  if (ev.n == 4) {
    const char *st_names[3] = {"queued", "running", "failed"};
    for (int i = 0; i < 3; i++) {
      CHECK(ev.v[i].id == i + 1 && !strcmp(ev.v[i].type, "status"));
      CHECK(!strcmp(json_string_value(json_object_get(ev.v[i].data, "status")), st_names[i]));
    }
    CHECK(!strcmp(json_string_value(json_object_get(ev.v[1].data, "previous")), "queued"));
    CHECK(json_equal(json_object_get(ev.v[2].data, "error"), err));
    CHECK(!strcmp(json_string_value(json_object_get(ev.v[2].data, "message")),
                  "the judge stopped answering"));
    CHECK(ev.v[3].id == 4 && !strcmp(ev.v[3].type, "end") &&
          !strcmp(json_string_value(json_object_get(ev.v[3].data, "status")), "failed"));
  }
  store_event_list_deinit(&ev);
  /* a finished job takes no more events */
  int64_t eid = 99;
  CHECK(store_event_append(st, id, "log", NULL, &eid, &e) == STORE_ESTATE && eid == 0);
  json_decref(err);
  json_decref(extra);

  /* the request functions */
  quick_job(st, id);
  CHECK(store_job_request_pause(st, id, "alice", &j, &e) == STORE_ETRANSITION); /* queued */
  CHECK(store_job_request_resume(st, id, "alice", &j, &e) == 0 && j.status == STORE_JOB_QUEUED);
  store_job_deinit(&j);
  CHECK(store_job_request_cancel(st, id, "bob", &j, &e) == STORE_ENOTFOUND);
  CHECK(store_job_request_cancel(st, id, "alice", &j, &e) == 0);
  CHECK(j.status == STORE_JOB_CANCELLED && j.cancel_requested && j.finished_at > 0);
  store_job_deinit(&j);
  CHECK(store_job_request_cancel(st, id, NULL, &j, &e) == STORE_ETRANSITION);

  quick_job(st, id);
  CHECK(store_job_set_status(st, id, STORE_JOB_RUNNING, NULL, NULL, NULL, &e) == 0);
  CHECK(store_job_request_resume(st, id, NULL, &j, &e) == STORE_ETRANSITION);
  CHECK(store_job_request_pause(st, id, "alice", &j, &e) == 0);
  CHECK(j.status == STORE_JOB_PAUSING && j.pause_requested && !j.cancel_requested);
  store_job_deinit(&j);
  CHECK(store_job_request_pause(st, id, "alice", &j, &e) == 0 && j.status == STORE_JOB_PAUSING);
  store_job_deinit(&j);
  CHECK(store_job_set_status(st, id, STORE_JOB_PAUSED, NULL, NULL, &j, &e) == 0);
  CHECK(j.status == STORE_JOB_PAUSED && !j.pause_requested && j.queue_position == 0);
  int64_t old_seq = j.queue_seq;
  store_job_deinit(&j);
  CHECK(store_job_request_pause(st, id, NULL, &j, &e) == 0 && j.status == STORE_JOB_PAUSED);
  store_job_deinit(&j);
  CHECK(store_job_request_resume(st, id, "alice", &j, &e) == 0);
  CHECK(j.status == STORE_JOB_QUEUED && j.queue_seq > old_seq && j.queue_position >= 1);
  store_job_deinit(&j);
  CHECK(store_job_set_status(st, id, STORE_JOB_RUNNING, NULL, NULL, NULL, &e) == 0);
  CHECK(store_job_request_cancel(st, id, NULL, &j, &e) == 0);
  CHECK(j.status == STORE_JOB_CANCELLING && j.cancel_requested);
  store_job_deinit(&j);
  CHECK(store_job_request_cancel(st, id, NULL, &j, &e) == 0 && j.status == STORE_JOB_CANCELLING);
  store_job_deinit(&j);
  CHECK(store_job_request_pause(st, id, NULL, &j, &e) == STORE_ETRANSITION);
  CHECK(store_job_set_status(st, id, STORE_JOB_CANCELLED, NULL, NULL, NULL, &e) == 0);
}

/* Queue order, positions, claims, recovery list; uses a fresh store so that the queue holds only
 * these jobs. */
static void test_queue(struct store *st) {
  struct dapo_err e = {0};
  struct store_job j;
  char ids[4][STORE_ID_MAX], next[STORE_ID_MAX];
  /* drain what earlier tests left queued */
  while (store_job_claim_next(st, &j, &e) == 0) {
    store_job_deinit(&j);
  }
  CHECK(e.code == STORE_ENOTFOUND);
  struct store_job_list live;
  CHECK(store_job_list_live(st, &live, &e) == 0);
  for (size_t i = 0; i < live.n; i++) {
    CHECK(store_job_request_cancel(st, live.v[i].id, NULL, NULL, &e) == 0);
    CHECK(store_job_set_status(st, live.v[i].id, STORE_JOB_CANCELLED, NULL, NULL, NULL, &e) == 0);
  }
  store_job_list_deinit(&live);
  CHECK(store_job_next_queued(st, next, &e) == STORE_ENOTFOUND);

  for (int i = 0; i < 4; i++) quick_job(st, ids[i]);
  for (int i = 0; i < 4; i++) {
    int64_t pos = -1;
    CHECK(store_job_queue_position(st, ids[i], &pos, &e) == 0 && pos == i + 1);
  }
  CHECK(store_job_next_queued(st, next, &e) == 0 && !strcmp(next, ids[0]));
  CHECK(store_job_claim_next(st, &j, &e) == 0);
  CHECK(!strcmp(j.id, ids[0]) && j.status == STORE_JOB_RUNNING && j.started_at > 0);
  store_job_deinit(&j);
  int64_t pos = -1;
  CHECK(store_job_queue_position(st, ids[0], &pos, &e) == 0 && pos == 0);
  CHECK(store_job_queue_position(st, ids[3], &pos, &e) == 0 && pos == 3);
  CHECK(store_job_queue_position(st, "job-missing", &pos, &e) == STORE_ENOTFOUND);
  /* cancelling the head moves the others up */
  CHECK(store_job_request_cancel(st, ids[1], NULL, NULL, &e) == 0);
  CHECK(store_job_queue_position(st, ids[2], &pos, &e) == 0 && pos == 1);
  CHECK(store_job_get(st, ids[3], NULL, &j, &e) == 0 && j.queue_position == 2);
  store_job_deinit(&j);
  /* ids[2] runs and pauses; ids[0] is left running, pausing or cancelling for recovery */
  CHECK(store_job_claim_next(st, &j, &e) == 0 && !strcmp(j.id, ids[2]));
  store_job_deinit(&j);
  CHECK(store_job_request_pause(st, ids[2], NULL, NULL, &e) == 0);
  CHECK(store_job_list_live(st, &live, &e) == 0);
  CHECK(live.n == 2 && !strcmp(live.v[0].id, ids[0]) && !strcmp(live.v[1].id, ids[2]) &&
        live.v[1].status == STORE_JOB_PAUSING);
  store_job_list_deinit(&live);
  /* recovery requeues a running job in its old place: ahead of ids[3] */
  CHECK(store_job_set_status(st, ids[0], STORE_JOB_QUEUED, NULL, NULL, NULL, &e) == 0);
  CHECK(store_job_next_queued(st, next, &e) == 0 && !strcmp(next, ids[0]));
  CHECK(store_job_queue_position(st, ids[3], &pos, &e) == 0 && pos == 2);
  /* a resumed job goes to the back */
  CHECK(store_job_set_status(st, ids[2], STORE_JOB_PAUSED, NULL, NULL, NULL, &e) == 0);
  CHECK(store_job_request_resume(st, ids[2], NULL, NULL, &e) == 0);
  CHECK(store_job_queue_position(st, ids[2], &pos, &e) == 0 && pos == 3);
  const char *order[3] = {ids[0], ids[3], ids[2]};
  for (int i = 0; i < 3; i++) {
    CHECK(store_job_claim_next(st, &j, &e) == 0 && !strcmp(j.id, order[i]));
    store_job_deinit(&j);
    CHECK(store_job_set_status(st, order[i], STORE_JOB_SUCCEEDED, NULL, NULL, NULL, &e) == 0);
  }
  CHECK(store_job_claim_next(st, &j, &e) == STORE_ENOTFOUND);
}

static void test_job_list(struct store *st) {
  struct dapo_err e = {0};
  struct store_job_list l;
  /* every job so far, newest first, in pages of 7 */
  int64_t prev_created = INT64_MAX;
  size_t total = 0;
  char cursor[STORE_ID_MAX];
  const char *after = NULL;
  int ok = 1;
  for (;;) {
    CHECK(store_job_list(st, NULL, NULL, 7, after, &l, &e) == 0);
    for (size_t i = 0; i < l.n; i++) {
      ok &= l.v[i].created_at <= prev_created;
      prev_created = l.v[i].created_at;
    }
    total += l.n;
    int more = l.has_more;
    if (l.n) memcpy(cursor, l.v[l.n - 1].id, STORE_ID_MAX);
    store_job_list_deinit(&l);
    if (!more) break;
    after = cursor;
  }
  CHECK(ok);
  long long n_jobs = sql_int("SELECT COUNT(*) FROM jobs", NULL);
  CHECK_MSG((long long)total == n_jobs, "paged %zu of %lld jobs", total, n_jobs);
  /* newest first exactly: two jobs made now come first, in reverse */
  char a[STORE_ID_MAX], b[STORE_ID_MAX];
  quick_job(st, a);
  quick_job(st, b);
  CHECK(store_job_list(st, "alice", NULL, 2, NULL, &l, &e) == 0);
  CHECK(l.n == 2 && !strcmp(l.v[0].id, b) && !strcmp(l.v[1].id, a) && l.has_more);
  store_job_list_deinit(&l);
  CHECK(store_job_list(st, "alice", NULL, 1, b, &l, &e) == 0);
  CHECK(l.n == 1 && !strcmp(l.v[0].id, a));
  store_job_list_deinit(&l);
  /* status filter */
  CHECK(store_job_list(st, NULL, "queued", 100, NULL, &l, &e) == 0);
  ok = l.n >= 2;
  for (size_t i = 0; i < l.n; i++) ok &= l.v[i].status == STORE_JOB_QUEUED;
  CHECK(ok);
  store_job_list_deinit(&l);
  CHECK(store_job_list(st, NULL, "failed", 100, NULL, &l, &e) == 0);
  ok = l.n >= 1;
  for (size_t i = 0; i < l.n; i++) ok &= l.v[i].status == STORE_JOB_FAILED;
  CHECK(ok);
  store_job_list_deinit(&l);
  CHECK(store_job_list(st, NULL, "finished", 10, NULL, &l, &e) == DAPO_EINVAL);
  /* owner filter: bob has exactly one job (from the idempotency test) */
  CHECK(store_job_list(st, "bob", NULL, 100, NULL, &l, &e) == 0);
  CHECK(l.n == 1 && !strcmp(l.v[0].owner, "bob") && !l.has_more);
  store_job_list_deinit(&l);
  CHECK(store_job_list(st, "bob", NULL, 10, a, &l, &e) == STORE_ENOTFOUND);
  CHECK(store_job_list(st, NULL, NULL, 0, NULL, &l, &e) == DAPO_EINVAL);
  CHECK(store_job_request_cancel(st, a, NULL, NULL, &e) == 0);
  CHECK(store_job_request_cancel(st, b, NULL, NULL, &e) == 0);
}

/* ---- events under concurrency -------------------------------------------------------------- */

#define N_THREADS 4
#define N_PER_THREAD 60

struct writer {
  struct store *st;
  const char *job;
  int t;
  int64_t ids[N_PER_THREAD];
  int failures;
};

static void *writer_main(void *arg) {
  struct writer *w = arg;
  struct dapo_err e = {0};
  for (int i = 0; i < N_PER_THREAD; i++) {
    json_t *d = json_pack("{s:i,s:i}", "thread", w->t, "i", i);
    if (store_event_append(w->st, w->job, i % 2 ? "metrics" : "log", d, &w->ids[i], &e)) {
      fprintf(stderr, "writer %d: %s\n", w->t, e.msg);
      w->failures++;
    }
    json_decref(d);
  }
  return NULL;
}

static void test_events(struct store *st) {
  struct dapo_err e = {0};
  char jobs[2][STORE_ID_MAX];
  quick_job(st, jobs[0]);
  quick_job(st, jobs[1]);
  CHECK(store_job_set_status(st, jobs[0], STORE_JOB_RUNNING, NULL, NULL, NULL, &e) == 0);
  struct writer w[N_THREADS];
  pthread_t th[N_THREADS];
  for (int t = 0; t < N_THREADS; t++) {
    memset(&w[t], 0, sizeof w[t]);
    w[t].st = st;
    w[t].job = jobs[t % 2];
    w[t].t = t;
    CHECK(pthread_create(&th[t], NULL, writer_main, &w[t]) == 0);
  }
  for (int t = 0; t < N_THREADS; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < N_THREADS; t++) {
    CHECK(w[t].failures == 0);
    int inc = 1;
    for (int i = 1; i < N_PER_THREAD; i++) inc &= w[t].ids[i] > w[t].ids[i - 1];
    CHECK_MSG(inc, "thread %d got ids out of order", t);
  }
  /* job 0 started with 2 status events, job 1 with 1; then 2 threads x N each */
  int64_t first[2] = {3, 2};
  for (int k = 0; k < 2; k++) {
    int64_t last = -1, want_last = first[k] - 1 + 2 * N_PER_THREAD;
    CHECK(store_event_last_id(st, jobs[k], &last, &e) == 0);
    CHECK_MSG(last == want_last, "job %d last id %lld, want %lld", k, (long long)last,
              (long long)want_last);
    /* read back in pages of 25: ids 1..last without gaps, every (thread, i) once, in order */
    int64_t after = 0, expect = 1;
    int next_i[N_THREADS] = {0}, ok = 1, pages = 0;
    for (;;) {
      struct store_event_list l;
      CHECK(store_event_list(st, jobs[k], after, 25, &l, &e) == 0);
      pages++;
      for (size_t i = 0; i < l.n; i++, expect++) {
        ok &= l.v[i].id == expect;
        if (l.v[i].id >= first[k]) {
          int t = (int)json_integer_value(json_object_get(l.v[i].data, "thread"));
          int n = (int)json_integer_value(json_object_get(l.v[i].data, "i"));
          ok &= t >= 0 && t < N_THREADS && t % 2 == k && n == next_i[t];
          if (t >= 0 && t < N_THREADS) next_i[t]++;
          ok &= !strcmp(l.v[i].type, n % 2 ? "metrics" : "log") && l.v[i].created_at > 0;
        }
      }
      int more = l.has_more;
      if (l.n) after = l.v[l.n - 1].id;
      store_event_list_deinit(&l);
      if (!more) break;
    }
    CHECK_MSG(ok && expect == want_last + 1, "job %d events not 1..%lld in order", k,
              (long long)want_last);
    CHECK(pages == (int)((want_last + 24) / 25));
    for (int t = k; t < N_THREADS; t += 2) CHECK(next_i[t] == N_PER_THREAD);
  }
  /* replay after an id */
  struct store_event_list l;
  CHECK(store_event_list(st, jobs[1], 100, STORE_EVENTS_MAX, &l, &e) == 0);
  CHECK(l.n == (size_t)(2 * N_PER_THREAD + 1 - 100) && l.v[0].id == 101 && !l.has_more);
  store_event_list_deinit(&l);
  CHECK(store_event_list(st, jobs[1], 10000, 10, &l, &e) == 0 && l.n == 0);
  store_event_list_deinit(&l);
  CHECK(store_event_list(st, jobs[1], 0, 0, &l, &e) == DAPO_EINVAL);
  CHECK(store_event_list(st, "job-missing", 0, 10, &l, &e) == 0 && l.n == 0);
  store_event_list_deinit(&l);
  int64_t id = -1;
  CHECK(store_event_last_id(st, "job-missing", &id, &e) == 0 && id == 0);
  CHECK(store_event_append(st, "job-missing", "log", NULL, &id, &e) == STORE_ENOTFOUND);
  CHECK(store_event_append(st, jobs[1], "", NULL, &id, &e) == DAPO_EINVAL);
  CHECK(store_event_append(st, jobs[1], "log", NULL, &id, &e) == 0 && id == 2 * N_PER_THREAD + 2);
  CHECK(store_event_list(st, jobs[1], id - 1, 10, &l, &e) == 0 && l.n == 1 &&
        json_is_object(l.v[0].data) && json_object_size(l.v[0].data) == 0);
  store_event_list_deinit(&l);
  CHECK(store_job_request_cancel(st, jobs[0], NULL, NULL, &e) == 0);
  CHECK(store_job_set_status(st, jobs[0], STORE_JOB_CANCELLED, NULL, NULL, NULL, &e) == 0);
  CHECK(store_job_request_cancel(st, jobs[1], NULL, NULL, &e) == 0);
}

/* ---- metrics, checkpoints, file use, deletion ---------------------------------------------- */

static void test_metrics_ckpts(struct store *st, char job[STORE_ID_MAX]) {
  struct dapo_err e = {0};
  quick_job(st, job);
  json_t *m;
  const struct {
    int64_t step;
    const char *kind;
    double v;
  } puts[] = {{2, "train", 0.2}, {1, "eval", 0.11},  {1, "train", 0.1},
              {3, "eval", 0.3},  {2, "train", 0.25}, {0, "eval", 0.0}};
  for (size_t i = 0; i < sizeof puts / sizeof puts[0]; i++) {
    m = json_pack("{s:f}", "reward", puts[i].v);
    CHECK(store_metrics_put(st, job, puts[i].step, puts[i].kind, m, &e) == 0);
    json_decref(m);
  }
  m = json_object();
  CHECK(store_metrics_put(st, job, 1, "test", m, &e) == DAPO_EINVAL);
  CHECK(store_metrics_put(st, "job-missing", 1, "train", m, &e) == STORE_ENOTFOUND);
  json_decref(m);
  struct store_metric_list ml;
  CHECK(store_metrics_list(st, job, &ml, &e) == 0);
  const struct {
    int64_t step;
    const char *kind;
    double v;
  } want[] = {
      {0, "eval", 0.0}, {1, "train", 0.1}, {1, "eval", 0.11}, {2, "train", 0.25}, {3, "eval", 0.3}};
  CHECK(ml.n == 5);
  for (size_t i = 0; i < ml.n && i < 5; i++) {
    CHECK_MSG(ml.v[i].step == want[i].step && !strcmp(ml.v[i].kind, want[i].kind),
              "row %zu: step %lld %s", i, (long long)ml.v[i].step, ml.v[i].kind);
    CHECK_NEAR(json_real_value(json_object_get(ml.v[i].data, "reward")), want[i].v, 0);
  }
  store_metric_list_deinit(&ml);
  CHECK(store_metrics_list(st, "job-missing", &ml, &e) == 0 && ml.n == 0);
  store_metric_list_deinit(&ml);
  /* the generation: moves with every metrics write, a list carries the one it was read at */
  uint64_t g0 = store_metrics_gen(st);
  CHECK(store_metrics_list(st, job, &ml, &e) == 0 && ml.gen == g0);
  store_metric_list_deinit(&ml);
  json_t *gd = json_pack("{s:f}", "reward", 0.3); /* replaces (3, eval) with the same row */
  CHECK(store_metrics_put(st, job, 3, "eval", gd, &e) == 0);
  json_decref(gd);
  CHECK(store_metrics_gen(st) > g0);
  CHECK(store_metrics_list(st, job, &ml, &e) == 0 && ml.gen == store_metrics_gen(st));
  store_metric_list_deinit(&ml);
  /* a step recorded at once: its row, the job's step and latest_metrics, and its event, in one
   * transaction; nothing of it where it fails */
  char rj[STORE_ID_MAX];
  quick_job(st, rj);
  json_t *rd = json_pack("{s:I, s:f}", "step", (json_int_t)1, "reward", 0.5);
  struct store_job_patch rp = {
      .set = STORE_SET_STEP | STORE_SET_METRICS, .step = 1, .latest_metrics = rd};
  int64_t rid = -1, last = -1;
  uint64_t g1 = store_metrics_gen(st);
  CHECK(store_metrics_record(st, rj, 1, "train", rd, &rp, &rid, &e) == 0 && rid > 0);
  CHECK(store_metrics_gen(st) > g1);
  CHECK(store_event_last_id(st, rj, &last, &e) == 0 && last == rid);
  struct store_event_list rel = {0};
  CHECK(store_event_list(st, rj, 0, 10, &rel, &e) == 0 && rel.n >= 1 &&
        rel.v[rel.n - 1].id == rid && !strcmp(rel.v[rel.n - 1].type, "metrics") &&
        json_equal(rel.v[rel.n - 1].data, rd));
  store_event_list_deinit(&rel);
  struct store_job rjob;
  CHECK(store_job_get(st, rj, NULL, &rjob, &e) == 0 && rjob.step == 1);
  store_job_deinit(&rjob);
  CHECK(store_metrics_list(st, rj, &ml, &e) == 0 && ml.n == 1 && ml.v[0].step == 1);
  store_metric_list_deinit(&ml);
  CHECK(store_metrics_record(st, rj, 2, "test", rd, &rp, &rid, &e) == DAPO_EINVAL && rid == 0);
  CHECK(store_metrics_record(st, "job-missing", 2, "train", rd, NULL, &rid, &e) ==
            STORE_ENOTFOUND &&
        rid == 0);
  CHECK(store_job_request_cancel(st, rj, NULL, NULL, &e) == 0); /* queued: cancelled at once */
  CHECK(store_job_get(st, rj, NULL, &rjob, &e) == 0 && store_job_status_terminal(rjob.status));
  store_job_deinit(&rjob);
  rp.step = 2;
  CHECK(store_metrics_record(st, rj, 2, "train", rd, &rp, &rid, &e) == STORE_ESTATE && rid == 0);
  CHECK(store_metrics_list(st, rj, &ml, &e) == 0 && ml.n == 1); /* no row of step 2 */
  store_metric_list_deinit(&ml);
  CHECK(store_job_get(st, rj, NULL, &rjob, &e) == 0 && rjob.step == 1);
  store_job_deinit(&rjob);
  json_decref(rd);

  /* checkpoints */
  json_t *files =
      json_pack("[{s:s,s:i,s:s},{s:s,s:i,s:s}]", "name", "config.json", "bytes", 512, "sha256",
                HEX64, "name", "model.safetensors", "bytes", 40960, "sha256", HEX64);
  json_t *cm = json_pack("{s:f}", "reward", 0.5);
  CHECK(store_ckpt_put(st, job, 10, "/ck/step-10", files, cm, &e) == 0);
  CHECK(store_ckpt_put(st, job, 0, "/ck/step-0", files, NULL, &e) == 0);
  CHECK(store_ckpt_put(st, job, 20, "/ck/old", files, NULL, &e) == 0);
  CHECK(store_ckpt_put(st, job, 20, "/ck/step-20", files, cm, &e) == 0); /* replaces */
  json_t *badf = json_pack("[{s:s}]", "name", "x");
  CHECK(store_ckpt_put(st, job, 30, "/ck/step-30", badf, NULL, &e) == DAPO_EINVAL);
  CHECK(store_ckpt_put(st, job, 30, "/ck/step-30", cm, NULL, &e) == DAPO_EINVAL);
  CHECK(store_ckpt_put(st, "job-missing", 30, "/x", files, NULL, &e) == STORE_ENOTFOUND);
  json_decref(badf);
  struct store_ckpt_list cl;
  CHECK(store_ckpt_list(st, job, &cl, &e) == 0);
  CHECK(cl.n == 3);
  if (cl.n == 3) {
    CHECK(cl.v[0].step == 0 && cl.v[1].step == 10 && cl.v[2].step == 20);
    CHECK(!strcmp(cl.v[2].path, "/ck/step-20") && json_equal(cl.v[2].metrics, cm));
    CHECK(cl.v[0].metrics == NULL && json_equal(cl.v[1].files, files) && cl.v[1].created_at > 0);
  }
  store_ckpt_list_deinit(&cl);
  /* a job read carries its checkpoint steps, ascending (the job object's "checkpoints") */
  struct store_job jr;
  CHECK(store_job_get(st, job, NULL, &jr, &e) == 0);
  CHECK(jr.n_ckpt == 3 && jr.ckpt_steps[0] == 0 && jr.ckpt_steps[1] == 10 &&
        jr.ckpt_steps[2] == 20);
  store_job_deinit(&jr);
  struct store_ckpt c;
  CHECK(store_ckpt_get(st, job, 10, &c, &e) == 0);
  CHECK(c.step == 10 && !strcmp(c.path, "/ck/step-10") && json_equal(c.files, files));
  store_ckpt_deinit(&c);
  CHECK(store_ckpt_get(st, job, 11, &c, &e) == STORE_ENOTFOUND);
  CHECK(store_ckpt_delete(st, job, 10, &e) == 0);
  CHECK(store_ckpt_delete(st, job, 10, &e) == STORE_ENOTFOUND);
  CHECK(store_ckpt_list(st, job, &cl, &e) == 0 && cl.n == 2 && cl.v[1].step == 20);
  store_ckpt_list_deinit(&cl);
  CHECK(store_job_get(st, job, NULL, &jr, &e) == 0);
  CHECK(jr.n_ckpt == 2 && jr.ckpt_steps[0] == 0 && jr.ckpt_steps[1] == 20);
  store_job_deinit(&jr);
  /* a checkpoint recorded and announced at once: its row and its event in one transaction;
   * neither where it fails */
  char kj[STORE_ID_MAX];
  quick_job(st, kj);
  json_t *ce = json_pack("{s:I, s:s}", "step", (json_int_t)40, "model", "x:step-40");
  int64_t cid = -1, klast = -1;
  CHECK(store_ckpt_record(st, kj, 40, "/ck/step-40", files, cm, ce, &cid, &e) == 0 && cid > 0);
  CHECK(store_event_last_id(st, kj, &klast, &e) == 0 && klast == cid);
  struct store_event_list kel = {0};
  CHECK(store_event_list(st, kj, 0, 10, &kel, &e) == 0 && kel.n >= 1 &&
        !strcmp(kel.v[kel.n - 1].type, "checkpoint") && json_equal(kel.v[kel.n - 1].data, ce));
  store_event_list_deinit(&kel);
  CHECK(store_ckpt_get(st, kj, 40, &c, &e) == 0 && !strcmp(c.path, "/ck/step-40") &&
        json_equal(c.metrics, cm));
  store_ckpt_deinit(&c);
  json_t *badk = json_pack("[{s:s}]", "name", "x");
  CHECK(store_ckpt_record(st, kj, 50, "/ck/step-50", badk, NULL, ce, &cid, &e) == DAPO_EINVAL &&
        cid == 0);
  json_decref(badk);
  CHECK(store_ckpt_record(st, "job-missing", 50, "/x", files, NULL, ce, &cid, &e) ==
            STORE_ENOTFOUND &&
        cid == 0);
  CHECK(store_job_request_cancel(st, kj, NULL, NULL, &e) == 0); /* queued: cancelled at once */
  CHECK(store_event_last_id(st, kj, &klast, &e) == 0);          /* its status event */
  CHECK(store_ckpt_record(st, kj, 50, "/ck/step-50", files, NULL, ce, &cid, &e) == STORE_ESTATE &&
        cid == 0);
  CHECK(store_ckpt_get(st, kj, 50, &c, &e) == STORE_ENOTFOUND); /* no row without its event */
  CHECK(store_event_last_id(st, kj, &cid, &e) == 0 && cid == klast);
  json_decref(ce);
  json_decref(files);
  json_decref(cm);
}

static void test_file_in_use(struct store *st) {
  struct dapo_err e = {0};
  char tf[STORE_ID_MAX], vf[STORE_ID_MAX];
  add_file(st, "alice", "t.jsonl", tf);
  add_file(st, "alice", "v.jsonl", vf);
  json_t *spec = json_pack("{s:s}", "model", "tiny");
  struct store_job_new nj = {
      .owner = "alice", .spec = spec, .training_file = tf, .validation_file = vf};
  struct store_job j;
  CHECK(store_job_insert(st, &nj, &j, NULL, &e) == 0);
  CHECK(store_file_delete(st, tf, "alice", NULL, &e) == STORE_EINUSE);
  CHECK_MSG(strstr(e.msg, j.id) != NULL, "message: %s", e.msg);
  CHECK(store_file_delete(st, vf, "alice", NULL, &e) == STORE_EINUSE);
  CHECK(store_job_set_status(st, j.id, STORE_JOB_RUNNING, NULL, NULL, NULL, &e) == 0);
  CHECK(store_job_request_pause(st, j.id, NULL, NULL, &e) == 0);
  CHECK(store_job_set_status(st, j.id, STORE_JOB_PAUSED, NULL, NULL, NULL, &e) == 0);
  CHECK(store_file_delete(st, vf, NULL, NULL, &e) == STORE_EINUSE); /* paused is not finished */
  CHECK(store_job_request_cancel(st, j.id, NULL, NULL, &e) == 0);
  struct store_file f;
  CHECK(store_file_get(st, tf, NULL, &f, &e) == 0); /* still there after the refusals */
  store_file_deinit(&f);
  CHECK(store_file_delete(st, tf, "alice", NULL, &e) == 0);
  CHECK(store_file_delete(st, vf, "alice", NULL, &e) == 0);
  /* the finished job still reads back with its (now dangling) file ids */
  char id[STORE_ID_MAX];
  memcpy(id, j.id, STORE_ID_MAX);
  store_job_deinit(&j);
  CHECK(store_job_get(st, id, NULL, &j, &e) == 0 && !strcmp(j.training_file, tf));
  store_job_deinit(&j);
  json_decref(spec);
}

static void test_delete_job(struct store *st, const char *job) {
  struct dapo_err e = {0};
  CHECK(sql_int("SELECT COUNT(*) FROM events WHERE job_id = ?1", job) >= 1);
  CHECK(sql_int("SELECT COUNT(*) FROM metrics WHERE job_id = ?1", job) == 5);
  CHECK(sql_int("SELECT COUNT(*) FROM checkpoints WHERE job_id = ?1", job) == 2);
  CHECK(store_job_delete(st, job, NULL, &e) == STORE_ESTATE); /* queued */
  CHECK(store_job_request_cancel(st, job, NULL, NULL, &e) == 0);
  CHECK(store_job_delete(st, job, "bob", &e) == STORE_ENOTFOUND);
  uint64_t gen = store_metrics_gen(st);
  CHECK(store_job_delete(st, job, "alice", &e) == 0);
  CHECK(store_metrics_gen(st) > gen); /* its metrics rows went with it */
  struct store_job j;
  CHECK(store_job_get(st, job, NULL, &j, &e) == STORE_ENOTFOUND);
  CHECK(sql_int("SELECT COUNT(*) FROM events WHERE job_id = ?1", job) == 0);
  CHECK(sql_int("SELECT COUNT(*) FROM metrics WHERE job_id = ?1", job) == 0);
  CHECK(sql_int("SELECT COUNT(*) FROM checkpoints WHERE job_id = ?1", job) == 0);
  CHECK(sql_int("SELECT COUNT(*) FROM jobs WHERE id = ?1", job) == 0);
  CHECK(store_job_delete(st, job, NULL, &e) == STORE_ENOTFOUND);
}

/* Close and reopen: everything acknowledged is there. */
static void test_restart(struct store **stp, const char *job) {
  struct dapo_err e = {0};
  struct store_file_list fl;
  struct store_job_list jl;
  CHECK(store_file_list(*stp, NULL, 100, NULL, &fl, &e) == 0);
  CHECK(store_job_list(*stp, NULL, NULL, 100, NULL, &jl, &e) == 0);
  int64_t last = 0;
  CHECK(store_event_last_id(*stp, job, &last, &e) == 0 && last > 0);
  size_t nf = fl.n, nj = jl.n;
  char first_job[STORE_ID_MAX] = "";
  if (jl.n) memcpy(first_job, jl.v[0].id, STORE_ID_MAX);
  store_file_list_deinit(&fl);
  store_job_list_deinit(&jl);
  store_close(*stp);
  *stp = open_store();
  if (!*stp) return;
  CHECK(store_file_list(*stp, NULL, 100, NULL, &fl, &e) == 0 && fl.n == nf);
  CHECK(store_job_list(*stp, NULL, NULL, 100, NULL, &jl, &e) == 0 && jl.n == nj &&
        !strcmp(jl.v[0].id, first_job));
  store_file_list_deinit(&fl);
  store_job_list_deinit(&jl);
  int64_t last2 = 0;
  CHECK(store_event_last_id(*stp, job, &last2, &e) == 0 && last2 == last);
  struct store_metric_list ml;
  CHECK(store_metrics_list(*stp, job, &ml, &e) == 0 && ml.n == 5);
  store_metric_list_deinit(&ml);
  struct store_ckpt_list cl;
  CHECK(store_ckpt_list(*stp, job, &cl, &e) == 0 && cl.n == 2);
  store_ckpt_list_deinit(&cl);
  /* queue_seq keeps growing across a restart */
  struct store_job a, b;
  CHECK(store_job_get(*stp, job, NULL, &a, &e) == 0);
  char id[STORE_ID_MAX];
  quick_job(*stp, id);
  CHECK(store_job_get(*stp, id, NULL, &b, &e) == 0 && b.queue_seq > a.queue_seq);
  store_job_deinit(&a);
  store_job_deinit(&b);
  CHECK(store_job_request_cancel(*stp, id, NULL, NULL, &e) == 0);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/test_store.XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(db_path, sizeof db_path, "%s/dapod.sqlite3", dir);
  test_ids();
  test_migrations();
  struct store *st = open_store();
  if (st) {
    char job[STORE_ID_MAX];
    test_files(st);
    test_job_insert(st);
    test_status_machine(st);
    test_queue(st);
    test_job_list(st);
    test_events(st);
    test_metrics_ckpts(st, job);
    test_file_in_use(st);
    test_restart(&st, job);
    if (st) test_delete_job(st, job);
    store_close(st);
  }
  rm_data_dir();
  return check_done("test_store");
}
