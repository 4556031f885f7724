/* An environment's reply, read (env.h). */
#include "env.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

/* A reply's reward (a finite number, null or absent) and done (a boolean or absent) into out;
 * at prefixes the fields' names in why. */
static int reward_done(const json_t *rw, const json_t *done, const char *at, struct env_reply *out,
                       char *why, size_t cap) {
  if (rw && !json_is_null(rw)) {
    if (!json_is_number(rw) || !isfinite(json_number_value(rw)))
      return refuse(out, why, cap, "%sreward: expected a finite number or null", at);
    out->reward = json_number_value(rw), out->has_reward = 1;
  }
  if (done && !json_is_boolean(done))
    return refuse(out, why, cap, "%sdone: expected true or false", at);
  out->done = json_is_true(done);
  return 0;
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
  if (!rc) rc = reward_done(rw, done, "", out, why, cap);
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

/* The user message an OpenEnv observation gives (docs/AGENTS.md), appended to out->messages. */
static int openenv_message(const json_t *obs, const char *field, struct env_reply *out, char *why,
                           size_t cap) {
  const json_t *v = obs;
  if (field) {
    if (!json_is_object(obs)) return refuse(out, why, cap, "data.observation: expected an object");
    if (!(v = json_object_get(obs, field)))
      return refuse(out, why, cap, "data.observation.%.64s: missing", field);
    if (json_is_null(v)) return 0;
  }
  char *text = json_is_string(v) ? NULL : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (!json_is_string(v) && !text) return refuse(out, why, cap, "out of memory");
  int bad = message(out->messages, "user", text ? text : json_string_value(v), NULL);
  free(text);
  return bad ? refuse(out, why, cap, "out of memory") : 0;
}

int env_openenv_reply_parse(const char *text, size_t n, const char *observation_field,
                            struct env_reply *out, char *why, size_t cap) {
  memset(out, 0, sizeof *out);
  json_error_t je;
  json_t *root = json_loadb(text ? text : "", n, JSON_REJECT_DUPLICATES, &je);
  const char *type = json_string_value(json_object_get(root, "type"));
  const json_t *data = json_object_get(root, "data");
  int rc = 0;
  if (!json_is_object(root)) {
    rc = refuse(out, why, cap, "the reply is not a JSON object (%.100s)",
                root ? "another JSON value" : je.text);
  } else if (!type || (strcmp(type, "observation") && strcmp(type, "error"))) {
    rc = refuse(out, why, cap, "type: expected \"observation\" or \"error\"");
  } else if (!json_is_object(data)) {
    rc = refuse(out, why, cap, "data: expected an object");
  } else if (!strcmp(type, "error")) {
    const char *msg = json_string_value(json_object_get(data, "message")),
               *code = json_string_value(json_object_get(data, "code"));
    refuse(out, why, cap, "the environment answered an error: %.200s%s%.40s%s",
           msg ? msg : "(no message)", code ? " (" : "", code ? code : "", code ? ")" : "");
    rc = 1;
  } else if (!json_object_get(data, "observation")) {
    rc = refuse(out, why, cap, "data.observation: missing");
  } else if (!(out->messages = json_array())) {
    rc = refuse(out, why, cap, "out of memory");
  } else {
    rc = openenv_message(json_object_get(data, "observation"), observation_field, out, why, cap);
    if (!rc)
      rc = reward_done(json_object_get(data, "reward"), json_object_get(data, "done"), "data.", out,
                       why, cap);
  }
  json_decref(root);
  return rc;
}
