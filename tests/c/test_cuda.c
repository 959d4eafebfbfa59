/* test_cuda: the CUDA backend and the NCCL transport on a real GPU, checked
 * against CPU references; exits 77 (ctest: skipped) where no GPU is present.
 *
 * NCCL refuses two ranks on one GPU, and our GPU machines have one GPU, so
 * the collectives run on a world of one: that checks the whole path (PMIx
 * bootstrap, communicator per group, streams, dtypes, the bf16 -> fp32
 * reduce-scatter with its cast kernel) but not multi-GPU data movement,
 * which the shared-memory transport's tests cover with the same API.
 * Outputs are poisoned (NaN) before every collective; NaN never passes.
 * Every collective runs for fp32, bf16 and fp16, sum and avg (where it has an
 * op), sizes 0, 1, 1001 and 16M elements (64 MiB in fp32), plus bf16/fp16 ->
 * fp32 reduce-scatter. Tolerance: inputs are multiples of 1/4 below 8, exact
 * in every dtype, so results must match bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fsdp.h"

static float value(size_t i) { return (float)((int)(i * 7u % 61u) - 30) * 0.25f; }

static void fill_host(void *h, int dtype, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (dtype == FSDP_FP32)
      ((float *)h)[i] = value(i);
    else if (dtype == FSDP_BF16)
      ((uint16_t *)h)[i] = fsdp_f32_to_bf16(value(i));
    else
      ((uint16_t *)h)[i] = fsdp_f32_to_fp16(value(i));
  }
}

static double get(const void *h, int dtype, size_t i) {
  if (dtype == FSDP_FP32) return ((const float *)h)[i];
  uint16_t v = ((const uint16_t *)h)[i];
  return dtype == FSDP_BF16 ? fsdp_bf16_to_f32(v) : fsdp_fp16_to_f32(v);
}

static int all_bytes(const unsigned char *p, int v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)v) return 0;
  return 1;
}

static void test_memory_streams(void) {
  size_t n = 1 << 22;
  void *d1 = NULL, *d2 = NULL, *pinned = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, n, &d1));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, n, &d2));
  CHECK_OK(fsdp_alloc_host_pinned(n, &pinned));
  CHECK(fsdp_device_count(FSDP_CUDA) >= 1);
  char *h = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n; i++) h[i] = (char)(i * 31);
  /* synchronous copies and fills: done when the call returns */
  CHECK_OK(fsdp_memset(d2, 0x5a, n, NULL));
  CHECK_OK(fsdp_memcpy(back, d2, n, NULL));
  CHECK(all_bytes((unsigned char *)back, 0x5a, n));
  CHECK_OK(fsdp_memcpy(d1, h, n, NULL));
  CHECK_OK(fsdp_memcpy(d2, d1, n, NULL));
  memset(back, 0, n);
  CHECK_OK(fsdp_memcpy(back, d2, n, NULL));
  CHECK(memcmp(back, h, n) == 0);
  CHECK_OK(fsdp_memset(d2, 0, n, NULL));
  fsdp_stream *a = NULL, *b = NULL;
  fsdp_event *e = NULL;
  CHECK_OK(fsdp_stream_create(FSDP_CUDA, &a));
  CHECK_OK(fsdp_stream_create(FSDP_CUDA, &b));
  CHECK_OK(fsdp_event_create(FSDP_CUDA, &e));
  CHECK(fsdp_stream_device(a) == FSDP_CUDA);
  /* a: delay, then d2 = d1; record. b: wait, then pinned = d2 */
  CHECK_OK(fsdp_stream_delay(a, 200000));
  CHECK_OK(fsdp_memcpy(d2, d1, n, a));
  CHECK_OK(fsdp_event_record(e, a));
  CHECK_OK(fsdp_stream_wait_event(b, e));
  memset(pinned, 0, n);
  CHECK_OK(fsdp_memcpy(pinned, d2, n, b));
  CHECK(fsdp_event_query(e) == 0);
  CHECK_OK(fsdp_stream_synchronize(b));
  CHECK(fsdp_event_query(e) == 1);
  CHECK(memcmp(pinned, h, n) == 0);
  /* async fill and pinned -> device on a stream, waited through an event */
  CHECK_OK(fsdp_memset(d1, 0x11, n, a));
  CHECK_OK(fsdp_memcpy(d1, pinned, n / 2, a));
  CHECK_OK(fsdp_event_record(e, a));
  CHECK_OK(fsdp_event_synchronize(e));
  CHECK_OK(fsdp_memcpy(back, d1, n, NULL));
  CHECK(memcmp(back, h, n / 2) == 0 && all_bytes((unsigned char *)back + n / 2, 0x11, n - n / 2));
  CHECK(fsdp_event_query(e) == 1);
  void *big = NULL;
  CHECK_FAILS(fsdp_alloc(FSDP_CUDA, (size_t)1 << 50, &big), FSDP_ENOMEM, "bytes on the GPU failed");
  CHECK(big == NULL);
  CHECK_OK(fsdp_event_destroy(e));
  CHECK_OK(fsdp_stream_destroy(a));
  CHECK_OK(fsdp_stream_destroy(b));
  CHECK_OK(fsdp_free(FSDP_CUDA, d1));
  CHECK_OK(fsdp_free(FSDP_CUDA, d2));
  CHECK_OK(fsdp_free_host_pinned(pinned));
  free(h);
  free(back);
}

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE_SCATTER_F32, KINDS };
static const char *kind_name[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce_scatter->fp32"};

/* one rank: all_reduce/all_gather/broadcast copy, reduce_scatter converts;
 * avg over one rank is the sum. Returns the number of wrong elements. */
static int run_one(fsdp_comm *c, int kind, int in_dt, int op, size_t n) {
  int out_dt = kind == REDUCE_SCATTER_F32 ? FSDP_FP32 : in_dt;
  size_t ib = n * fsdp_dtype_size(in_dt), ob = n * fsdp_dtype_size(out_dt);
  void *hin = malloc(ib + 4), *hout = malloc(ob + 4), *din = NULL, *dout = NULL;
  fill_host(hin, in_dt, n);
  CHECK_OK(fsdp_alloc(FSDP_CUDA, ib, &din));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, ob, &dout));
  CHECK_OK(fsdp_memcpy(din, hin, ib, NULL));
  CHECK_OK(fsdp_memset(dout, 0xff, ob, NULL)); /* NaN in every dtype */
  switch (kind) {
    case ALL_REDUCE: CHECK_OK(fsdp_comm_all_reduce(c, dout, din, n, in_dt, op)); break;
    case ALL_GATHER: CHECK_OK(fsdp_comm_all_gather(c, dout, din, n, in_dt)); break;
    case BROADCAST:
      CHECK_OK(fsdp_memcpy(dout, din, ib, NULL));
      CHECK_OK(fsdp_comm_broadcast(c, dout, n, in_dt, 0));
      break;
    default: CHECK_OK(fsdp_comm_reduce_scatter(c, dout, out_dt, din, in_dt, n, op)); break;
  }
  CHECK_OK(fsdp_comm_barrier(c));
  CHECK_OK(fsdp_comm_synchronize(c));
  CHECK_OK(fsdp_memcpy(hout, dout, ob, NULL));
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    double want = get(hin, in_dt, i), got = get(hout, out_dt, i);
    if (isnan(got) || got != want) {
      if (bad++ < 3)
        fprintf(stderr, "%s %s->%s %s n=%zu: [%zu] = %g, expected %g\n", kind_name[kind], fsdp_dtype_name(in_dt),
                fsdp_dtype_name(out_dt), op == FSDP_AVG ? "avg" : "sum", n, i, got, want);
    }
  }
  CHECK_OK(fsdp_free(FSDP_CUDA, din));
  CHECK_OK(fsdp_free(FSDP_CUDA, dout));
  free(hin);
  free(hout);
  return bad;
}

static void test_collectives(fsdp_comm *c) {
  static const size_t sizes[] = {0, 1, 1001, (size_t)16 << 20};
  static const int dtypes[] = {FSDP_FP32, FSDP_BF16, FSDP_FP16};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
      for (int kind = 0; kind < KINDS; kind++)
        for (int op = FSDP_SUM; op <= FSDP_AVG; op++) {
          if (kind == REDUCE_SCATTER_F32 && dtypes[d] == FSDP_FP32) continue;
          if ((kind == ALL_GATHER || kind == BROADCAST) && op != FSDP_SUM) continue; /* no op */
          CHECK(run_one(c, kind, dtypes[d], op, sizes[k]) == 0);
        }
  /* more than one staging block (64 Mi fp32 at one rank): the chunked cast
   * of comm_cast_chunks.c through NCCL, its second chunk a short one */
  CHECK(run_one(c, REDUCE_SCATTER_F32, FSDP_BF16, FSDP_SUM, fsdp_comm_cast_chunk((size_t)1 << 30, 1) + 1001) == 0);
}

/* The overlap pattern of docs/COLLECTIVES.md: a compute stream writes the
 * input late (behind a delay), the comm stream waits on its event, gathers,
 * and the compute stream waits on the gather before reading. */
static void test_comm_stream_order(fsdp_comm *c) {
  size_t n = 1 << 20, bytes = n * sizeof(float);
  float *h = malloc(bytes), *back = NULL; /* pinned: a copy to pageable memory may block until done */
  CHECK_OK(fsdp_alloc_host_pinned(bytes, (void **)&back));
  for (size_t i = 0; i < n; i++) h[i] = value(i);
  void *src = NULL, *in = NULL, *out = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, bytes, &src));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, bytes, &in));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, bytes, &out));
  CHECK_OK(fsdp_memcpy(src, h, bytes, NULL));
  CHECK_OK(fsdp_memset(in, 0xff, bytes, NULL));
  CHECK_OK(fsdp_memset(out, 0xff, bytes, NULL));
  fsdp_stream *compute = NULL;
  fsdp_event *ready = NULL, *gathered = NULL;
  CHECK_OK(fsdp_stream_create(FSDP_CUDA, &compute));
  CHECK_OK(fsdp_event_create(FSDP_CUDA, &ready));
  CHECK_OK(fsdp_event_create(FSDP_CUDA, &gathered));
  CHECK(fsdp_stream_device(fsdp_comm_stream(c)) == FSDP_CUDA);
  CHECK_OK(fsdp_stream_delay(compute, 200000));
  CHECK_OK(fsdp_memcpy(in, src, bytes, compute));
  CHECK_OK(fsdp_event_record(ready, compute));
  CHECK_OK(fsdp_stream_wait_event(fsdp_comm_stream(c), ready));
  CHECK_OK(fsdp_comm_all_gather(c, out, in, n, FSDP_FP32));
  CHECK_OK(fsdp_event_record(gathered, fsdp_comm_stream(c)));
  CHECK_OK(fsdp_stream_wait_event(compute, gathered));
  CHECK_OK(fsdp_memcpy(back, out, bytes, compute));
  CHECK(fsdp_event_query(gathered) == 0); /* still behind the delay */
  CHECK_OK(fsdp_stream_synchronize(compute));
  CHECK(memcmp(back, h, bytes) == 0);
  CHECK_OK(fsdp_comm_synchronize(c));
  fsdp_event_destroy(ready);
  fsdp_event_destroy(gathered);
  fsdp_stream_destroy(compute);
  fsdp_free(FSDP_CUDA, src);
  fsdp_free(FSDP_CUDA, in);
  fsdp_free(FSDP_CUDA, out);
  free(h);
  fsdp_free_host_pinned(back);
}

/* User-buffer registration: buffers from ncclMemAlloc, registered (and,
 * where this NCCL has them, as symmetric windows), gather and reduce exactly
 * like plain ones, and a pool can be registered before use. */
static void test_registration(fsdp_comm *c) {
  size_t n = (size_t)1 << 20, bytes = n * sizeof(float);
  float *h = malloc(bytes), *back = malloc(bytes * (size_t)fsdp_comm_size(c));
  for (size_t i = 0; i < n; i++) h[i] = value(i);
  for (int mode = FSDP_REG_BUFFER; mode <= FSDP_REG_WINDOW; mode++) {
    void *in = NULL, *out = NULL;
    fsdp_comm_reg *ri = NULL, *ro = NULL;
    size_t ob = bytes * (size_t)fsdp_comm_size(c);
    CHECK_OK(fsdp_comm_mem_alloc(c, mode, bytes, &in));
    CHECK_OK(fsdp_comm_mem_alloc(c, mode, ob, &out));
    int rc = fsdp_comm_register(c, in, bytes, mode, &ri);
    if (rc == FSDP_EUNSUPPORTED && mode == FSDP_REG_WINDOW) { /* an NCCL before 2.27: said, not hidden */
      printf("test_cuda: symmetric windows not available: %s\n", fsdp_last_error());
    } else {
      CHECK(rc == FSDP_OK && fsdp_comm_reg_active(ri));
      CHECK_OK(fsdp_comm_register(c, out, ob, mode, &ro));
      CHECK_OK(fsdp_memcpy(in, h, bytes, NULL));
      CHECK_OK(fsdp_comm_all_gather(c, out, in, n, FSDP_FP32));
      CHECK_OK(fsdp_comm_synchronize(c));
      CHECK_OK(fsdp_memcpy(back, out, ob, NULL));
      int bad = 0;
      for (int r = 0; r < fsdp_comm_size(c); r++) bad += memcmp(back + (size_t)r * n, h, bytes) != 0;
      CHECK(bad == 0);
      CHECK_OK(fsdp_comm_deregister(c, ro));
      CHECK_OK(fsdp_comm_deregister(c, ri));
    }
    CHECK_OK(fsdp_comm_mem_free(c, mode, in));
    CHECK_OK(fsdp_comm_mem_free(c, mode, out));
  }
  fsdp_pool *p = NULL;
  int64_t slots[2] = {(int64_t)bytes, (int64_t)bytes};
  CHECK_OK(fsdp_pool_create(FSDP_CUDA, 2, slots, &p));
  CHECK_OK(fsdp_pool_register(p, c, FSDP_REG_BUFFER));
  fsdp_pool_destroy(p);
  free(h);
  free(back);
}

/* The CUDA caching pool: statistics follow allocations, a freed block is
 * reused for its size class, empty_cache gives it back to the device. */
/* timed events on a GPU stream: a 20 ms delay kernel between two records
 * reads 15-500 ms; an untimed event is refused */
static void test_timed_events(void) {
  fsdp_stream *s = NULL;
  fsdp_event *a = NULL, *b = NULL, *plain = NULL;
  double sec = -1;
  CHECK_OK(fsdp_stream_create(FSDP_CUDA, &s));
  CHECK_OK(fsdp_event_create_timed(FSDP_CUDA, &a));
  CHECK_OK(fsdp_event_create_timed(FSDP_CUDA, &b));
  CHECK_OK(fsdp_event_create(FSDP_CUDA, &plain));
  CHECK_OK(fsdp_event_record(a, s));
  CHECK_OK(fsdp_stream_delay(s, 20000));
  CHECK_OK(fsdp_event_record(b, s));
  CHECK_OK(fsdp_event_record(plain, s));
  CHECK_OK(fsdp_stream_synchronize(s));
  CHECK_OK(fsdp_event_elapsed(a, b, &sec));
  CHECK(sec >= 0.015 && sec < 0.5);
  CHECK_FAILS(fsdp_event_elapsed(a, plain, &sec), FSDP_EINVAL, "not created timed");
  fsdp_event_destroy(a);
  fsdp_event_destroy(b);
  fsdp_event_destroy(plain);
  fsdp_stream_destroy(s);
}

static void test_cuda_pool(void) {
  fsdp_memory_stats a, b;
  void *p = NULL, *q = NULL;
  CHECK_OK(fsdp_memory_empty_cache(FSDP_CUDA));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CUDA, &a));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, 3000000, &p)); /* class 3145728 */
  CHECK_OK(fsdp_memory_get_stats(FSDP_CUDA, &b));
  CHECK(b.allocated - a.allocated == 3000000 && b.reserved - a.reserved == 3145728);
  CHECK_OK(fsdp_free(FSDP_CUDA, p));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, 3100000, &q));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CUDA, &b));
  CHECK(q == p && b.cache_hits == a.cache_hits + 1);
  CHECK_OK(fsdp_free(FSDP_CUDA, q));
  CHECK_FAILS(fsdp_free(FSDP_CUDA, q), FSDP_EINVAL, "freed already");
  /* above 8 MiB whole 2 MiB granules: 116.01 MiB (a 1B layer's bf16 row) in 118 */
  CHECK_OK(fsdp_memory_empty_cache(FSDP_CUDA));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CUDA, &a));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, 121645000, &p));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CUDA, &b));
  CHECK(b.reserved - a.reserved == 118 << 20 && b.allocated - a.allocated == 121645000);
  CHECK_OK(fsdp_free(FSDP_CUDA, p));
  CHECK_OK(fsdp_memory_empty_cache(FSDP_CUDA));
  CHECK_OK(fsdp_memory_get_stats(FSDP_CUDA, &b));
  CHECK(b.reserved == a.reserved && b.allocated == a.allocated && b.cached == 0);
}

int main(void) {
  if (!fsdp_device_available(FSDP_CUDA)) {
    printf("test_cuda: skipped: %s\n", fsdp_last_error());
    return 77;
  }
  fsdp_proc_info info;
  CHECK_OK(fsdp_init(&info));
  char name[256];
  CHECK_OK(fsdp_device_name(FSDP_CUDA, name, sizeof name));
  CHECK(strlen(name) > 0); /* the MFU's table is keyed by it (lua/fsdp/peak.lua) */
  printf("test_cuda: %d GPU(s) (%s), rank %d of %d\n", info.device_count, name, info.rank, info.size);
  test_memory_streams();
  test_timed_events();
  test_cuda_pool();
  fsdp_mesh *m = NULL;
  fsdp_comm *c = fsdp_test_world(FSDP_CUDA, &m);
  if (c) {
    CHECK(fsdp_comm_size(c) == info.size);
    float x = 0;
    CHECK_FAILS(fsdp_comm_reduce_scatter(c, &x, FSDP_BF16, &x, FSDP_FP32, 1, FSDP_SUM), FSDP_EINVAL, "not supported");
    test_collectives(c);
    test_comm_stream_order(c);
    test_registration(c);
    char desc[1024];
    CHECK_OK(fsdp_mesh_describe(m, desc, sizeof desc));
    printf("%s\n", desc);
  }
  fsdp_mesh_destroy(m);
  fsdp_finalize();
  return fsdp_test_summary("test_cuda");
}
