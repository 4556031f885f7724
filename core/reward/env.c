/* An environment's reply, read (env.h). */
#include "env.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int refuse(struct env_reply *out, char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(struct env_reply *out, char *why, size_t cap, const char *fmt, ...) {
  env_reply_clear(out);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, cap, fmt, ap);
  va_end(ap);
  return -1;
}

static int message(json_t *list, const char *role, const char *content, const char *name) {
  json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
  if (m && name) json_object_set_new(m, "name", json_string(name));
  return !m || json_array_append_new(list, m);
}

int env_reply_parse(const char *text, size_t n, struct env_reply *out, char *why, size_t cap) {
  memset(out, 0, sizeof *out);
  json_error_t je;
  json_t *root = json_loadb(text ? text : "", n, JSON_REJECT_DUPLICATES, &je);
  if (!json_is_object(root)) {
    json_decref(root);
    return refuse(out, why, cap, "the reply is not a JSON object (%.100s)",
                  root ? "another JSON value" : je.text);
  }
  int rc = 0;
  const json_t *obs = json_object_get(root, "observation"), *rw = json_object_get(root, "reward"),
               *done = json_object_get(root, "done"), *info = json_object_get(root, "info");
  if (!(out->messages = json_array())) {
    rc = refuse(out, why, cap, "out of memory");
  } else if (json_is_string(obs)) {
    if (message(out->messages, "user", json_string_value(obs), NULL))
      rc = refuse(out, why, cap, "out of memory");
  } else if (json_is_object(obs) && json_is_array(json_object_get(obs, "messages"))) {
    const json_t *ms = json_object_get(obs, "messages");
    if (json_array_size(ms) > ENV_MESSAGES_MAX)
      rc = refuse(out, why, cap, "observation.messages: more than %d messages", ENV_MESSAGES_MAX);
    for (size_t i = 0; !rc && i < json_array_size(ms); i++) {
      const json_t *m = json_array_get(ms, i);
      const char *role = json_string_value(json_object_get(m, "role"));
      const json_t *ct = json_object_get(m, "content"), *nm = json_object_get(m, "name");
      if (!json_is_object(m))
        rc = refuse(out, why, cap, "observation.messages[%zu]: expected an object", i);
      else if (!role || (strcmp(role, "user") && strcmp(role, "tool") && strcmp(role, "system")))
        rc = refuse(out, why, cap,
                    "observation.messages[%zu].role: expected \"user\", \"tool\" or \"system\"", i);
      else if (!json_is_string(ct))
        rc = refuse(out, why, cap, "observation.messages[%zu].content: expected a string", i);
      else if (nm && !json_is_null(nm) && !json_is_string(nm))
        rc = refuse(out, why, cap, "observation.messages[%zu].name: expected a string", i);
      else if (message(out->messages, role, json_string_value(ct), json_string_value(nm)))
        rc = refuse(out, why, cap, "out of memory");
    }
  } else if (obs && !json_is_null(obs)) {
    rc = refuse(out, why, cap, "observation: expected a string, {\"messages\": [...]} or null");
  }
  if (!rc && rw && !json_is_null(rw)) {
    if (!json_is_number(rw) || !isfinite(json_number_value(rw)))
      rc = refuse(out, why, cap, "reward: expected a finite number or null");
    else
      out->reward = json_number_value(rw), out->has_reward = 1;
  }
  if (!rc && done && !json_is_boolean(done))
    rc = refuse(out, why, cap, "done: expected true or false");
  if (!rc) out->done = json_is_true(done);
  if (!rc && info && !json_is_null(info)) {
    if (!json_is_object(info))
      rc = refuse(out, why, cap, "info: expected an object");
    else
      out->info = json_incref((json_t *)info);
  }
  json_decref(root);
  return rc;
}

void env_reply_clear(struct env_reply *r) {
  json_decref(r->messages);
  json_decref(r->info);
  memset(r, 0, sizeof *r);
}
