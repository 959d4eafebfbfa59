// test_adamw_emu: the optimizer kernels (kernels/adamw.cuh) run on the CPU
// under tests/emu/cuda_emu.h, 2 blocks of 64 threads striding over 1000
// elements, 3 steps, against the host's loop over the same element update
// (src/base/adamw_math.h; SGD's formula as src/shard/adamw.c writes it).
// Three ways to hold the params, for AdamW and for SGD with momentum: fp32
// writing an fp32 copy, fp32 writing a bf16 copy, and split (the bf16 copy's
// high halves plus low halves, src/base/bf16_split.h); each with fp32 grads
// and with bf16 grads (a unit's compact grads) of the same values. Tolerance: none, the
// fp32 params, the optimizer's arrays and the copies bit for bit (the same
// compiler compiles both sides; on the GPU test_kernels checks the kernel
// against the CPU library within 1e-6).
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_kit.h"
#include "../../kernels/adamw.cuh"

static EmuKit kit{"test_adamw_emu"};
enum { N = 1000, STEPS = 3 };
enum Hold { FP32_COPY, BF16_COPY, SPLIT };
static const char *const hold_name[] = {"fp32 params, fp32 copy", "fp32 params, bf16 copy", "split params"};

struct State {
  std::vector<float> p, m, v, out32;
  std::vector<__nv_bfloat16> out16;
  std::vector<uint16_t> low;
};

static bool bf16_grads;  // this round's grads: bf16 values, passed as bf16

static float grad_at(int t, int i) {
  float g = 0.05f * (float)std::sin(0.37 * i + 1.3 * t) * (float)(1 + i % 5);
  return bf16_grads ? fsdp_bf16_join(fsdp_bf16_round_away(g), 0) : g;
}

static State start() {
  State s;
  uint32_t r = 99;
  for (int i = 0; i < N; i++) {
    /* every third a tie (low half 0x8000), the rest from the generator */
    float p = i % 3 == 0 ? fsdp_bf16_join((uint16_t)(0x3c00 + i), 0x8000) : 0.1f * rnd(r);
    s.p.push_back(p);
    s.m.push_back(0.01f * rnd(r));
    s.v.push_back(1e-4f * (1 + rnd(r)));
  }
  s.out32.assign(N, 0);
  s.out16.assign(N, __nv_bfloat16{0});
  s.low.assign(N, 0);
  return s;
}

static void run_kernel(State &s, Hold h, bool adamw, int t) {
  const float b1 = 0.9f, b2 = 0.95f, lr = 1e-2f, eps = 1e-8f, decay = 1 - lr * 0.1f;
  const float c1 = (float)(1 / (1 - std::pow(0.9, t))), c2 = (float)(1 / (1 - std::pow(0.95, t)));
  std::vector<float> g32(N);
  std::vector<__nv_bfloat16> g16(N);
  for (int i = 0; i < N; i++) g32[i] = grad_at(t, i), g16[i].x = fsdp_bf16_round_away(g32[i]);
  float *p = h == SPLIT ? nullptr : s.p.data();
  uint16_t *low = h == SPLIT ? s.low.data() : nullptr;
  if (bf16_grads) {
    cuda_emu::launch({2, 1, 1}, 64, 0, [&] {
      if (adamw)
        fsdp_opt::adamw_kernel<__nv_bfloat16>(p, s.out16.data(), low, g16.data(), s.m.data(), s.v.data(), N, b1, b2, lr, eps,
                                              decay, c1, c2, 0.5f);
      else
        fsdp_opt::sgd_kernel<__nv_bfloat16>(p, s.out16.data(), low, g16.data(), s.m.data(), N, t == 1, 0.05f, 0.9f, 0.01f,
                                            0.5f);
    });
    return;
  }
  const float *g = g32.data();
  cuda_emu::launch({2, 1, 1}, 64, 0, [&] {
    if (h == FP32_COPY && adamw)
      fsdp_opt::adamw_kernel<float>(p, s.out32.data(), low, g, s.m.data(), s.v.data(), N, b1, b2, lr, eps, decay, c1, c2, 0.5f);
    else if (adamw)
      fsdp_opt::adamw_kernel<__nv_bfloat16>(p, s.out16.data(), low, g, s.m.data(), s.v.data(), N, b1, b2, lr, eps, decay,
                                            c1, c2, 0.5f);
    else if (h == FP32_COPY)
      fsdp_opt::sgd_kernel<float>(p, s.out32.data(), low, g, s.m.data(), N, t == 1, 0.05f, 0.9f, 0.01f, 0.5f);
    else
      fsdp_opt::sgd_kernel<__nv_bfloat16>(p, s.out16.data(), low, g, s.m.data(), N, t == 1, 0.05f, 0.9f, 0.01f, 0.5f);
  });
}

/* the host's loop: fp32 params */
static void run_host(State &s, bool adamw, int t) {
  const float b1 = 0.9f, b2 = 0.95f, lr = 1e-2f, eps = 1e-8f, decay = 1 - lr * 0.1f;
  const float c1 = (float)(1 / (1 - std::pow(0.9, t))), c2 = (float)(1 / (1 - std::pow(0.95, t)));
  for (int i = 0; i < N; i++) {
    float g = grad_at(t, i) * 0.5f;
    if (adamw) {
      fsdp_adamw_element(&s.p[i], &s.m[i], &s.v[i], g, b1, b2, lr, eps, decay, c1, c2);
      continue;
    }
    g += 0.01f * s.p[i];
    s.m[i] = t == 1 ? g : 0.9f * s.m[i] + g;
    s.p[i] -= 0.05f * s.m[i];
  }
}

static void check(bool adamw, Hold h) {
  State ref = start(), got = start();
  if (h == SPLIT)
    for (int i = 0; i < N; i++) got.out16[i].x = fsdp_bf16_round_away(got.p[i]), got.low[i] = fsdp_bf16_low(got.p[i]);
  for (int t = 1; t <= STEPS; t++) {
    run_host(ref, adamw, t);
    run_kernel(got, h, adamw, t);
  }
  int bad = 0;
  for (int i = 0; i < N; i++) {
    float p = h == SPLIT ? fsdp_bf16_join(got.out16[i].x, got.low[i]) : got.p[i];
    bad += std::memcmp(&p, &ref.p[i], 4) != 0 || std::memcmp(&got.m[i], &ref.m[i], 4) != 0;
    if (adamw) bad += std::memcmp(&got.v[i], &ref.v[i], 4) != 0;
    if (h == FP32_COPY) bad += std::memcmp(&got.out32[i], &ref.p[i], 4) != 0;
    else bad += got.out16[i].x != fsdp_bf16_round_away(ref.p[i]);
  }
  char what[96];
  std::snprintf(what, sizeof what, "%s, %s, %s grads: elements off", adamw ? "AdamW" : "SGD", hold_name[h],
                bf16_grads ? "bf16" : "fp32");
  kit.expect(bad == 0, what, bad, 0);
}

int main() {
  for (int adamw = 0; adamw <= 1; adamw++)
    for (int h = FP32_COPY; h <= SPLIT; h++) check(adamw != 0, (Hold)h);
  bf16_grads = true;  // the bf16 copy's kernels with bf16 grads: split and not
  for (int adamw = 0; adamw <= 1; adamw++)
    for (int h = BF16_COPY; h <= SPLIT; h++) check(adamw != 0, (Hold)h);
  /* ties rounded away from zero in the bf16 copy (not to even) */
  const uint32_t tie_bits = 0x3f808000u; /* 1 + 2^-8: halfway between 1 and the next bf16 */
  float tie;
  std::memcpy(&tie, &tie_bits, 4);
  __nv_bfloat16 c[1];
  st_param(c, 0, tie);
  kit.expect(c[0].x == 0x3f81 && fsdp_bf16_round(tie) == 0x3f80, "the copy of 1 + 2^-8 is 0x3f81 (away), not 0x3f80 (even)",
             c[0].x, 0);
  return kit.finish();
}
