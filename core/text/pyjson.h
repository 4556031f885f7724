/* JSON text exactly as Python's json.dumps(v, ensure_ascii=False[, indent=N]) writes it: what
 * the `tojson` filter of Hugging Face's chat templates puts into a prompt (a tool's signature,
 * a call's arguments), so that a prompt rendered here is the one the model was tuned on.
 *   separators ", " and ": " (with indent: "," at line ends), keys in their order, strings with
 *   only '"', '\\', the control characters escaped (\n \r \t \b \f, else \u00xx) and every other
 *   character as itself, integers as written, reals as Python's repr (the shortest text that
 *   reads back the same double: 0.1, 1e-05, 1e+16, 100.0, -0.0).
 * Pure and thread-safe. */
#ifndef DAPO_PYJSON_H
#define DAPO_PYJSON_H

#include <jansson.h>

/* v as Python writes it (indent < 0: on one line; else that many spaces a level), a new
 * malloc'd NUL-terminated string; NULL when out of memory. */
char *pyjson_dumps(const json_t *v, int indent);

#endif
