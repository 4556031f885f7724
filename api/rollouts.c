/* Handler: GET /v1/jobs/{id}/rollouts?step=N — the step's samples as JSON Lines (the runner's
 * rollouts/step-N.jsonl, one object per sampled response: API.md "Rollouts file"), sent from the
 * file; 404 when the step has none (not reached yet, or the job failed before writing it). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <microhttpd.h>

#include "handlers.h"
#include "http.h"
#include "parse.h"
#include "server.h"
#include "store.h"
#include "workers.h"

int api_rollouts_get(struct api_req *r) {
  const char *id = r->params[0];
  const char *s = api_query(r, "step");
  int64_t step;
  if (!s) return api_reply_error(r, API_ERR_INVALID_REQUEST, "step: required (?step=N)", NULL);
  if (parse_i64(s, 1, INT64_MAX, &step, "step", NULL))
    return api_reply_errorf(r, API_ERR_INVALID_REQUEST,
                            "step: '%.32s' is not a step number (1, 2, ...)", s);
  struct store_job job;
  if (api_job_load(r, id, &job)) return 0;
  store_job_deinit(&job);
  char dir[4096], path[4200];
  if (workers_job_dir(r->srv, id, dir, sizeof dir))
    return api_reply_error(r, API_ERR_INTERNAL, "job folder path too long", NULL);
  snprintf(path, sizeof path, "%s/rollouts/step-%lld.jsonl", dir, (long long)step);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    int err = errno;
    if (fd >= 0) close(fd);
    if (err == ENOENT || fd >= 0)
      return api_reply_errorf(r, API_ERR_NOT_FOUND, "job %.64s has no rollouts of step %lld", id,
                              (long long)step);
    return api_reply_errorf(r, API_ERR_INTERNAL, "cannot read the rollouts: %s", strerror(err));
  }
  if (api_reply_fd(r, 200, "application/x-ndjson", fd, (uint64_t)st.st_size)) return -1;
  char disp[96];
  snprintf(disp, sizeof disp, "attachment; filename=\"rollouts-step-%lld.jsonl\"", (long long)step);
  api_reply_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disp);
  return 0;
}
