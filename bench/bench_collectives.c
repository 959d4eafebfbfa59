/* bench_collectives: nccl-tests-style bandwidth of every collective, run on
 * each rank of a job (fsdprun -n N --host bench_collectives [options]).
 *
 * For each size (the bytes of the full buffer: the all_reduce vector, the
 * all_gather output, the reduce_scatter input) it prints the time per call,
 * the algorithm bandwidth (size / time) and the bus bandwidth (algbw times
 * nccl-tests' factor: 2(n-1)/n for all_reduce, (n-1)/n for all_gather and
 * reduce_scatter, 1 for broadcast), next to the bandwidth of a plain copy
 * of the same size measured in the same run on the same rank: memcpy in host
 * memory for CPU ranks, a device-to-device copy on the comm's stream for
 * GPUs. The ratio busbw / copy is the figure to compare across machines.
 * With one rank a collective is a local copy (broadcast in place: nothing),
 * so there the table measures per-call overhead against the copy.
 *
 * Options: --device cpu|cuda, --dtype fp32|bf16, --min BYTES, --max BYTES,
 * --iters N (scaled down for large sizes), --json (one JSON object a line). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fsdp.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *what) {
  fprintf(stderr, "bench_collectives: %s: %s\n", what, fsdp_last_error());
  exit(1);
}

#define OK(x) \
  if ((x) < 0) die(#x)

int main(int argc, char **argv) {
  int device = FSDP_CPU, dtype = FSDP_FP32, json = 0, iters0 = 20;
  size_t minb = 4096, maxb = (size_t)256 << 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) device = !strcmp(argv[++i], "cuda") ? FSDP_CUDA : FSDP_CPU;
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = fsdp_dtype_from_name(argv[++i]);
    else if (!strcmp(argv[i], "--min") && i + 1 < argc) minb = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--max") && i + 1 < argc) maxb = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters0 = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--json")) json = 1;
    else {
      fprintf(stderr, "usage: bench_collectives [--device cpu|cuda] [--dtype fp32|bf16] [--min BYTES] [--max BYTES] [--iters N] [--json]\n");
      return 2;
    }
  }
  if (dtype < 0) die("--dtype");
  fsdp_proc_info info;
  OK(fsdp_init(&info));
  const char *names[] = {"dp"};
  int64_t sizes[] = {-1};
  fsdp_mesh *m;
  fsdp_comm *c;
  OK(fsdp_mesh_create(1, names, sizes, device, &m));
  OK(fsdp_mesh_group(m, "dp", &c));
  int n = fsdp_comm_size(c), me = fsdp_comm_rank(c);
  size_t es = fsdp_dtype_size(dtype);
  void *a, *b, *h1, *h2;
  OK(fsdp_alloc(device, maxb, &a));
  OK(fsdp_alloc(device, maxb, &b));
  OK(fsdp_alloc(FSDP_CPU, maxb, &h1));
  OK(fsdp_alloc(FSDP_CPU, maxb, &h2));
  memset(h1, 0, maxb);
  memset(h2, 0, maxb);
  OK(fsdp_memset(a, 0, maxb, NULL));
  OK(fsdp_memset(b, 0, maxb, NULL));
  fsdp_stream *s = fsdp_comm_stream(c);
  if (me == 0 && !json) {
    printf("# fsdp collectives: %d ranks, %s, %s, transport %s\n", n, device == FSDP_CUDA ? "cuda" : "cpu",
           fsdp_dtype_name(dtype), device == FSDP_CUDA ? "nccl" : "shm");
    printf("# %-14s %12s %10s %10s %10s %10s %8s\n", "collective", "bytes", "time_us", "algbw_GB/s", "busbw_GB/s",
           "copy_GB/s", "bus/copy");
  }
  const char *ops[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  for (size_t bytes = minb; bytes <= maxb; bytes *= 4) {
    int iters = bytes >= (64u << 20) ? 3 : bytes >= (4u << 20) ? (iters0 > 10 ? 10 : iters0) : iters0;
    /* copy reference: same size, this rank, same memory kind */
    double t, mcp;
    if (device == FSDP_CUDA) {
      OK(fsdp_memcpy(b, a, bytes, s));
      OK(fsdp_stream_synchronize(s));
      t = now();
      for (int i = 0; i < iters; i++) OK(fsdp_memcpy(b, a, bytes, s));
      OK(fsdp_stream_synchronize(s));
    } else {
      memcpy(h2, h1, bytes);
      t = now();
      for (int i = 0; i < iters; i++) memcpy(h2, h1, bytes);
    }
    mcp = (double)bytes * iters / (now() - t) / 1e9;
    for (int op = 0; op < 4; op++) {
      size_t count = bytes / es;
      size_t per = count / (size_t)n;
      for (int rep = 0; rep <= iters; rep++) {
        if (rep == 1) { /* rep 0 warms up */
          OK(fsdp_comm_barrier(c));
          OK(fsdp_comm_synchronize(c));
          t = now();
        }
        switch (op) {
          case 0: OK(fsdp_comm_all_gather(c, b, a, per, dtype)); break;
          case 1: OK(fsdp_comm_reduce_scatter(c, b, dtype, a, dtype, per, FSDP_SUM)); break;
          case 2: OK(fsdp_comm_all_reduce(c, b, a, count, dtype, FSDP_SUM)); break;
          default: OK(fsdp_comm_broadcast(c, a, count, dtype, 0)); break;
        }
      }
      OK(fsdp_stream_synchronize(s));
      double dt = (now() - t) / iters;
      double alg = (double)bytes / dt / 1e9;
      double factor = op == 2 ? 2.0 * (n - 1) / n : op == 3 ? 1.0 : (double)(n - 1) / n;
      if (n == 1) factor = 1.0; /* one rank: report the local copy rate */
      double bus = alg * factor;
      if (me == 0) {
        if (json)
          printf("{\"collective\":\"%s\",\"ranks\":%d,\"device\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"time_us\":%.2f,"
                 "\"algbw_gbs\":%.3f,\"busbw_gbs\":%.3f,\"copy_gbs\":%.3f}\n",
                 ops[op], n, device == FSDP_CUDA ? "cuda" : "cpu", fsdp_dtype_name(dtype), bytes, dt * 1e6, alg,
                 bus, mcp);
        else
          printf("  %-14s %12zu %10.1f %10.3f %10.3f %10.3f %8.2f\n", ops[op], bytes, dt * 1e6, alg, bus, mcp,
                 bus / mcp);
        fflush(stdout);
      }
    }
  }
  fsdp_free(device, a);
  fsdp_free(device, b);
  fsdp_free(FSDP_CPU, h1);
  fsdp_free(FSDP_CPU, h2);
  fsdp_mesh_destroy(m);
  fsdp_finalize();
  return 0;
}
