/* Job creation and admission, the daemon's service behind POST /v1/jobs: a job body is resolved
 * once (model id -> preset name, folder or checkpoint path through the registry; file ids ->
 * their paths, visible to the owner and valid), parsed into a job spec, checked against its model
 * and data (core/runner.h runner_check_job) and against the memory limit, and stored queued with
 * the resolved body, which the worker runs as it is (jobs_run_spec): the model id is not
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

/* Validates, admits and stores a queued job, then wakes a worker. Returns 0 with the job in *job
 * (owned: store_job_deinit) and *existed = 1 when the idempotency key gave back an earlier job;
 * DAPO_EINVAL when the body has problems, every one appended to errors as {field, message};
 * STORE_ECONFLICT (the key was used with another body), STORE_EFULL (queue or owner limit; e
 * says which), DAPO_ENOMEM, or another store error with e set. */
int jobs_create(struct server *srv, const struct jobs_new *req, struct store_job *job, int *existed,
                json_t *errors, struct dapo_err *e);

/* The spec a worker runs for a stored job: its resolved body as admitted (jobs created by an
 * earlier version, which stored none, are resolved now from their request body). Problems are
 * appended to errors; returns their count (0: spec is usable; release it with jobspec_deinit in
 * any case), or -1 out of memory. */
int jobs_run_spec(struct server *srv, const struct store_job *job, struct job_spec *spec,
                  json_t *errors);

#endif
