/* PyTorch cross-check of the dtype conversions: runs tests/engine/torch_bf16.py with
 * /usr/bin/python3 (Debian's python3-torch), then checks bit for bit that our BF16 and F16 readers
 * equal torch's .float(), and that our float32 -> bfloat16 rounding (direct and through st_write)
 * equals torch's .to(torch.bfloat16) (any NaN for a NaN: torch's vector and scalar paths disagree
 * on the NaN pattern). Exit 77 (skip) when torch is unavailable. Usage: test_torch_bf16
 * [path/to/torch_bf16.py] */
#include "check.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "safetensors.h"

#ifndef DAPO_TORCH_BF16_SCRIPT
#define DAPO_TORCH_BF16_SCRIPT "torch_bf16.py"
#endif
#define PYTHON "/usr/bin/python3"

static char scratch[64];

static void cleanup(const char *a, const char *b) {
  unlink(a);
  unlink(b);
  rmdir(scratch);
}

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* Runs python script out; returns its exit status, 77 if it could not run at all. */
static int run_script(const char *script, const char *out) {
  if (access(PYTHON, X_OK) != 0) {
    fprintf(stderr, "test_torch_bf16: %s not found; skipping\n", PYTHON);
    return 77;
  }
  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    char *argv[] = {PYTHON, (char *)script, (char *)out, NULL};
    execv(PYTHON, argv);
    _exit(77);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* Reads tensor name as float32 into a new buffer of *n floats. */
static float *read_all(struct st_file *f, const char *name, size_t *n) {
  const struct st_info *t = st_find(f, name);
  CHECK_MSG(t != NULL, "tensor '%s' missing from the torch file", name);
  if (!t) return NULL;
  *n = (size_t)t->numel;
  float *v = malloc(*n * sizeof *v);
  struct dapo_err e = {0};
  int rc = v ? st_read_f32(f, t, v, *n, &e) : DAPO_ENOMEM;
  CHECK_MSG(rc == 0, "reading '%s': %s", name, e.msg);
  if (rc) {
    free(v);
    return NULL;
  }
  return v;
}

static uint16_t *read_raw16(struct st_file *f, const char *name, size_t n) {
  const struct st_info *t = st_find(f, name);
  CHECK_MSG(t && t->numel == n, "tensor '%s' missing or of the wrong size", name);
  if (!t || t->numel != n) return NULL;
  uint16_t *v = malloc(n * sizeof *v);
  struct dapo_err e = {0};
  int rc = v ? st_read_raw(f, t, v, n * 2, &e) : DAPO_ENOMEM;
  CHECK_MSG(rc == 0, "reading '%s': %s", name, e.msg);
  if (rc) {
    free(v);
    return NULL;
  }
  return v;
}

/* Counts mismatches, printing the first few. nan_any: two NaNs compare equal. */
static int compare32(const char *what, const float *x, const float *got, const float *want,
                     size_t n, int nan_any) {
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    int ok = bits(got[i]) == bits(want[i]) || (nan_any && isnan(got[i]) && isnan(want[i]));
    if (!ok && bad++ < 5)
      fprintf(stderr, "%s[%zu]: x 0x%08X: got 0x%08X, torch 0x%08X\n", what, i, bits(x[i]),
              bits(got[i]), bits(want[i]));
  }
  return bad;
}

static int compare_bf16(const char *what, const float *x, const uint16_t *got, const uint16_t *want,
                        size_t n) {
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    int nan_g = (got[i] & 0x7FFF) > 0x7F80, nan_w = (want[i] & 0x7FFF) > 0x7F80;
    int ok = got[i] == want[i] || (nan_g && nan_w);
    if (!ok && bad++ < 5)
      fprintf(stderr, "%s[%zu]: x 0x%08X: got 0x%04X, torch 0x%04X\n", what, i, bits(x[i]), got[i],
              want[i]);
  }
  return bad;
}

int main(int argc, char **argv) {
  const char *script = argc > 1 ? argv[1] : DAPO_TORCH_BF16_SCRIPT;
  snprintf(scratch, sizeof scratch, "/tmp/dapo-torch-XXXXXX");
  if (!mkdtemp(scratch)) {
    perror("mkdtemp");
    return 1;
  }
  char ref[128], mine[128];
  snprintf(ref, sizeof ref, "%s/torch.safetensors", scratch);
  snprintf(mine, sizeof mine, "%s/mine.safetensors", scratch);
  int st = run_script(script, ref);
  if (st == 77) {
    fprintf(stderr, "test_torch_bf16: skipped (%s cannot import torch)\n", PYTHON);
    cleanup(ref, mine);
    return 77;
  }
  CHECK_MSG(st == 0, "%s %s exited with %d", PYTHON, script, st);
  if (st != 0) {
    cleanup(ref, mine);
    return check_done("test_torch_bf16");
  }

  struct dapo_err e = {0};
  struct st_file *f = NULL;
  CHECK_MSG(st_open(ref, &f, &e) == 0, "opening torch's file: %s", e.msg);
  size_t n = 0, n2 = 0;
  float *x = NULL, *bf = NULL, *bf_t = NULL, *hf = NULL, *hf_t = NULL, *back = NULL;
  uint16_t *bf_raw = NULL, *mine_raw = NULL, *direct = NULL;
  struct st_file *g = NULL;
  if (!f) goto out;
  x = read_all(f, "x", &n);
  bf = read_all(f, "bf16", &n2);
  bf_t = read_all(f, "bf16_f32", &n2);
  hf = read_all(f, "f16", &n2);
  hf_t = read_all(f, "f16_f32", &n2);
  bf_raw = read_raw16(f, "bf16", n);
  if (!x || !bf || !bf_t || !hf || !hf_t || !bf_raw) goto out;
  fprintf(stderr, "test_torch_bf16: %zu values from torch %s\n", n,
          json_string_value(json_object_get(st_metadata(f), "torch")));

  /* readers: BF16 -> F32 is bits << 16, NaNs included; F16 -> F32 exact */
  CHECK(compare32("bf16 read", x, bf, bf_t, n, 0) == 0);
  CHECK(compare32("f16 read", x, hf, hf_t, n, 1) == 0);
  int nan_bits = 0;
  for (size_t i = 0; i < n; i++) nan_bits += isnan(hf[i]) && bits(hf[i]) != bits(hf_t[i]);
  fprintf(stderr, "test_torch_bf16: %d F16 NaNs with another payload than torch's\n", nan_bits);

  /* our rounding, direct and through the writer */
  direct = malloc(n * sizeof *direct);
  if (!direct) goto out;
  for (size_t i = 0; i < n; i++) direct[i] = st_f32_to_bf16(x[i]);
  CHECK(compare_bf16("st_f32_to_bf16", x, direct, bf_raw, n) == 0);
  struct st_tensor_in t = {.name = "x", .data = x, .ndim = 1, .shape = {(int64_t)n}};
  CHECK_MSG(st_write(mine, &t, 1, ST_BF16, NULL, &e) == 0, "st_write: %s", e.msg);
  CHECK_MSG(st_open(mine, &g, &e) == 0, "reopening: %s", e.msg);
  if (!g) goto out;
  mine_raw = read_raw16(g, "x", n);
  back = read_all(g, "x", &n2);
  if (!mine_raw || !back) goto out;
  CHECK(compare_bf16("st_write BF16", x, mine_raw, bf_raw, n) == 0);
  CHECK(compare32("st_write BF16 read back", x, back, bf_t, n, 1) == 0);

out:
  st_close(f);
  st_close(g);
  free(x);
  free(bf);
  free(bf_t);
  free(hf);
  free(hf_t);
  free(back);
  free(bf_raw);
  free(mine_raw);
  free(direct);
  cleanup(ref, mine);
  return check_done("test_torch_bf16");
}
