/* Every route handler, one file per resource: health.c, files.c, models.c, judges.c. Internal to
 * api/: the route table in http.c is the only caller. Each returns 0 after replying through
 * api_reply_* (http.h), or -1 when not even a reply could be built. */
#ifndef DAPOD_API_HANDLERS_H
#define DAPOD_API_HANDLERS_H

#include <stddef.h>

struct api_req;

/* health.c: GET /healthz, GET /readyz, GET /metrics */
int api_health_live(struct api_req *r);
int api_health_ready(struct api_req *r);
int api_health_metrics(struct api_req *r);

/* files.c: POST /v1/files (streamed), POST /v1/files/validate (streamed), GET /v1/files,
 * GET /v1/files/{id}, GET /v1/files/{id}/content, DELETE /v1/files/{id} */
int api_files_upload_begin(struct api_req *r);
int api_files_validate_begin(struct api_req *r);
int api_files_upload_chunk(struct api_req *r, const char *data, size_t n);
int api_files_upload_end(struct api_req *r);
int api_files_validate_end(struct api_req *r);
int api_files_list(struct api_req *r);
int api_files_get(struct api_req *r);
int api_files_content(struct api_req *r);
int api_files_delete(struct api_req *r);

/* models.c: GET /v1/models, GET /v1/models/{id} */
int api_models_list(struct api_req *r);
int api_models_get(struct api_req *r);

/* judges.c: POST /v1/judges/test */
int api_judges_test(struct api_req *r);

#endif
