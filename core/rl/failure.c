/* The registry of failure codes (failure.h): one table, in enum order. */
#include "failure.h"

#include <string.h>

static const struct failure_info ROWS[FAIL_COUNT] = {
    {FAIL_NONE, "none", "system", "no failure"},
    {FAIL_CANCELLED, "cancelled", "user", "the job was cancelled"},
    {FAIL_INVALID_SPEC, "invalid_spec", "user", "the job's spec no longer validates"},
    {FAIL_INVALID_MODEL, "invalid_model", "user", "the model cannot be loaded"},
    {FAIL_INVALID_DATASET, "invalid_dataset", "user", "a dataset line cannot be used"},
    {FAIL_PROMPT_TOO_LONG, "prompt_too_long", "user",
     "a prompt plus max_new_tokens exceeds the model's context"},
    {FAIL_INVALID_CHAT_TEMPLATE, "invalid_chat_template", "user",
     "a `messages` prompt cannot be rendered with the chat template"},
    {FAIL_INVALID_JUDGE, "invalid_judge", "user", "the judge spec is refused"},
    {FAIL_JUDGE_ERROR, "judge_error", "user", "the judge failed or answered wrongly"},
    {FAIL_SAMPLING_SHORTFALL, "sampling_shortfall", "user",
     "dynamic sampling found too few groups with mixed rewards"},
    {FAIL_INVALID_CHECKPOINT, "invalid_checkpoint", "user",
     "the checkpoint to resume from cannot be read"},
    {FAIL_CHECKPOINT_MISMATCH, "checkpoint_mismatch", "user",
     "the checkpoint to resume from was written for another spec"},
    {FAIL_NON_FINITE_GRADIENT, "non_finite_gradient", "system", "NaN or infinity in the update"},
    {FAIL_GENERATION_FAILED, "generation_failed", "system", "sampling responses failed"},
    {FAIL_OUT_OF_MEMORY, "out_of_memory", "system", "an allocation failed"},
    {FAIL_IO_ERROR, "io_error", "system", "reading or writing the job's files failed"},
    {FAIL_EVENT_STORE_FAILED, "event_store_failed", "system",
     "the daemon could not record the job's events"},
    {FAIL_LAUNCH_FAILED, "launch_failed", "system",
     "a multi-process job's launcher or one of its ranks exited before the job ended, as many "
     "times as launch_retries allows"},
    {FAIL_INTERNAL, "internal", "system", "an impossible state (a bug; logged)"},
    {FAIL_ENVIRONMENT_ERROR, "environment_error", "user",
     "an episode's environment failed or answered wrongly, retries spent"},
};

const struct failure_info *failure_info(enum failure code) {
  return (int)code >= 0 && code < FAIL_COUNT ? &ROWS[code] : &ROWS[FAIL_INTERNAL];
}

enum failure failure_by_name(const char *name) {
  for (int i = 1; i < FAIL_COUNT; i++)
    if (!strcmp(ROWS[i].name, name)) return (enum failure)i;
  return FAIL_NONE;
}
