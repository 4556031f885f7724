/* Data-parallel training across processes: the few collectives the runner needs, on MPI (the
 * standard API only: Open MPI or MPICH), or as the one-process identities when the job runs
 * alone or dapod was built without MPI (-DDAPO_MPI=OFF). Every call is collective: every rank
 * makes the same calls in the same order, from the thread that called dist_init (the runner's
 * thread; MPI_THREAD_FUNNELED). A failed collective is not recoverable (MPI's default error
 * handler ends the job), so these functions return nothing.
 *
 * A process is one rank of a multi-process job when it was started by an MPI launcher (mpirun,
 * mpiexec, srun with PMI/PMIx): dist_init tells from the launcher's environment and initialises
 * MPI only then, so `dapod train` alone and `dapod serve` never touch MPI. */
#ifndef DAPO_DIST_H
#define DAPO_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

struct dist {
  int rank, size; /* this process's rank of size (0 of 1 alone) */
  int local_size; /* ranks on this machine (sharing its memory), this one included */
  int mpi;        /* MPI was initialised by dist_init (dist_finalize ends it) */
};

/* Whether this dapod was built with MPI. */
int dist_available(void);

/* Whether the environment says this process was started by an MPI launcher (Open MPI's
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE of MPICH's hydra and Slurm, PMIX_RANK). */
int dist_launched(void);

/* Initialises d: MPI when launched by one (dist_launched), else the one-process group. Fails
 * with a clear message when launched by MPI but built without it, or when MPI cannot give
 * MPI_THREAD_FUNNELED. */
int dist_init(struct dist *d, int *argc, char ***argv, struct dapo_err *e);
void dist_finalize(struct dist *d);
/* Ends every rank of the job at once (MPI_Abort); exits alone. Never returns. */
_Noreturn void dist_abort(const struct dist *d, int code);

/* In place, on every rank: the sum over ranks of v[0 .. n) (MPI_Allreduce). The MPI libraries'
 * algorithms (ring, recursive doubling, Rabenseifner) compute each element once, or
 * symmetrically with a commutative addition, so every rank gets the same bits; the runner checks
 * that the weights agree after each step (dist_hash) rather than trusting it. NULL d or one
 * rank: nothing to do. Large arrays go in buckets of at most 2^26 elements. */
void dist_sum_f32(const struct dist *d, float *v, size_t n);
void dist_sum_f64(const struct dist *d, double *v, size_t n);
void dist_sum_i64(const struct dist *d, int64_t *v, size_t n);
/* The bitwise or, and the maximum, of an int over ranks. */
int dist_or(const struct dist *d, int v);
int dist_max(const struct dist *d, int v);
/* Whether the n bytes at p are the same on every rank (a 64-bit hash of them compared). */
int dist_same(const struct dist *d, const void *p, size_t n);
/* root's n bytes into every rank's buf. */
void dist_bcast(const struct dist *d, void *buf, size_t n, int root);
/* Gathers every rank's bytes on every rank, in rank order: *all (malloc'ed, the caller frees)
 * holds them concatenated, lens[r] the bytes of rank r (lens: d->size entries). 0, or
 * DAPO_ENOMEM (then on every rank: the sizes are agreed first). */
int dist_allgather(const struct dist *d, const void *mine, size_t n, void **all, size_t *lens,
                   struct dapo_err *e);

static inline int dist_rank(const struct dist *d) {
  return d ? d->rank : 0;
}
static inline int dist_size(const struct dist *d) {
  return d ? d->size : 1;
}

#endif
