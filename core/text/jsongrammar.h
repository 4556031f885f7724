/* Structured outputs: JSON that follows a schema, byte by byte and token by token.
 *
 * jgrammar_new compiles a response_format once ({"type": "json_object"}: any JSON object;
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}) into a grammar: a node per
 * schema (objects, arrays, strings, numbers, literals for enum/const/true/false/null, choices for
 * anyOf and type lists, $ref followed into the same node so recursion is a cycle). The schema is
 * first checked by jsonschema.h (what it refuses is refused by the same name); the grammar then
 * refuses what it cannot guarantee (a multipleOf that is not an integer, an unknown format, a
 * keyword beside $ref or anyOf that would narrow them) naming the keyword; enum and const values
 * the rest of their schema refuses are dropped.
 *
 * A jmatch is one sequence's position: a pushdown automaton, kept as a small set of stacks (one
 * per way the bytes so far can still be read: anyOf's branches, enum values, keys that share a
 * prefix), advanced a byte at a time. What it accepts, by construction:
 *   - no whitespace anywhere: the text is compact JSON, so a model cannot loop on spaces;
 *   - an object with properties gives them in schema order, each at most once, required ones
 *     always, optional ones skippable, and nothing else (additionalProperties is never used
 *     there); an object without properties takes any keys, values of additionalProperties' schema;
 *   - arrays within minItems..maxItems; strings within minLength..maxLength (code points), valid
 *     UTF-8, escapes other than surrogates and \u0000; under a pattern or format, printable
 *     ASCII and simple escapes only, at most JG_PATTERN_BYTES bytes, each prefix one PCRE2 can
 *     still extend (PCRE2_PARTIAL_HARD); formats are patterns (date-time, date, time,
 *     duration, email, hostname, ipv4, ipv6, uuid);
 *   - numbers without exponent or -0: integers of at most 15 digits; numbers of at most 12
 *     integer and 6 fraction digits; every prefix is one that some number within the bounds (and
 *     a multiple of an integer multipleOf) extends, so bounds never leave a dead end;
 *   - enum and const values as their compact JSON text.
 * No byte is accepted after which no complete value exists: nesting is bounded (JG_DEPTH) and a
 * value is begun only where its shallowest completion fits; a schema with no finite value is
 * refused.
 *
 * A jmasker joins a grammar to a vocabulary (jvocab: every id's bytes, from tok_token_bytes) and
 * computes, for a jmatch, the set of ids whose whole byte string it accepts: the vocabulary
 * sorted by bytes is walked with the matcher, a prefix that dies skipping every id under it
 * (inside a free string, ids of plain characters are allowed without stepping).
 * Special tokens are never allowed; the stop ids only when the value is complete (then only
 * they, unless the value can go on: a top-level number). Masks are cached by the matcher's state
 * (inside a free string the state repeats). A grammar, a vocabulary and a masker never change but
 * for the masker's cache, which is locked: all may be shared by threads; a jmatch belongs to one
 * thread at a time. */
#ifndef DAPO_JSONGRAMMAR_H
#define DAPO_JSONGRAMMAR_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define JG_DEPTH 32         /* frames a matcher's stack holds (nesting of values, +1) */
#define JG_PATTERN_BYTES 96 /* the longest string under a pattern or format */

struct jgrammar;
struct jmatch;
struct jvocab;
struct jmasker;
struct tokenizer;

/* From a response_format object (borrowed); errors name the member under field
 * ("response_format.json_schema.schema.properties.x.foo: this keyword is not supported").
 * NULL + e on failure. */
struct jgrammar *jgrammar_new(const json_t *response_format, const char *field, struct dapo_err *e);
/* From a schema alone (borrowed); NULL schema: any JSON object. */
struct jgrammar *jgrammar_from_schema(const json_t *schema, const char *field, struct dapo_err *e);
void jgrammar_free(struct jgrammar *g);

/* A matcher at the start of a value; NULL when out of memory. */
struct jmatch *jmatch_new(const struct jgrammar *g);
void jmatch_free(struct jmatch *m);
/* A copy of m (its own state from here on); NULL when out of memory. */
struct jmatch *jmatch_clone(const struct jmatch *m);
void jmatch_reset(struct jmatch *m);
/* Advances by n bytes: 0, or -1 when a byte is refused (the matcher is then unchanged). */
int jmatch_feed(struct jmatch *m, const char *bytes, size_t n);
/* 1 when the bytes so far are a complete value of the schema. */
int jmatch_done(const struct jmatch *m);
/* 1 when a further byte can be accepted. */
int jmatch_can_continue(const struct jmatch *m);

/* Every id's bytes from t for ids 0..V-1 (ids past t's vocabulary, and special tokens, are never
 * allowed). NULL + e on failure. */
struct jvocab *jvocab_new(const struct tokenizer *t, int V, struct dapo_err *e);
/* The same from byte strings (tests): toks[i] of lens[i] bytes, special[i] non-zero (or NULL). */
struct jvocab *jvocab_from_bytes(const char *const *toks, const size_t *lens, const char *special,
                                 int V, struct dapo_err *e);
void jvocab_free(struct jvocab *v);
int jvocab_size(const struct jvocab *v);

/* g and v borrowed (they outlive the masker); stop ids (n_stop of them) end the value. */
struct jmasker *jmasker_new(const struct jgrammar *g, const struct jvocab *v, const int *stop,
                            int n_stop, struct dapo_err *e);
void jmasker_free(struct jmasker *k);
/* The allowed ids for m's state as bits (bit i of bits[i / 64]; (V + 63) / 64 words). Returns
 * how many ids are allowed (0 only when the value is complete and there is no stop id), or -1
 * when out of memory. Thread-safe for distinct matchers (m lends its scratch: one thread at a
 * time per matcher). */
int jmasker_mask(struct jmasker *k, const struct jmatch *m, uint64_t *bits);
/* Sets logits[V] of the ids not allowed to -INFINITY; returns jmasker_mask's count. m is not
 * advanced (it lends its scratch). */
int jmasker_apply(struct jmasker *k, struct jmatch *m, float *logits, int V);
/* Feeds id's bytes (a stop id feeds nothing): 0, or -1 when m refuses them. */
int jmasker_feed(const struct jmasker *k, struct jmatch *m, int id);
/* Cache figures: lookups answered from the cache, and walks of the vocabulary. */
void jmasker_stats(struct jmasker *k, int64_t *hits, int64_t *walks);

#endif
