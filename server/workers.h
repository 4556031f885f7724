/* The job threads: cfg.workers threads, each with its own compute pool of cfg.blas_threads
 * threads (core/engine/pool.h), so jobs side by side use disjoint core budgets. A free worker
 * claims the oldest queued job (store_job_claim_next), takes the spec admitted at its creation
 * (jobs_run_spec: ids already resolved), and runs it with runner_run into data_dir/jobs/<id>/; the
 * runner's events go to the store and then the bus, metrics and checkpoints also to their tables;
 * its phase and latest progress report stay in memory (workers_phase, workers_progress). Cancel and
 * pause requests are mirrored from the store flags into the running job's in-memory words, which
 * the runner polls. Also the startup recovery of jobs a previous process left live.
 *
 * Thread-safety: every function may be called from any thread, except workers_free. */
#ifndef DAPOD_WORKERS_H
#define DAPOD_WORKERS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "error.h"

struct server;
struct workers;
struct job_spec;
struct judge_policy;

/* Starts srv->cfg.workers threads (srv->store and srv->bus must be open). Owned; NULL with e set
 * on failure (nothing left running). */
struct workers *workers_start(struct server *srv, struct dapo_err *e);

/* A job was queued (created or resumed): wakes an idle worker. */
void workers_wake(struct workers *w);

/* Mirrors a cancel (cancel = 1) or pause (pause = 1) request that the store has recorded into
 * the job's running record, if a worker here runs job_id. Returns 1 when it does, else 0. */
int workers_signal(struct workers *w, const char *job_id, int cancel, int pause);

/* The phase of job_id ("sampling", "judging", ...) when a worker here runs it and the runner has
 * entered one: copied into buf (cap bytes, cut to fit), returns 1; otherwise buf = "" and 0.
 * Kept in memory only (the runner changes it many times a step; after a restart it is gone). */
int workers_phase(struct workers *w, const char *job_id, char *buf, size_t cap);
/* The latest progress report of job_id's step under way when a worker here runs it, as the
 * progress event's data ({step, pass, round, done, total, unit, tokens}; new reference), or NULL
 * (no report since the job started or since the step's metrics were recorded, not run here, or
 * out of memory). In memory only, like the phase. */
json_t *workers_progress(struct workers *w, const char *job_id);
/* Number of jobs being run now, and whether the threads are up (for /readyz and /metrics). */
int workers_busy(struct workers *w);
int workers_up(struct workers *w);

/* Totals over the jobs run by this process: tokens generated and trained (metrics events). */
void workers_tokens(struct workers *w, uint64_t *generated, uint64_t *trained);

/* Shutdown, first half: no new claims, and every running job is asked to pause at its next safe
 * point (it is queued again, keeping its place, with a log event; a job that was pausing ends
 * paused, one that was cancelling ends cancelled). Waits up to grace_s seconds for the running
 * jobs to stop and returns how many still run (0: workers_free may join). */
int workers_stop(struct workers *w, int grace_s);

/* Joins the threads and frees w (NULL is fine). Only after workers_stop returned 0, or when the
 * threads are known to be idle. */
void workers_free(struct workers *w);

/* Startup recovery, before any worker starts: jobs found running are queued again (keeping their
 * place), pausing ones become paused, cancelling ones cancelled; each gets a log event saying
 * what happens next (the runner resumes from the newest complete checkpoint). Returns 0 or a
 * store error. */
int workers_recover(struct server *srv, struct dapo_err *e);

/* data_dir/jobs/<job_id> into buf (cap bytes); -1 when it does not fit. */
int workers_job_dir(const struct server *srv, const char *job_id, char *buf, size_t cap);

#endif
