/* bench_tokenizer: encoding speed of our tokenizer (core/text/bpe.c through tokenizer.h) on a
 * corpus, single-threaded and in a batch over threads, as one JSON line. Run by bench/tokenizer.sh
 * beside the reference library (bench_tokenizer.mjs). Never a pass/fail on time. Usage:
 * bench_tokenizer TOKENIZER.json CORPUS.json [THREADS]   (corpus: a JSON array of strings)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "tokenizer.h"

struct job {
  const struct tokenizer *t;
  json_t *texts;
  size_t from, to;
  long ids;
  int failed;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *run(void *p) {
  struct job *j = p;
  int cap = 1 << 16;
  int *ids = malloc((size_t)cap * sizeof *ids);
  for (size_t i = j->from; i < j->to && ids; i++) {
    json_t *v = json_array_get(j->texts, i);
    int n = 0;
    if (tok_encode(j->t, json_string_value(v), json_string_length(v), ids, cap, &n, NULL)) {
      j->failed++;
      continue;
    }
    j->ids += n;
  }
  free(ids);
  return NULL;
}

/* Encodes everything on nth threads; returns seconds, ids in *ids. */
static double pass(const struct tokenizer *t, json_t *texts, int nth, long *ids, int *failed) {
  pthread_t th[64];
  struct job jobs[64];
  size_t n = json_array_size(texts);
  double t0 = now();
  for (int k = 0; k < nth; k++) {
    jobs[k] = (struct job){t, texts, n * (size_t)k / (size_t)nth, n * (size_t)(k + 1) / (size_t)nth,
                           0, 0};
    if (nth == 1)
      run(&jobs[k]);
    else
      pthread_create(&th[k], NULL, run, &jobs[k]);
  }
  *ids = 0;
  *failed = 0;
  for (int k = 0; k < nth; k++) {
    if (nth > 1) pthread_join(th[k], NULL);
    *ids += jobs[k].ids;
    *failed += jobs[k].failed;
  }
  return now() - t0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bench_tokenizer TOKENIZER.json CORPUS.json [THREADS]\n");
    return 2;
  }
  int nth = argc > 3 ? (int)strtol(argv[3], NULL, 10) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (nth < 1 || nth > 64) nth = 1;
  json_error_t je;
  double t0 = now();
  json_t *tj = json_load_file(argv[1], 0, &je);
  struct dapo_err e = {0};
  struct tokenizer *t = tj ? tok_from_json(tj, &e) : NULL;
  double load_s = now() - t0;
  json_t *texts = json_load_file(argv[2], JSON_ALLOW_NUL, &je);
  if (!t || !json_is_array(texts)) {
    fprintf(stderr, "bench_tokenizer: %s\n", t ? je.text : e.msg);
    return 1;
  }
  size_t bytes = 0;
  for (size_t i = 0; i < json_array_size(texts); i++)
    bytes += json_string_length(json_array_get(texts, i));
  long ids = 0;
  int failed = 0;
  double single = 1e30, batch = 1e30;
  for (int rep = 0; rep < 3; rep++) { /* best of three; the first also fills the cache */
    double s = pass(t, texts, 1, &ids, &failed);
    if (s < single) single = s;
    s = pass(t, texts, nth, &ids, &failed);
    if (s < batch) batch = s;
  }
  printf("{\"impl\": \"dapo\", \"bytes\": %zu, \"strings\": %zu, \"ids\": %ld, \"failed\": %d, "
         "\"load_s\": %.3f, \"single_mbps\": %.2f, \"batch_threads\": %d, \"batch_mbps\": %.2f}\n",
         bytes, json_array_size(texts), ids, failed, load_s, bytes / single / 1e6, nth,
         bytes / batch / 1e6);
  json_decref(texts);
  json_decref(tj);
  tok_free(t);
  return failed ? 1 : 0;
}
