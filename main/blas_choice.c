/* The OpenBLAS kernel by measuring (blas_choice.h). */
#include "blas_choice.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#include <jansson.h>

#include "pool.h"

#define CACHE_FILE "openblas-kernel.json"
#define MARK_ENV "DAPOD_BLAS_KERNEL_CHOSEN" /* set with OPENBLAS_CORETYPE by a re-execution */
#define PROBE_CMD "__blas-probe"
#define PROBE_SECONDS 0.2  /* of a thread's CPU time in products per candidate and round */
#define PROBE_WALL_MAX 2.0 /* seconds of the clock a thread's products take at most */
#define STALL_ENV "DAPOD_BLAS_PROBE_STALL_MS" /* tests: each probe thread sleeps once */
#define PROBE_TIMEOUT_MS 20000
#define MIN_GAIN 1.10   /* a named kernel must beat OpenBLAS's own pick by this much */
#define TIE_MARGIN 1.05 /* a later candidate must beat the best so far by this much */
#define MAX_THREADS 8

/* Kernels a DYNAMIC_ARCH OpenBLAS may carry for this architecture, beside its own pick (names
 * as OPENBLAS_CORETYPE takes them; one the build lacks runs OpenBLAS's pick and is dropped). */
static const char *const candidates[] = {
#if defined(__x86_64__)
    "Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen", "Sandybridge",
#elif defined(__aarch64__)
    "NeoverseN1", "NeoverseV1", "NeoverseN2", "CortexA72", "ARMV8",
#endif
    NULL};

static char g_describe[256] = "OpenBLAS's own pick";

const char *blas_choice_describe(void) {
  return g_describe;
}

/* ---- the child: one kernel measured --------------------------------------------------------- */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fill(float *x, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)((double)(seed >> 8) / (double)(1u << 24) * 2.0 - 1.0);
  }
}

/* The largest error of C = op(A) op(B) (m x n, inner k; row-major; ta/tb transposed operands)
 * against a double-precision product, relative to sum |a||b| of each element: ~1e-7 for a
 * sound kernel, ~1 for a broken one. -1 out of memory. */
static double product_error(int ta, int tb, int m, int n, int k) {
  float *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n),
        *c = malloc(sizeof(float) * (size_t)m * n);
  double worst = -1;
  if (a && b && c) {
    fill(a, (size_t)m * k, 7u + (unsigned)ta), fill(b, (size_t)k * n, 11u + (unsigned)tb);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, 1.0f, a, ta ? m : k, b, tb ? k : n, 0.0f, c, n);
    worst = 0;
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double s = 0, mag = 0;
        for (int l = 0; l < k; l++) {
          double x = ta ? a[(size_t)l * m + i] : a[(size_t)i * k + l];
          double y = tb ? b[(size_t)j * k + l] : b[(size_t)l * n + j];
          s += x * y, mag += fabs(x * y);
        }
        double err = fabs((double)c[(size_t)i * n + j] - s) / (mag + 1e-30);
        if (!(err <= worst)) worst = err; /* NaN counts as the worst */
      }
  }
  free(a), free(b), free(c);
  return worst;
}

/* The calling thread's CPU time: what it ran, not what a neighbour or the host took from it */
static double thread_cpu_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

struct timed {
  double flops, seconds; /* seconds: the thread's CPU time in the products timed */
  int failed, stall_ms;  /* stall_ms: sleeps once after its first product timed (tests) */
};

/* One thread's products at a training shape: X (256 x 1024) times W^T (1024 x 1024), rated by
 * the thread's CPU time, so that a kernel measured while other work shares the cores (a build
 * beside the first start) is not rated by the share it got: measured by the clock, such a
 * moment once chose a kernel 1.2x slower than the best, kept in the cache ever after. The
 * threads still run at once, sharing caches and memory as the engine's pool does. */
static void *timed_products(void *arg) {
  struct timed *t = arg;
  const int m = 256, n = 1024, k = 1024;
  float *x = malloc(sizeof(float) * (size_t)m * k), *w = malloc(sizeof(float) * (size_t)n * k),
        *y = malloc(sizeof(float) * (size_t)m * n);
  if (!x || !w || !y) {
    t->failed = 1;
  } else {
    fill(x, (size_t)m * k, 3), fill(w, (size_t)n * k, 5);
    int calls = 0;
    double t0 = 0, c0 = 0;
    for (;;) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
      if (calls++ == 0) { /* the first product warms caches and pages */
        t0 = now_s(), c0 = thread_cpu_s();
        continue;
      }
      if (calls == 2 && t->stall_ms > 0) {
        struct timespec ts = {t->stall_ms / 1000, 1000000L * (t->stall_ms % 1000)};
        nanosleep(&ts, NULL);
      }
      if (thread_cpu_s() - c0 >= PROBE_SECONDS || now_s() - t0 >= PROBE_WALL_MAX) break;
    }
    t->seconds = thread_cpu_s() - c0;
    t->flops = 2.0 * m * n * k * (calls - 1);
  }
  free(x), free(w), free(y);
  return NULL;
}

/* Prints {"core", "gflops", "error"}: `threads` threads each running single-threaded products
 * at once (as the engine's pool runs them), and the worst product error. */
static void probe_child(int threads) {
  openblas_set_num_threads(1);
  double err = 0;
  for (int v = 0; v < 4; v++) { /* the transpositions the engine uses, odd sizes */
    double e = product_error(v & 1, v >> 1, 37, 53, 301);
    if (e < 0 || !(e <= err)) err = e < 0 ? 1 : e;
  }
  struct timed t[MAX_THREADS] = {0};
  const char *stall = getenv(STALL_ENV);
  for (int i = 0; i < MAX_THREADS; i++) t[i].stall_ms = stall ? atoi(stall) : 0;
  pthread_t th[MAX_THREADS];
  int started = 0;
  for (; started < threads; started++)
    if (pthread_create(&th[started], NULL, timed_products, &t[started])) break;
  double rate = 0; /* the threads' rates, each by its own CPU time */
  int failed = started == 0;
  for (int i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    failed |= t[i].failed || !(t[i].seconds > 0) || !(t[i].flops > 0);
    if (!failed) rate += t[i].flops / t[i].seconds;
  }
  if (failed) _exit(3);
  printf("{\"core\": \"%s\", \"gflops\": %.3f, \"error\": %.3g}\n", openblas_get_corename(),
         rate * 1e-9, err);
  fflush(stdout);
  _exit(0);
}

/* ---- the parent: candidates measured in children -------------------------------------------- */

struct measured {
  char kernel[32]; /* as asked ("" for OpenBLAS's own pick) */
  char core[32];   /* as the library reports running it */
  double gflops, error;
  int ok;       /* ran, and its products are sound */
  char why[96]; /* why not */
};

static int probe_threads(void) {
  int n = pool_cpu_count();
  return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

/* Runs `dapod __blas-probe T` with OPENBLAS_CORETYPE=kernel (unset for ""). */
static void measure(const char *kernel, int threads, struct measured *m) {
  memset(m, 0, sizeof *m);
  snprintf(m->kernel, sizeof m->kernel, "%s", kernel);
  int pfd[2];
  if (pipe(pfd)) {
    snprintf(m->why, sizeof m->why, "pipe: %s", strerror(errno));
    return;
  }
  char targ[16];
  snprintf(targ, sizeof targ, "%d", threads);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pfd[1], 1);
    int dn = open("/dev/null", O_WRONLY);
    if (dn >= 0) dup2(dn, 2); /* OpenBLAS says "Core not found" there */
    close(pfd[0]);
    if (*kernel)
      setenv("OPENBLAS_CORETYPE", kernel, 1);
    else
      unsetenv("OPENBLAS_CORETYPE");
    unsetenv("OPENBLAS_VERBOSE");
    char *av[] = {"dapod", PROBE_CMD, targ, NULL};
    execv("/proc/self/exe", av);
    _exit(127);
  }
  close(pfd[1]);
  if (pid < 0) {
    close(pfd[0]);
    snprintf(m->why, sizeof m->why, "fork: %s", strerror(errno));
    return;
  }
  char out[512];
  size_t len = 0;
  double deadline = now_s() + PROBE_TIMEOUT_MS / 1000.0;
  for (;;) {
    int left = (int)((deadline - now_s()) * 1000);
    struct pollfd p = {.fd = pfd[0], .events = POLLIN};
    if (left <= 0 || poll(&p, 1, left) == 0) {
      kill(pid, SIGKILL);
      snprintf(m->why, sizeof m->why, "no answer in %d s", PROBE_TIMEOUT_MS / 1000);
      break;
    }
    ssize_t k = read(pfd[0], out + len, sizeof out - 1 - len);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    len += (size_t)k;
    if (len == sizeof out - 1) break;
  }
  close(pfd[0]);
  out[len] = 0;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (m->why[0]) return;
  if (WIFSIGNALED(status)) {
    snprintf(m->why, sizeof m->why, "died of signal %d (%s)", WTERMSIG(status),
             strsignal(WTERMSIG(status)));
    return;
  }
  json_t *j = json_loads(out, 0, NULL);
  const char *core = json_string_value(json_object_get(j, "core"));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !core) {
    snprintf(m->why, sizeof m->why, "exit status %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  } else {
    snprintf(m->core, sizeof m->core, "%s", core);
    m->gflops = json_number_value(json_object_get(j, "gflops"));
    m->error = json_number_value(json_object_get(j, "error"));
    if (!(m->error < 1e-5))
      snprintf(m->why, sizeof m->why, "wrong products (error %.2g)", m->error);
    else
      m->ok = 1;
  }
  json_decref(j);
}

/* The machine's key: processor, its flags, the OpenBLAS build and the threads measured. */
static void machine_key(int threads, char *key, size_t cap) {
  char model[128] = "?", line[8192];
  uint64_t h = 1469598103934665603ull; /* FNV-1a of the flags line */
  FILE *f = fopen("/proc/cpuinfo", "r");
  int got_model = 0, got_flags = 0;
  while (f && fgets(line, sizeof line, f) && !(got_model && got_flags)) {
    char *colon = strchr(line, ':');
    if (!colon) continue;
    if (!got_model && (!strncmp(line, "model name", 10) || !strncmp(line, "CPU part", 8))) {
      snprintf(model, sizeof model, "%s", colon + 2);
      model[strcspn(model, "\n")] = 0;
      got_model = 1;
    } else if (!got_flags && (!strncmp(line, "flags", 5) || !strncmp(line, "Features", 8))) {
      for (const char *p = colon; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
      got_flags = 1;
    }
  }
  if (f) fclose(f);
  /* the build's description without the kernel running now (it names the running core) */
  char build[256];
  snprintf(build, sizeof build, "%s", openblas_get_config());
  const char *core = openblas_get_corename();
  char *at = core && *core ? strstr(build, core) : NULL;
  if (at) memmove(at, at + strlen(core), strlen(at + strlen(core)) + 1);
  snprintf(key, cap, "%s | flags %016llx | %s | %d threads", model, (unsigned long long)h, build,
           threads);
}

/* The cache file's folder: $CACHE_DIRECTORY (systemd's CacheDirectory=), $XDG_CACHE_HOME/dapod,
 * ~/.cache/dapod, or without a home $TMPDIR (or /tmp)/dapod-cache-UID, made if missing. 0 when
 * none can be made (then every start measures). */
static int cache_path(char *out, size_t cap) {
  const char *base = getenv("CACHE_DIRECTORY"), *xdg = getenv("XDG_CACHE_HOME"),
             *home = getenv("HOME");
  char dir[4096];
  if (base && *base) {
    snprintf(dir, sizeof dir, "%s", base);
  } else if (xdg && *xdg) {
    mkdir(xdg, 0700);
    snprintf(dir, sizeof dir, "%s/dapod", xdg);
  } else if (home && *home) {
    snprintf(dir, sizeof dir, "%s/.cache", home);
    mkdir(dir, 0700);
    snprintf(dir, sizeof dir, "%s/.cache/dapod", home);
  } else { /* no home (a bare service or CI): a folder of this user's own in the temp dir */
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/dapod-cache-%u", tmp && *tmp ? tmp : "/tmp", (unsigned)getuid());
    struct stat st;
    if (mkdir(dir, 0700) && errno != EEXIST) return 0;
    if (lstat(dir, &st) || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 0022))
      return 0; /* someone else's, or writable by others: not trusted */
  }
  if (mkdir(dir, 0700) && errno != EEXIST) return 0;
  return snprintf(out, cap, "%s/%s", dir, CACHE_FILE) < (int)cap;
}

static json_t *measured_json(const struct measured *m, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) {
    json_t *o = json_pack("{s:s, s:s, s:b}", "kernel", m[i].kernel[0] ? m[i].kernel : "library",
                          "core", m[i].core, "ok", m[i].ok);
    if (m[i].core[0]) {
      json_object_set_new(o, "gflops", json_real(m[i].gflops));
      json_object_set_new(o, "error", json_real(m[i].error));
    }
    if (m[i].why[0]) json_object_set_new(o, "why", json_string(m[i].why));
    json_array_append_new(a, o);
  }
  return a;
}

/* Measures OpenBLAS's pick and every candidate; fills m (at most cap) and returns how many were
 * kept (a candidate the build lacks reports OpenBLAS's pick again and is dropped). *best is the
 * index of the choice: 0 (OpenBLAS's pick) unless a candidate beats it by MIN_GAIN. */
static int measure_all(int threads, struct measured *m, int cap, int *best) {
  int n = 0;
  measure("", threads, &m[n++]);
  for (int i = 0; candidates[i] && n < cap; i++) {
    measure(candidates[i], threads, &m[n]);
    int dup = 0;
    for (int j = 0; j < n; j++) dup |= m[n].core[0] && !strcasecmp(m[n].core, m[j].core);
    if (!dup) n++;
  }
  /* a second round in the same order, each kernel keeping its better figure: a busy moment
   * of the machine slows one measurement, rarely both */
  for (int i = 0; i < n; i++) {
    if (!m[i].ok) continue;
    struct measured again;
    measure(m[i].kernel, threads, &again);
    if (again.ok && !strcasecmp(again.core, m[i].core) && again.gflops > m[i].gflops)
      m[i].gflops = again.gflops;
  }
  /* a later candidate displaces an earlier one only by a clear margin, so that two kernels
   * of the same speed (SkylakeX and Cooperlake share their SGEMM) do not flip with noise */
  *best = 0;
  for (int i = 1; i < n; i++)
    if (m[i].ok && (!m[0].ok || m[i].gflops >= MIN_GAIN * m[0].gflops) &&
        (*best == 0 || m[i].gflops > TIE_MARGIN * m[*best].gflops))
      *best = i;
  return n;
}

static void describe_choice(const struct measured *m, int best) {
  if (best == 0)
    snprintf(g_describe, sizeof g_describe, "%s, OpenBLAS's own pick (measured %.0f GFLOP/s)",
             m[0].core[0] ? m[0].core : "?", m[0].gflops);
  else if (m[0].ok)
    snprintf(g_describe, sizeof g_describe,
             "%s, chosen by measuring: %.0f GFLOP/s, %.1fx OpenBLAS's own pick %s", m[best].core,
             m[best].gflops, m[best].gflops / m[0].gflops, m[0].core);
  else
    snprintf(g_describe, sizeof g_describe,
             "%s, chosen by measuring: %.0f GFLOP/s (OpenBLAS's own pick failed: %s)", m[best].core,
             m[best].gflops, m[0].why);
}

/* The cache's content: the machine's key, the kernel chosen ("" for OpenBLAS's own pick), its
 * description and the table (new reference). */
static json_t *choice_json(const char *key, const char *kernel, const struct measured *m, int n) {
  return json_pack("{s:s, s:s, s:s, s:o, s:I}", "key", key, "kernel", kernel, "chosen", g_describe,
                   "measured", measured_json(m, n), "at", (json_int_t)time(NULL));
}

/* Replaces the content of the cache file fd (locked by the caller) with j. */
static void write_cache(int fd, const json_t *j) {
  char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
  if (text && !ftruncate(fd, 0) && pwrite(fd, text, strlen(text), 0) == (ssize_t)strlen(text))
    fsync(fd);
  free(text);
}

/* Looks up or makes the machine's choice: the kernel to name ("" for OpenBLAS's own pick) and
 * the description. Under the cache file's lock, so concurrent starts measure once. */
static void choose(int threads, char *kernel, size_t cap) {
  char key[512], path[4200];
  machine_key(threads, key, sizeof key);
  int fd = cache_path(path, sizeof path) ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
  if (fd >= 0) {
    while (flock(fd, LOCK_EX) && errno == EINTR) {
    }
    FILE *f = fdopen(dup(fd), "r");
    json_t *j = f ? json_loadf(f, 0, NULL) : NULL;
    if (f) fclose(f);
    const char *k = json_string_value(json_object_get(j, "kernel")),
               *d = json_string_value(json_object_get(j, "chosen"));
    const char *kept_key = json_string_value(json_object_get(j, "key"));
    if (k && d && kept_key && !strcmp(kept_key, key)) {
      snprintf(kernel, cap, "%s", k);
      snprintf(g_describe, sizeof g_describe, "%s", d);
      json_decref(j);
      close(fd); /* releases the lock */
      return;
    }
    json_decref(j);
  }
  struct measured m[16];
  int best, n = measure_all(threads, m, 16, &best);
  describe_choice(m, best);
  snprintf(kernel, cap, "%s", m[best].kernel);
  if (fd >= 0) {
    json_t *j = choice_json(key, kernel, m, n);
    write_cache(fd, j);
    json_decref(j);
    close(fd);
  }
}

void blas_choice_apply(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], PROBE_CMD)) probe_child(atoi(argv[2]) > 0 ? atoi(argv[2]) : 1);
  const char *set = getenv("OPENBLAS_CORETYPE"), *mark = getenv(MARK_ENV);
  if (set && *set) {
    if (mark && *mark)
      snprintf(g_describe, sizeof g_describe, "%s", mark);
    else
      snprintf(g_describe, sizeof g_describe, "%s, set by OPENBLAS_CORETYPE", set);
    return;
  }
  const char *policy = getenv("DAPOD_BLAS_KERNEL");
  if (policy && !strcmp(policy, "library")) {
    snprintf(g_describe, sizeof g_describe, "%s, OpenBLAS's own pick (DAPOD_BLAS_KERNEL=library)",
             openblas_get_corename());
    return;
  }
  char kernel[32] = "";
  if (policy && *policy && strcmp(policy, "auto")) {
    snprintf(kernel, sizeof kernel, "%s", policy);
    snprintf(g_describe, sizeof g_describe, "%s, set by DAPOD_BLAS_KERNEL", policy);
  } else {
    choose(probe_threads(), kernel, sizeof kernel);
  }
  if (!*kernel) return; /* OpenBLAS's own pick, already loaded */
  setenv("OPENBLAS_CORETYPE", kernel, 1);
  setenv(MARK_ENV, g_describe, 1);
  fflush(NULL);
  execv("/proc/self/exe", argv);
  fprintf(stderr, "dapod: could not re-execute to run OpenBLAS's %s kernel (%s); running %s\n",
          kernel, strerror(errno), openblas_get_corename());
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(MARK_ENV);
  snprintf(g_describe, sizeof g_describe, "%s, OpenBLAS's own pick (re-execution failed)",
           openblas_get_corename());
}

int blas_choice_cmd(int argc, char **argv) {
  int as_json = argc > 2 && !strcmp(argv[2], "--json");
  int threads = probe_threads();
  struct measured m[16];
  int best, n = measure_all(threads, m, 16, &best);
  describe_choice(m, best);
  char key[512], path[4200];
  machine_key(threads, key, sizeof key);
  int have_path = cache_path(path, sizeof path);
  json_t *j = choice_json(key, m[best].kernel, m, n);
  if (have_path) { /* refresh the cache: the next start runs this choice */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0 && !flock(fd, LOCK_EX)) write_cache(fd, j);
    if (fd >= 0) close(fd);
  }
  if (as_json) {
    if (have_path) json_object_set_new(j, "cache", json_string(path));
    json_dumpf(j, stdout, JSON_INDENT(2));
    fputc('\n', stdout);
  } else {
    printf("OpenBLAS %s; %d threads, each a single-threaded SGEMM 256x1024x1024 rated by its "
           "CPU time\n",
           openblas_get_config(), threads);
    printf("%-16s %-16s %10s  %s\n", "kernel", "runs as", "GFLOP/s", "");
    for (int i = 0; i < n; i++)
      printf("%-16s %-16s %10.1f  %s%s\n", m[i].kernel[0] ? m[i].kernel : "(library's pick)",
             m[i].core[0] ? m[i].core : "-", m[i].gflops, i == best ? "chosen" : "", m[i].why);
    printf("choice: %s\n", g_describe);
    if (have_path) printf("cache: %s\n", path);
  }
  json_decref(j);
  return 0;
}
