/* bf16_split.h: an fp32 main param held as its bf16 compute copy (the high
 * half) and 16 low bits, so a unit that computes in bf16 needs no separate
 * fp32 copy: 4 bytes per parameter, not 4 + 2.
 *
 * The split is exact only if the high half is rounded from the fp32 bits by
 * a rule the low bits can undo: ties rounded away from zero (add half an
 * ulp to the bit pattern, keep the top 16 bits). Then the high half was
 * rounded up exactly when the low bits are >= 0x8000, and joining subtracts
 * that carry again. Round-to-nearest-even cannot be undone: at a tie the
 * low bits are 0x8000 whether it rounded up or down. So every compute copy
 * of the params (split or not, CPU or CUDA, offloaded or in place) rounds
 * with fsdp_bf16_round_away, and all configurations train to the same bits.
 * It differs from round-to-nearest-even only at exact ties (1 value in
 * 65536), by one bf16 ulp. Shared by src/shard/ and kernels/adamw.cu. */
#ifndef FSDP_BASE_BF16_SPLIT_H
#define FSDP_BASE_BF16_SPLIT_H

#include <stdint.h>
#include <string.h>

#include "host_device.h"

static inline FSDP_HOST_DEVICE uint32_t fsdp_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* nearest bf16, ties away from zero; NaN stays a (quiet) NaN */
static inline FSDP_HOST_DEVICE uint16_t fsdp_bf16_round_away(float f) {
  uint32_t u = fsdp_f32_bits(f);
  uint32_t rounded = (u + 0x8000u) >> 16, quiet_nan = (u >> 16) | 0x40u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* the low half that fsdp_bf16_join needs besides fsdp_bf16_round_away(f) */
static inline FSDP_HOST_DEVICE uint16_t fsdp_bf16_low(float f) { return (uint16_t)(fsdp_f32_bits(f) & 0xffffu); }

/* f again, bit for bit, from its two halves (a NaN comes back a NaN) */
static inline FSDP_HOST_DEVICE float fsdp_bf16_join(uint16_t high, uint16_t low) {
  uint32_t u = (((uint32_t)high << 16) | low) - ((uint32_t)(low >> 15) << 16);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif
