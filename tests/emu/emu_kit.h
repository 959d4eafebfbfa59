// emu_kit.h: what the emulated-kernel tests share: the element loads and
// stores the kernels' headers expect (fp32 arithmetic over fp32 or bf16
// storage), a seeded generator, and the pass/fail count.
#ifndef FSDP_TESTS_EMU_KIT_H
#define FSDP_TESTS_EMU_KIT_H

#include <cstdio>
#include <cstring>
#include <vector>

#include "../../src/base/bf16_split.h"
#include "cuda_emu.h"

static inline float ld(const float *p, int64_t i) { return p[i]; }
static inline float ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
static inline void st(float *p, int64_t i, float v) { p[i] = v; }
static inline void st(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
/* a param's compute copy (kernels/common.cuh): bf16 ties away from zero */
static inline void st_param(float *p, int64_t i, float v) { p[i] = v; }
static inline void st_param(__nv_bfloat16 *p, int64_t i, float v) { p[i].x = fsdp_bf16_round_away(v); }

/* the bit casts and bf16 rounding that kernels/vec16.cuh takes from its includer */
static inline float f32_of_bits(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline unsigned bits_of_f32(float v) {
  unsigned u;
  std::memcpy(&u, &v, 4);
  return u;
}
static inline unsigned bf16_bits(float v) { return fsdp_bf16_round(v); }

/* uniform in [-1, 1), from seed s */
static inline float rnd(uint32_t &s) {
  s = s * 1664525u + 1013904223u;
  return (float)(int32_t)s / 2147483648.0f;
}

template <typename T>
static T from(float v);
template <>
inline float from<float>(float v) { return v; }
template <>
inline __nv_bfloat16 from<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/* the stored values as floats (a CPU op's inputs) */
template <typename T>
static std::vector<float> widen(const std::vector<T> &x) {
  std::vector<float> f(x.size());
  for (size_t i = 0; i < x.size(); i++) f[i] = ld(x.data(), (int64_t)i);
  return f;
}

/* counts checks; a failure prints `label: FAILED: what (value, tolerance)` */
struct EmuKit {
  const char *label;
  int passed = 0, failed = 0;
  void expect(bool ok, const char *what, double value, double tol) {
    if (ok) {
      passed++;
    } else {
      failed++;
      fprintf(stderr, "%s: FAILED: %s (%.3g, tolerance %.3g)\n", label, what, value, tol);
    }
  }
  int finish() {
    printf("%s: %d passed, %d failed\n", label, passed, failed);
    return failed ? 1 : 0;
  }
};

#endif
