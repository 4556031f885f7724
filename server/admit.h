/* The memory ledger: one account of the memory the daemon's compute may use (memory_limit_bytes,
 * or the machine's physical memory), shared by the job workers (a job's memory plan, held while it
 * runs) and the completion service (a completion's generation state while it samples, and the
 * weights of the models it keeps open). Two kinds of holdings:
 *   reserved: memory that is in use or about to be (a running job, a completion in service, the
 *             weights of a model a completion is using);
 *   cached:   memory that can be given back at once (the weights of an opened model no
 *             completion uses now, kept for the next request).
 * A reservation fits when reserved + cached + bytes <= limit (admit_try), so the two together
 * stay under the limit; a job claimed by admit_claim may count the cache as free, and the
 * cache is then emptied (the reclaim hook) before admit_claim returns, i.e. before the job
 * allocates anything.
 *
 * Thread-safety: every function may be called from any thread, except admit_free. The listeners
 * and the reclaim hook are called without the ledger's lock held, from the thread that freed
 * memory; none of admit_release, admit_uncache or admit_claim may be called with a lock held
 * that a listener or the hook takes. */
#ifndef DAPOD_ADMIT_H
#define DAPOD_ADMIT_H

#include <stdint.h>

struct admit;

/* A ledger of limit bytes (UINT64_MAX: no limit). Owned; NULL when out of memory. */
struct admit *admit_new(uint64_t limit);
/* Frees a (NULL is fine); no other thread may use it any more. */
void admit_free(struct admit *a);

/* The limit the ledger was made with. */
uint64_t admit_limit(const struct admit *a);

/* What the ledger holds now. */
struct admit_stats {
  uint64_t limit, reserved, cached;
};
void admit_stats(struct admit *a, struct admit_stats *out);

/* Reserves bytes when reserved + cached + bytes <= limit: returns 0, else 1 (nothing changes).
 * Calls nothing. */
int admit_try(struct admit *a, uint64_t bytes);

/* Gives back bytes reserved before, then calls the listeners (memory came free). */
void admit_release(struct admit *a, uint64_t bytes);

/* Reserved bytes become cached (a model nobody uses now, kept open): never fails, frees nothing.
 * Calls nothing. */
void admit_to_cache(struct admit *a, uint64_t bytes);

/* Cached bytes become reserved again (a kept model is used): 0, or 1 when the ledger is over its
 * limit now (a job's claim is waiting for the cache to be emptied; the model is about to go).
 * Calls nothing. */
int admit_from_cache(struct admit *a, uint64_t bytes);

/* Cached bytes are gone (a kept model was closed); then calls the listeners. */
void admit_uncache(struct admit *a, uint64_t bytes);

/* Reserves memory for what claim takes, atomically with its decision: claim runs under the
 * ledger's lock with free = limit - reserved (the cache counts as free) and returns 0 with
 * *taken set (those bytes are reserved now, and *taken <= free), 1 when nothing fitted, or a
 * negative code (an error of its own; nothing reserved). When what it took overlaps the cache,
 * the reclaim hook is called (without the lock) to close kept models until the ledger is back
 * under its limit. Returns claim's return. claim must not call into the ledger. */
int admit_claim(struct admit *a, int (*claim)(void *ctx, uint64_t free, uint64_t *taken),
                void *ctx);

/* The hook that closes kept models: called with the bytes the ledger is over its limit by; it
 * calls admit_uncache for each model it closes. One hook (NULL: none); set before any use,
 * cleared before its owner is freed. */
void admit_set_reclaim(struct admit *a, void (*reclaim)(void *ctx, uint64_t over), void *ctx);

/* Listeners, called after memory came free (admit_release, admit_uncache of at least one byte):
 * e.g. to wake a job waiting for memory. At most ADMIT_LISTENERS; admit_listen returns -1 when
 * they are all taken. admit_unlisten removes one and waits until no call of it is in progress,
 * so that its ctx may be freed afterwards (never call it from a listener). */
#define ADMIT_LISTENERS 4
int admit_listen(struct admit *a, void (*fn)(void *ctx), void *ctx);
void admit_unlisten(struct admit *a, void (*fn)(void *ctx), void *ctx);

#endif
