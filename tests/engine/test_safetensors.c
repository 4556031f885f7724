/* safetensors reader/writer and checkpoint folders: bit-exact round trips (Llama tied/untied,
 * Qwen2 with biases and GQA), BF16 rounding and F16 widening on hand-picked values, every kind
 * of malformed file rejected with a message naming the problem, atomic saves, sharded loads and
 * the optimizer-state files. Scratch files live under a mkdtemp folder in /tmp. */
#include "check.h"

#include <dirent.h>
#include <ftw.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "model.h"
#include "safetensors.h"

static char scratch[64];

static void path_in(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", scratch, name);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p);
}

static void rm_tree(const char *p) {
  nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static float from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static void write_bytes(const char *path, const void *data, size_t len) {
  FILE *fp = fopen(path, "wb");
  CHECK(fp != NULL);
  if (!fp) return;
  CHECK(fwrite(data, 1, len, fp) == len);
  fclose(fp);
}

/* A safetensors file from a header string (header length field = hlen_field, or the real length
 * when hlen_field is 0) and dlen bytes of data. */
static void write_raw(const char *path, const char *header, uint64_t hlen_field, const void *data,
                      size_t dlen) {
  size_t hl = strlen(header);
  uint64_t field = hlen_field ? hlen_field : hl;
  FILE *fp = fopen(path, "wb");
  CHECK(fp != NULL);
  if (!fp) return;
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(field >> (8 * i));
  CHECK(fwrite(lb, 1, 8, fp) == 8);
  CHECK(fwrite(header, 1, hl, fp) == hl);
  if (dlen) CHECK(fwrite(data, 1, dlen, fp) == dlen);
  fclose(fp);
}

static void expect_open_fail(const char *what, const char *header, uint64_t hlen_field, size_t dlen,
                             const char *needle) {
  char p[128];
  path_in(p, sizeof p, "bad.safetensors");
  unsigned char zeros[512] = {0};
  write_raw(p, header, hlen_field, zeros, dlen);
  struct st_file *f = (struct st_file *)1;
  struct dapo_err e = {0};
  int rc = st_open(p, &f, &e);
  CHECK_MSG(rc < 0, "%s: st_open accepted a bad file", what);
  CHECK(f == NULL);
  CHECK_MSG(strstr(e.msg, needle) != NULL, "%s: message '%s' lacks '%s'", what, e.msg, needle);
  CHECK_MSG(strstr(e.msg, "bad.safetensors") != NULL, "%s: message '%s' does not name the file",
            what, e.msg);
  if (rc == 0) st_close(f);
}

static struct model_config small_config(enum model_arch arch, int tied) {
  struct model_config c = {
      .arch = arch,
      .vocab_size = 37,
      .hidden_size = 16,
      .intermediate_size = 24,
      .num_layers = 2,
      .num_heads = 4,
      .num_kv_heads = 2,
      .head_dim = 4,
      .max_position_embeddings = 64,
      .rms_norm_eps = 1e-5f,
      .rope_theta = 10000.0f,
      .tie_word_embeddings = tied,
      .qkv_bias = arch == ARCH_QWEN2,
      .bos_token_id = 1,
      .eos_token_id = 2,
      .initializer_range = 0.02f,
  };
  return c;
}

static struct model *random_model(enum model_arch arch, int tied, uint64_t seed) {
  struct model_config c = small_config(arch, tied);
  struct dapo_err e = {0};
  struct model *m = model_new(&c, &e);
  CHECK_MSG(m != NULL, "model_new: %s", e.msg);
  if (m) {
    model_init_random(m, seed);
    /* distinct non-trivial norms and biases, so that a mix-up would show */
    for (size_t i = 0; i < m->n_params; i++)
      if (m->params[i] == 1.0f || m->params[i] == 0.0f) m->params[i] = 0.5f + 1e-3f * (float)i;
  }
  return m;
}

/* Every row of b equals a's, bit for bit; with bf16, a's values rounded through bfloat16. */
static int same_params(const struct model *a, const struct model *b, int bf16) {
  if (a->n_tensors != b->n_tensors || a->n_params != b->n_params) return 0;
  for (int i = 0; i < a->n_tensors; i++) {
    const struct param_info *r = &a->tensors[i];
    if (strcmp(r->name, b->tensors[i].name)) return 0;
    for (size_t k = 0; k < r->numel; k++) {
      float want = a->params[r->offset + k];
      if (bf16) want = st_bf16_to_f32(st_f32_to_bf16(want));
      if (bits(want) != bits(b->params[r->offset + k])) {
        fprintf(stderr, "%s[%zu]: %a vs %a\n", r->name, k, (double)want,
                (double)b->params[r->offset + k]);
        return 0;
      }
    }
  }
  return 1;
}

static char *slurp(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, fp);
  buf[n] = '\0';
  fclose(fp);
  return buf;
}

static void test_roundtrip(enum model_arch arch, int tied, int bf16) {
  char dir[128], p[160];
  snprintf(dir, sizeof dir, "%s/ckpt-%d-%d-%d", scratch, (int)arch, tied, bf16);
  struct model *m = random_model(arch, tied, 1234 + (uint64_t)arch * 10 + (uint64_t)tied);
  if (!m) return;
  struct dapo_err e = {0};
  const char *tok = "{\"model\": {\"type\": \"BPE\"}}";
  int rc = ckpt_save(dir, m, bf16 ? tok : NULL, NULL, bf16, &e);
  CHECK_MSG(rc == 0, "ckpt_save: %s", e.msg);

  /* the safetensors file itself: names, tied lm_head absent, metadata, header alignment */
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  struct st_file *f = NULL;
  rc = st_open(p, &f, &e);
  CHECK_MSG(rc == 0, "st_open: %s", e.msg);
  if (f) {
    CHECK(st_count(f) == m->n_tensors);
    CHECK((st_find(f, "lm_head.weight") != NULL) == !tied);
    const struct st_info *q = st_find(f, "model.layers.1.self_attn.q_proj.weight");
    CHECK(q && q->ndim == 2 && q->shape[0] == 16 && q->shape[1] == 16);
    const struct st_info *k = st_find(f, "model.layers.1.self_attn.k_proj.weight");
    CHECK(k && k->shape[0] == 8 && k->shape[1] == 16 && k->dtype == (bf16 ? ST_BF16 : ST_F32));
    CHECK((st_find(f, "model.layers.0.self_attn.v_proj.bias") != NULL) == (arch == ARCH_QWEN2));
    CHECK(json_is_string(json_object_get(st_metadata(f), "format")) &&
          !strcmp(json_string_value(json_object_get(st_metadata(f), "format")), "pt"));
    for (int i = 1; i < st_count(f); i++) CHECK(st_at(f, i)->begin >= st_at(f, i - 1)->end);
    st_close(f);
  }
  FILE *fp = fopen(p, "rb");
  unsigned char lb[8] = {0};
  if (fp) {
    CHECK(fread(lb, 1, 8, fp) == 8);
    fclose(fp);
  }
  CHECK(lb[0] % 8 == 0);

  snprintf(p, sizeof p, "%s/config.json", dir);
  char *cfg = slurp(p);
  CHECK(cfg && strstr(cfg, bf16 ? "\"bfloat16\"" : "\"float32\""));
  snprintf(p, sizeof p, "%s/generation_config.json", dir);
  char *gen = slurp(p);
  CHECK(gen && strstr(gen, "\"bos_token_id\": 1") && strstr(gen, "\"eos_token_id\": 2"));
  snprintf(p, sizeof p, "%s/tokenizer.json", dir);
  CHECK(access(p, F_OK) == (bf16 ? 0 : -1));

  struct model *m2 = NULL;
  char *tok2 = (char *)1;
  rc = ckpt_load(dir, &m2, &tok2, &e);
  CHECK_MSG(rc == 0, "ckpt_load: %s", e.msg);
  if (m2) {
    CHECK(m2->cfg.arch == arch && m2->cfg.tie_word_embeddings == tied);
    CHECK(m2->cfg.qkv_bias == (arch == ARCH_QWEN2) && m2->cfg.num_kv_heads == 2);
    CHECK(m2->cfg.rms_norm_eps == m->cfg.rms_norm_eps && m2->cfg.rope_theta == 10000.0f);
    CHECK(m2->cfg.bos_token_id == 1 && m2->cfg.eos_token_id == 2);
    CHECK_MSG(same_params(m, m2, bf16), "arch %d tied %d bf16 %d: parameters differ", (int)arch,
              tied, bf16);
    CHECK((m2->w.lm_head == m2->w.tok_emb) == tied);
  }
  if (bf16)
    CHECK(tok2 && !strcmp(tok2, tok));
  else
    CHECK(tok2 == NULL);
  free(tok2);
  model_free(m2);
  model_free(m);
}

/* Hand-picked float32 inputs and PyTorch's round-to-nearest-even bfloat16 results. */
static void test_bf16_values(void) {
  static const struct {
    uint32_t in;
    uint16_t out; /* 0xFFFF: any NaN */
  } cases[] = {
      {0x3F800000, 0x3F80},                       /* 1 */
      {0x3F808000, 0x3F80},                       /* tie, even below: down */
      {0x3F818000, 0x3F82},                       /* tie, odd below: up */
      {0x3F808001, 0x3F81},                       /* just above the tie */
      {0x3F807FFF, 0x3F80},                       /* just below the tie */
      {0xBF818000, 0xBF82},                       /* negative tie */
      {0x00000000, 0x0000}, {0x80000000, 0x8000}, /* -0 */
      {0x7F800000, 0x7F80},                       /* inf */
      {0xFF800000, 0xFF80},                       /* -inf */
      {0x7F7FFFFF, 0x7F80},                       /* FLT_MAX rounds to inf */
      {0xFF7FFFFF, 0xFF80}, {0x7F7F0000, 0x7F7F}, /* largest bfloat16 */
      {0x7F7F7FFF, 0x7F7F}, {0x7F7F8000, 0x7F80}, /* tie at the top, odd: to inf */
      {0x7F7E8000, 0x7F7E},                       /* tie at the top, even: stays */
      {0x00000001, 0x0000},                       /* smallest subnormal */
      {0x00008000, 0x0000},                       /* subnormal tie, even */
      {0x00018000, 0x0002},                       /* subnormal tie, odd */
      {0x00008001, 0x0001}, {0x007FFFFF, 0x0080}, /* largest subnormal rounds up to FLT_MIN */
      {0x00400000, 0x0040}, {0x80010000, 0x8001}, /* negative subnormal exact */
      {0x7FC00000, 0xFFFF},                       /* quiet NaN */
      {0xFFC00001, 0xFFFF},                       /* negative NaN */
      {0x7F800001, 0xFFFF}, /* signalling NaN: plain rounding would make it inf */
      {0x7FFFFFFF, 0xFFFF}, /* would wrap to -0 without the NaN check */
  };
  enum { N = sizeof cases / sizeof cases[0] };
  float in[N];
  for (int i = 0; i < N; i++) {
    in[i] = from_bits(cases[i].in);
    uint16_t got = st_f32_to_bf16(in[i]);
    if (cases[i].out == 0xFFFF)
      CHECK_MSG(got == 0x7FC0, "bf16(0x%08X) = 0x%04X, want NaN 0x7FC0", cases[i].in, got);
    else
      CHECK_MSG(got == cases[i].out, "bf16(0x%08X) = 0x%04X, want 0x%04X", cases[i].in, got,
                cases[i].out);
  }
  /* through the file writer and reader */
  char p[128];
  path_in(p, sizeof p, "bf16.safetensors");
  struct st_tensor_in t = {.name = "v", .data = in, .ndim = 1, .shape = {N}};
  struct dapo_err e = {0};
  CHECK_MSG(st_write(p, &t, 1, ST_BF16, NULL, &e) == 0, "st_write: %s", e.msg);
  struct st_file *f = NULL;
  CHECK_MSG(st_open(p, &f, &e) == 0, "st_open: %s", e.msg);
  if (!f) return;
  const struct st_info *v = st_find(f, "v");
  CHECK(v && v->dtype == ST_BF16 && v->numel == N && v->end - v->begin == 2 * N);
  uint16_t raw[N];
  float back[N];
  CHECK(v && st_read_raw(f, v, raw, sizeof raw, &e) == 0);
  CHECK(v && st_read_f32(f, v, back, N, &e) == 0);
  for (int i = 0; i < N; i++) {
    uint16_t want = cases[i].out == 0xFFFF ? 0x7FC0 : cases[i].out;
    CHECK_MSG(raw[i] == want, "file bf16[%d] = 0x%04X, want 0x%04X", i, raw[i], want);
    if (cases[i].out == 0xFFFF)
      CHECK(isnan(back[i]));
    else
      CHECK_MSG(bits(back[i]) == (uint32_t)want << 16, "read bf16[%d] = 0x%08X", i, bits(back[i]));
  }
  /* wrong element count is refused */
  CHECK(v && st_read_f32(f, v, back, N - 1, &e) == DAPO_EINVAL && strstr(e.msg, "'v'"));
  CHECK(st_read_f32_by_name(f, "nope", back, N, &e) == DAPO_EINVAL && strstr(e.msg, "'nope'"));
  st_close(f);
}

static void test_f16_read(void) {
  static const struct {
    uint16_t h;
    uint32_t f; /* expected float32 bits; 0xFFFFFFFF: NaN */
  } cases[] = {
      {0x0000, 0x00000000}, {0x8000, 0x80000000}, /* +-0 */
      {0x3C00, 0x3F800000}, {0xC000, 0xC0000000}, /* 1, -2 */
      {0x3555, 0x3EAAA000},                       /* 0.333251953125 */
      {0x7BFF, 0x477FE000},                       /* 65504 */
      {0x0400, 0x38800000},                       /* 2^-14, smallest normal */
      {0x0001, 0x33800000},                       /* 2^-24, smallest subnormal */
      {0x03FF, 0x387FC000},                       /* largest subnormal 1023 * 2^-24 */
      {0x8200, 0xB8000000},                       /* -2^-15 */
      {0x7C00, 0x7F800000}, {0xFC00, 0xFF800000}, /* +-inf */
      {0x7E00, 0xFFFFFFFF}, {0xFD01, 0xFFFFFFFF}, /* NaNs */
  };
  enum { N = sizeof cases / sizeof cases[0] };
  unsigned char data[2 * N];
  for (int i = 0; i < N; i++) {
    data[2 * i] = (unsigned char)(cases[i].h & 0xFF);
    data[2 * i + 1] = (unsigned char)(cases[i].h >> 8);
  }
  char header[160], p[128];
  snprintf(header, sizeof header,
           "{\"__metadata__\":{\"k\":\"v\"},\"h\":{\"dtype\":\"F16\",\"shape\":[2,%d],"
           "\"data_offsets\":[0,%d]}}  ",
           N / 2, 2 * N);
  path_in(p, sizeof p, "f16.safetensors");
  write_raw(p, header, 0, data, sizeof data);
  struct st_file *f = NULL;
  struct dapo_err e = {0};
  CHECK_MSG(st_open(p, &f, &e) == 0, "st_open: %s", e.msg);
  if (!f) return;
  CHECK(!strcmp(json_string_value(json_object_get(st_metadata(f), "k")), "v"));
  float out[N];
  CHECK_MSG(st_read_f32_by_name(f, "h", out, N, &e) == 0, "read: %s", e.msg);
  for (int i = 0; i < N; i++) {
    float direct = st_f16_to_f32(cases[i].h);
    if (cases[i].f == 0xFFFFFFFF) {
      CHECK_MSG(isnan(out[i]) && isnan(direct), "f16 0x%04X should be NaN", cases[i].h);
      CHECK((bits(out[i]) >> 31) == (uint32_t)(cases[i].h >> 15)); /* sign kept */
    } else {
      CHECK_MSG(bits(out[i]) == cases[i].f, "f16 0x%04X -> 0x%08X, want 0x%08X", cases[i].h,
                bits(out[i]), cases[i].f);
    }
  }
  /* every finite half against ldexp arithmetic */
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; h++) {
    int ex = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (ex == 0x1F) continue;
    double v = ex ? ldexp(1024 + man, ex - 25) : ldexp(man, -24);
    if (h & 0x8000) v = -v;
    if (st_f16_to_f32((uint16_t)h) != (float)v ||
        !signbit(st_f16_to_f32((uint16_t)h)) != !signbit(v))
      bad++;
  }
  CHECK_MSG(bad == 0, "%d finite halves convert wrongly", bad);
  st_close(f);
}

static void test_bad_files(void) {
  const char *ok_t = "\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}";
  char h[512];

  /* truncated data: the declared region no longer fits */
  snprintf(h, sizeof h, "{%s}", ok_t);
  expect_open_fail("truncated", h, 0, 10, "exceed the data region (10 bytes");
  /* header length larger than the file */
  expect_open_fail("hlen > file", h, 4096, 16, "header length 4096");
  expect_open_fail("hlen huge", h, (uint64_t)1 << 40, 16, "header length");
  expect_open_fail("hlen < 2", h, 1, 16, "header length 1 ");
  {
    char p[128];
    path_in(p, sizeof p, "bad.safetensors");
    write_bytes(p, "\x02\0\0", 3);
    struct st_file *f = NULL;
    struct dapo_err e = {0};
    CHECK(st_open(p, &f, &e) == DAPO_EFORMAT && strstr(e.msg, "too short"));
    path_in(p, sizeof p, "absent.safetensors");
    CHECK(st_open(p, &f, &e) == DAPO_EIO && strstr(e.msg, "absent.safetensors: cannot open"));
  }
  /* header not JSON, not an object, duplicate keys */
  expect_open_fail("not json", "{\"t\": [1, 2", 0, 16, "not valid JSON");
  expect_open_fail("not object", "[1, 2]  ", 0, 16, "not a JSON object");
  snprintf(h, sizeof h, "{%s,%s}", ok_t, ok_t);
  expect_open_fail("duplicate", h, 0, 16, "not valid JSON");
  /* offsets past the data region */
  expect_open_fail("past end",
                   "{\"x\":{\"dtype\":\"F32\",\"shape\":[10,10],\"data_offsets\":[0,400]}}", 0, 256,
                   "tensor 'x': data_offsets [0, 400) exceed the data region (256 bytes");
  /* overlapping tensors */
  expect_open_fail("overlap",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                   0, 32, "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
  expect_open_fail("overlap inside",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
                   "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   0, 32, "overlap");
  /* offsets inconsistent with the shape */
  expect_open_fail("size mismatch",
                   "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 0, 16,
                   "tensor 'x': data_offsets [0, 12) hold 12 bytes but shape [2, 2] of F32 needs "
                   "16");
  expect_open_fail("begin > end",
                   "{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 0, 16,
                   "begin after end");
  expect_open_fail("offsets not ints",
                   "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 0, 16,
                   "tensor 'x': data_offsets must be two");
  /* unknown dtype, bad shapes, bad metadata */
  expect_open_fail("unknown dtype",
                   "{\"x\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 16,
                   "tensor 'x': unknown dtype 'F99'");
  expect_open_fail("negative dim",
                   "{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 0, 16,
                   "tensor 'x': shape[0] is not a non-negative integer");
  expect_open_fail("ndim 9",
                   "{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                   "\"data_offsets\":[0,1]}}",
                   0, 16, "9 dimensions");
  expect_open_fail("overflow",
                   "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
                   "\"data_offsets\":[0,4]}}",
                   0, 16, "tensor 'x': shape overflows");
  expect_open_fail("metadata value",
                   "{\"__metadata__\":{\"a\":1},"
                   "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                   0, 16, "__metadata__['a'] is not a string");
  expect_open_fail("entry not object", "{\"x\":3}", 0, 16, "tensor 'x': entry is not");

  /* recognised dtype that does not convert */
  char p[128];
  path_in(p, sizeof p, "i64.safetensors");
  unsigned char zeros[64] = {0};
  write_raw(p, "{\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 0, zeros, 16);
  struct st_file *f = NULL;
  struct dapo_err e = {0};
  CHECK_MSG(st_open(p, &f, &e) == 0, "I64 file should open: %s", e.msg);
  if (f) {
    float out[2];
    CHECK(st_find(f, "ids")->dtype == ST_I64);
    CHECK(st_read_f32_by_name(f, "ids", out, 2, &e) == DAPO_EUNSUPPORTED);
    CHECK_MSG(strstr(e.msg, "tensor 'ids': dtype I64 cannot be converted"), "%s", e.msg);
    st_close(f);
  }
  /* writer rejects duplicates and bad dtypes and leaves no file */
  float one = 1;
  struct st_tensor_in dup[2] = {{.name = "a", .data = &one, .ndim = 0},
                                {.name = "a", .data = &one, .ndim = 0}};
  path_in(p, sizeof p, "dup.safetensors");
  CHECK(st_write(p, dup, 2, ST_F32, NULL, &e) == DAPO_EINVAL && strstr(e.msg, "duplicate"));
  CHECK(access(p, F_OK) != 0);
  CHECK(st_write(p, dup, 1, ST_F16, NULL, &e) == DAPO_EINVAL);
  path_in(p, sizeof p, "no-such-dir/x.safetensors");
  CHECK(st_write(p, dup, 1, ST_F32, NULL, &e) == DAPO_EIO && strstr(e.msg, "No such file"));
}

/* Writes model.safetensors in dir from m's rows, with one row dropped, one extra tensor, or one
 * row's shape changed (its data truncated accordingly). */
static void rewrite_weights(const char *dir, const struct model *m, const char *drop,
                            const char *extra, const char *reshape) {
  struct st_tensor_in ts[64];
  int n = 0;
  static float pad[64];
  for (int i = 0; i < m->n_tensors && n < 63; i++) {
    const struct param_info *r = &m->tensors[i];
    if (drop && !strcmp(r->name, drop)) continue;
    ts[n] = (struct st_tensor_in){.name = r->name, .data = m->params + r->offset, .ndim = r->ndim};
    for (int k = 0; k < r->ndim; k++) ts[n].shape[k] = r->shape[k];
    if (reshape && !strcmp(r->name, reshape)) ts[n].shape[r->ndim - 1] /= 2;
    n++;
  }
  if (extra) ts[n++] = (struct st_tensor_in){.name = extra, .data = pad, .ndim = 1, .shape = {4}};
  char p[192];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  struct dapo_err e = {0};
  CHECK_MSG(st_write(p, ts, n, ST_F32, NULL, &e) == 0, "rewrite: %s", e.msg);
}

static void expect_load_fail(const char *what, const char *dir, const char *needle) {
  struct model *m = (struct model *)1;
  char *tok = (char *)1;
  struct dapo_err e = {0};
  int rc = ckpt_load(dir, &m, &tok, &e);
  CHECK_MSG(rc < 0, "%s: ckpt_load accepted it", what);
  CHECK(m == NULL && tok == NULL);
  CHECK_MSG(strstr(e.msg, needle) != NULL, "%s: message '%s' lacks '%s'", what, e.msg, needle);
  if (rc == 0) model_free(m);
}

static void test_bad_checkpoints(void) {
  char dir[128], p[192];
  snprintf(dir, sizeof dir, "%s/bad-ckpt", scratch);
  struct model *m = random_model(ARCH_QWEN2, 1, 99);
  if (!m) return;
  struct dapo_err e = {0};
  CHECK_MSG(ckpt_save(dir, m, NULL, NULL, 0, &e) == 0, "save: %s", e.msg);

  rewrite_weights(dir, m, "model.norm.weight", NULL, NULL);
  expect_load_fail("missing", dir, "model.safetensors: missing tensor 'model.norm.weight'");
  rewrite_weights(dir, m, NULL, "model.layers.0.mlp.extra.weight", NULL);
  expect_load_fail("unexpected", dir,
                   "model.safetensors: unexpected tensor 'model.layers.0.mlp.extra.weight'");
  rewrite_weights(dir, m, NULL, NULL, "model.layers.1.mlp.up_proj.weight");
  expect_load_fail("shape", dir,
                   "tensor 'model.layers.1.mlp.up_proj.weight': shape [24, 8] in the file but "
                   "config.json implies [24, 16]");

  /* ignored extras: RoPE buffers, and lm_head.weight of a tied model */
  rewrite_weights(dir, m, NULL, "model.layers.0.self_attn.rotary_emb.inv_freq", NULL);
  struct model *m2 = NULL;
  CHECK_MSG(ckpt_load(dir, &m2, NULL, &e) == 0, "inv_freq should be ignored: %s", e.msg);
  CHECK(m2 && same_params(m, m2, 0));
  model_free(m2);
  m2 = NULL;
  rewrite_weights(dir, m, NULL, "lm_head.weight", NULL);
  CHECK_MSG(ckpt_load(dir, &m2, NULL, &e) == 0, "tied lm_head should be ignored: %s", e.msg);
  model_free(m2);

  /* a model tensor stored as I64 */
  {
    json_t *h = json_object();
    uint64_t off = 0;
    for (int i = 0; i < m->n_tensors; i++) {
      const struct param_info *r = &m->tensors[i];
      int i64 = !strcmp(r->name, "model.layers.0.input_layernorm.weight");
      uint64_t bytes = r->numel * (i64 ? 8 : 4);
      json_t *shape = r->ndim == 2
                          ? json_pack("[I,I]", (json_int_t)r->shape[0], (json_int_t)r->shape[1])
                          : json_pack("[I]", (json_int_t)r->shape[0]);
      json_object_set_new(h, r->name,
                          json_pack("{s:s,s:o,s:[I,I]}", "dtype", i64 ? "I64" : "F32", "shape",
                                    shape, "data_offsets", (json_int_t)off,
                                    (json_int_t)(off + bytes)));
      off += bytes;
    }
    char *hs = json_dumps(h, JSON_COMPACT);
    unsigned char *zeros = calloc(off, 1);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_raw(p, hs, 0, zeros, off);
    free(zeros);
    free(hs);
    json_decref(h);
    expect_load_fail("I64", dir,
                     "tensor 'model.layers.0.input_layernorm.weight': dtype I64 cannot be "
                     "converted");
  }

  /* sharded: two good shards, then an index escaping the folder */
  {
    struct st_tensor_in a[64], b[64];
    int na = 0, nb = 0;
    json_t *wm = json_object();
    for (int i = 0; i < m->n_tensors; i++) {
      const struct param_info *r = &m->tensors[i];
      int first = i < m->n_tensors / 2;
      struct st_tensor_in *t = first ? &a[na++] : &b[nb++];
      *t = (struct st_tensor_in){.name = r->name, .data = m->params + r->offset, .ndim = r->ndim};
      for (int k = 0; k < r->ndim; k++) t->shape[k] = r->shape[k];
      json_object_set_new(wm, r->name,
                          json_string(first ? "model-00001-of-00002.safetensors"
                                            : "model-00002-of-00002.safetensors"));
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    CHECK(st_write(p, a, na, ST_BF16, NULL, &e) == 0);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    CHECK(st_write(p, b, nb, ST_F32, NULL, &e) == 0);
    json_t *idx = json_pack("{s:{s:i},s:o}", "metadata", "total_size", 0, "weight_map", wm);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    CHECK(json_dump_file(idx, p, 0) == 0);
    m2 = NULL;
    CHECK_MSG(ckpt_load(dir, &m2, NULL, &e) == 0, "sharded load: %s", e.msg);
    if (m2) {
      for (int i = 0; i < m->n_tensors; i++) {
        const struct param_info *r = &m->tensors[i];
        int first = i < m->n_tensors / 2, same = 1;
        for (size_t k = 0; k < r->numel; k++) {
          float want = m->params[r->offset + k];
          if (first) want = st_bf16_to_f32(st_f32_to_bf16(want));
          same &= bits(want) == bits(m2->params[r->offset + k]);
        }
        CHECK_MSG(same, "sharded tensor %s differs", r->name);
      }
      model_free(m2);
    }
    /* a tensor listed in the index but absent from its shard */
    json_object_set_new(wm, "model.norm.weight", json_string("model-00001-of-00002.safetensors"));
    CHECK(json_dump_file(idx, p, 0) == 0);
    expect_load_fail("shard lacks tensor", dir,
                     "model-00001-of-00002.safetensors: missing tensor 'model.norm.weight'");
    json_object_del(wm, "model.norm.weight");
    CHECK(json_dump_file(idx, p, 0) == 0);
    expect_load_fail("index lacks tensor", dir,
                     "model.safetensors.index.json: missing tensor 'model.norm.weight'");
    json_object_set_new(wm, "model.norm.weight", json_string("../x"));
    CHECK(json_dump_file(idx, p, 0) == 0);
    expect_load_fail("escaping shard", dir, "shard '../x' is not a plain file name");
    json_object_set_new(wm, "model.norm.weight", json_string("sub/x.safetensors"));
    CHECK(json_dump_file(idx, p, 0) == 0);
    expect_load_fail("shard in subfolder", dir, "shard 'sub/x.safetensors'");
    json_decref(idx);
    unlink(p);
    expect_load_fail("no weights", dir, "neither model.safetensors nor");
  }

  /* config.json broken, then absent */
  snprintf(p, sizeof p, "%s/config.json", dir);
  write_bytes(p, "{\"model_type\": \"llama\",", 23);
  expect_load_fail("config not JSON", dir, "config.json: not valid JSON");
  write_bytes(p, "{\"model_type\": \"gpt2\"}", 22);
  expect_load_fail("config arch", dir, "config.model_type: 'gpt2'");
  unlink(p);
  expect_load_fail("config absent", dir, "config.json: cannot open");
  model_free(m);
}

/* Mutated and truncated copies of a valid file: st_open must never crash or read out of bounds
 * (run under ASan); whatever opens must read back in bounds or fail cleanly. */
static void test_mutations(void) {
  const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                  "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                  "\"c\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[32,38]}}";
  size_t hl = strlen(h), total = 8 + hl + 40;
  unsigned char good[512], buf[512];
  CHECK(total <= sizeof good);
  memset(good, 0, sizeof good);
  for (int i = 0; i < 8; i++) good[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  memcpy(good + 8, h, hl);
  for (size_t i = 8 + hl; i < total; i++) good[i] = (unsigned char)(i * 37);
  char p[128];
  path_in(p, sizeof p, "mut.safetensors");
  uint64_t r = 0x9E3779B97F4A7C15u;
  int opened = 0, rejected = 0;
  for (int it = 0; it < 3000; it++) {
    memcpy(buf, good, total);
    size_t len = total;
    r = r * 6364136223846793005u + 1442695040888963407u;
    if (it % 4 == 0) {
      len = (size_t)(r >> 33) % total; /* truncate */
    } else {
      int flips = 1 + (int)((r >> 20) % 4);
      for (int k = 0; k < flips; k++) {
        r = r * 6364136223846793005u + 1442695040888963407u;
        size_t at = (size_t)(r >> 33) % (8 + hl);
        static const char alphabet[] = "0123456789-,[]{}\":eE FIBU8_";
        buf[at] = (r >> 8) & 1 ? (unsigned char)alphabet[(r >> 12) % (sizeof alphabet - 1)]
                               : (unsigned char)(r >> 40);
      }
    }
    write_bytes(p, buf, len);
    struct st_file *f = NULL;
    struct dapo_err e = {0};
    if (st_open(p, &f, &e) != 0) {
      CHECK(f == NULL && e.msg[0] != '\0');
      rejected++;
      continue;
    }
    opened++;
    for (int i = 0; i < st_count(f); i++) {
      const struct st_info *t = st_at(f, i);
      CHECK(t->end >= t->begin && st_find(f, t->name) == t);
      float *dst = malloc((size_t)t->numel * sizeof(float) + 1);
      if (dst) (void)st_read_f32(f, t, dst, (size_t)t->numel, &e);
      free(dst);
    }
    st_close(f);
  }
  CHECK_MSG(opened > 10 && rejected > 500, "opened %d, rejected %d", opened, rejected);
}

static int count_tmp_entries(void) {
  DIR *d = opendir(scratch);
  int n = 0;
  struct dirent *de;
  while (d && (de = readdir(d)))
    if (strstr(de->d_name, ".tmp-")) n++;
  if (d) closedir(d);
  return n;
}

static void test_atomic_save(void) {
  char dir[128], p[192];
  snprintf(dir, sizeof dir, "%s/existing", scratch);
  CHECK(mkdir(dir, 0755) == 0);
  snprintf(p, sizeof p, "%s/marker", dir);
  write_bytes(p, "keep", 4);
  struct model *m = random_model(ARCH_LLAMA, 0, 5);
  if (!m) return;
  struct dapo_err e = {0};
  int rc = ckpt_save(dir, m, NULL, NULL, 0, &e);
  CHECK(rc == DAPO_EINVAL);
  CHECK_MSG(strstr(e.msg, dir) && strstr(e.msg, "already exists"), "%s", e.msg);
  char *marker = slurp(p);
  CHECK(marker && !strcmp(marker, "keep"));
  snprintf(p, sizeof p, "%s/config.json", dir);
  CHECK(access(p, F_OK) != 0);
  /* also with a trailing slash */
  char dir2[140];
  snprintf(dir2, sizeof dir2, "%s/", dir);
  CHECK(ckpt_save(dir2, m, NULL, NULL, 0, &e) == DAPO_EINVAL);
  /* a failure midway (parent missing) leaves nothing */
  snprintf(dir2, sizeof dir2, "%s/missing/ckpt", scratch);
  CHECK(ckpt_save(dir2, m, NULL, NULL, 0, &e) == DAPO_EIO);
  CHECK(count_tmp_entries() == 0);
  /* an explicit generation config is written as given */
  snprintf(dir2, sizeof dir2, "%s/with-gen", scratch);
  json_t *gen = json_pack("{s:f,s:i}", "temperature", 0.5, "eos_token_id", 7);
  CHECK(ckpt_save(dir2, m, NULL, gen, 1, &e) == 0);
  json_decref(gen);
  snprintf(p, sizeof p, "%s/generation_config.json", dir2);
  char *g = slurp(p);
  CHECK(g && strstr(g, "\"temperature\": 0.5") && strstr(g, "\"eos_token_id\": 7"));
  CHECK(count_tmp_entries() == 0);
  model_free(m);
}

static void test_optimizer_tensors(void) {
  struct model *m = random_model(ARCH_QWEN2, 0, 77);
  if (!m) return;
  float *b1 = dapo_alloc_floats(m->n_params), *b2 = dapo_alloc_floats(m->n_params);
  float *r1 = dapo_alloc_floats(m->n_params), *r2 = dapo_alloc_floats(m->n_params);
  for (size_t i = 0; i < m->n_params; i++) {
    b1[i] = m->params[i] * 3.0f;
    b2[i] = from_bits(0x00000001u + (uint32_t)i); /* subnormals must survive untouched */
  }
  const char *pre[2] = {"exp_avg.", "exp_avg_sq."};
  const float *in[2] = {b1, b2};
  float *out[2] = {r1, r2};
  char p[128];
  path_in(p, sizeof p, "optimizer.safetensors");
  json_t *meta = json_pack("{s:s}", "step", "12");
  struct dapo_err e = {0};
  CHECK_MSG(ckpt_save_tensors(p, m, 2, pre, in, meta, &e) == 0, "save: %s", e.msg);
  /* saving again replaces the file atomically */
  CHECK_MSG(ckpt_save_tensors(p, m, 2, pre, in, meta, &e) == 0, "resave: %s", e.msg);
  CHECK(count_tmp_entries() == 0);
  json_decref(meta);
  json_t *mo = NULL;
  CHECK_MSG(ckpt_load_tensors(p, m, 2, pre, out, &mo, &e) == 0, "load: %s", e.msg);
  CHECK(mo && !strcmp(json_string_value(json_object_get(mo, "step")), "12"));
  json_decref(mo);
  int same = 1;
  for (int t = 0; t < m->n_tensors; t++) {
    const struct param_info *r = &m->tensors[t];
    for (size_t k = 0; k < r->numel; k++)
      same &= bits(r1[r->offset + k]) == bits(b1[r->offset + k]) &&
              bits(r2[r->offset + k]) == bits(b2[r->offset + k]);
  }
  CHECK_MSG(same, "optimizer buffers differ after the round trip");
  /* a model with another shape, or other prefixes, is refused by name */
  const char *wrong[1] = {"exp_avg."};
  CHECK(ckpt_load_tensors(p, m, 1, wrong, out, NULL, &e) == DAPO_EFORMAT);
  CHECK_MSG(strstr(e.msg, "unexpected tensor 'exp_avg_sq."), "%s", e.msg);
  const char *three[3] = {"exp_avg.", "exp_avg_sq.", "extra."};
  float *out3[3] = {r1, r2, r1};
  CHECK(ckpt_load_tensors(p, m, 3, three, out3, NULL, &e) == DAPO_EFORMAT);
  CHECK_MSG(strstr(e.msg, "missing tensor 'extra.model.embed_tokens.weight'"), "%s", e.msg);
  struct model *tied = random_model(ARCH_QWEN2, 1, 77);
  if (tied) {
    CHECK(ckpt_load_tensors(p, tied, 2, pre, out, NULL, &e) == DAPO_EFORMAT);
    CHECK_MSG(strstr(e.msg, "unexpected tensor 'exp_avg.lm_head.weight'"), "%s", e.msg);
    model_free(tied);
  }
  free(b1);
  free(b2);
  free(r1);
  free(r2);
  model_free(m);
}

int main(void) {
  snprintf(scratch, sizeof scratch, "/tmp/dapo-st-XXXXXX");
  if (!mkdtemp(scratch)) {
    perror("mkdtemp");
    return 1;
  }
  for (int arch = 0; arch < 2; arch++)
    for (int tied = 0; tied < 2; tied++)
      for (int bf16 = 0; bf16 < 2; bf16++) test_roundtrip((enum model_arch)arch, tied, bf16);
  test_bf16_values();
  test_f16_read();
  test_bad_files();
  test_mutations();
  test_bad_checkpoints();
  test_atomic_save();
  test_optimizer_tensors();
  rm_tree(scratch);
  return check_done("test_safetensors");
}
