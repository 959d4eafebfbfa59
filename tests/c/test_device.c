/* test_device: CPU memory, streams and events. Ordering is checked against
 * the obvious reference (a sequential run) with deliberate delays that make
 * any reordering visible. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "check.h"
#include "device/device_impl.h"
#include "fsdp.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_memory(void) {
  void *p = NULL;
  fsdp_memory_stats a, b;
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &a));
  CHECK_OK(fsdp_alloc(FSDP_CPU, 12345, &p));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.allocated - a.allocated == 12345 && b.peak >= b.allocated && b.allocs == a.allocs + 1);
  CHECK_OK(fsdp_free(FSDP_CPU, p));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.allocated == a.allocated && b.frees == a.frees + 1 && b.peak >= a.allocated + 12345);
  CHECK_OK(fsdp_memory_reset_peak(FSDP_CPU));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.peak == b.allocated);
  CHECK_OK(fsdp_alloc(FSDP_CPU, 1000, &p));
  CHECK(p && ((uintptr_t)p % 256) == 0);
  memset(p, 1, 1000);
  CHECK_OK(fsdp_free(FSDP_CPU, p));
  CHECK_OK(fsdp_free(FSDP_CPU, NULL));
  CHECK_OK(fsdp_alloc(FSDP_CPU, 0, &p));
  CHECK_OK(fsdp_free(FSDP_CPU, p));
  CHECK_FAILS(fsdp_alloc(7, 10, &p), FSDP_EINVAL, "unknown device 7");
  CHECK(p == NULL);
  CHECK_FAILS(fsdp_alloc(FSDP_CPU, SIZE_MAX - 1000, &p), FSDP_ENOMEM, "bytes on cpu");
  if (!fsdp_device_available(FSDP_CUDA)) {
    CHECK_FAILS(fsdp_alloc(FSDP_CUDA, 10, &p), FSDP_EUNSUPPORTED, "CUDA");
    CHECK(fsdp_device_count(FSDP_CUDA) == 0);
  }
  /* device names (the GPU's is checked by test_cuda) */
  char name[8];
  CHECK_OK(fsdp_device_name(FSDP_CPU, name, sizeof name));
  CHECK(strcmp(name, "cpu") == 0);
  CHECK_OK(fsdp_device_name(FSDP_CPU, name, 3));
  CHECK(strcmp(name, "cp") == 0);
  CHECK_FAILS(fsdp_device_name(FSDP_CPU, name, 0), FSDP_EINVAL, "no buffer");
  CHECK_FAILS(fsdp_device_name(7, name, sizeof name), FSDP_EINVAL, "unknown device 7");
  if (!fsdp_device_available(FSDP_CUDA)) CHECK_FAILS(fsdp_device_name(FSDP_CUDA, name, sizeof name), FSDP_EUNSUPPORTED, "CUDA");
  CHECK_OK(fsdp_alloc_host_pinned(4096, &p));
  CHECK_OK(fsdp_free_host_pinned(p));
}

static void test_stream_order(void) {
  fsdp_stream *a = NULL, *b = NULL;
  fsdp_event *e = NULL;
  CHECK_OK(fsdp_stream_create(FSDP_CPU, &a));
  CHECK_OK(fsdp_stream_create(FSDP_CPU, &b));
  CHECK_OK(fsdp_event_create(FSDP_CPU, &e));
  CHECK(fsdp_stream_device(a) == FSDP_CPU);
  enum { N = 1 << 20 };
  char *x = malloc(N), *y = malloc(N), *z = malloc(N);
  memset(x, 0, N);
  memset(y, 7, N);
  memset(z, 0, N);
  CHECK(fsdp_event_query(e) == 1); /* never recorded: complete */
  /* a: sleep, then x = y; record e.  b: wait e, then z = x. */
  double t0 = now();
  CHECK_OK(fsdp_stream_delay(a, 150000));
  CHECK_OK(fsdp_memcpy(x, y, N, a));
  CHECK_OK(fsdp_event_record(e, a));
  CHECK_OK(fsdp_stream_wait_event(b, e));
  CHECK_OK(fsdp_memcpy(z, x, N, b));
  CHECK(now() - t0 < 0.1); /* enqueueing did not block */
  CHECK(fsdp_event_query(e) == 0);
  CHECK(z[0] == 0 && x[N - 1] == 0);
  CHECK_OK(fsdp_stream_synchronize(b));
  CHECK(now() - t0 >= 0.14);
  CHECK(z[0] == 7 && z[N - 1] == 7);
  CHECK(fsdp_event_query(e) == 1);
  /* a wait captures the record at wait time: a later re-record is not waited for */
  CHECK_OK(fsdp_event_record(e, NULL));
  CHECK_OK(fsdp_stream_wait_event(b, e));
  CHECK_OK(fsdp_stream_delay(a, 300000));
  CHECK_OK(fsdp_event_record(e, a));
  t0 = now();
  CHECK_OK(fsdp_stream_synchronize(b));
  CHECK(now() - t0 < 0.2);
  CHECK_OK(fsdp_event_synchronize(e));
  /* host waits */
  CHECK_OK(fsdp_memset(x, 3, N, a));
  CHECK_OK(fsdp_event_record(e, a));
  CHECK_OK(fsdp_stream_wait_event(NULL, e));
  CHECK(x[0] == 3 && x[N - 1] == 3);
  CHECK_OK(fsdp_memset(y, 9, N, NULL));
  CHECK(y[5] == 9);
  CHECK_FAILS(fsdp_stream_delay(a, -1), FSDP_EINVAL, "negative");
  /* many tasks, in order */
  int counter_ok = 1;
  for (int i = 0; i < 1000; i++) CHECK_OK(fsdp_memset(x + i, i & 0x7f, 1, a));
  CHECK_OK(fsdp_stream_synchronize(a));
  for (int i = 0; i < 1000; i++) counter_ok &= x[i] == (i & 0x7f);
  CHECK(counter_ok);
  fsdp_event_destroy(e);
  fsdp_stream_destroy(a);
  fsdp_stream_destroy(b);
  free(x);
  free(y);
  free(z);
}

/* timed events (lua/fsdp/profile.lua's timeline): the time between two
 * records on a stream is the work between them (a 50 ms pause, within
 * 40-500 ms); an untimed or pending event is refused, never a number */
static void test_timed_events(void) {
  fsdp_stream *s = NULL;
  fsdp_event *a = NULL, *b = NULL, *plain = NULL;
  double sec = -1;
  CHECK_OK(fsdp_stream_create(FSDP_CPU, &s));
  CHECK_OK(fsdp_event_create_timed(FSDP_CPU, &a));
  CHECK_OK(fsdp_event_create_timed(FSDP_CPU, &b));
  CHECK_OK(fsdp_event_create(FSDP_CPU, &plain));
  CHECK_FAILS(fsdp_event_elapsed(a, b, &sec), FSDP_EINVAL, "has not completed"); /* never recorded */
  CHECK_OK(fsdp_event_record(a, s));
  CHECK_OK(fsdp_stream_delay(s, 50000));
  CHECK_OK(fsdp_event_record(b, s));
  CHECK_OK(fsdp_stream_delay(s, 300000)); /* b pending until the 50 ms pass; the stream goes on */
  if (fsdp_event_query(b) == 0) CHECK_FAILS(fsdp_event_elapsed(a, b, &sec), FSDP_EINVAL, "has not completed");
  CHECK_OK(fsdp_event_synchronize(b));
  CHECK_OK(fsdp_event_elapsed(a, b, &sec));
  CHECK(sec >= 0.04 && sec < 0.5);
  double back = 0;
  CHECK_OK(fsdp_event_elapsed(b, a, &back));
  CHECK(back == -sec);
  CHECK_OK(fsdp_event_record(plain, NULL));
  CHECK_FAILS(fsdp_event_elapsed(a, plain, &sec), FSDP_EINVAL, "not created timed");
  CHECK_FAILS(fsdp_event_elapsed(a, NULL, &sec), FSDP_EINVAL, "NULL");
  CHECK_OK(fsdp_stream_synchronize(s));
  fsdp_event_destroy(a);
  fsdp_event_destroy(b);
  fsdp_event_destroy(plain);
  fsdp_stream_destroy(s);
}

static int failing_task(void *arg) { return fsdp_fail(FSDP_ECOMM, "task %d broke", *(int *)arg); }
static int flag_task(void *arg) {
  *(int *)arg = 1;
  return FSDP_OK;
}

static void test_stream_failure(void) {
  fsdp_stream *s = NULL, *w = NULL;
  fsdp_event *e = NULL;
  CHECK_OK(fsdp_stream_create(FSDP_CPU, &s));
  CHECK_OK(fsdp_stream_create(FSDP_CPU, &w));
  CHECK_OK(fsdp_event_create(FSDP_CPU, &e));
  static int id = 5, ran = 0;
  CHECK_OK(fsdp_stream_delay(s, 100000)); /* so that all three are queued before the failure */
  CHECK_OK(fsdp_cpu_stream_enqueue(s, failing_task, &id, NULL));
  CHECK_OK(fsdp_cpu_stream_enqueue(s, flag_task, &ran, NULL));
  CHECK_OK(fsdp_event_record(e, s));
  CHECK_OK(fsdp_stream_wait_event(w, e));
  CHECK_FAILS(fsdp_stream_synchronize(s), FSDP_ECOMM, "task 5 broke");
  CHECK(ran == 0);                                     /* skipped after the failure */
  CHECK_FAILS(fsdp_event_synchronize(e), FSDP_ECOMM, "task 5 broke"); /* record completed, with the error */
  CHECK_FAILS(fsdp_stream_synchronize(w), FSDP_ECOMM, "task 5 broke"); /* and it propagates */
  CHECK_FAILS(fsdp_cpu_stream_enqueue(s, flag_task, &ran, NULL), FSDP_ECOMM, "task 5 broke");
  fsdp_event_destroy(e);
  fsdp_stream_destroy(s);
  fsdp_stream_destroy(w);
}

static void test_tensor(void) {
  fsdp_tensor t, v, w;
  int64_t shape[2] = {3, 5}, vs[1] = {4}, bad[1] = {20}, neg[2] = {2, -1};
  fsdp_memory_stats a, b;
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &a));
  CHECK_OK(fsdp_tensor_alloc(&t, FSDP_CPU, FSDP_BF16, 2, shape));
  CHECK(t.owns == 1 && t.ndim == 2 && t.shape[2] == 1 && fsdp_tensor_numel(&t) == 15 && fsdp_tensor_nbytes(&t) == 30);
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.allocated - a.allocated == 30);
  for (int i = 0; i < 15; i++) ((uint16_t *)t.data)[i] = (uint16_t)i;
  CHECK_OK(fsdp_tensor_view(&v, &t, 11, 1, vs)); /* elements 11..14 */
  CHECK(v.owns == 0 && ((uint16_t *)v.data)[0] == 11 && ((uint16_t *)v.data)[3] == 14 && v.dtype == FSDP_BF16);
  CHECK_FAILS(fsdp_tensor_view(&w, &t, 12, 1, vs), FSDP_EINVAL, "outside the base's 15");
  CHECK_FAILS(fsdp_tensor_view(&w, &t, 0, 1, bad), FSDP_EINVAL, "outside");
  CHECK_FAILS(fsdp_tensor_alloc(&w, FSDP_CPU, FSDP_FP32, 2, neg), FSDP_EINVAL, "dimension 1 has size -1");
  CHECK_FAILS(fsdp_tensor_alloc(&w, FSDP_CPU, FSDP_FP32, 5, shape), FSDP_EINVAL, "5 dimensions");
  /* a shape whose product overflows int64 (2^70 wrapped to 0 elements) */
  const int64_t huge[2] = {(int64_t)1 << 40, (int64_t)1 << 30};
  CHECK_FAILS(fsdp_tensor_alloc(&w, FSDP_CPU, FSDP_FP32, 2, huge), FSDP_EINVAL, "too many elements");
  CHECK_FAILS(fsdp_tensor_view(&w, &t, 0, 2, huge), FSDP_EINVAL, "too many elements");
  CHECK_OK(fsdp_tensor_free(&v)); /* a view frees nothing */
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.allocated - a.allocated == 30);
  CHECK_OK(fsdp_tensor_free(&t));
  CHECK_OK(fsdp_tensor_free(&t)); /* idempotent */
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.allocated == a.allocated);
}

/* The caching pool: a freed block is reused for the next request of its
 * size class; reserved counts class sizes (at most 25% over the request up
 * to 8 MiB, whole 2 MiB granules above); empty_cache gives cached blocks
 * back; a foreign or double free fails. */
/* Large blocks: whole 2 MiB granules (a 116.01 MiB row of the 1B model in
 * 118 MiB, not a 128 MiB class); a cached one serves a request at most 1/8
 * of itself smaller, the best fit first. */
static void test_caching_large(void) {
  const size_t MiB = (size_t)1 << 20;
  fsdp_memory_stats st, *a = &st, b;
  void *p = NULL, *q = NULL, *r = NULL;
  CHECK_OK(fsdp_memory_empty_cache(FSDP_CPU));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, a));
  CHECK_OK(fsdp_alloc(FSDP_CPU, 121645000, &p)); /* 116.01 MiB */
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.reserved - a->reserved == (int64_t)(118 * MiB) && b.allocated - a->allocated == 121645000);
  memset(p, 1, 121645000);
  CHECK_OK(fsdp_free(FSDP_CPU, p));
  CHECK_OK(fsdp_alloc(FSDP_CPU, 22 * MiB + 1, &p)); /* 24 MiB; the cached 118 MiB block is far too big */
  CHECK_OK(fsdp_alloc(FSDP_CPU, 26 * MiB, &q));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(p != q && b.reserved - a->reserved == (int64_t)((118 + 24 + 26) * MiB) && b.cached == (int64_t)(118 * MiB));
  CHECK_OK(fsdp_free(FSDP_CPU, q));
  CHECK_OK(fsdp_free(FSDP_CPU, p));
  CHECK_OK(fsdp_alloc(FSDP_CPU, 23 * MiB, &r)); /* 24 and 26 both fit: the smaller */
  CHECK(r == p);
  CHECK_OK(fsdp_alloc(FSDP_CPU, 23 * MiB, &p)); /* then the 26 MiB block (2 MiB spare <= 26/8) */
  CHECK(p == q);
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.reserved - a->reserved == (int64_t)((118 + 24 + 26) * MiB) && b.cached == (int64_t)(118 * MiB) &&
        b.allocated - a->allocated == (int64_t)(46 * MiB));
  CHECK_OK(fsdp_free(FSDP_CPU, p));
  CHECK_OK(fsdp_alloc(FSDP_CPU, 22 * MiB, &p)); /* 26 - 22 > 26/8: a new 22 MiB block */
  CHECK(p != q);
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.reserved - a->reserved == (int64_t)((118 + 24 + 26 + 22) * MiB));
  CHECK_OK(fsdp_free(FSDP_CPU, p));
  CHECK_OK(fsdp_free(FSDP_CPU, r));
  CHECK_OK(fsdp_memory_empty_cache(FSDP_CPU));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.cached == 0 && b.reserved == a->reserved && b.allocated == a->allocated);
}

static void test_caching(void) {
  fsdp_memory_stats a, b;
  void *p = NULL, *q = NULL, *r = NULL;
  CHECK_OK(fsdp_memory_empty_cache(FSDP_CPU));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &a));
  CHECK(a.cached == 0 && a.reserved >= a.allocated);
  CHECK_OK(fsdp_alloc(FSDP_CPU, 1000000, &p)); /* class 2^19 * 2 = 1048576 */
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.reserved - a.reserved == 1048576 && b.allocated - a.allocated == 1000000);
  CHECK(b.peak_reserved >= b.reserved);
  CHECK_OK(fsdp_free(FSDP_CPU, p));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.cached == 1048576 && b.reserved - a.reserved == 1048576 && b.allocated == a.allocated);
  CHECK_OK(fsdp_alloc(FSDP_CPU, 950000, &q)); /* same class: the cached block */
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(q == p && b.cache_hits == a.cache_hits + 1 && b.cached == 0);
  CHECK_OK(fsdp_alloc(FSDP_CPU, 700000, &r)); /* class 786432: a new block */
  CHECK(r != q);
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.reserved - a.reserved == 1048576 + 786432);
  CHECK_OK(fsdp_free(FSDP_CPU, q));
  CHECK_OK(fsdp_free(FSDP_CPU, r));
  CHECK_FAILS(fsdp_free(FSDP_CPU, r), FSDP_EINVAL, "freed already");
  int local = 0;
  CHECK_FAILS(fsdp_free(FSDP_CPU, &local), FSDP_EINVAL, "was not allocated by fsdp_alloc");
  CHECK_OK(fsdp_memory_empty_cache(FSDP_CPU));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.cached == 0 && b.reserved == a.reserved && b.allocated == a.allocated);
  /* many blocks at once (the block table grows), all distinct, all freed */
  enum { N = 3000 };
  static void *blocks[N];
  int ok = 1;
  for (int i = 0; i < N; i++) ok &= fsdp_alloc(FSDP_CPU, (size_t)(i % 97) * 40 + 1, &blocks[i]) == 0;
  for (int i = 0; i < N; i++) memset(blocks[i], 0x5a, (size_t)(i % 97) * 40 + 1);
  for (int i = N - 1; i >= 0; i -= 2) ok &= fsdp_free(FSDP_CPU, blocks[i]) == 0;
  for (int i = N - 2; i >= 0; i -= 2) ok &= fsdp_free(FSDP_CPU, blocks[i]) == 0;
  CHECK(ok);
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &b));
  CHECK(b.allocated == a.allocated && b.frees == a.frees + 3 + N);
  test_caching_large();
  CHECK_FAILS(fsdp_memory_get_stats(7, &b), FSDP_EINVAL, "unknown device 7");
  /* the machine's memory: MemTotal equals the kernel's page count (1%) */
  int64_t avail = 0, total = 0;
  CHECK_OK(fsdp_device_memory_info(FSDP_CPU, &avail, &total));
  double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  CHECK(avail > 0 && avail <= total && fabs((double)total - phys) <= 0.01 * phys);
}

/* The CUDA backend is a library opened on demand (src/device/cuda_loader.c):
 * host memory and copies never open it, and where it cannot be opened
 * (FSDP_CUDA_LIB naming a missing file, or a build without CUDA) every CUDA
 * call fails with that reason instead of crashing. */
static void test_cuda_backend_loading(void) {
  void *p = NULL;
  char a[64] = "host", b[64];
  CHECK_OK(fsdp_alloc_host_pinned(64, &p));
  CHECK_OK(fsdp_memcpy(b, a, sizeof a, NULL));
  CHECK_OK(fsdp_free_host_pinned(p));
  const char *lib = getenv("FSDP_CUDA_LIB");
  if (lib && strstr(lib, "does-not-exist")) {
    /* a build without CUDA has no backend to look for */
    CHECK(fsdp_device_available(FSDP_CUDA) == 0);
    const char *why = strstr(fsdp_last_error(), "built without CUDA") ? "built without CUDA" : "does-not-exist";
    CHECK(strstr(fsdp_last_error(), "no CUDA backend") && strstr(fsdp_last_error(), why));
    CHECK(fsdp_cuda_library() == NULL);
    fsdp_stream *s = NULL;
    CHECK_FAILS(fsdp_stream_create(FSDP_CUDA, &s), FSDP_EUNSUPPORTED, why);
    CHECK_FAILS(fsdp_device_set(FSDP_CUDA, 0), FSDP_EUNSUPPORTED, why);
  }
}

int main(void) {
  test_cuda_backend_loading();
  test_caching();
  test_tensor();
  test_memory();
  test_stream_order();
  test_timed_events();
  test_stream_failure();
  return fsdp_test_summary("test_device");
}
