/* Wake-ups for readers of job events: after an event is committed to the store, its writer
 * publishes (job id, event id) here; SSE streams, ?wait long-polls and tests wait for it. The bus
 * carries no data (readers read the events back from the store by id) and never spins: waits
 * sleep on condition variables with a bound.
 *
 * Two ways to wait: bus_wait for one job (a thread that may block, e.g. a test or a worker), and
 * bus_wait_any for "anything was published" with a generation counter (the HTTP layer's hub,
 * which resumes suspended connections, uses it). Thread-safe: every function may be called from
 * any thread. */
#ifndef DAPOD_BUS_H
#define DAPOD_BUS_H

#include <stdint.h>

struct bus;

/* A new bus (owned; bus_free) or NULL when out of memory. */
struct bus *bus_new(void);

/* Frees b (NULL is fine). No thread may be waiting on it any more (bus_close first wakes them). */
void bus_free(struct bus *b);

/* Records that job_id's events up to event_id are stored and wakes its waiters and every
 * bus_wait_any. A lower id than one already published is ignored (publishers may race). */
void bus_publish(struct bus *b, const char *job_id, int64_t event_id);

/* The highest event id published for job_id by this process (0: none yet). */
int64_t bus_last_id(struct bus *b, const char *job_id);

/* Waits until an event after after_id is published for job_id, timeout_ms passes, or the bus is
 * closed. Returns 1 (an event is there, possibly already before the call), 0 (timeout), -1
 * (closed). Events stored before this process started are the store's to report, not the bus's:
 * a reader reads the store first and then waits for what comes next. */
int bus_wait(struct bus *b, const char *job_id, int64_t after_id, int timeout_ms);

/* The publish generation: incremented by every bus_publish and bus_kick. */
uint64_t bus_generation(struct bus *b);

/* Waits until the generation differs from seen, timeout_ms passes or the bus is closed. Returns
 * the generation at return (so callers loop: g = bus_generation(); check; g = wait_any(g, t)). */
uint64_t bus_wait_any(struct bus *b, uint64_t seen, int timeout_ms);

/* Wakes every bus_wait_any without publishing (a new waiter changed someone's deadline). */
void bus_kick(struct bus *b);

/* Forgets job_id (a deleted job); its waiters are woken. */
void bus_forget(struct bus *b, const char *job_id);

/* Closes the bus: every wait returns -1 (bus_wait) or at once (bus_wait_any), now and later. */
void bus_close(struct bus *b);
int bus_closed(struct bus *b);

#endif
