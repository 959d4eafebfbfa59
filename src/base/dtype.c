/* dtype.c: dtype sizes and names, and the bf16/fp16 <-> fp32 conversions
 * (round to nearest even, NaN stays NaN, as CUDA's __float2bfloat16_rn). */
#include <math.h>
#include <string.h>

#include "bf16.h"
#include "error.h"
#include "../fsdp_base.h"

size_t fsdp_dtype_size(fsdp_dtype dtype) {
  switch (dtype) {
    case FSDP_FP32: return 4;
    case FSDP_BF16: return 2;
    case FSDP_FP16: return 2;
    case FSDP_FP64: return 8;
    case FSDP_INT32: return 4;
    default: return 0;
  }
}

const char *fsdp_dtype_name(fsdp_dtype dtype) {
  switch (dtype) {
    case FSDP_FP32: return "fp32";
    case FSDP_BF16: return "bf16";
    case FSDP_FP16: return "fp16";
    case FSDP_FP64: return "fp64";
    case FSDP_INT32: return "int32";
    default: return "?";
  }
}

int fsdp_dtype_from_name(const char *name) {
  if (!name) return fsdp_fail(FSDP_EINVAL, "dtype: NULL name");
  static const struct { const char *n; int d; } tab[] = {
      {"fp32", FSDP_FP32}, {"float32", FSDP_FP32}, {"bf16", FSDP_BF16}, {"bfloat16", FSDP_BF16},
      {"fp16", FSDP_FP16}, {"float16", FSDP_FP16}, {"fp64", FSDP_FP64}, {"float64", FSDP_FP64}, {"int32", FSDP_INT32}};
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
    if (!strcmp(tab[i].n, name)) return tab[i].d;
  return fsdp_fail(FSDP_EINVAL, "unknown dtype '%s' (expected fp32, bf16, fp16, fp64 or int32)", name);
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float fsdp_bf16_to_f32(uint16_t h) { return fsdp_bf16_load(h); }

uint16_t fsdp_f32_to_bf16(float f) { return fsdp_bf16_round(f); }

float fsdp_fp16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    float v = ldexpf((float)man, -24);
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t fsdp_f32_to_fp16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
  if (a < 0x38800000u) {                                   /* subnormal or zero */
    float v = bits_f32(a);
    /* scale so the subnormal unit is 1, then round to nearest even */
    float s = v * 16777216.0f;
    uint32_t m = (uint32_t)lrintf(s);
    return (uint16_t)(sign | m);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

static double load(const void *p, int dt, size_t i) {
  switch (dt) {
    case FSDP_FP32: return ((const float *)p)[i];
    case FSDP_BF16: return fsdp_bf16_to_f32(((const uint16_t *)p)[i]);
    case FSDP_FP16: return fsdp_fp16_to_f32(((const uint16_t *)p)[i]);
    case FSDP_INT32: return ((const int32_t *)p)[i];
    default: return ((const double *)p)[i];
  }
}

static void store(void *p, int dt, size_t i, double v) {
  switch (dt) {
    case FSDP_FP32: ((float *)p)[i] = (float)v; break;
    case FSDP_BF16: ((uint16_t *)p)[i] = fsdp_f32_to_bf16((float)v); break;
    case FSDP_FP16: ((uint16_t *)p)[i] = fsdp_f32_to_fp16((float)v); break;
    case FSDP_INT32: /* truncates like a C cast; NaN -> 0, out of range saturates (a bare cast is UB) */
      ((int32_t *)p)[i] = v != v ? 0 : v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
      break;
    default: ((double *)p)[i] = v; break;
  }
}

int fsdp_convert(void *dst, fsdp_dtype dst_dtype, const void *src, fsdp_dtype src_dtype, size_t n) {
  if (!fsdp_dtype_size(dst_dtype) || !fsdp_dtype_size(src_dtype))
    return fsdp_fail(FSDP_EINVAL, "convert: unknown dtype (%d -> %d)", src_dtype, dst_dtype);
  if (n && (!dst || !src)) return fsdp_fail(FSDP_EINVAL, "convert: NULL buffer");
  if (dst_dtype == src_dtype) {
    memmove(dst, src, n * fsdp_dtype_size(dst_dtype));
    return FSDP_OK;
  }
  /* fp64 -> bf16/fp16 goes through fp32 on purpose: the same double rounding
   * a GPU cast performs, so CPU and CUDA results agree bit for bit. */
  for (size_t i = 0; i < n; i++) store(dst, dst_dtype, i, load(src, src_dtype, i));
  return FSDP_OK;
}

int fsdp_accumulate(void *dst, fsdp_dtype dst_dtype, const void *src, fsdp_dtype src_dtype, size_t n) {
  if (!fsdp_dtype_size(dst_dtype) || !fsdp_dtype_size(src_dtype))
    return fsdp_fail(FSDP_EINVAL, "accumulate: unknown dtype (%d += %d)", dst_dtype, src_dtype);
  if (n && (!dst || !src)) return fsdp_fail(FSDP_EINVAL, "accumulate: NULL buffer");
  /* the sum is formed in float64 and rounded once to the destination */
  for (size_t i = 0; i < n; i++) store(dst, dst_dtype, i, load(dst, dst_dtype, i) + load(src, src_dtype, i));
  return FSDP_OK;
}
