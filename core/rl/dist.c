/* dist.h: MPI collectives when built with DAPO_HAVE_MPI, the one-process identities without. */
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DAPO_HAVE_MPI
#include <mpi.h>
#endif

#define BUCKET ((size_t)1 << 26) /* elements per MPI call: counts are ints */

int dist_available(void) {
#ifdef DAPO_HAVE_MPI
  return 1;
#else
  return 0;
#endif
}

int dist_launched(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

int dist_init(struct dist *d, int *argc, char ***argv, struct dapo_err *e) {
  *d = (struct dist){.rank = 0, .size = 1, .local_size = 1, .mpi = 0};
  if (!dist_launched()) return 0;
#ifdef DAPO_HAVE_MPI
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    return dapo_errf(e, DAPO_EIO, "MPI_Init_thread failed");
  d->mpi = 1;
  if (provided < MPI_THREAD_FUNNELED) {
    dist_finalize(d);
    return dapo_errf(e, DAPO_EINVAL,
                     "the MPI library gives no MPI_THREAD_FUNNELED (%d): dapod's compute threads "
                     "need it",
                     provided);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &d->size);
  MPI_Comm local;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) ==
      MPI_SUCCESS) {
    MPI_Comm_size(local, &d->local_size);
    MPI_Comm_free(&local);
  }
  return 0;
#else
  (void)argc, (void)argv;
  return dapo_errf(e, DAPO_EINVAL,
                   "started by an MPI launcher, but this dapod was built without MPI "
                   "(configure with -DDAPO_MPI=ON and an MPI library such as libopenmpi-dev)");
#endif
}

void dist_finalize(struct dist *d) {
#ifdef DAPO_HAVE_MPI
  if (d->mpi) MPI_Finalize();
#endif
  d->mpi = 0;
}

_Noreturn void dist_abort(const struct dist *d, int code) {
#ifdef DAPO_HAVE_MPI
  if (d && d->mpi) MPI_Abort(MPI_COMM_WORLD, code);
#else
  (void)d;
#endif
  exit(code);
}

static int many(const struct dist *d) {
  return d && d->size > 1;
}

/* The element types of dist_sum_*, one row each: its size and, with MPI, its datatype. The three
 * typed entry points stay (the compiler checks each call's pointer type); sum() is their one
 * body. */
enum elem { ELEM_F32, ELEM_F64, ELEM_I64 };

static void sum(const struct dist *d, void *v, size_t n, enum elem t) {
  if (!many(d)) return;
#ifdef DAPO_HAVE_MPI
  static const struct {
    size_t size;
    MPI_Datatype type;
  } rows[] = {
      [ELEM_F32] = {sizeof(float), MPI_FLOAT},
      [ELEM_F64] = {sizeof(double), MPI_DOUBLE},
      [ELEM_I64] = {sizeof(int64_t), MPI_INT64_T},
  };
  for (size_t i = 0; i < n; i += BUCKET) {
    size_t k = n - i < BUCKET ? n - i : BUCKET;
    MPI_Allreduce(MPI_IN_PLACE, (char *)v + i * rows[t].size, (int)k, rows[t].type, MPI_SUM,
                  MPI_COMM_WORLD);
  }
#else
  (void)v, (void)n, (void)t;
#endif
}

void dist_sum_f32(const struct dist *d, float *v, size_t n) {
  sum(d, v, n, ELEM_F32);
}

void dist_sum_f64(const struct dist *d, double *v, size_t n) {
  sum(d, v, n, ELEM_F64);
}

void dist_sum_i64(const struct dist *d, int64_t *v, size_t n) {
  sum(d, v, n, ELEM_I64);
}

static int reduce_int(const struct dist *d, int v, int max) {
  if (!many(d)) return v;
  int out = v;
#ifdef DAPO_HAVE_MPI
  MPI_Allreduce(&v, &out, 1, MPI_INT, max ? MPI_MAX : MPI_BOR, MPI_COMM_WORLD);
#else
  (void)max;
#endif
  return out;
}

int dist_or(const struct dist *d, int v) {
  return reduce_int(d, v, 0);
}

int dist_max(const struct dist *d, int v) {
  return reduce_int(d, v, 1);
}

void dist_bcast(const struct dist *d, void *buf, size_t n, int root) {
  if (!many(d)) return;
#ifdef DAPO_HAVE_MPI
  for (size_t i = 0; i < n; i += BUCKET) {
    size_t k = n - i < BUCKET ? n - i : BUCKET;
    MPI_Bcast((char *)buf + i, (int)k, MPI_BYTE, root, MPI_COMM_WORLD);
  }
#else
  (void)buf, (void)n, (void)root;
#endif
}

int dist_same(const struct dist *d, const void *p, size_t n) {
  if (!many(d)) return 1;
  /* 64-bit words mixed in order (multiply-xorshift), then the tail bytes */
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
  const unsigned char *b = p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 29;
  }
  for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
  uint64_t lo = h, hi = h;
#ifdef DAPO_HAVE_MPI
  uint64_t mine = h;
  MPI_Allreduce(&mine, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
#endif
  return lo == hi;
}

int dist_allgather(const struct dist *d, const void *mine, size_t n, void **all, size_t *lens,
                   struct dapo_err *e) {
  int size = dist_size(d);
  int64_t *l = calloc((size_t)size, sizeof *l);
  int ok = l != NULL;
  if (l) l[dist_rank(d)] = (int64_t)n;
#ifdef DAPO_HAVE_MPI
  if (many(d)) {
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
      free(l);
      return dapo_errf(e, DAPO_ENOMEM, "out of memory gathering from the ranks");
    }
    dist_sum_i64(d, l, (size_t)size);
  }
#endif
  if (!ok) return dapo_errf(e, DAPO_ENOMEM, "out of memory gathering from the ranks");
  size_t total = 0;
  for (int r = 0; r < size; r++) total += (size_t)l[r];
  char *buf = malloc(total ? total : 1);
  ok = buf != NULL;
#ifdef DAPO_HAVE_MPI
  if (many(d)) {
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    ok = all_ok;
  }
#endif
  if (!ok) {
    free(buf), free(l);
    return dapo_errf(e, DAPO_ENOMEM, "out of memory gathering %zu bytes from the ranks", total);
  }
  /* each rank's bytes broadcast from it in turn (counts are ints: buckets) */
  size_t off = 0;
  for (int r = 0; r < size; r++) {
    if (r == dist_rank(d) && n) memcpy(buf + off, mine, n);
    dist_bcast(d, buf + off, (size_t)l[r], r);
    lens[r] = (size_t)l[r];
    off += (size_t)l[r];
  }
  free(l);
  *all = buf;
  return 0;
}
