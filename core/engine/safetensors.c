/* safetensors reader and writer (safetensors.h). The reader trusts nothing in the file: the
 * header is size-bounded before it is loaded, every entry is checked against the data region,
 * and tensor data is read with pread into caller buffers, never mapped. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

struct st_file {
  int fd;
  char label[128];       /* base name of the path, for messages */
  uint64_t data_off;     /* file offset of the data region (8 + N) */
  uint64_t data_size;    /* bytes in the data region */
  int n;                 /* tensors */
  struct st_info *infos; /* n, sorted by (begin, end) */
  int *by_name;          /* n indices into infos, sorted by name */
  char *names;           /* one arena holding every name */
  json_t *metadata;      /* owned reference or NULL */
};

static const struct {
  const char *name;
  size_t size;
} dtypes[] = {
    [ST_F32] = {"F32", 4},         [ST_F16] = {"F16", 2},         [ST_BF16] = {"BF16", 2},
    [ST_F64] = {"F64", 8},         [ST_I64] = {"I64", 8},         [ST_I32] = {"I32", 4},
    [ST_I16] = {"I16", 2},         [ST_I8] = {"I8", 1},           [ST_U64] = {"U64", 8},
    [ST_U32] = {"U32", 4},         [ST_U16] = {"U16", 2},         [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1},       [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_F8_E8M0] = {"F8_E8M0", 1},
};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

const char *st_dtype_name(enum st_dtype d) {
  return (int)d >= 0 && (int)d < N_DTYPES ? dtypes[d].name : "?";
}

size_t st_dtype_size(enum st_dtype d) {
  return (int)d >= 0 && (int)d < N_DTYPES ? dtypes[d].size : 0;
}

static int dtype_parse(const char *s, enum st_dtype *out) {
  for (int i = 0; i < N_DTYPES; i++)
    if (!strcmp(s, dtypes[i].name)) {
      *out = (enum st_dtype)i;
      return 0;
    }
  return -1;
}

/* ---- scalar conversions ---- */

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static float f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

uint16_t st_f32_to_bf16(float x) {
  /* c10::BFloat16's round_to_nearest_even: add 0x7FFF plus the lowest kept bit, truncate. */
  if (x != x) return 0x7FC0;
  uint32_t u = f32_bits(x);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float st_bf16_to_f32(uint16_t h) {
  return f32_from_bits((uint32_t)h << 16);
}

float st_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0x1F) /* inf, or NaN keeping its payload (quietened, as F16C does) */
    return f32_from_bits(sign | 0x7F800000u | (man << 13) | (man ? 0x400000u : 0));
  if (exp == 0) {
    if (man == 0) return f32_from_bits(sign);
    /* subnormal: man * 2^-24, normalise into a float32 normal */
    int e = -1;
    do {
      man <<= 1;
      e++;
    } while (!(man & 0x400u));
    return f32_from_bits(sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FFu) << 13));
  }
  return f32_from_bits(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

/* ---- reading ---- */

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* Reads exactly len bytes at off; 0, or -1 with errno (0 at end of file). */
static int pread_full(int fd, void *buf, size_t len, uint64_t off) {
  char *p = buf;
  while (len > 0) {
    size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
    ssize_t r = pread(fd, p, chunk, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) {
      errno = 0;
      return -1;
    }
    p += r;
    len -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

static int cmp_offsets(const void *a, const void *b) {
  const struct st_info *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int cmp_names_ctx(const void *a, const void *b, void *ctx) {
  const struct st_info *in = ctx;
  return strcmp(in[*(const int *)a].name, in[*(const int *)b].name);
}

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t n = 0;
  n += (size_t)snprintf(buf + n, cap - n, "[");
  for (int i = 0; i < ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Validates one header entry into t (name not yet set). */
static int parse_entry(const char *label, const char *name, json_t *v, uint64_t data_size,
                       struct st_info *t, struct dapo_err *e) {
  if (!json_is_object(v))
    return dapo_errf(e, DAPO_EFORMAT, "%s: tensor '%.200s': entry is not a JSON object", label,
                     name);
  json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
         *jo = json_object_get(v, "data_offsets");
  if (!json_is_string(jd))
    return dapo_errf(e, DAPO_EFORMAT, "%s: tensor '%.200s': dtype missing or not a string", label,
                     name);
  if (dtype_parse(json_string_value(jd), &t->dtype))
    return dapo_errf(e, DAPO_EFORMAT, "%s: tensor '%.200s': unknown dtype '%.32s'", label, name,
                     json_string_value(jd));
  if (!json_is_array(js))
    return dapo_errf(e, DAPO_EFORMAT, "%s: tensor '%.200s': shape missing or not an array", label,
                     name);
  if (json_array_size(js) > ST_MAX_DIMS)
    return dapo_errf(e, DAPO_EFORMAT, "%s: tensor '%.200s': shape has %zu dimensions (at most %d)",
                     label, name, json_array_size(js), ST_MAX_DIMS);
  t->ndim = (int)json_array_size(js);
  uint64_t numel = 1;
  for (int i = 0; i < t->ndim; i++) {
    json_t *d = json_array_get(js, (size_t)i);
    if (!json_is_integer(d) || json_integer_value(d) < 0)
      return dapo_errf(e, DAPO_EFORMAT,
                       "%s: tensor '%.200s': shape[%d] is not a non-negative integer", label, name,
                       i);
    t->shape[i] = (int64_t)json_integer_value(d);
    if (__builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel))
      return dapo_errf(e, DAPO_EFORMAT, "%s: tensor '%.200s': shape overflows the element count",
                       label, name);
  }
  for (int i = t->ndim; i < ST_MAX_DIMS; i++) t->shape[i] = 0;
  t->numel = numel;
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, (uint64_t)dtypes[t->dtype].size, &bytes))
    return dapo_errf(e, DAPO_EFORMAT, "%s: tensor '%.200s': shape overflows the byte count", label,
                     name);
  if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
      !json_is_integer(json_array_get(jo, 1)) || json_integer_value(json_array_get(jo, 0)) < 0 ||
      json_integer_value(json_array_get(jo, 1)) < 0)
    return dapo_errf(e, DAPO_EFORMAT,
                     "%s: tensor '%.200s': data_offsets must be two non-negative integers", label,
                     name);
  t->begin = (uint64_t)json_integer_value(json_array_get(jo, 0));
  t->end = (uint64_t)json_integer_value(json_array_get(jo, 1));
  if (t->begin > t->end)
    return dapo_errf(e, DAPO_EFORMAT,
                     "%s: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64 ") begin after end",
                     label, name, t->begin, t->end);
  if (t->end > data_size)
    return dapo_errf(e, DAPO_EFORMAT,
                     "%s: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64
                     ") exceed the data region (%" PRIu64 " bytes; file truncated?)",
                     label, name, t->begin, t->end, data_size);
  if (t->end - t->begin != bytes) {
    char sh[160];
    fmt_shape(sh, sizeof sh, t->ndim, t->shape);
    return dapo_errf(e, DAPO_EFORMAT,
                     "%s: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64
                     " bytes but shape %s of %s needs %" PRIu64,
                     label, name, t->begin, t->end, t->end - t->begin, sh, dtypes[t->dtype].name,
                     bytes);
  }
  return 0;
}

static int parse_metadata(const char *label, json_t *v, struct dapo_err *e) {
  if (!json_is_object(v))
    return dapo_errf(e, DAPO_EFORMAT, "%s: __metadata__ is not a JSON object", label);
  const char *k;
  json_t *x;
  json_object_foreach(v, k, x) {
    if (!json_is_string(x))
      return dapo_errf(e, DAPO_EFORMAT, "%s: __metadata__['%.200s'] is not a string", label, k);
  }
  return 0;
}

int st_open(const char *path, struct st_file **out, struct dapo_err *e) {
  int rc = 0;
  char *hbuf = NULL;
  json_t *root = NULL;
  struct st_file *f = NULL;
  *out = NULL;
  const char *label = base_name(path);

  f = calloc(1, sizeof *f);
  if (!f) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", label);
  f->fd = -1;
  snprintf(f->label, sizeof f->label, "%s", label);
  label = f->label;

  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    rc = dapo_errf(e, DAPO_EIO, "%s: cannot open: %s", label, strerror(errno));
    goto out;
  }
  struct stat sb;
  if (fstat(f->fd, &sb) != 0) {
    rc = dapo_errf(e, DAPO_EIO, "%s: cannot stat: %s", label, strerror(errno));
    goto out;
  }
  if (!S_ISREG(sb.st_mode)) {
    rc = dapo_errf(e, DAPO_EIO, "%s: not a regular file", label);
    goto out;
  }
  uint64_t fsize = (uint64_t)sb.st_size;
  if (fsize < 8) {
    rc = dapo_errf(e, DAPO_EFORMAT,
                   "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length", label,
                   fsize);
    goto out;
  }
  unsigned char lenb[8];
  if (pread_full(f->fd, lenb, 8, 0)) {
    rc = dapo_errf(e, DAPO_EIO, "%s: cannot read the header length: %s", label,
                   errno ? strerror(errno) : "unexpected end of file");
    goto out;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenb[i];
  if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > fsize - 8) {
    rc = dapo_errf(e, DAPO_EFORMAT,
                   "%s: header length %" PRIu64 " is invalid (must be in [2, %" PRIu64
                   "] and fit in the %" PRIu64 "-byte file)",
                   label, hlen, ST_MAX_HEADER, fsize);
    goto out;
  }
  f->data_off = 8 + hlen;
  f->data_size = fsize - 8 - hlen;
  hbuf = malloc((size_t)hlen);
  if (!hbuf) {
    rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory for a %" PRIu64 "-byte header", label, hlen);
    goto out;
  }
  if (pread_full(f->fd, hbuf, (size_t)hlen, 8)) {
    rc = dapo_errf(e, DAPO_EIO, "%s: cannot read the header: %s", label,
                   errno ? strerror(errno) : "unexpected end of file");
    goto out;
  }
  json_error_t jerr;
  root = json_loadb(hbuf, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    rc = dapo_errf(e, DAPO_EFORMAT, "%s: header is not valid JSON (line %d, column %d: %s)", label,
                   jerr.line, jerr.column, jerr.text);
    goto out;
  }
  if (!json_is_object(root)) {
    rc = dapo_errf(e, DAPO_EFORMAT, "%s: header is not a JSON object", label);
    goto out;
  }

  size_t nkeys = json_object_size(root), names_bytes = 0;
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) names_bytes += strlen(k) + 1;
  f->infos = calloc(nkeys ? nkeys : 1, sizeof *f->infos);
  f->by_name = calloc(nkeys ? nkeys : 1, sizeof *f->by_name);
  f->names = malloc(names_bytes ? names_bytes : 1);
  if (!f->infos || !f->by_name || !f->names) {
    rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory for %zu header entries", label, nkeys);
    goto out;
  }
  size_t npos = 0;
  json_object_foreach(root, k, v) {
    if (!strcmp(k, "__metadata__")) {
      if ((rc = parse_metadata(label, v, e))) goto out;
      f->metadata = json_incref(v);
      continue;
    }
    struct st_info *t = &f->infos[f->n];
    if ((rc = parse_entry(label, k, v, f->data_size, t, e))) goto out;
    size_t kl = strlen(k) + 1;
    memcpy(f->names + npos, k, kl);
    t->name = f->names + npos;
    npos += kl;
    f->n++;
  }

  /* non-empty tensors must not share bytes */
  qsort(f->infos, (size_t)f->n, sizeof *f->infos, cmp_offsets);
  const struct st_info *last = NULL;
  for (int i = 0; i < f->n; i++) {
    const struct st_info *t = &f->infos[i];
    if (t->begin == t->end) continue;
    if (last && t->begin < last->end) {
      rc = dapo_errf(e, DAPO_EFORMAT,
                     "%s: tensors '%.200s' [%" PRIu64 ", %" PRIu64 ") and '%.200s' [%" PRIu64
                     ", %" PRIu64 ") overlap",
                     label, last->name, last->begin, last->end, t->name, t->begin, t->end);
      goto out;
    }
    if (!last || t->end > last->end) last = t;
  }
  for (int i = 0; i < f->n; i++) f->by_name[i] = i;
  qsort_r(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_names_ctx, f->infos);

out:
  free(hbuf);
  json_decref(root);
  if (rc) {
    st_close(f);
    return rc;
  }
  *out = f;
  return 0;
}

void st_close(struct st_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  free(f->infos);
  free(f->by_name);
  free(f->names);
  json_decref(f->metadata);
  free(f);
}

const struct st_info *st_find(const struct st_file *f, const char *name) {
  int lo = 0, hi = f->n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    const struct st_info *t = &f->infos[f->by_name[mid]];
    int c = strcmp(name, t->name);
    if (c == 0) return t;
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return NULL;
}

int st_count(const struct st_file *f) {
  return f->n;
}

const struct st_info *st_at(const struct st_file *f, int i) {
  return i >= 0 && i < f->n ? &f->infos[i] : NULL;
}

const json_t *st_metadata(const struct st_file *f) {
  return f->metadata;
}

static int read_bytes(const struct st_file *f, const struct st_info *t, void *dst, uint64_t rel,
                      size_t len, struct dapo_err *e) {
  if (pread_full(f->fd, dst, len, f->data_off + t->begin + rel) == 0) return 0;
  return dapo_errf(e, DAPO_EIO, "%s: tensor '%.200s': read failed: %s", f->label, t->name,
                   errno ? strerror(errno) : "unexpected end of file (file changed?)");
}

int st_read_raw(const struct st_file *f, const struct st_info *t, void *dst, size_t bytes,
                struct dapo_err *e) {
  if (t->end - t->begin != bytes)
    return dapo_errf(e, DAPO_EINVAL,
                     "%s: tensor '%.200s': has %" PRIu64 " bytes, caller expects %zu", f->label,
                     t->name, t->end - t->begin, bytes);
  return read_bytes(f, t, dst, 0, bytes, e);
}

int st_read_f32(const struct st_file *f, const struct st_info *t, float *dst, size_t n_expected,
                struct dapo_err *e) {
  if (t->numel != (uint64_t)n_expected)
    return dapo_errf(e, DAPO_EINVAL,
                     "%s: tensor '%.200s': has %" PRIu64 " elements, caller expects %zu", f->label,
                     t->name, t->numel, n_expected);
  if (t->dtype == ST_F32) return read_bytes(f, t, dst, 0, n_expected * 4, e);
  if (t->dtype != ST_F16 && t->dtype != ST_BF16)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "%s: tensor '%.200s': dtype %s cannot be converted to float32 (F32, F16 and "
                     "BF16 can)",
                     f->label, t->name, dtypes[t->dtype].name);
  enum { CHUNK = 1 << 18 };
  size_t cap = n_expected < CHUNK ? (n_expected ? n_expected : 1) : CHUNK;
  uint16_t *buf = malloc(cap * sizeof *buf);
  if (!buf)
    return dapo_errf(e, DAPO_ENOMEM, "%s: tensor '%.200s': out of memory", f->label, t->name);
  int rc = 0;
  for (size_t i = 0; i < n_expected; i += cap) {
    size_t k = n_expected - i < cap ? n_expected - i : cap;
    if ((rc = read_bytes(f, t, buf, (uint64_t)i * 2, k * 2, e))) break;
    if (t->dtype == ST_F16)
      for (size_t j = 0; j < k; j++) dst[i + j] = st_f16_to_f32(buf[j]);
    else
      for (size_t j = 0; j < k; j++) dst[i + j] = st_bf16_to_f32(buf[j]);
  }
  free(buf);
  return rc;
}

int st_read_f32_by_name(const struct st_file *f, const char *name, float *dst, size_t n_expected,
                        struct dapo_err *e) {
  const struct st_info *t = st_find(f, name);
  if (!t) return dapo_errf(e, DAPO_EINVAL, "%s: no tensor '%.200s'", f->label, name);
  return st_read_f32(f, t, dst, n_expected, e);
}

/* ---- writing ---- */

static int build_header(const char *label, const struct st_tensor_in *ts, int n,
                        enum st_dtype dtype, const json_t *metadata, char **out, size_t *out_len,
                        struct dapo_err *e) {
  int rc = 0;
  char *s = NULL;
  json_t *h = json_object();
  if (!h) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", label);
  if (metadata) {
    const char *k;
    json_t *v;
    if (!json_is_object(metadata)) {
      rc = dapo_errf(e, DAPO_EINVAL, "%s: metadata is not a JSON object", label);
      goto out;
    }
    json_object_foreach((json_t *)metadata, k, v) {
      if (!json_is_string(v)) {
        rc = dapo_errf(e, DAPO_EINVAL, "%s: metadata['%.200s'] is not a string", label, k);
        goto out;
      }
    }
    if (json_object_set_new(h, "__metadata__", json_deep_copy(metadata))) goto oom;
  }
  uint64_t off = 0, esize = dtypes[dtype].size;
  for (int i = 0; i < n; i++) {
    const struct st_tensor_in *t = &ts[i];
    if (!t->name || !t->name[0] || !strcmp(t->name, "__metadata__")) {
      rc = dapo_errf(e, DAPO_EINVAL, "%s: tensor %d: name missing, empty or reserved", label, i);
      goto out;
    }
    if (json_object_get(h, t->name)) {
      rc = dapo_errf(e, DAPO_EINVAL, "%s: tensor '%.200s': duplicate name", label, t->name);
      goto out;
    }
    if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) {
      rc = dapo_errf(e, DAPO_EINVAL, "%s: tensor '%.200s': ndim %d not in [0, %d]", label, t->name,
                     t->ndim, ST_MAX_DIMS);
      goto out;
    }
    uint64_t numel = 1, bytes;
    json_t *shape = json_array();
    if (!shape) goto oom;
    for (int d = 0; d < t->ndim; d++) {
      if (t->shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel)) {
        json_decref(shape);
        rc = dapo_errf(e, DAPO_EINVAL, "%s: tensor '%.200s': bad shape", label, t->name);
        goto out;
      }
      json_array_append_new(shape, json_integer(t->shape[d]));
    }
    if (__builtin_mul_overflow(numel, esize, &bytes) || numel > SIZE_MAX / sizeof(float) ||
        (numel > 0 && !t->data)) {
      json_decref(shape);
      rc = dapo_errf(e, DAPO_EINVAL, "%s: tensor '%.200s': too large or no data", label, t->name);
      goto out;
    }
    json_t *ent = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtypes[dtype].name, "shape", shape,
                            "data_offsets", (json_int_t)off, (json_int_t)(off + bytes));
    if (!ent || json_object_set_new(h, t->name, ent)) {
      rc = dapo_errf(e, DAPO_EINVAL, "%s: tensor '%.200s': cannot encode (invalid UTF-8?)", label,
                     t->name);
      goto out;
    }
    off += bytes;
  }
  s = json_dumps(h, JSON_COMPACT);
  if (!s) goto oom;
  size_t len = strlen(s), padded = (len + 7) & ~(size_t)7;
  char *p = realloc(s, padded + 1);
  if (!p) goto oom;
  s = p;
  memset(s + len, ' ', padded - len);
  s[padded] = '\0';
  *out = s;
  *out_len = padded;
  s = NULL;
  goto out;
oom:
  rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory building the header", label);
out:
  free(s);
  json_decref(h);
  return rc;
}

int st_write(const char *path, const struct st_tensor_in *tensors, int n, enum st_dtype dtype,
             const json_t *metadata, struct dapo_err *e) {
  const char *label = base_name(path);
  if (dtype != ST_F32 && dtype != ST_BF16)
    return dapo_errf(e, DAPO_EINVAL, "%s: can only write F32 or BF16, not %s", label,
                     st_dtype_name(dtype));
  if (n < 0 || (n > 0 && !tensors)) return dapo_errf(e, DAPO_EINVAL, "%s: bad tensor list", label);
  char *header = NULL;
  size_t hlen = 0;
  int rc = build_header(label, tensors, n, dtype, metadata, &header, &hlen, e);
  if (rc) return rc;

  enum { CHUNK = 1 << 18 };
  uint16_t *buf = NULL;
  FILE *fp = NULL;
  if (dtype == ST_BF16 && !(buf = malloc(CHUNK * sizeof *buf))) {
    rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", label);
    goto out;
  }
  fp = fopen(path, "wb");
  if (!fp) {
    rc = dapo_errf(e, DAPO_EIO, "%s: cannot create: %s", label, strerror(errno));
    goto out;
  }
  errno = 0;
  unsigned char lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  if (fwrite(lenb, 1, 8, fp) != 8 || fwrite(header, 1, hlen, fp) != hlen) goto ioerr;
  for (int i = 0; i < n; i++) {
    const struct st_tensor_in *t = &tensors[i];
    size_t numel = 1;
    for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d]; /* checked in build_header */
    if (dtype == ST_F32) {
      if (numel && fwrite(t->data, sizeof(float), numel, fp) != numel) goto ioerr;
      continue;
    }
    for (size_t j = 0; j < numel; j += CHUNK) {
      size_t k = numel - j < CHUNK ? numel - j : CHUNK;
      for (size_t q = 0; q < k; q++) buf[q] = st_f32_to_bf16(t->data[j + q]);
      if (fwrite(buf, sizeof *buf, k, fp) != k) goto ioerr;
    }
  }
  if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) goto ioerr;
  FILE *done = fp;
  fp = NULL;
  if (fclose(done) != 0) goto ioerr;
  goto out;
ioerr:
  rc = dapo_errf(e, DAPO_EIO, "%s: write failed: %s", label,
                 errno ? strerror(errno) : "short write");
  if (fp) fclose(fp);
  fp = NULL;
  unlink(path);
out:
  if (fp) fclose(fp);
  free(buf);
  free(header);
  return rc;
}
