/* A small fixed thread pool for the compute path. A job owns one; the thread that runs the job
 * calls pool_run, which splits tasks over the pool's threads and the caller, and returns when
 * all are done (workers sleep on a condition variable between calls: no spinning that would
 * steal the core from another job). With a pool in use, OpenBLAS runs single-threaded inside
 * each task (pool_new sets it), so the cores a job uses are exactly its pool's threads.
 *
 * Kernels find the pool of the calling thread through pool_current() (thread-local, set with
 * pool_set_current); NULL means run serially. Static partitioning only: the split of work
 * depends on the thread count alone, so results are reproducible for a given count. */
#ifndef DAPO_POOL_H
#define DAPO_POOL_H

struct pool;

/* n_threads >= 1 (the caller counts as one: n_threads - 1 workers are started). NULL on
 * failure. Sets OpenBLAS to one thread per call (process-wide). */
struct pool *pool_new(int n_threads);
void pool_free(struct pool *p);
int pool_threads(const struct pool *p);

/* Runs fn(ctx, i, n) for i in [0, n) where n = number of threads (one call per thread, the
 * caller's included); fn partitions its own work by i. Not reentrant on the same pool. */
void pool_run(struct pool *p, void (*fn)(void *ctx, int i, int n), void *ctx);

/* A barrier among the n threads of one pool_run (fn's i and n), for a task made of phases that
 * each need all of the previous phase (decoding: column-split products between row-split
 * attention). Waiters spin briefly (phases are short and every thread of the pool is busy on the
 * same task), then sleep on a futex. pool_barrier_init before use; the same barrier serves
 * any number of successive phases and pool_runs. n == 1 returns at once. pool_barrier_wait
 * returns 1 where the caller slept, else 0 (for profiles). */
struct pool_barrier {
  int count, phase, sleepers;
  int spin; /* adaptive spin budget (pool.c) */
};
void pool_barrier_init(struct pool_barrier *b);
int pool_barrier_wait(struct pool_barrier *b, int n);

/* The pool the calling thread's kernels use (thread-local); NULL: serial. */
struct pool *pool_current(void);
void pool_set_current(struct pool *p);

/* Splits [0, total) into n nearly equal parts; part i is [*lo, *hi). */
void pool_split(int total, int i, int n, int *lo, int *hi);

/* Number of online CPUs (>= 1). */
int pool_cpu_count(void);

#endif
