/* Renders conversations with core/text/chat.c for tests/text/chat/test_chat_jinja.py. Reads one
 * JSON object from stdin: {"tokenizer_config": object|null, "spec": any, "conversations":
 * [conversation...]} where a conversation is [messages], {"messages": [...], "tools": [...],
 * "generation_prompt": bool (default true)} (chat_render_tools) or {"after": "stop" | "cut" |
 * "prompt", "world": [world messages]} (chat_render_after), and prints {"family": ..., "stop": ...,
 * "rendered": [string |
 * {"error": message}]}, or {"error": message} when the template itself is refused. With
 * {"pyjson": [values], "indent": n} it prints {"pyjson": [pyjson_dumps of each]} instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat.h"
#include "pyjson.h"

int main(void) {
  json_error_t je;
  json_t *in = json_loadf(stdin, 0, &je);
  if (!in) {
    fprintf(stderr, "chat_dump: stdin: %s\n", je.text);
    return 2;
  }
  if (json_object_get(in, "pyjson")) {
    json_t *outs = json_array();
    size_t i;
    json_t *v;
    int indent = (int)json_integer_value(json_object_get(in, "indent"));
    if (json_is_null(json_object_get(in, "indent"))) indent = -1;
    json_array_foreach(json_object_get(in, "pyjson"), i, v) {
      char *s = pyjson_dumps(v, indent);
      json_array_append_new(outs, json_string(s ? s : "(out of memory)"));
      free(s);
    }
    json_t *o = json_pack("{s:o}", "pyjson", outs);
    json_dumpf(o, stdout, JSON_ENSURE_ASCII);
    putchar('\n');
    json_decref(o);
    json_decref(in);
    return 0;
  }
  struct dapo_err e = {0};
  json_t *cfg = json_object_get(in, "tokenizer_config");
  struct chat_template *t =
      chat_from_spec(json_object_get(in, "spec"), json_is_null(cfg) ? NULL : cfg, &e);
  json_t *out = json_object();
  if (!t) {
    json_object_set_new(out, "error", json_string(e.msg));
  } else {
    json_object_set_new(out, "family", json_string(chat_family(t)));
    json_object_set_new(out, "stop",
                        chat_stop_text(t) ? json_string(chat_stop_text(t)) : json_null());
    json_object_set_new(out, "resolved", chat_to_json(t));
    json_t *arr = json_array();
    size_t i;
    json_t *conv;
    json_array_foreach(json_object_get(in, "conversations"), i, conv) {
      char *s = NULL;
      struct dapo_err re = {0};
      const char *after = json_string_value(json_object_get(conv, "after"));
      int rc = after ? chat_render_after(t,
                                         !strcmp(after, "stop")  ? CHAT_AFTER_STOP
                                         : !strcmp(after, "cut") ? CHAT_AFTER_CUT
                                                                 : CHAT_AFTER_PROMPT,
                                         json_object_get(conv, "world"), &s, &re)
               : json_is_object(conv)
                   ? chat_render_tools(
                         t, json_object_get(conv, "messages"), json_object_get(conv, "tools"),
                         !json_is_false(json_object_get(conv, "generation_prompt")), &s, &re)
                   : chat_render(t, conv, &s, &re);
      if (rc)
        json_array_append_new(arr, json_pack("{s:s}", "error", re.msg));
      else
        json_array_append_new(arr, json_string(s));
      free(s);
    }
    json_object_set_new(out, "rendered", arr);
    chat_free(t);
  }
  json_dumpf(out, stdout, JSON_ENSURE_ASCII);
  putchar('\n');
  json_decref(out);
  json_decref(in);
  return 0;
}
