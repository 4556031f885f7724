/* libFuzzer target: an environment's reply (core/reward/env.h), what dapod reads from an
 * environment. An input that starts with a NUL byte is an OpenEnv server's WebSocket message
 * (env_openenv_reply_parse), its second byte picking the observation_field (none, "text",
 * "message", "board"), the rest the message; any other input is an http environment's /reset or
 * /step body (env_reply_parse). It is read, or refused with a reason that names a field
 * ("observation...", "reward...", "done...", "info..."; OpenEnv's "type...", "data...") or the
 * reply itself (an OpenEnv error reply is told apart: "the environment answered an error");
 * a reply read has at most ENV_MESSAGES_MAX messages (an OpenEnv one, one user message or none),
 * each with a role of user, tool or system and string content, a finite reward when it has one,
 * and renders in the dapod format as one ">..." or "=..." line per message, "\n" between. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "env.h"
#include "fuzz.h"
#include "toolcall.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  static const char *const FIELDS[4] = {NULL, "text", "message", "board"};
  struct env_reply r;
  char why[256];
  int openenv = size >= 2 && data[0] == 0, rc;
  if (openenv)
    rc = env_openenv_reply_parse((const char *)data + 2, size - 2, FIELDS[data[1] % 4], &r, why,
                                 sizeof why);
  else
    rc = env_reply_parse((const char *)data, size, &r, why, sizeof why);
  if (rc) {
    FUZZ_CHECK(r.messages == NULL && r.info == NULL);
    if (openenv)
      FUZZ_CHECK(rc == 1
                     ? !strncmp(why, "the environment answered an error: ", 35)
                     : rc == -1 && (!strncmp(why, "type", 4) || !strncmp(why, "data.", 5) ||
                                    !strncmp(why, "data:", 5) || !strncmp(why, "the reply", 9) ||
                                    !strcmp(why, "out of memory")));
    else
      FUZZ_CHECK(!strncmp(why, "observation", 11) || !strncmp(why, "reward", 6) ||
                 !strncmp(why, "done", 4) || !strncmp(why, "info", 4) ||
                 !strncmp(why, "the reply", 9) || !strcmp(why, "out of memory"));
    return 0;
  }
  size_t n = json_array_size(r.messages);
  FUZZ_CHECK(json_is_array(r.messages) && n <= (openenv ? 1 : ENV_MESSAGES_MAX));
  FUZZ_CHECK(!openenv || r.info == NULL);
  FUZZ_CHECK(!r.has_reward || isfinite(r.reward));
  FUZZ_CHECK(r.info == NULL || json_is_object(r.info));
  struct tc_answer a[ENV_MESSAGES_MAX];
  for (size_t i = 0; i < n; i++) {
    const json_t *m = json_array_get(r.messages, i);
    const char *role = json_string_value(json_object_get(m, "role"));
    FUZZ_CHECK(role && (!strcmp(role, "user") || !strcmp(role, "tool") || !strcmp(role, "system")));
    FUZZ_CHECK(json_is_string(json_object_get(m, "content")));
    a[i] = (struct tc_answer){"", json_string_value(json_object_get(m, "content")), role};
  }
  char *out = NULL;
  FUZZ_CHECK(tc_render_answers(TC_DAPOD, a, (int)n, &out) == 0 && out);
  size_t lines = 0;
  for (const char *p = out; *p; p++) lines += *p == '\n';
  size_t newlines = 0; /* the contents' own newlines, beside one between messages */
  for (size_t i = 0; i < n; i++)
    for (const char *p = a[i].content; *p; p++) newlines += *p == '\n';
  FUZZ_CHECK(lines == (n ? n - 1 : 0) + newlines && (n == 0 || out[0] == '>' || out[0] == '='));
  free(out);
  env_reply_clear(&r);
  return 0;
}
