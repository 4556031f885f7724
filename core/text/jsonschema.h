/* JSON Schema, the subset that function tools' `parameters` and structured outputs use (OpenAI's
 * strict subset and what hand-written tool schemas hold): type (a name or a list), properties,
 * required, additionalProperties (a boolean or a schema), items, enum, const, anyOf, minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum, multipleOf, minLength, maxLength, pattern
 * (PCRE2, unanchored as JSON Schema says), minItems, maxItems, $defs (or definitions) and $ref
 * (a JSON Pointer into the same schema: '#', '#/$defs/name'; recursion allowed, checked when
 * the schema is built); and annotations that change
 * nothing (title, description, default, examples, format, $schema, $id, $comment). Any other
 * keyword is refused by name when the schema is built, never silently ignored.
 * A schema never changes after jschema_new: checks may run from several threads at once. */
#ifndef DAPO_JSONSCHEMA_H
#define DAPO_JSONSCHEMA_H

#include <jansson.h>
#include <stddef.h>

#include "error.h"

struct jschema;

/* Builds a checker for schema (borrowed; a JSON object, or true/false). Errors name the keyword
 * at fault under field ("episode.tools[0].function.parameters.properties.x.minimum: expected a
 * number"). NULL + e on failure. */
struct jschema *jschema_new(const json_t *schema, const char *field, struct dapo_err *e);
void jschema_free(struct jschema *s);

/* 0 when v (borrowed) is valid; 1 when not, with the first problem in why (cap bytes) as a path
 * into v and a reason ("arguments.n: 3.5 is not an integer"), root naming v's own place. */
int jschema_check(const struct jschema *s, const json_t *v, const char *root, char *why,
                  size_t cap);

/* jschema_check against node, a schema inside jschema_root's tree: 0 when v is valid there. */
int jschema_check_at(const struct jschema *s, const json_t *node, const json_t *v);

/* The kept copy of the schema (lives with s), for compilers that walk it (jsongrammar.h). */
const json_t *jschema_root(const struct jschema *s);
/* What ref ('#', '#/$defs/name', a JSON Pointer after '#') points to in s's schema; NULL if
 * nothing. */
const json_t *jschema_ref(const struct jschema *s, const char *ref);
/* The compiled pcre2_code of the "pattern" string node (a node of jschema_root's tree); NULL if
 * node is not one. */
const void *jschema_pattern(const struct jschema *s, const json_t *node);

#endif
