/* Job creation and admission, the daemon's service behind POST /v1/jobs: a job body is resolved
 * once (model id -> preset name, folder or checkpoint path through the registry; file ids ->
 * their paths, visible to the owner and valid), parsed into a job spec, checked against its model
 * and data (core/rl/runner.h runner_check_data) and against the memory limit, and stored queued
 * with the resolved body, which the worker runs as it is (jobs_run_spec): the model id is not
 * resolved a second time, so the job trains what was admitted.
 *
 * Thread-safety: every function may be called from any thread. */
#ifndef DAPOD_JOBS_H
#define DAPOD_JOBS_H

#include <jansson.h>

#include "error.h"
#include "runner.h"
#include "store.h"

struct server;

struct jobs_new {
  const json_t *body;          /* the request body (borrowed) */
  const char *owner;           /* API key name; NULL without auth */
  const char *idempotency_key; /* or NULL */
};

/* The job service: the checks of jobs' data against their models, kept (64, least recently
 * used first out) and run for large datasets on a checker thread of its own. Owned by struct
 * server (jobsvc); started by server_start, stopped by server_stop after HTTP stopped. */
struct jobs_service;
struct jobs_service *jobs_service_start(struct server *srv, struct dapo_err *e);
void jobs_service_stop(struct jobs_service *js);
/* Checks run, answered from the kept ones, and run on the checker thread, since the start. */
void jobs_service_counts(const struct jobs_service *js, uint64_t *ran, uint64_t *kept,
                         uint64_t *offloaded);

/* A creation waiting for the checker thread (jobs_create's *pending). */
struct jobs_task;
#define JOBS_PENDING 1

/* Validates, admits and stores a queued job, then wakes a worker. In order: the body's ids are
 * resolved and its fields parsed (every problem of both at once); its data is checked against
 * its model (kept checks answer at once; datasets over job_check_inline_bytes go to the checker
 * thread when pending is not NULL); its memory plan against the limit; the store.
 * Returns 0 with the job in *job (owned: store_job_deinit) and *existed = 1 when the idempotency
 * key gave back an earlier job; JOBS_PENDING with *pending (the caller holds one reference:
 * jobs_task_release) when the checker thread has the job: the caller waits until the bus
 * publishes jobs_task_ticket(*pending) and calls jobs_create_resume; DAPO_EINVAL when the body
 * has problems, every one appended to errors as {field, message}; STORE_ECONFLICT (the key was
 * used with another body), STORE_EFULL (queue or owner limit, or too many checks waiting; e says
 * which), DAPO_ENOMEM, or another store error with e set. */
int jobs_create(struct server *srv, const struct jobs_new *req, struct store_job *job, int *existed,
                json_t *errors, struct jobs_task **pending, struct dapo_err *e);

/* The bus key published when t's check is done (borrowed, lives with t). */
const char *jobs_task_ticket(const struct jobs_task *t);

/* Finishes a pending creation: JOBS_PENDING while the check runs, else as jobs_create. */
int jobs_create_resume(struct server *srv, struct jobs_task *t, struct store_job *job, int *existed,
                       json_t *errors, struct dapo_err *e);

/* Drops the caller's reference to t (NULL is fine). */
void jobs_task_release(struct server *srv, struct jobs_task *t);

/* The spec a worker runs for a stored job: its resolved body as admitted (jobs created by an
 * earlier version, which stored none, are resolved now from their request body). Problems are
 * appended to errors; returns their count (0: spec is usable; release it with jobspec_deinit in
 * any case), or -1 out of memory. */
int jobs_run_spec(struct server *srv, const struct store_job *job, struct job_spec *spec,
                  json_t *errors);

#endif
