/* Unit checks of server/bus.c: a wait returns at once for an event already published, wakes on a
 * later publish from another thread, times out otherwise (within its bound), ignores older ids,
 * and every wait returns -1 once the bus is closed; bus_wait_any follows the generation. */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "bus.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

struct later {
  struct bus *b;
  int64_t id;
  int close;
};

static void *publish_later(void *arg) {
  struct later *l = arg;
  usleep(50 * 1000);
  if (l->close)
    bus_close(l->b);
  else
    bus_publish(l->b, "job-a", l->id);
  return NULL;
}

int main(void) {
  struct bus *b = bus_new();
  CHECK(b != NULL);
  CHECK(bus_last_id(b, "job-a") == 0);
  /* nothing published: a bounded wait times out */
  double t0 = now_s();
  CHECK(bus_wait(b, "job-a", 0, 100) == 0);
  double dt = now_s() - t0;
  CHECK_MSG(dt >= 0.09 && dt < 2.0, "waited %.3f s for a 100 ms timeout", dt);
  /* published before the wait: at once */
  uint64_t g0 = bus_generation(b);
  bus_publish(b, "job-a", 3);
  CHECK(bus_generation(b) == g0 + 1);
  CHECK(bus_last_id(b, "job-a") == 3);
  CHECK(bus_wait(b, "job-a", 2, 5000) == 1);
  CHECK(bus_wait(b, "job-a", 3, 10) == 0);
  bus_publish(b, "job-a", 2); /* older: ignored */
  CHECK(bus_last_id(b, "job-a") == 3);
  CHECK(bus_last_id(b, "job-b") == 0);
  /* a publish from another thread wakes the waiter long before its timeout */
  struct later l = {b, 4, 0};
  pthread_t th;
  pthread_create(&th, NULL, publish_later, &l);
  t0 = now_s();
  CHECK(bus_wait(b, "job-a", 3, 10000) == 1);
  CHECK_MSG(now_s() - t0 < 5.0, "woken after %.3f s", now_s() - t0);
  pthread_join(th, NULL);
  /* wait_any follows the generation; a kick changes it without publishing */
  uint64_t g = bus_generation(b);
  CHECK(bus_wait_any(b, g, 10) == g);
  bus_kick(b);
  CHECK(bus_wait_any(b, g, 5000) == g + 1);
  /* forget: the entry goes, the id reads 0 again */
  bus_forget(b, "job-a");
  CHECK(bus_last_id(b, "job-a") == 0);
  /* close wakes a waiter and every later wait returns -1 at once */
  struct later c = {b, 0, 1};
  pthread_create(&th, NULL, publish_later, &c);
  t0 = now_s();
  CHECK(bus_wait(b, "job-c", 0, 10000) == -1);
  CHECK(now_s() - t0 < 5.0);
  pthread_join(th, NULL);
  CHECK(bus_closed(b));
  CHECK(bus_wait(b, "job-c", 0, 10000) == -1);
  t0 = now_s();
  bus_wait_any(b, bus_generation(b), 10000);
  CHECK(now_s() - t0 < 1.0);
  bus_free(b);
  return check_done("test_bus");
}
