/* Multi-process jobs (resources.processes > 1): the configured launcher (an `mpirun`/`srun`
 * command template, config `launcher`) starts `dapod train --events` as the job's ranks
 * (core/rl/dist.h), and their events, JSON lines on the launcher's stdout, are relayed to the same
 * runner hooks an in-process job calls, so that the store, SSE, the dashboard and downloads see
 * no difference. docs/SCALE.md has the decisions.
 *
 * - The job file the ranks read is written into the job's folder (launch-job.json: the resolved
 *   spec, without resources: where a job runs is not what it computes); the launcher's stderr
 *   goes to launch.log beside it.
 * - Pause and cancel: SIGUSR1 and SIGUSR2 to the launcher's process group (the local ranks get
 *   them directly, mpirun and srun forward them to the others); the ranks agree on them
 *   (runner_requests) and stop at the same point, pause with a checkpoint. A launcher that does
 *   not end within a grace period after a cancel is killed.
 * - A launcher that exits without the ranks' final result (a rank died, a machine went away) ends
 *   the attempt: the job starts again from its last checkpoint, at most cfg->launch_retries
 *   times, each logged as an event; then it fails with launch_failed, quoting launch.log's end.
 * - If the daemon dies, the launcher gets SIGTERM (PR_SET_PDEATHSIG) and takes its ranks with
 *   it; the restarted daemon queues the job again like any running job. */
#ifndef DAPOD_LAUNCH_H
#define DAPOD_LAUNCH_H

#include "config.h"
#include "runner.h"

/* Runs spec (spec->processes ranks) in out like runner_run: hooks h told as the ranks go, o's
 * cancel and pause words honoured (its other fields are the ranks' own business), res filled.
 * Returns 0 (the outcome is in res). */
int launch_run(const struct config *cfg, const struct job_spec *spec, const char *out,
               const struct runner_hooks *h, const struct runner_opts *o,
               struct runner_result *res);

#endif
