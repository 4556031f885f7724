/* Judges without a network: the math rules on typical math-RL outputs (GSM8K "####", \boxed{},
 * "the answer is", "=", last number; fractions, decimals, units, lists), the exact and regex
 * judges through judge_run, spec validation messages that name the field, and the host
 * allowlist. */
#include "check.h"

#include <string.h>

#include "judge.h"

struct math_case {
  const char *response, *answer;
  int correct;
};

static const struct math_case math_cases[] = {
    /* GSM8K: "####" reads like "answer is"; the dataset's own answer lines too */
    {"Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72",
     "72", 1},
    {"Weng earns 12/60 = $0.2 per minute.\nShe earned 0.2 x 50 = $10.\n#### 10",
     "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n#### 10", 1},
    {"#### 1,234", "1234", 1},
    {"#### 72", "71", 0},
    {"She has 5 left.\n#### 5\nLet me also note 7 more.", "5", 1},
    /* "the answer is" */
    {"The answer is 18.", "18", 1},
    {"The answer is: $18", "18", 1},
    {"So the answer is \\$18.00.", "18", 1},
    {"The final answer is 42", "43", 0},
    {"Therefore, the answer is 5 apples.", "5", 1},
    {"The answer is 1,000,000.", "1000000", 1},
    {"the answer is 1,2", "12", 0},
    {"The answer is $\\frac{7}{2}$.", "3.5", 1},
    {"So the final answer is: **17**", "17", 1},
    {"**Answer:** 42", "42", 1},
    {"Answer: (C)", "C", 1},
    {"I think the answer is 5. Let me double check: 2+3 = 5. Yes.", "5", 1},
    {"The answer is 3.5 meters.", "7/2", 1},
    {"THE ANSWER IS 9", "9", 1},
    {"The answer is\n\n$x = -2$", "-2", 1},
    {"The answer is 0.1 + 0.2", "0.3", 0},
    {"The answer is 007", "7", 1},
    {"The answer is 1/2", "2/4", 1},
    {"The answer is 12345678901234567890", "12345678901234567890", 1},
    {"The answer is 12345678901234567890", "12345678901234567891", 0},
    {"The answer is 100%", "100", 1},
    {"The answer is \\(\\frac{2}{3}\\)", "2/3", 1},
    {"the answer is 2,000 dollars.", "2000", 1},
    {"The answer is $\\boxed{-1}$", "-1", 1},
    {"The answer is 17 because 12 + 5 = 17.", "17", 0}, /* no guessing inside prose */
    {"The answer is 2 or 3.", "2", 0},                  /* a hedge is not an answer */
    {"The answer is \\boxed{2 \\text{ or } 3}", "3", 0},
    {"\\boxed{5 \\text{ m}^{2}}", "5", 1},
    {"\\boxed{\\text{1,234}}", "1234", 1},
    {"The answer is 12 dollars per week.", "12", 1},
    /* \boxed{} and \fbox{} */
    {"Thus $\\boxed{\\frac{1}{2}}$.", "0.5", 1},
    {"\\boxed{0.5}", "\\frac{1}{2}", 1},
    {"\\boxed{\\dfrac{3}{4}}", "3/4", 1},
    {"\\boxed{\\tfrac34}", "\\frac{3}{4}", 1},
    {"\\boxed{\\frac12}", "1/2", 1},
    {"First \\boxed{3}, then on reflection \\boxed{4}", "4", 1},
    {"First \\boxed{3}, then on reflection \\boxed{4}", "3", 0},
    {"\\boxed{x = 5}", "5", 1},
    {"\\boxed{\\text{(B)}}", "B", 1},
    {"\\boxed{(B)}", "(B)", 1},
    {"\\fbox{7}", "7", 1},
    {"\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1},
    {"\\boxed{(1,2)}", "(2,1)", 0},
    {"\\boxed{\\{1, 2, 3\\}}", "\\{1,2,3\\}", 1},
    {"\\boxed{[0, \\frac{1}{2})}", "[0,0.5)", 1},
    {"\\boxed{[0, 1)}", "(0,1)", 0},
    {"\\boxed{\\left[ 2, 5 \\right]}", "[2,5]", 1},
    {"\\boxed{3, 5}", "3,5", 1},
    {"\\boxed{3, 5}", "5, 3", 0},
    {"\\boxed{2\\sqrt{3}}", "2 \\sqrt 3", 1},
    {"\\boxed{\\sqrt{2}}", "\\sqrt{3}", 0},
    {"\\boxed{\\frac{\\pi}{2}}", "\\pi/2", 1},
    {"\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1},
    {"\\boxed{-\\frac{1}{3}}", "-1/3", 1},
    {"\\boxed{\\frac{-1}{3}}", "-\\frac13", 1},
    {"\\boxed{\xE2\x88\x92"
     "5}",
     "-5", 1},
    {"\\boxed{+7}", "7", 1},
    {"\\boxed{50\\%}", "50", 1},
    {"\\boxed{50\\%}", "0.5", 0},
    {"\\boxed{30^\\circ}", "30", 1},
    {"\\boxed{30^{\\circ}}", "30", 1},
    {"\\boxed{45\xC2\xB0}", "45", 1},
    {"\\boxed{10\\text{ cm}}", "10", 1},
    {"\\boxed{10 \\text{ cm}^2}", "10", 1},
    {"\\boxed{1{,}000}", "1000", 1},
    {"\\boxed{1\\,000}", "1000", 1},
    {"\\boxed{1,000}", "1000", 1},
    {"\\boxed{3.14159}", "3.14159", 1},
    {"\\boxed{0.3333333333}", "1/3", 1},
    {"\\boxed{0.333}", "1/3", 0},
    {"\\boxed{2.50}", "2.5", 1},
    {"\\boxed{5.}", "5", 1},
    {"\\boxed{.5}", "0.5", 1},
    {"\\boxed{1e3}", "1000", 1},
    {"\\boxed{2\\frac{1}{2}}", "5/2", 1},
    {"\\boxed{\\frac{10}{4}}", "\\frac{5}{2}", 1},
    {"\\boxed{\\frac{1}{0}}", "1", 0},
    {"\\boxed{0.1}", "0.10000000001", 1},
    {"\\boxed{0.1}", "0.1001", 0},
    {"\\boxed{x^2+2x+1}", "x^2 + 2x + 1", 1},
    {"\\boxed{y = 2x + 3}", "2x+3", 1},
    {"\\boxed{f(x) = x^2}", "x^2", 1},
    {"\\boxed{k=3}", "3", 1},
    {"\\boxed{\\infty}", "\\infty", 1},
    {"\\boxed{-\\infty}", "\\infty", 0},
    {"\\boxed{\\text{Yes}}", "yes", 1},
    {"\\boxed{No}", "Yes", 0},
    {"\\boxed{\\text{New York}}", "new york", 1},
    {"\\boxed{\\$1,234.50}", "1234.5", 1},
    {"$\\boxed{12}$ dollars", "12", 1},
    {"\\boxed{\\boxed{8}}", "8", 1},
    {"\\boxed 9", "9", 1},
    {"\\[\\boxed{6}\\]", "6", 1},
    {"\\boxed{4\\pi}", "4 \\pi", 1},
    {"\\boxed{\\frac{1}{2}}", "\\frac{1}{3}", 0},
    {"The answer is \\boxed{\\displaystyle \\frac{9}{4}}.", "2.25", 1},
    {"so $\\boxed{\\left\\{ -1, 1 \\right\\}}$", "\\{-1,1\\}", 1},
    {"\\boxed{12", "12", 1}, /* truncated box: falls back to the last number */
    /* after the last "=" */
    {"2 + 3 = 5", "5", 1},
    {"First 3*4 = 12. Then 12 + 5 = 17. She has 17 apples.", "17", 1},
    {"x = 1/4", "0.25", 1},
    {"So total = $1,250.", "1250", 1},
    {"Area = 12 square meters", "12", 1},
    /* the last number */
    {"She has 12 apples and gives away 5, leaving 7", "7", 1},
    {"We get 3.75 in the end", "15/4", 1},
    {"The result: -12", "-12", 1},
    {"between 1,234 and 5", "5", 1},
    {"the value is 1,234", "1234", 1},
    {"5-3 gives 2", "2", 1},
    {"5-3 gives 2", "-3", 0},
    /* nothing to read */
    {"No numbers here", "5", 0},
    {"", "0", 0},
    {"I don't know", "", 0},
};

static void test_math_cases(void) {
  int n = (int)(sizeof math_cases / sizeof *math_cases);
  CHECK_MSG(n >= 80, "only %d math cases", n);
  struct judge_item *items = calloc((size_t)n, sizeof *items);
  struct judge_result *res = calloc((size_t)n, sizeof *res);
  CHECK(items && res);
  if (!items || !res) goto out;
  for (int i = 0; i < n; i++) {
    char *x = judge_math_extract(math_cases[i].response);
    int eq = x ? judge_math_equal(x, math_cases[i].answer) : 0;
    CHECK_MSG(eq == math_cases[i].correct,
              "case %d: response '%s' answer '%s': extracted '%s', got %d", i,
              math_cases[i].response, math_cases[i].answer, x ? x : "(none)", eq);
    free(x);
    items[i].response = math_cases[i].response;
    items[i].answer = math_cases[i].answer;
    items[i].group = i / 4;
  }
  json_t *spec = json_pack("{ss}", "type", "math");
  struct dapo_err e = {0};
  struct judge *j = judge_new(spec, NULL, &e);
  CHECK_MSG(j != NULL, "%s", e.msg);
  struct judge_stats st = {0};
  int rc = judge_run(j, "job-x", 1, items, n, res, &st, NULL, &e);
  CHECK_MSG(rc == 0, "%s", e.msg);
  int agree = 0;
  for (int i = 0; i < n; i++) {
    agree += res[i].correct == math_cases[i].correct &&
             res[i].reward == (math_cases[i].correct ? 1.0 : -1.0) && res[i].err == JE_NONE &&
             res[i].mask == 0 && json_is_object(res[i].info);
  }
  CHECK_MSG(agree == n, "judge_run agreed on %d of %d", agree, n);
  CHECK(st.n_requests == 0 && st.seconds >= 0);
  fprintf(stderr, "test_judge: %d math cases\n", n);
  judge_results_release(res, n);
  judge_free(j);
  json_decref(spec);
out:
  free(items);
  free(res);
}

static void check_extract(const char *response, const char *want) {
  char *x = judge_math_extract(response);
  if (!want)
    CHECK_MSG(x == NULL, "extract('%s') = '%s', expected none", response, x);
  else
    CHECK_MSG(x && !strcmp(x, want), "extract('%s') = '%s', expected '%s'", response, x, want);
  free(x);
}

static void check_norm(const char *in, const char *want) {
  char *x = judge_math_normalize(in);
  CHECK_MSG(x && !strcmp(x, want), "normalize('%s') = '%s', expected '%s'", in, x, want);
  free(x);
}

static void test_extract_normalize(void) {
  check_extract("a \\boxed{1} b \\boxed{\\frac{2}{3}} c", "\\frac{2}{3}");
  check_extract("\\boxed{\\{a\\}} and \\fbox{x}", "x");
  check_extract("\\boxed{open {never closed}", NULL);
  check_extract("The answer is: 5. More text", "5");
  check_extract("The answer is 3.14 exactly.\nNext line", "3.14 exactly");
  check_extract("#### 72", "72");
  check_extract("a = b = 9\nwhat", "9");
  check_extract("values 3, 4 and 1,024.", "1,024");
  check_extract("-7 is it", "-7");
  check_extract("nothing", NULL);
  check_norm("$\\frac12$", "\\frac{1}{2}");
  check_norm("\\left[ x, y \\right]", "[x,y]");
  check_norm(" +1,234.5 ", "1234.5");
  check_norm("1, 234", "1,234");
  check_norm("\\text{ 5 apples }", "5");
  check_norm("x = \\dfrac{\\pi}{4}", "\\frac{\\pi}{4}");
  check_norm("\\pi/4", "\\frac{\\pi}{4}");
  check_norm("90^\\circ.", "90");
  check_norm("#### 8", "8");
  check_norm("\\boxed{7}", "7");
  /* big and odd inputs stay bounded and do not crash */
  size_t big = 200000;
  char *s = malloc(big + 1);
  if (s) {
    for (size_t i = 0; i < big; i++) s[i] = "\\frac{"[i % 6];
    s[big] = '\0';
    char *x = judge_math_extract(s);
    char *y = judge_math_normalize(s);
    CHECK(y != NULL);
    CHECK(judge_math_equal(s, "1") == 0);
    free(x);
    free(y);
    memset(s, '9', big);
    x = judge_math_extract(s);
    CHECK(x != NULL);
    CHECK(judge_math_equal(s, "1") == 0);
    free(x);
    free(s);
  }
}

static struct judge *make(const char *spec_text, const struct judge_policy *pol,
                          struct dapo_err *e) {
  json_error_t jerr;
  json_t *spec = json_loads(spec_text, 0, &jerr);
  CHECK_MSG(spec != NULL, "bad test spec %s: %s", spec_text, jerr.text);
  struct judge *j = judge_new(spec, pol, e);
  json_decref(spec);
  return j;
}

/* spec must be refused with a message containing want. */
static void refuse(const char *spec_text, const struct judge_policy *pol, const char *want) {
  struct dapo_err e = {0};
  struct judge *j = make(spec_text, pol, &e);
  CHECK_MSG(j == NULL, "accepted %s", spec_text);
  CHECK_MSG(e.code == DAPO_EINVAL && strstr(e.msg, want), "%s: message '%s' lacks '%s'", spec_text,
            e.msg, want);
  judge_free(j);
}

static void accept(const char *spec_text, const struct judge_policy *pol, const char *type) {
  struct dapo_err e = {0};
  struct judge *j = make(spec_text, pol, &e);
  CHECK_MSG(j != NULL, "refused %s: %s", spec_text, e.msg);
  CHECK(j == NULL || !strcmp(judge_type(j), type));
  judge_free(j);
}

static void test_specs(void) {
  refuse("[]", NULL, "judge: expected an object");
  refuse("{}", NULL, "judge.type: required");
  refuse("{\"type\": \"llm\"}", NULL, "judge.type: 'llm' is not one of");
  refuse("{\"type\": \"math\", \"tolerance\": 1}", NULL, "judge.tolerance: unknown field");
  refuse("{\"type\": \"regex\"}", NULL, "judge.pattern: required");
  refuse("{\"type\": \"regex\", \"pattern\": \"\"}", NULL, "judge.pattern: length 0");
  refuse("{\"type\": \"regex\", \"pattern\": \"(ab\"}", NULL,
         "judge.pattern: missing closing parenthesis at offset 3");
  refuse("{\"type\": \"regex\", \"pattern\": \"a[\"}", NULL, "judge.pattern: ");
  refuse("{\"type\": \"http\"}", NULL, "judge.url: required");
  refuse("{\"type\": \"http\", \"url\": 5}", NULL, "judge.url: required");
  refuse("{\"type\": \"http\", \"url\": \"not a url\"}", NULL, "judge.url: ");
  refuse("{\"type\": \"http\", \"url\": \"ftp://127.0.0.1/x\"}", NULL, "judge.url: scheme 'ftp'");
  refuse("{\"type\": \"http\", \"url\": \"file:///etc/passwd\"}", NULL, "judge.url: ");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"timeout_ms\": 50}", NULL,
         "judge.timeout_ms: 50 not in [100, 600000]");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"timeout_ms\": \"1000\"}", NULL,
         "judge.timeout_ms: expected an integer");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"timeout_ms\": 1000.5}", NULL,
         "judge.timeout_ms: expected an integer");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"max_batch\": 0}", NULL,
         "judge.max_batch: 0 not in [1, 4096]");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"concurrency\": 65}", NULL,
         "judge.concurrency: 65 not in [1, 64]");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"max_retries\": 11}", NULL,
         "judge.max_retries: 11 not in [0, 10]");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"format\": \"xml\"}", NULL,
         "judge.format: expected \"dapod\" or \"openrlhf\"");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"timeout\": 5}", NULL,
         "judge.timeout: unknown field");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"headers\": [\"a\"]}", NULL,
         "judge.headers: expected an object");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"headers\": {\"X-A\": 1}}", NULL,
         "judge.headers.X-A: expected a string");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", "
         "\"headers\": {\"X-A\": \"ok\\r\\nX-Injected: 1\"}}",
         NULL, "judge.headers.X-A: header values cannot contain CR, LF or NUL");
  refuse(
      "{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"headers\": {\"X-A\": \"a\\nb\"}}",
      NULL, "cannot contain CR, LF");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", "
         "\"headers\": {\"X-A\\r\\nX-B\": \"1\"}}",
         NULL, "judge.headers: header names cannot contain CR or LF");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", \"headers\": {\"X A\": \"1\"}}",
         NULL, "not a valid header name");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:1/\", "
         "\"headers\": {\"Content-Length\": \"1\"}}",
         NULL, "judge.headers.Content-Length: set by the daemon");
  accept("{\"type\": \"exact\"}", NULL, "exact");
  accept("{\"type\": \"math\"}", NULL, "math");
  accept("{\"type\": \"regex\", \"pattern\": \"answer: (\\\\d+)\"}", NULL, "regex");
  accept("{\"type\": \"http\", \"url\": \"http://127.0.0.1:9000/score\", \"timeout_ms\": 100, "
         "\"max_batch\": 4096, \"concurrency\": 64, \"max_retries\": 0, \"format\": \"openrlhf\", "
         "\"headers\": {\"Authorization\": \"Bearer x\", \"X-Empty\": \"\"}}",
         NULL, "http");
}

static void test_allowlist(void) {
  accept("{\"type\": \"http\", \"url\": \"http://127.0.0.1:9000/score\"}", NULL, "http");
  accept("{\"type\": \"http\", \"url\": \"http://LOCALHOST:9000/\"}", NULL, "http");
  accept("{\"type\": \"http\", \"url\": \"https://localhost/score\"}", NULL, "http");
  accept("{\"type\": \"http\", \"url\": \"http://[::1]:9000/score\"}", NULL, "http");
  refuse("{\"type\": \"http\", \"url\": \"http://example.com/score\"}", NULL,
         "judge.url: host 'example.com' is not in the judge host allowlist");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.2:9000/\"}", NULL,
         "judge.url: host '127.0.0.2' is not in");
  refuse("{\"type\": \"http\", \"url\": \"http://169.254.169.254/latest/meta-data\"}", NULL,
         "judge.url: host '169.254.169.254' is not in");
  refuse("{\"type\": \"http\", \"url\": \"http://localhost.example.com/\"}", NULL,
         "is not in the judge host allowlist");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1@example.com/\"}", NULL,
         "host 'example.com' is not in");
  const char *hosts[] = {"judge.internal", "10.1.2.3"};
  struct judge_policy pol = {.allowed_hosts = hosts, .n_allowed = 2};
  accept("{\"type\": \"http\", \"url\": \"http://JUDGE.internal:8080/x\"}", &pol, "http");
  accept("{\"type\": \"http\", \"url\": \"https://10.1.2.3/x\"}", &pol, "http");
  refuse("{\"type\": \"http\", \"url\": \"http://127.0.0.1:9000/\"}", &pol,
         "host '127.0.0.1' is not in");
}

static void run_builtin(const char *spec, const char *response, const char *answer,
                        int want_correct, const char *want_extracted) {
  struct dapo_err e = {0};
  struct judge *j = make(spec, NULL, &e);
  CHECK_MSG(j != NULL, "%s: %s", spec, e.msg);
  if (!j) return;
  struct judge_item it = {.id = "a", .response = response, .answer = answer};
  struct judge_result r;
  int rc = judge_run(j, NULL, 0, &it, 1, &r, NULL, NULL, &e);
  CHECK_MSG(rc == 0, "%s", e.msg);
  CHECK_MSG(r.correct == want_correct && r.reward == (want_correct ? 1.0 : -1.0),
            "%s on '%s' vs '%s': correct %d reward %g", spec, response, answer, r.correct,
            r.reward);
  if (want_extracted) {
    const char *x = json_string_value(json_object_get(r.info, "extracted"));
    CHECK_MSG(x && !strcmp(x, want_extracted), "%s: extracted '%s', expected '%s'", spec, x,
              want_extracted);
  }
  judge_results_release(&r, 1);
  CHECK(r.info == NULL);
  judge_free(j);
}

static void test_exact_regex(void) {
  const char *ex = "{\"type\": \"exact\"}";
  run_builtin(ex, "  42\n", "42", 1, NULL);
  run_builtin(ex, "42", " 42\t", 1, NULL);
  run_builtin(ex, "042", "42", 0, NULL);
  run_builtin(ex, "Paris", "paris", 0, NULL);
  run_builtin(ex,
              "\xC2\xA0"
              "42",
              "42", 0, NULL); /* only ASCII white space is trimmed */
  run_builtin(ex, "", "", 1, NULL);
  const char *re = "{\"type\": \"regex\", \"pattern\": \"[Aa]nswer:\\\\s*(-?\\\\d+)\"}";
  run_builtin(re, "blah. Answer: 17 apples", "17", 1, "17");
  run_builtin(re, "answer: -3", " -3 ", 1, "-3");
  run_builtin(re, "Answer: 18", "17", 0, "18");
  run_builtin(re, "no match here", "17", 0, NULL);
  run_builtin(re, "Answer: 5 and later Answer: 6", "5", 1, "5"); /* the first match */
  run_builtin(re, "\xFF\xFE Answer: 4 \xC3", "4", 1, "4");       /* invalid UTF-8 subject */
  const char *whole = "{\"type\": \"regex\", \"pattern\": \"\\\\d+\"}";
  run_builtin(whole, "it is 12 or 13", "12", 1, "12");
  const char *opt = "{\"type\": \"regex\", \"pattern\": \"x(\\\\d)?y\"}";
  run_builtin(opt, "xy", "", 0, NULL); /* group unset: no answer read */
  const char *uni = "{\"type\": \"regex\", \"pattern\": \"R\xC3\xA9ponse\\\\s*:\\\\s*(\\\\w+)\"}";
  run_builtin(uni, "R\xC3\xA9ponse : \xC3\xA9t\xC3\xA9", "\xC3\xA9t\xC3\xA9", 1, NULL);
  /* catastrophic backtracking hits the match limit and reads as no match, quickly */
  const char *evil = "{\"type\": \"regex\", \"pattern\": \"(a+)+$\"}";
  run_builtin(evil, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab", "a", 0, NULL);
  run_builtin("{\"type\": \"math\"}", "so \\boxed{\\frac{1}{2}}", "0.5", 1, "\\frac{1}{2}");
  run_builtin("{\"type\": \"math\"}", "no idea", "3", 0, NULL);

  /* a raised cancel flag stops a built-in before it starts */
  struct dapo_err e = {0};
  struct judge *j = make(ex, NULL, &e);
  struct judge_item it[2] = {{.response = "1", .answer = "1"}, {.response = "2", .answer = "1"}};
  struct judge_result r[2];
  volatile int cancel = 1;
  CHECK(judge_run(j, NULL, 0, it, 2, r, NULL, &cancel, &e) == DAPO_ECANCELLED);
  CHECK(r[0].err == JE_CANCELLED && r[1].err == JE_CANCELLED);
  cancel = 0;
  CHECK(judge_run(j, NULL, 0, it, 2, r, NULL, &cancel, &e) == 0);
  CHECK(r[0].correct == 1 && r[1].correct == 0 && r[0].err == JE_NONE);
  CHECK(judge_run(j, NULL, 0, it, 0, r, NULL, NULL, &e) == 0);
  CHECK(judge_run(j, NULL, 0, NULL, 1, r, NULL, NULL, &e) == DAPO_EINVAL);
  judge_free(j);
  judge_free(NULL);
  CHECK(!strcmp(judge_err_name(JE_TIMEOUT), "judge_timeout"));
  CHECK(!strcmp(judge_err_name(JE_HTTP), "judge_http_error"));
  CHECK(!strcmp(judge_err_name(JE_CONNECT), "judge_http_error"));
  CHECK(!strcmp(judge_err_name(JE_PARSE), "judge_parse_error"));
  CHECK(!strcmp(judge_err_name(JE_RANGE), "reward_out_of_range"));
}

int main(void) {
  test_math_cases();
  test_extract_normalize();
  test_specs();
  test_allowlist();
  test_exact_regex();
  judge_global_cleanup();
  return check_done("test_judge");
}
