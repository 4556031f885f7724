/* Why a job failed: the registry of failure codes. A row is {code, name, category, meaning}; the
 * name is what the job object's error.code shows, the category "user" (the job's spec, data,
 * model or judge is at fault: fix and resubmit) or "system" (the machine or the daemon: retry).
 * openapi.yaml's JobError.code enumerates exactly these names (checked by tests/api). Names
 * never change once shipped; a new failure gets a new row. */
#ifndef DAPO_FAILURE_H
#define DAPO_FAILURE_H

enum failure {
  FAIL_NONE = 0,
  FAIL_CANCELLED,             /* not a failure: how a cancelled run ends (RUNNER_CANCELLED) */
  FAIL_INVALID_SPEC,          /* the stored job spec no longer parses */
  FAIL_INVALID_MODEL,         /* the model folder cannot be loaded */
  FAIL_INVALID_DATASET,       /* a dataset line cannot be used */
  FAIL_PROMPT_TOO_LONG,       /* a prompt plus max_new_tokens exceeds the context */
  FAIL_INVALID_CHAT_TEMPLATE, /* a `messages` prompt cannot be rendered */
  FAIL_INVALID_JUDGE,         /* the judge spec is refused */
  FAIL_JUDGE_ERROR,           /* the judge failed or answered wrongly */
  FAIL_SAMPLING_SHORTFALL,    /* dynamic sampling found too few informative groups */
  FAIL_INVALID_CHECKPOINT,    /* the checkpoint to resume from cannot be read */
  FAIL_CHECKPOINT_MISMATCH,   /* the checkpoint was written by another spec */
  FAIL_NON_FINITE_GRADIENT,   /* NaN or infinity in the update */
  FAIL_GENERATION_FAILED,     /* the sampler failed */
  FAIL_OUT_OF_MEMORY,         /* an allocation failed */
  FAIL_IO_ERROR,              /* reading or writing the job's files failed */
  FAIL_EVENT_STORE_FAILED,    /* the daemon could not record the job's events */
  FAIL_LAUNCH_FAILED,         /* a multi-process job's launcher or a rank ended it, retries spent */
  FAIL_INTERNAL,              /* a bug: an impossible state, logged */
  FAIL_ENVIRONMENT_ERROR,     /* an episode's environment failed, retries spent (on_env_error) */
  FAIL_COUNT
};
/* The codes a job object's error.code may show (FAIL_NONE and FAIL_CANCELLED never do: a
 * cancelled job has no error). */
#define FAIL_FIRST_SHOWN FAIL_INVALID_SPEC

struct failure_info {
  enum failure code;
  const char *name;     /* "sampling_shortfall" */
  const char *category; /* "user" or "system" */
  const char *meaning;  /* one line for docs and listings */
};

/* The row of code (a code out of range gives FAIL_INTERNAL's row). Borrowed static. */
const struct failure_info *failure_info(enum failure code);

/* The code named name; FAIL_NONE when there is none. */
enum failure failure_by_name(const char *name);

#endif
