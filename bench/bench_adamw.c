/* bench_adamw: one AdamW step over a flat fp32 shard, the way each place
 * that can run it does: the plain C loop on one thread, the same loop split
 * over the CPU threads (what an offloaded optimizer uses), and the CUDA
 * kernel on device buffers when a GPU is here. Each is compared with its
 * ceiling, measured in the same run: the memory traffic of a step is 28
 * bytes per element (read param, grad, m, v; write param, m, v), so the
 * floor of a step is the time of the same traffic with no arithmetic: on
 * the host an in-place stream (p += g, m += g, v += g, one thread; a memcpy
 * is no ceiling here: it writes a fresh buffer, and the write-allocate
 * reads it first), on the GPU a device-to-device copy scaled to 28 bytes.
 * Then the two steps a bf16 unit runs (multi-threaded and on the GPU): fp32
 * params writing a bf16 copy (30 bytes per element), and split params, the
 * bf16 copy plus 16 low bits read and written in place (28 bytes;
 * src/base/bf16_split.h), and split params reading bf16 grads (a unit's
 * compact grads: 26 bytes).
 *   bench_adamw [ELEMENTS (default 64M)] [REPEATS (default 5)]
 * Prints one line per variant: ms per step, GB/s moved, % of the ceiling. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp.h"

static double best_of(int reps, int (*fn)(void *), void *arg) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = fsdp_time_now();
    if (fn(arg) != 0) {
      fprintf(stderr, "bench_adamw: %s\n", fsdp_last_error());
      exit(1);
    }
    double dt = fsdp_time_now() - t0;
    if (dt < best) best = dt;
  }
  return best;
}

typedef struct run {
  float *p, *g, *m, *v;
  uint16_t *bf16, *low; /* the bf16 copy (split: the high halves), the low halves */
  uint16_t *g16;        /* bf16 grads */
  int64_t n;
  fsdp_stream *s;
  void *copy_dst;
} run;

static fsdp_adamw_config cfg = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
static int64_t step = 1;

static int cpu_step(void *a) {
  run *r = a;
  return fsdp_adamw_step(r->p, NULL, NULL, r->g, FSDP_FP32, r->m, r->v, r->n, step++, &cfg, 1.0f);
}
static int cpu_step_copy(void *a) {
  run *r = a;
  return fsdp_adamw_step(r->p, r->bf16, NULL, r->g, FSDP_FP32, r->m, r->v, r->n, step++, &cfg, 1.0f);
}
static int cpu_step_split(void *a) {
  run *r = a;
  return fsdp_adamw_step(NULL, r->bf16, r->low, r->g, FSDP_FP32, r->m, r->v, r->n, step++, &cfg, 1.0f);
}
static int cpu_step_split_g16(void *a) {
  run *r = a;
  return fsdp_adamw_step(NULL, r->bf16, r->low, r->g16, FSDP_BF16, r->m, r->v, r->n, step++, &cfg, 1.0f);
}
/* the grad norm's share: a sum of squares over the grads (4 bytes each) */
static int cpu_sumsq(void *a) {
  run *r = a;
  double s;
  int64_t bad;
  return fsdp_sum_squares(r->g, FSDP_FP32, r->n, &s, &bad);
}

/* the step's traffic without its arithmetic */
static int host_stream(void *a) {
  run *r = a;
  float *restrict p = r->p, *restrict m = r->m, *restrict v = r->v;
  const float *restrict g = r->g;
  for (int64_t i = 0; i < r->n; i++) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
  return 0;
}
#ifdef FSDP_HAVE_CUDA
static int gpu_step(void *a) {
  run *r = a;
  int rc = fsdp_cuda_adamw_step(r->p, NULL, FSDP_FP32, NULL, r->g, FSDP_FP32, r->m, r->v, r->n, step++, &cfg, 1.0f, r->s);
  return rc ? rc : fsdp_stream_synchronize(r->s);
}
static int gpu_step_copy(void *a) {
  run *r = a;
  int rc = fsdp_cuda_adamw_step(r->p, r->bf16, FSDP_BF16, NULL, r->g, FSDP_FP32, r->m, r->v, r->n, step++, &cfg, 1.0f, r->s);
  return rc ? rc : fsdp_stream_synchronize(r->s);
}
static int gpu_step_split(void *a) {
  run *r = a;
  int rc = fsdp_cuda_adamw_step(NULL, r->bf16, FSDP_BF16, r->low, r->g, FSDP_FP32, r->m, r->v, r->n, step++, &cfg, 1.0f, r->s);
  return rc ? rc : fsdp_stream_synchronize(r->s);
}
static int gpu_step_split_g16(void *a) {
  run *r = a;
  int rc = fsdp_cuda_adamw_step(NULL, r->bf16, FSDP_BF16, r->low, r->g16, FSDP_BF16, r->m, r->v, r->n, step++, &cfg, 1.0f, r->s);
  return rc ? rc : fsdp_stream_synchronize(r->s);
}
static int gpu_copy(void *a) {
  run *r = a;
  int rc = fsdp_memcpy(r->copy_dst, r->p, (size_t)r->n * 4, r->s);
  return rc ? rc : fsdp_stream_synchronize(r->s);
}
#endif

static void report_bytes(const char *what, double s, int64_t n, double bytes, double ceiling_gbs) {
  double gbs = bytes * (double)n / s / 1e9;
  printf("%-34s %9.2f ms  %7.1f GB/s  %5.1f%% of the %.1f GB/s 1-thread stream\n", what, s * 1e3, gbs,
         100 * gbs / ceiling_gbs, ceiling_gbs);
}
static void report(const char *what, double s, int64_t n, double ceiling_gbs) { report_bytes(what, s, n, 28, ceiling_gbs); }

/* the bf16 unit's steps side by side, each against the plain step's ceiling */
static void bf16_steps(const char *where, int (*copy)(void *), int (*split)(void *), int (*split_g16)(void *), run *r,
                       int reps, double ceiling) {
  char label[128];
  double tc = best_of(reps, copy, r), ts = best_of(reps, split, r), tg = best_of(reps, split_g16, r);
  snprintf(label, sizeof label, "%s, fp32 + bf16 out", where);
  report_bytes(label, tc, r->n, 30, ceiling);
  snprintf(label, sizeof label, "%s, split bf16", where);
  report_bytes(label, ts, r->n, 28, ceiling);
  printf("%-34s %9.2fx the fp32 + copy step's time\n", "  split / copy", ts / tc);
  snprintf(label, sizeof label, "%s, split, bf16 grads", where);
  report_bytes(label, tg, r->n, 26, ceiling);
  printf("%-34s %9.2fx the split step's time\n", "  bf16 grads / fp32 grads", tg / ts);
}

int main(int argc, char **argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : 64LL << 20;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  if (n < 1 || reps < 1) {
    fprintf(stderr, "usage: bench_adamw [ELEMENTS] [REPEATS]\n");
    return 2;
  }
  run r = {.n = n};
  float **bufs[] = {&r.p, &r.g, &r.m, &r.v};
  for (int i = 0; i < 4; i++) {
    if (fsdp_alloc(FSDP_CPU, (size_t)n * 4, (void **)bufs[i]) != 0) {
      fprintf(stderr, "bench_adamw: %s\n", fsdp_last_error());
      return 1;
    }
    for (int64_t k = 0; k < n; k++) (*bufs[i])[k] = i == 3 ? 1e-4f : 0.01f * (float)(k % 97);
  }
  printf("bench_adamw: %lld elements (%.2f GB of state touched per step), best of %d\n", (long long)n, 28.0 * (double)n / 1e9,
         reps);
  double c = best_of(reps, host_stream, &r);
  double host_gbs = 28.0 * (double)n / c / 1e9;
  int threads = fsdp_cpu_threads();
  fsdp_cpu_threads_set(1);
  report("CPU, plain loop, 1 thread", best_of(reps, cpu_step, &r), n, host_gbs);
  fsdp_cpu_threads_set(threads);
  char label[64];
  snprintf(label, sizeof label, "CPU, %d threads", threads);
  report(label, best_of(reps, cpu_step, &r), n, host_gbs);
  r.bf16 = calloc((size_t)n, 2), r.low = calloc((size_t)n, 2), r.g16 = malloc((size_t)n * 2);
  if (!r.bf16 || !r.low || !r.g16) return 1;
  for (int64_t k = 0; k < n; k++) r.g16[k] = fsdp_f32_to_bf16(r.g[k]);
  bf16_steps(label, cpu_step_copy, cpu_step_split, cpu_step_split_g16, &r, reps, host_gbs);
  double sq = best_of(reps, cpu_sumsq, &r);
  printf("%-34s %9.2f ms  %7.1f GB/s  (reads 4 bytes per element)\n", "CPU, grad sum of squares", sq * 1e3,
         4.0 * (double)n / sq / 1e9);
#ifdef FSDP_HAVE_CUDA
  if (fsdp_device_available(FSDP_CUDA) == 1) {
    run d = {.n = n};
    float **dbufs[] = {&d.p, &d.g, &d.m, &d.v};
    for (int i = 0; i < 4; i++) {
      if (fsdp_alloc(FSDP_CUDA, (size_t)n * 4, (void **)dbufs[i]) != 0) return 1;
      fsdp_memcpy(*dbufs[i], *bufs[i], (size_t)n * 4, NULL);
    }
    if (fsdp_alloc(FSDP_CUDA, (size_t)n * 4, &d.copy_dst) != 0 || fsdp_stream_create(FSDP_CUDA, &d.s) != 0) return 1;
    double gc = best_of(reps, gpu_copy, &d);
    double dev_gbs = 8.0 * (double)n / gc / 1e9;
    report("GPU kernel (kernels/adamw.cu)", best_of(reps, gpu_step, &d), n, dev_gbs);
    if (fsdp_alloc(FSDP_CUDA, (size_t)n * 2, (void **)&d.bf16) != 0 || fsdp_alloc(FSDP_CUDA, (size_t)n * 2, (void **)&d.low) != 0 ||
        fsdp_alloc(FSDP_CUDA, (size_t)n * 2, (void **)&d.g16) != 0)
      return 1;
    fsdp_memset(d.bf16, 0, (size_t)n * 2, NULL), fsdp_memset(d.low, 0, (size_t)n * 2, NULL);
    fsdp_memcpy(d.g16, r.g16, (size_t)n * 2, NULL);
    bf16_steps("GPU kernel", gpu_step_copy, gpu_step_split, gpu_step_split_g16, &d, reps, dev_gbs);
  } else {
    printf("GPU kernel: no CUDA device here\n");
  }
#else
  printf("GPU kernel: built without CUDA\n");
#endif
  return 0;
}
