/* Structured outputs' matcher (jsongrammar.h): byte strings accepted and refused for every
 * keyword; random walks that take any accepted byte never meet a dead end (a state that is not
 * complete and accepts no byte) and end in JSON that jsonschema.h validates; the token mask over
 * a vocabulary equals feeding each token alone; keywords outside the subset refused by name. */
#include <string.h>

#include "check.h"
#include "jsongrammar.h"
#include "jsonschema.h"
#include "rng.h"

static struct jgrammar *grammar(const char *schema) {
  struct dapo_err e = {0};
  json_t *s = json_loads(schema, 0, NULL);
  CHECK_MSG(s != NULL, "bad test schema %s", schema);
  struct jgrammar *g = jgrammar_from_schema(s, "schema", &e);
  CHECK_MSG(g != NULL, "%s: %s", schema, e.msg);
  json_decref(s);
  return g;
}

/* 1 when text is accepted whole and complete */
static int accepts(const struct jgrammar *g, const char *text) {
  struct jmatch *m = jmatch_new(g);
  int ok = jmatch_feed(m, text, strlen(text)) == 0 && jmatch_done(m);
  jmatch_free(m);
  return ok;
}

static void acc(const char *schema, const char *const *yes, const char *const *no) {
  struct jgrammar *g = grammar(schema);
  if (!g) return;
  for (; yes && *yes; yes++) CHECK_MSG(accepts(g, *yes), "%s should accept %s", schema, *yes);
  for (; no && *no; no++) CHECK_MSG(!accepts(g, *no), "%s should refuse %s", schema, *no);
  jgrammar_free(g);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_keywords(void) {
  acc("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
      "\"string\"}},\"required\":[\"a\",\"b\"],\"additionalProperties\":false}",
      L("{\"a\":1,\"b\":\"x\"}", "{\"a\":-20,\"b\":\"\"}"),
      L("{\"b\":\"x\",\"a\":1}", "{\"a\":1}", "{\"a\":1,\"b\":\"x\",\"c\":1}",
        "{ \"a\":1,\"b\":\"\"}", "{\"a\":1.5,\"b\":\"x\"}", "{\"a\":01,\"b\":\"x\"}", "{}"));
  /* optional properties skippable, in order */
  acc("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},"
      "\"c\":{\"type\":\"number\"}},\"required\":[\"b\"]}",
      L("{\"b\":null}", "{\"a\":true,\"b\":null}", "{\"b\":null,\"c\":2.5}",
        "{\"a\":false,\"b\":null,\"c\":-0.125}"),
      L("{}", "{\"a\":true}", "{\"c\":1,\"b\":null}", "{\"b\":null,\"a\":true}", "{\"b\":nul}"));
  /* arrays with bounds */
  acc("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}",
      L("[1,2]", "[1,2,3]"), L("[]", "[1]", "[1,2,3,4]", "[1,]"));
  /* enum and const */
  acc("{\"enum\":[\"red\",\"green\",1,10,null,{\"k\":[1]}]}",
      L("\"red\"", "\"green\"", "1", "10", "null", "{\"k\":[1]}"),
      L("\"blue\"", "2", "100", "\"re\""));
  /* enum values the rest of the schema refuses are never written */
  acc("{\"type\":\"string\",\"maxLength\":2,\"enum\":[\"ab\",1,\"abc\",null]}", L("\"ab\""),
      L("1", "\"abc\"", "null"));
  acc("{\"const\":\"fixed\"}", L("\"fixed\""), L("\"fixe\"", "\"fixed!\""));
  /* anyOf with null; type lists */
  acc("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"null\"}]}",
      L("\"ab\"", "null", "\"\""), L("\"abc\"", "1"));
  acc("{\"type\":[\"integer\",\"boolean\"]}", L("7", "true"), L("7.5", "\"7\""));
  /* strings: lengths in code points, escapes, UTF-8 */
  acc("{\"type\":\"string\"}", L("\"\\u0001\"", "\"\\u1000\""), L("\"\\u0000\""));
  acc("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
      L("\"ab\"", "\"\\u00e9\\n\"", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\""),
      L("\"a\"", "\"abcd\"", "\"\\ud800x\"", "\"\xc3\x28x\"", "\"\xed\xa0\x80x\"", "\"a\nb\"",
        "\"\\x\""));
  /* patterns (unanchored as JSON Schema says) and formats */
  acc("{\"type\":\"string\",\"pattern\":\"^[a-c]+-[0-9]{2}$\"}", L("\"ab-12\"", "\"c-00\""),
      L("\"ab-1\"", "\"d-12\"", "\"ab-123\""));
  acc("{\"type\":\"string\",\"pattern\":\"x\"}", L("\"x\"", "\"abxc\""), L("\"abc\""));
  acc("{\"type\":\"string\",\"format\":\"date\"}", L("\"2024-02-28\""),
      L("\"2024-13-01\"", "\"2024-1-01\""));
  acc("{\"type\":\"string\",\"format\":\"uuid\"}", L("\"0123abcd-0000-1111-2222-333344445555\""),
      L("\"0123abcd\""));
  acc("{\"type\":\"string\",\"format\":\"ipv4\"}", L("\"10.0.255.1\""), L("\"256.0.0.1\""));
  /* numeric bounds */
  acc("{\"type\":\"integer\",\"minimum\":10,\"maximum\":20}", L("10", "15", "20"),
      L("9", "21", "100", "-15", "1"));
  acc("{\"type\":\"number\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":3}",
      L("-2", "0", "2", "-0.5"), L("-3", "3", "-0", "-0.0"));
  acc("{\"type\":\"integer\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":3}", L("-2", "0", "2"),
      L("-3", "3", "-0", "1.5"));
  acc("{\"type\":\"number\",\"minimum\":0.5,\"maximum\":1.25}", L("0.5", "1", "1.25", "0.75"),
      L("0.4", "1.26", "2", "-1"));
  acc("{\"type\":\"number\",\"exclusiveMinimum\":0}", L("0.000001", "3"), L("0", "-1", "0.0"));
  /* multipleOf (an integer one), with bounds: every prefix still reaches a multiple */
  acc("{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":7,\"maximum\":40}", L("10", "35", "40"),
      L("12", "5", "45", "0"));
  acc("{\"type\":\"number\",\"multipleOf\":3}", L("6", "6.0", "-3", "0"), L("6.5", "4", "-0"));
  /* $defs and $ref, recursion */
  acc("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
      "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\","
      "\"kids\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
      L("{\"v\":1,\"kids\":[]}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3,\"kids\":[]}]}]}"),
      L("{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2}]}"));
  /* json_object: any object, compact */
  struct dapo_err e = {0};
  json_t *rf = json_loads("{\"type\":\"json_object\"}", 0, NULL);
  struct jgrammar *g = jgrammar_new(rf, "response_format", &e);
  json_decref(rf);
  CHECK(g && accepts(g, "{}") && accepts(g, "{\"a\":[1,{\"b\":null}],\"c\":\"\\\"\"}"));
  CHECK(g && !accepts(g, "[]") && !accepts(g, "{\"a\":1} ") && !accepts(g, "{\"a\" :1}") &&
        !accepts(g, "{\"a\":1e5}"));
  jgrammar_free(g);
}

static void refused(const char *rf_text, const char *want) {
  struct dapo_err e = {0};
  json_t *rf = json_loads(rf_text, 0, NULL);
  CHECK(rf != NULL);
  struct jgrammar *g = jgrammar_new(rf, "response_format", &e);
  CHECK_MSG(!g && strstr(e.msg, want), "%s: got '%s', want '%s'", rf_text, g ? "" : e.msg, want);
  jgrammar_free(g);
  json_decref(rf);
}

static void test_refusals(void) {
  const char *pre = "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"strict\":true,"
                    "\"schema\":";
  char buf[1024];
  struct {
    const char *schema, *want;
  } cases[] = {
      {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"foo\":1}}}",
       "response_format.json_schema.schema.properties.x.foo: this keyword is not supported"},
      {"{\"type\":\"object\",\"patternProperties\":{}}", "schema.patternProperties"},
      {"{\"allOf\":[]}", "schema.allOf"},
      {"{\"type\":\"number\",\"multipleOf\":0.5}", "schema.multipleOf"},
      {"{\"type\":\"object\",\"anyOf\":[{\"type\":\"object\"}]}",
       "schema.type: not supported beside anyOf"},
      {"{\"$defs\":{\"a\":{\"type\":\"null\"}},\"$ref\":\"#/$defs/a\",\"minimum\":1}",
       "schema.minimum: not supported beside $ref"},
      {"{\"type\":\"string\",\"format\":\"iri\"}", "schema.format"},
      {"{\"$ref\":\"#/$defs/none\"}", "schema.$ref"},
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}",
       "no value of at most"},
      {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no value of at most"},
      {"{\"type\":\"object\",\"properties\":{},\"required\":[\"a\"]}", "schema.required[0]"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(buf, sizeof buf, "%s%s}}", pre, cases[i].schema);
    refused(buf, cases[i].want);
  }
  refused("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}",
          "response_format.json_schema.name");
  refused("{\"type\":\"xml\"}", "response_format.type");
}

/* Random walks: from every state reached, the accepted bytes are found by trying all 256; none
 * may be empty unless the value is complete. Completed texts must validate. */
static const char *WALK_SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},\"age\":{"
    "\"type\":\"integer\",\"minimum\":0,\"maximum\":130},\"tags\":{\"type\":\"array\",\"items\":{"
    "\"enum\":[\"a\",\"b\",\"ab\"]},\"minItems\":1,\"maxItems\":3},\"spouse\":{\"anyOf\":[{"
    "\"type\":"
    "\"string\"},{\"type\":\"null\"}]}},\"required\":[\"name\",\"age\",\"tags\",\"spouse\"],"
    "\"additionalProperties\":false}",
    "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"l\":{\"anyOf\":[{\"$ref\":\"#/$defs/"
    "t\"},{\"type\":\"null\"}]},\"v\":{\"type\":\"number\",\"exclusiveMinimum\":-1.5,"
    "\"maximum\":2.25}},\"required\":[\"l\",\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/"
    "$defs/t\"}",
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}[0-9]{"
    "3}$\"},\"when\":{\"type\":\"string\",\"format\":\"date-time\"},\"ip\":{\"type\":\"string\","
    "\"format\":\"ipv4\"},\"n\":{\"type\":\"integer\",\"exclusiveMinimum\":99,\"maximum\":1000}},"
    "\"required\":[\"id\",\"when\",\"ip\",\"n\"],\"additionalProperties\":false}",
    "{\"type\":\"object\"}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"integer\",\"multipleOf\":7,\"exclusiveMinimum\":-30,\"maximum\":50}}},\"required\":[\"a\"]}",
    "{\"type\":\"object\",\"properties\":{\"m\":{\"type\":\"object\",\"additionalProperties\":{"
    "\"type\":\"integer\",\"minimum\":-5,\"maximum\":-2}},\"k\":{\"type\":\"number\",\"minimum\":"
    "1000000,\"maximum\":1000000.5}},\"required\":[\"m\",\"k\"],\"additionalProperties\":false}",
};

static void test_walks(void) {
  struct rng r;
  rng_seed(&r, 7, 0);
  int completed = 0, walks = 0;
  for (size_t si = 0; si < sizeof WALK_SCHEMAS / sizeof *WALK_SCHEMAS; si++) {
    struct dapo_err e = {0};
    json_t *s = json_loads(WALK_SCHEMAS[si], 0, NULL);
    struct jgrammar *g = jgrammar_from_schema(s, "schema", &e);
    struct jschema *js = jschema_new(s, "schema", &e);
    CHECK_MSG(g && js, "%zu: %s", si, e.msg);
    if (!g || !js) continue;
    for (int w = 0; w < 150; w++, walks++) {
      struct jmatch *m = jmatch_new(g);
      char text[2048];
      int len = 0;
      while (len < 600) {
        unsigned char ok[256];
        int n_ok = 0;
        struct jmatch *x = jmatch_clone(m); /* a refused byte leaves it as it was */
        for (int c = 1; c < 256; c++) {
          char b = (char)c;
          if (jmatch_feed(x, &b, 1) == 0) {
            ok[n_ok++] = (unsigned char)c;
            jmatch_free(x);
            x = jmatch_clone(m);
          }
        }
        jmatch_free(x);
        if (jmatch_done(m) && (n_ok == 0 || rng_float(&r) < 0.3)) break;
        CHECK_MSG(n_ok > 0, "dead end after %.*s", len, text);
        if (!n_ok) break;
        /* lean towards closing: quotes and brackets often, so walks end */
        unsigned char pick = ok[(int)rng_below(&r, (uint64_t)n_ok)];
        if (len > 40)
          for (int i = 0; i < n_ok; i++)
            if (strchr("\"}],", ok[i]) && rng_float(&r) < 0.5) pick = ok[i];
        text[len++] = (char)pick;
        CHECK(jmatch_feed(m, (char *)&pick, 1) == 0);
      }
      if (jmatch_done(m)) {
        completed++;
        json_error_t je;
        json_t *v = json_loadb(text, (size_t)len, JSON_DECODE_ANY, &je);
        char why[256];
        CHECK_MSG(v && jschema_check(js, v, "v", why, sizeof why) == 0, "%.*s: %s", len, text,
                  v ? why : je.text);
        json_decref(v);
      }
      jmatch_free(m);
    }
    jgrammar_free(g);
    jschema_free(js);
    json_decref(s);
  }
  fprintf(stderr, "walks: %d of %d completed\n", completed, walks);
  CHECK(completed > walks / 2);
}

/* The mask over a small vocabulary of multi-byte tokens equals feeding each token alone. */
static void test_mask(void) {
  const char *toks[] = {"{",    "}",    "\"",   "\":", "{\"", "name", "\":\"", "\",\"", "a",  "1",
                        "12",   "-",    ".5",   ",",   "[",   "]",    "null",  "nu",    "ll", "tr",
                        "true", "\xc3", "\xa9", " ",   "\"}", "age",  "<s>",   "</s>"};
  int V = (int)(sizeof toks / sizeof *toks);
  size_t lens[64];
  char special[64] = {0};
  for (int i = 0; i < V; i++) lens[i] = strlen(toks[i]);
  special[V - 2] = special[V - 1] = 1;
  struct dapo_err e = {0};
  struct jvocab *v = jvocab_from_bytes(toks, lens, special, V, &e);
  struct jgrammar *g =
      grammar("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{"
              "\"type\":\"integer\"},\"list\":{\"type\":\"array\"}},\"required\":[\"name\"]}");
  int stop = V - 1;
  struct jmasker *k = jmasker_new(g, v, &stop, 1, &e);
  struct rng r;
  rng_seed(&r, 3, 0);
  int done = 0;
  for (int w = 0; w < 200; w++) {
    struct jmatch *m = jmatch_new(g);
    for (int t = 0; t < 400; t++) {
      uint64_t bits[1];
      int n = jmasker_mask(k, m, bits), count = 0;
      for (int id = 0; id < V; id++) {
        int want;
        if (id == stop) {
          want = jmatch_done(m);
        } else if (special[id]) {
          want = 0;
        } else {
          struct jmatch *y = jmatch_clone(m);
          want = jmatch_feed(y, toks[id], lens[id]) == 0;
          jmatch_free(y);
        }
        int got = (int)(bits[0] >> id & 1);
        CHECK_MSG(got == want, "token %d '%s': mask %d, matcher %d", id, toks[id], got, want);
        count += got;
      }
      CHECK(n == count);
      CHECK(!(bits[0] >> (V - 2) & 1)); /* special: never */
      CHECK((bits[0] >> stop & 1) == (uint64_t)jmatch_done(m));
      if (!n) break;
      int pick = stop;
      if (!(bits[0] >> stop & 1) || rng_float(&r) < 0.5) do
          pick = (int)rng_below(&r, (uint64_t)V);
        while (!(bits[0] >> pick & 1));
      if (pick == stop) {
        done++;
        break;
      }
      CHECK(jmasker_feed(k, m, pick) == 0);
    }
    jmatch_free(m);
  }
  CHECK(done > 0);
  jmasker_free(k);
  jgrammar_free(g);
  jvocab_free(v);
}

int main(void) {
  test_keywords();
  test_refusals();
  test_walks();
  test_mask();
  return check_done("test_jsongrammar");
}
