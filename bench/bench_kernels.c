/* bench_kernels: each CUDA kernel of the Llama step (kernels/) at the shapes
 * of a Llama-3.2-1B layer (hidden 2048, SwiGLU 8192, 32 heads / 8 kv heads
 * of 64, vocab 128256), one sequence of 4096 tokens, bf16, against the
 * ceilings measured in the same run on the same GPU: the GEMM rate of a
 * large cuBLASLt bf16 GEMM (8192^3) and the device-to-device copy
 * bandwidth. A kernel's floor is its FLOPs at the GEMM rate or its minimum
 * memory traffic at the copy bandwidth, whichever is larger; the last
 * column says how far from it the kernel runs.
 *   bench_kernels [TOKENS (4096)] [REPEATS (10)]
 * Needs a GPU (prints a line and exits 0 without one). */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>

#include "fsdp.h"

#define CK(x)                                                                        \
  do {                                                                               \
    if ((x) != 0) {                                                                  \
      fprintf(stderr, "bench_kernels: %s: %s\n", #x, fsdp_last_error());             \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

static fsdp_stream *S;
static int REPS = 10;
static double gemm_flops, copy_bw; /* the ceilings: FLOP/s, bytes/s */

static void *dev(size_t bytes) {
  void *p = NULL;
  CK(fsdp_alloc(FSDP_CUDA, bytes, &p));
  CK(fsdp_memset(p, 0, bytes, NULL)); /* zeros: finite inputs for every kernel */
  return p;
}

/* seconds per call of fn(arg), after two warm-up calls */
typedef void (*kernel_fn)(void *arg);
static double timed(kernel_fn fn, void *arg) {
  fn(arg);
  fn(arg);
  CK(fsdp_stream_synchronize(S));
  double t0 = fsdp_time_now();
  for (int r = 0; r < REPS; r++) fn(arg);
  CK(fsdp_stream_synchronize(S));
  return (fsdp_time_now() - t0) / REPS;
}

static void row(const char *name, double s, double flops, double bytes) {
  double t_compute = flops / gemm_flops, t_memory = bytes / copy_bw;
  double floor = t_compute > t_memory ? t_compute : t_memory;
  printf("%-28s %9.3f ms %9.1f TFLOP/s %8.1f GB/s  %-7s %5.1f%% of its floor\n", name, s * 1e3, flops / s / 1e12,
         bytes / s / 1e9, t_compute > t_memory ? "compute" : "memory", 100 * floor / s);
}

/* ---- the kernels, wrapped for timed() ---- */
typedef struct lin { void *y, *x, *w, *dx, *dw, *dy; int64_t n, in, out; } lin;
static void lin_f(void *a) { lin *l = a; CK(fsdp_cuda_linear_forward(l->y, l->x, l->w, NULL, l->n, l->in, l->out, FSDP_BF16, S)); }
static void lin_b(void *a) {
  lin *l = a;
  CK(fsdp_cuda_linear_backward(l->dx, l->dw, NULL, l->dy, l->x, l->w, l->n, l->in, l->out, FSDP_BF16, S));
}

typedef struct act { void *a, *b, *c, *d, *e; float *f; int32_t *ids; double *sum; int64_t *cnt; int64_t n, dim, extra; } act;
static void emb_f(void *p) { act *t = p; CK(fsdp_cuda_embedding_forward(t->a, t->ids, t->b, t->n, t->extra, t->dim, FSDP_BF16, S)); }
static void emb_b(void *p) { act *t = p; CK(fsdp_cuda_embedding_backward(t->b, t->a, t->ids, t->n, t->extra, t->dim, FSDP_BF16, S)); }
static void rms_f(void *p) { act *t = p; CK(fsdp_cuda_rmsnorm_forward(t->a, t->f, t->b, t->c, t->n, t->dim, 1e-5f, FSDP_BF16, S)); }
static void rms_b(void *p) {
  act *t = p;
  CK(fsdp_cuda_rmsnorm_backward(t->d, t->e, t->a, t->b, t->c, t->f, t->n, t->dim, FSDP_BF16, S));
}
static void swi_f(void *p) { act *t = p; CK(fsdp_cuda_swiglu_forward(t->a, t->b, t->c, t->n * t->dim, FSDP_BF16, S)); }
static void swi_b(void *p) { act *t = p; CK(fsdp_cuda_swiglu_backward(t->d, t->e, t->a, t->b, t->c, t->n * t->dim, FSDP_BF16, S)); }
static void add_f(void *p) { act *t = p; CK(fsdp_cuda_add(t->a, t->b, t->c, t->n * t->dim, FSDP_BF16, S)); }
static void ce_f(void *p) {
  act *t = p;
  CK(fsdp_memset(t->sum, 0, 16, S));
  CK(fsdp_cuda_cross_entropy(t->sum, t->cnt, t->b, t->a, t->ids, t->n, t->dim, -100, 1.0f, FSDP_BF16, S));
}

typedef struct rope { void *x; float *cs, *sn; int64_t seq, heads, hd; } rope;
static void rope_f(void *p) { rope *r = p; CK(fsdp_cuda_rope_forward(r->x, r->cs, r->sn, 1, r->seq, r->heads, r->hd, FSDP_BF16, S)); }

typedef struct attn { void *q, *k, *v, *o, *dq, *dk, *dv, *dout; float *lse; int64_t seq, h, kvh, d; } attn;
static void att_f(void *p) {
  attn *a = p;
  CK(fsdp_cuda_attention_forward(a->o, a->lse, a->q, a->k, a->v, 1, a->seq, a->h, a->kvh, a->d, FSDP_BF16, S));
}
static void att_b(void *p) {
  attn *a = p;
  CK(fsdp_cuda_attention_backward(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->o, a->lse, 1, a->seq, a->h, a->kvh,
                                  a->d, FSDP_BF16, S));
}

typedef struct opt { float *p, *g, *m, *v; int64_t n; } opt;
static void adamw_f(void *a) {
  static int64_t step = 1;
  static const fsdp_adamw_config cfg = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  opt *o = a;
  CK(fsdp_cuda_adamw_step(o->p, NULL, FSDP_FP32, NULL, o->g, FSDP_FP32, o->m, o->v, o->n, step++, &cfg, 1.0f, S));
}

typedef struct cp { void *dst, *src; size_t bytes; } cp;
static void copy_f(void *a) { cp *c = a; CK(fsdp_memcpy(c->dst, c->src, c->bytes, S)); }

int main(int argc, char **argv) {
  if (fsdp_device_available(FSDP_CUDA) != 1) {
    printf("bench_kernels: no CUDA device here\n");
    return 0;
  }
  int64_t n = argc > 1 ? atoll(argv[1]) : 4096;
  REPS = argc > 2 ? atoi(argv[2]) : 10;
  const int64_t h = 2048, I = 8192, V = 128256, heads = 32, kvh = 8, hd = 64, es = 2;
  CK(fsdp_device_set(FSDP_CUDA, 0));
  CK(fsdp_stream_create(FSDP_CUDA, &S));

  /* ceilings */
  size_t cb = (size_t)1 << 30;
  cp c = {dev(cb), dev(cb), cb};
  copy_bw = 2.0 * (double)cb / timed(copy_f, &c); /* read + write */
  int64_t g = 8192;
  lin big = {.y = dev((size_t)g * g * es), .x = dev((size_t)g * g * es), .w = dev((size_t)g * g * es), .n = g, .in = g, .out = g};
  gemm_flops = 2.0 * (double)g * g * g / timed(lin_f, &big);
  printf("bench_kernels: %lld tokens, bf16; ceilings measured here: GEMM %.1f TFLOP/s (cuBLASLt 8192^3), copy %.0f GB/s\n",
         (long long)n, gemm_flops / 1e12, copy_bw / 1e9);
  printf("%-28s %12s %16s %12s  %-7s %s\n", "kernel", "time", "rate", "traffic", "bound", "vs floor");

  /* GEMMs: q/o projections, gate/up, down, the head */
  struct { const char *name; int64_t in, out; } gemms[] = {
      {"linear q/o 2048->2048", h, heads * hd}, {"linear k/v 2048->512", h, kvh * hd},
      {"linear gate/up 2048->8192", h, I}, {"linear down 8192->2048", I, h}, {"linear head 2048->128256", h, V}};
  for (size_t i = 0; i < sizeof gemms / sizeof gemms[0]; i++) {
    int64_t in = gemms[i].in, out = gemms[i].out;
    lin l = {.y = dev((size_t)n * out * es), .x = dev((size_t)n * in * es), .w = dev((size_t)in * out * es),
             .dx = dev((size_t)n * in * es), .dw = dev((size_t)in * out * es), .dy = dev((size_t)n * out * es),
             .n = n, .in = in, .out = out};
    double bytes = (double)(n * in + in * out + n * out) * es;
    char name[64];
    snprintf(name, sizeof name, "%s fwd", gemms[i].name);
    row(name, timed(lin_f, &l), 2.0 * n * in * out, bytes);
    snprintf(name, sizeof name, "%s bwd", gemms[i].name);
    row(name, timed(lin_b, &l), 4.0 * n * in * out, 2 * bytes);
    void *bufs[] = {l.y, l.x, l.w, l.dx, l.dw, l.dy};
    for (int k = 0; k < 6; k++) fsdp_free(FSDP_CUDA, bufs[k]);
  }

  /* elementwise and normalisation */
  act e = {.a = dev((size_t)n * I * es), .b = dev((size_t)n * I * es), .c = dev((size_t)n * I * es),
           .d = dev((size_t)n * I * es), .e = dev((size_t)n * I * es), .f = dev((size_t)n * 4),
           .ids = dev((size_t)n * 4), .sum = dev(16), .n = n, .dim = h};
  e.cnt = (int64_t *)((char *)e.sum + 8);
  act emb = e;
  emb.b = dev((size_t)V * h * es);
  emb.extra = V;
  row("embedding fwd", timed(emb_f, &emb), 0, 2.0 * n * h * es);
  row("embedding bwd (one id)", timed(emb_b, &emb), 0, 3.0 * n * h * es); /* ids all 0: one run, the worst case */
  { /* text-like ids: id k about as often as 1/(k+1) (Zipf), most rows distinct */
    int32_t *host = malloc((size_t)n * 4);
    uint32_t r = 12345;
    for (int64_t i = 0; i < n; i++) {
      r = r * 1664525u + 1013904223u;
      host[i] = (int32_t)(exp((double)(r >> 8) / 16777216.0 * log((double)V)) - 1) % (int32_t)V;
    }
    act z = emb;
    z.ids = dev((size_t)n * 4);
    CK(fsdp_memcpy(z.ids, host, (size_t)n * 4, NULL));
    free(host);
    row("embedding bwd (Zipf ids)", timed(emb_b, &z), 0, 3.0 * n * h * es);
    fsdp_free(FSDP_CUDA, z.ids);
  }
  row("rmsnorm fwd", timed(rms_f, &e), 0, 2.0 * n * h * es);
  row("rmsnorm bwd", timed(rms_b, &e), 0, 3.0 * n * h * es);
  row("residual add", timed(add_f, &e), 0, 3.0 * n * h * es);
  act sw = e;
  sw.dim = I;
  row("swiglu fwd", timed(swi_f, &sw), 0, 3.0 * n * I * es);
  row("swiglu bwd", timed(swi_b, &sw), 0, 5.0 * n * I * es);
  rope ro = {.x = e.a, .cs = dev((size_t)n * hd * 4), .sn = dev((size_t)n * hd * 4), .seq = n, .heads = heads, .hd = hd};
  row("rope fwd (q)", timed(rope_f, &ro), 0, 2.0 * n * heads * hd * es + 2.0 * n * hd * 4);

  /* attention, causal: 4 T^2 d per head forward, halved by the mask; 2.5x that backward */
  attn at = {.q = dev((size_t)n * heads * hd * es), .k = dev((size_t)n * kvh * hd * es), .v = dev((size_t)n * kvh * hd * es),
             .o = dev((size_t)n * heads * hd * es), .dq = dev((size_t)n * heads * hd * es),
             .dk = dev((size_t)n * kvh * hd * es), .dv = dev((size_t)n * kvh * hd * es),
             .dout = dev((size_t)n * heads * hd * es), .lse = dev((size_t)n * heads * 4), .seq = n, .h = heads, .kvh = kvh, .d = hd};
  double aflops = 2.0 * heads * (double)n * n * hd;
  double abytes = (double)n * (2 * heads + 2 * kvh) * hd * es;
  /* the fp32 CUDA-core kernels, the tensor-core ones and cuDNN's, side by side */
  fsdp_cuda_attention_impl_set(FSDP_ATTN_SIMPLE);
  row("attention fwd (fp32 cores)", timed(att_f, &at), aflops, abytes);
  row("attention bwd (fp32 cores)", timed(att_b, &at), 2.5 * aflops, 2.5 * abytes);
  fsdp_cuda_attention_impl_set(FSDP_ATTN_TENSOR_CORES); /* bf16, head_dim 64: they apply */
  row("attention fwd (tensor cores)", timed(att_f, &at), aflops, abytes);
  row("attention bwd (tensor cores)", timed(att_b, &at), 2.5 * aflops, 2.5 * abytes);
  char why[512];
  if (fsdp_cuda_attention_choice(FSDP_BF16, 1, n, heads, kvh, hd, 1, why, sizeof why) == FSDP_ATTN_CUDNN) {
    fsdp_cuda_attention_impl_set(FSDP_ATTN_CUDNN);
    row("attention fwd (cuDNN)", timed(att_f, &at), aflops, abytes);
    row("attention bwd (cuDNN)", timed(att_b, &at), 2.5 * aflops, 2.5 * abytes);
  } else {
    printf("# attention (cuDNN): not run: %s\n", why);
  }
  fsdp_cuda_attention_impl_set(FSDP_ATTN_AUTO);

  /* the loss over the logits, in place */
  act ce = {.a = dev((size_t)n * V * es), .ids = e.ids, .sum = e.sum, .cnt = e.cnt, .n = n, .dim = V};
  ce.b = ce.a;
  row("cross-entropy fwd+bwd", timed(ce_f, &ce), 0, 2.0 * n * V * es);

  /* the optimizer over a 1B-parameter shard */
  int64_t np = (int64_t)1 << 30;
  opt o = {dev((size_t)np * 4), dev((size_t)np * 4), dev((size_t)np * 4), dev((size_t)np * 4), np};
  row("adamw (1.07B fp32 params)", timed(adamw_f, &o), 0, 28.0 * (double)np);
  return 0;
}
