/* safetensors files: a bounded, validating reader (pread, no mmap) and a writer (F32 or BF16).
 * Layout: u64 little-endian header length N, N bytes of JSON header mapping tensor name ->
 * {"dtype", "shape", "data_offsets": [begin, end)} relative to the data region that follows,
 * plus an optional "__metadata__" string->string map. Every message names the file (its base
 * name) and the tensor at fault. */
#ifndef DAPO_SAFETENSORS_H
#define DAPO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "error.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER ((uint64_t)256 << 20) /* refuse headers above 256 MiB */

/* Every dtype the format defines with a whole-byte element. Only F32, F16 and BF16 convert to
 * float32; the others are recognised (the file opens) but reading them as float fails. */
enum st_dtype {
  ST_F32,
  ST_F16,
  ST_BF16,
  ST_F64,
  ST_I64,
  ST_I32,
  ST_I16,
  ST_I8,
  ST_U64,
  ST_U32,
  ST_U16,
  ST_U8,
  ST_BOOL,
  ST_F8_E4M3,
  ST_F8_E5M2,
  ST_F8_E8M0,
};

/* Name as written in headers ("F32", "BF16", ...). Borrowed static string; "?" if invalid. */
const char *st_dtype_name(enum st_dtype d);
/* Bytes per element (0 if invalid). */
size_t st_dtype_size(enum st_dtype d);

/* One tensor of an open file. Borrowed: lives until st_close of its handle. */
struct st_info {
  const char *name;
  enum st_dtype dtype;
  int ndim; /* 0..ST_MAX_DIMS; 0 is a scalar (numel 1) */
  int64_t shape[ST_MAX_DIMS];
  uint64_t numel;
  uint64_t begin, end; /* bytes, relative to the data region, end - begin == numel * size */
};

/* An open file. Immutable after st_open: st_find, st_count, st_at, st_metadata and the reads
 * may run from several threads at once on one handle; st_close must not race with them. */
struct st_file;

/* Opens path and validates its whole header: header length within [2, 256 MiB] and the file,
 * JSON (duplicate keys refused), every entry's dtype, shape (ndim <= 8, no overflow) and
 * data_offsets (consistent with the shape, inside the data region, no two non-empty tensors
 * overlapping), and "__metadata__" a string->string map. On success *out is owned by the
 * caller (st_close); on failure *out is NULL and e names the tensor and the problem.
 * Returns 0, DAPO_EIO, DAPO_EFORMAT or DAPO_ENOMEM. */
int st_open(const char *path, struct st_file **out, struct dapo_err *e);

/* Closes the file and frees everything it owns (infos, names, metadata). Accepts NULL. */
void st_close(struct st_file *f);

/* The tensor named name, or NULL. O(log n). */
const struct st_info *st_find(const struct st_file *f, const char *name);

/* Iteration: tensors 0..st_count-1 in ascending order of their data offsets. */
int st_count(const struct st_file *f);
const struct st_info *st_at(const struct st_file *f, int i);

/* The "__metadata__" object, or NULL if the file has none. Borrowed: lives with f. */
const json_t *st_metadata(const struct st_file *f);

/* Reads tensor t (from this handle) into dst as float32, converting F16 (exact, subnormals,
 * infinities and NaN included) and BF16 (bits << 16). n_expected must equal t->numel. Fails
 * with DAPO_EUNSUPPORTED for other dtypes, DAPO_EINVAL on a count mismatch, DAPO_EIO on a read
 * error or if the file shrank since st_open. Reads with pread only: several threads may read
 * from one handle at once (st_close must not race with them). */
int st_read_f32(const struct st_file *f, const struct st_info *t, float *dst, size_t n_expected,
                struct dapo_err *e);
/* Same, looking the tensor up by name (DAPO_EINVAL naming it when absent). */
int st_read_f32_by_name(const struct st_file *f, const char *name, float *dst, size_t n_expected,
                        struct dapo_err *e);
/* Copies the raw little-endian bytes of t; bytes must equal t->end - t->begin. */
int st_read_raw(const struct st_file *f, const struct st_info *t, void *dst, size_t bytes,
                struct dapo_err *e);

/* One tensor to write; everything borrowed for the duration of st_write. */
struct st_tensor_in {
  const char *name;
  const float *data; /* numel floats, may be NULL when numel == 0 */
  int ndim;          /* 0..ST_MAX_DIMS */
  int64_t shape[ST_MAX_DIMS];
};

/* Writes n tensors to path (created or truncated) in the given order, contiguous, stored as
 * dtype (ST_F32, or ST_BF16 rounded to nearest even exactly as PyTorch does). metadata is
 * borrowed, NULL or an object of strings, stored as "__metadata__". The header is padded with
 * spaces to a multiple of 8 bytes. The file is fsynced before it is closed; on failure it is
 * removed and e carries the errno text. Names must be unique, non-empty and not
 * "__metadata__". Reentrant. */
int st_write(const char *path, const struct st_tensor_in *tensors, int n, enum st_dtype dtype,
             const json_t *metadata, struct dapo_err *e);

/* Scalar conversions (pure functions). st_f32_to_bf16 rounds to nearest even like PyTorch's
 * c10::BFloat16 (every NaN becomes 0x7FC0); the others are exact widenings. */
uint16_t st_f32_to_bf16(float x);
float st_bf16_to_f32(uint16_t h);
float st_f16_to_f32(uint16_t h);

#endif
