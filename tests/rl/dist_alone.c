/* core/rl/dist.c built without MPI (what -DDAPO_MPI=OFF builds): alone, every collective is the
 * identity; started by an MPI launcher, dist_init refuses with a message that says how to build
 * with MPI. Compiled here from dist.c without DAPO_HAVE_MPI, whatever the main build has. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"

int main(void) {
  struct dist d;
  struct dapo_err e = {0};
  unsetenv("OMPI_COMM_WORLD_SIZE"), unsetenv("PMI_SIZE"), unsetenv("PMIX_RANK");
  unsetenv("PMI_RANK");
  CHECK(!dist_available());
  CHECK(!dist_launched());
  CHECK(dist_init(&d, NULL, NULL, &e) == 0);
  CHECK(d.rank == 0 && d.size == 1 && d.local_size == 1 && !d.mpi);
  float f[3] = {1, 2, 3};
  double g[2] = {0.5, -1};
  int64_t i[2] = {7, -9};
  dist_sum_f32(&d, f, 3);
  dist_sum_f64(&d, g, 2);
  dist_sum_i64(&d, i, 2);
  CHECK(f[0] == 1 && f[1] == 2 && f[2] == 3 && g[0] == 0.5 && g[1] == -1 && i[0] == 7 &&
        i[1] == -9);
  CHECK(dist_or(&d, 2) == 2 && dist_max(&d, -4) == -4);
  CHECK(dist_same(&d, f, sizeof f));
  void *all = NULL;
  size_t lens[1] = {0};
  CHECK(dist_allgather(&d, "abc", 3, &all, lens, &e) == 0);
  CHECK(lens[0] == 3 && all && !memcmp(all, "abc", 3));
  free(all);
  dist_finalize(&d);
  /* started by mpirun, built without MPI: a clear refusal */
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  CHECK(dist_launched());
  CHECK(dist_init(&d, NULL, NULL, &e) != 0);
  CHECK_MSG(strstr(e.msg, "built without MPI") && strstr(e.msg, "-DDAPO_MPI=ON"), "%s", e.msg);
  return check_done("dist_alone");
}
