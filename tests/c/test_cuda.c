/* test_cuda: the CUDA backend and the NCCL transport on a real GPU, checked
 * against CPU references; exits 77 (ctest: skipped) where no GPU is present.
 *
 * NCCL refuses two ranks on one GPU, and our GPU machines have one GPU, so
 * the collectives run on a world of one: that checks the whole path (PMIx
 * bootstrap, communicator per group, streams, dtypes, the bf16 -> fp32
 * reduce-scatter with its cast kernel) but not multi-GPU data movement,
 * which the shared-memory transport's tests cover with the same API.
 * Outputs are poisoned (NaN) before every collective; NaN never passes.
 * Tolerance: inputs are multiples of 1/4 below 8, exact in bf16 and fp32, so
 * results must match bit for bit. */
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
    else
      ((uint16_t *)h)[i] = fsdp_f32_to_bf16(value(i));
  }
}

static double get(const void *h, int dtype, size_t i) {
  return dtype == FSDP_FP32 ? ((const float *)h)[i] : fsdp_bf16_to_f32(((const uint16_t *)h)[i]);
}

static void test_memory_streams(void) {
  size_t n = 1 << 22;
  void *d1 = NULL, *d2 = NULL, *pinned = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, n, &d1));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, n, &d2));
  CHECK_OK(fsdp_alloc_host_pinned(n, &pinned));
  char *h = malloc(n);
  for (size_t i = 0; i < n; i++) h[i] = (char)(i * 31);
  CHECK_OK(fsdp_memcpy(d1, h, n, NULL));
  CHECK_OK(fsdp_memset(d2, 0, n, NULL));
  fsdp_stream *a = NULL, *b = NULL;
  fsdp_event *e = NULL;
  CHECK_OK(fsdp_stream_create(FSDP_CUDA, &a));
  CHECK_OK(fsdp_stream_create(FSDP_CUDA, &b));
  CHECK_OK(fsdp_event_create(FSDP_CUDA, &e));
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
  void *big = NULL;
  CHECK_FAILS(fsdp_alloc(FSDP_CUDA, (size_t)1 << 50, &big), FSDP_ENOMEM, "bytes on the GPU failed");
  fsdp_event_destroy(e);
  fsdp_stream_destroy(a);
  fsdp_stream_destroy(b);
  fsdp_free(FSDP_CUDA, d1);
  fsdp_free(FSDP_CUDA, d2);
  fsdp_free_host_pinned(pinned);
  free(h);
}

/* one rank: all_reduce/all_gather/broadcast copy, reduce_scatter converts */
static void test_collectives(fsdp_comm *c) {
  static const size_t sizes[] = {0, 1, 1001, (size_t)16 << 20};
  int dtypes[] = {FSDP_FP32, FSDP_BF16};
  for (size_t k = 0; k < 4; k++)
    for (int d = 0; d < 2; d++)
      for (int kind = 0; kind < 5; kind++) {
        int in_dt = dtypes[d], out_dt = kind == 4 ? FSDP_FP32 : in_dt;
        if (kind == 4 && in_dt == FSDP_FP32) continue;
        size_t n = sizes[k], ib = n * fsdp_dtype_size(in_dt), ob = n * fsdp_dtype_size(out_dt);
        void *hin = malloc(ib + 4), *hout = malloc(ob + 4), *din = NULL, *dout = NULL;
        fill_host(hin, in_dt, n);
        CHECK_OK(fsdp_alloc(FSDP_CUDA, ib, &din));
        CHECK_OK(fsdp_alloc(FSDP_CUDA, ob, &dout));
        CHECK_OK(fsdp_memcpy(din, hin, ib, NULL));
        CHECK_OK(fsdp_memset(dout, 0xff, ob, NULL)); /* NaN */
        int op = k % 2 ? FSDP_AVG : FSDP_SUM;
        switch (kind) {
          case 0: CHECK_OK(fsdp_comm_all_reduce(c, dout, din, n, in_dt, op)); break;
          case 1: CHECK_OK(fsdp_comm_all_gather(c, dout, din, n, in_dt)); break;
          case 2: CHECK_OK(fsdp_comm_reduce_scatter(c, dout, out_dt, din, in_dt, n, op)); break;
          case 3:
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
              fprintf(stderr, "kind %d %s->%s n=%zu: [%zu] = %g, expected %g\n", kind, fsdp_dtype_name(in_dt),
                      fsdp_dtype_name(out_dt), n, i, got, want);
          }
        }
        CHECK(bad == 0);
        fsdp_free(FSDP_CUDA, din);
        fsdp_free(FSDP_CUDA, dout);
        free(hin);
        free(hout);
      }
}

int main(void) {
  if (!fsdp_device_available(FSDP_CUDA)) {
    printf("test_cuda: skipped: %s\n", fsdp_last_error());
    return 77;
  }
  fsdp_proc_info info;
  CHECK_OK(fsdp_init(&info));
  printf("test_cuda: %d GPU(s), rank %d of %d\n", info.device_count, info.rank, info.size);
  test_memory_streams();
  fsdp_mesh *m = NULL;
  fsdp_comm *c = fsdp_test_world(FSDP_CUDA, &m);
  if (c) {
    CHECK(fsdp_comm_size(c) == info.size);
    float x = 0;
    CHECK_FAILS(fsdp_comm_reduce_scatter(c, &x, FSDP_BF16, &x, FSDP_FP32, 1, FSDP_SUM), FSDP_EINVAL, "not supported");
    test_collectives(c);
    char desc[1024];
    CHECK_OK(fsdp_mesh_describe(m, desc, sizeof desc));
    printf("%s\n", desc);
  }
  fsdp_mesh_destroy(m);
  fsdp_finalize();
  return fsdp_test_summary("test_cuda");
}
