/* native_loop: the malloc/free loops of bench_malloc_free.py, in C, against the C ABI.
 *
 * Owns: nothing the library depends on. bench_malloc_free.py compiles it at run time (when
 * a C compiler is there) and links it to the installed _vtalloc library, so the same core is
 * timed with no Python or ctypes in the loop. The difference between its figures and the
 * Python ones is the per-call cost of the Python API.
 *
 * usage: native_loop BACKEND CAPACITY MODE SIZE THREADS TARGET_MS REPEATS
 *   BACKEND  1 = host, 2 = cuda (VTA_BACKEND_*)
 *   MODE     steady: each thread loops malloc(SIZE)+free on one shared space (cached reuse)
 *            map:    one thread; each cycle an untimed vta_trim gives every cached page back,
 *                    so the timed malloc(SIZE)+free must create, map and set access again
 * Prints one JSON object on stdout; on a vtalloc error prints it on stderr and exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vtalloc/vtalloc.h"

#define MAX_THREADS 64
#define MAX_REPEATS 64

static void check(vta_status_t s, const char* what) {
  if (s == VTA_OK) return;
  const char* msg = vta_last_error();
  fprintf(stderr, "native_loop: %s failed with status %d: %s\n", what, (int)s, msg ? msg : "");
  exit(1);
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef struct {
  vta_space_t* space;
  uint64_t size;
  long iters;
  pthread_barrier_t* start;
} worker_arg;

static void* steady_worker(void* p) {
  worker_arg* a = (worker_arg*)p;
  pthread_barrier_wait(a->start);
  for (long i = 0; i < a->iters; ++i) {
    uint64_t addr = 0;
    check(vta_malloc(a->space, a->size, 0, &addr), "vta_malloc");
    check(vta_free(a->space, addr), "vta_free");
  }
  return NULL;
}

/* Wall time of THREADS threads each doing ITERS pairs, per pair (all threads together). */
static double steady_once(vta_space_t* space, uint64_t size, int threads, long iters) {
  pthread_t tids[MAX_THREADS];
  worker_arg args[MAX_THREADS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  for (int t = 0; t < threads; ++t) {
    args[t] = (worker_arg){space, size, iters, &start};
    pthread_create(&tids[t], NULL, steady_worker, &args[t]);
  }
  pthread_barrier_wait(&start);
  double t0 = now_ns();
  for (int t = 0; t < threads; ++t) pthread_join(tids[t], NULL);
  double t1 = now_ns();
  pthread_barrier_destroy(&start);
  return (t1 - t0) / ((double)iters * threads);
}

/* Per timed pair; only the malloc+free is inside the clock, not the trim. */
static double map_once(vta_space_t* space, uint64_t size, long iters) {
  double total = 0;
  for (long i = 0; i < iters; ++i) {
    uint64_t released = 0, addr = 0;
    check(vta_trim(space, &released), "vta_trim");
    double t0 = now_ns();
    check(vta_malloc(space, size, 0, &addr), "vta_malloc");
    check(vta_free(space, addr), "vta_free");
    total += now_ns() - t0;
  }
  return total / (double)iters;
}

static double run_once(int map, vta_space_t* space, uint64_t size, int threads, long iters) {
  return map ? map_once(space, size, iters) : steady_once(space, size, threads, iters);
}

int main(int argc, char** argv) {
  if (argc != 8) {
    fprintf(stderr, "usage: %s BACKEND CAPACITY steady|map SIZE THREADS TARGET_MS REPEATS\n", argv[0]);
    return 2;
  }
  int backend = atoi(argv[1]);
  uint64_t capacity = strtoull(argv[2], NULL, 10);
  int map = strcmp(argv[3], "map") == 0;
  uint64_t size = strtoull(argv[4], NULL, 10);
  int threads = atoi(argv[5]);
  double target_ns = atof(argv[6]) * 1e6;
  int repeats = atoi(argv[7]);
  if (threads < 1 || threads > MAX_THREADS || repeats < 1 || repeats > MAX_REPEATS || (map && threads != 1)) {
    fprintf(stderr, "native_loop: bad THREADS or REPEATS (map runs one thread)\n");
    return 2;
  }

  vta_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.backend = backend;
  cfg.capacity_bytes = capacity;
  vta_space_t* space = NULL;
  check(vta_space_create(&cfg, &space), "vta_space_create");

  /* Warm up: map what THREADS live allocations need, so the steady loop finds it cached;
   * for map, leave one cached range of SIZE behind. */
  uint64_t held[MAX_THREADS];
  for (int t = 0; t < threads; ++t) check(vta_malloc(space, size, 0, &held[t]), "vta_malloc (warm-up)");
  for (int t = 0; t < threads; ++t) check(vta_free(space, held[t]), "vta_free (warm-up)");

  /* Calibrate: grow ITERS until one run lasts about TARGET_MS. */
  long iters = map ? 20 : 2000;
  for (;;) {
    double per_op = run_once(map, space, size, threads, iters);
    double spent = per_op * (double)iters * (map ? 1 : threads);
    if (spent >= target_ns * 0.5 || iters > 100000000L) {
      if (spent < target_ns) iters = (long)((double)iters * target_ns / (spent > 1 ? spent : 1));
      break;
    }
    iters *= 4;
  }
  if (iters < 1) iters = 1;

  vta_stats_t before, after;
  memset(&before, 0, sizeof before);
  before.struct_size = sizeof before;
  after = before;
  check(vta_stats(space, &before), "vta_stats");
  double per_op[MAX_REPEATS];
  for (int r = 0; r < repeats; ++r) per_op[r] = run_once(map, space, size, threads, iters);
  check(vta_stats(space, &after), "vta_stats");

  long total_ops = iters * (long)repeats * (map ? 1 : threads);
  printf("{\"mode\": \"%s\", \"size_bytes\": %llu, \"threads\": %d, \"pairs_per_thread_per_repeat\": %ld, "
         "\"repeats_ns_per_op\": [",
         map ? "map" : "steady", (unsigned long long)size, threads, iters);
  for (int r = 0; r < repeats; ++r) printf("%s%.2f", r ? ", " : "", per_op[r]);
  /* Counter deltas cover every timed pair (and, for map, the untimed trims). */
  printf("], \"timed_ops\": %ld, \"page_reclaims\": %llu, \"map_calls\": %llu, \"unmap_calls\": %llu, "
         "\"page_bytes\": %llu, \"capacity_bytes\": %llu}\n",
         total_ops, (unsigned long long)(after.num_page_reclaims - before.num_page_reclaims),
         (unsigned long long)(after.num_map_calls - before.num_map_calls),
         (unsigned long long)(after.num_unmap_calls - before.num_unmap_calls),
         (unsigned long long)after.page_bytes, (unsigned long long)after.capacity_bytes);

  check(vta_space_close(space), "vta_space_close");
  vta_space_destroy(space);
  return 0;
}
