// attention_merge.cuh: ring attention's combine (the CUDA twin of
// src/ops/attention_merge.c), the source nvcc (attention_merge.cu) and
// tests/emu/test_attention_merge_emu.cpp share.
//
// A warp per row (batch, query, head): the row's weights from the two
// lse values (src/base/attention_merge_math.h, the CPU op's formula), the
// lanes across head_dim, then lane 0 writes the merged lse. The lse is
// updated in place, so the warp meets at __syncwarp before that write:
// no lane may read it after it changed. fp32 arithmetic over fp32 or bf16
// storage; memory-bound, a read of both rows and a write of one.
//
// The includer provides ld(p, i) / st(p, i, v) for float and
// __nv_bfloat16, and __syncwarp.
#ifndef FSDP_KERNELS_ATTENTION_MERGE_CUH
#define FSDP_KERNELS_ATTENTION_MERGE_CUH

#include "../src/base/attention_merge_math.h"

namespace fsdp_merge {

// rows = B T H; row r = (b T + t) H + h is out's row r, lse's entry
// (b H + h) T + t. blockDim.x a multiple of 32; any grid (grid-stride
// over rows, a warp's lanes always on the same row).
template <typename T>
__global__ void merge_rows(T *out, float *lse, const T *out_b, const float *lse_b, int64_t rows, int64_t seq,
                           int64_t heads, int64_t head_dim) {
  const int lane = threadIdx.x & 31;
  const int64_t per_block = blockDim.x >> 5, warps = (int64_t)gridDim.x * per_block;
  for (int64_t r = blockIdx.x * per_block + (threadIdx.x >> 5); r < rows; r += warps) {
    const int64_t h = r % heads, bt = r / heads, t = bt % seq, b = bt / seq;
    const int64_t li = (b * heads + h) * seq + t;
    float wa = 0.0f, wb = 0.0f, merged = 0.0f;
    const int how = fsdp_attention_merge_row(lse[li], lse_b[li], &wa, &wb, &merged);
    if (how == FSDP_MERGE_KEEP) continue; /* the same for the whole warp */
    T *o = out + r * head_dim;
    const T *ob = out_b + r * head_dim;
    if (how == FSDP_MERGE_COPY)
      for (int64_t d = lane; d < head_dim; d += 32) st(o, d, ld(ob, d));
    else
      for (int64_t d = lane; d < head_dim; d += 32) st(o, d, wa * ld(o, d) + wb * ld(ob, d));
    __syncwarp(); /* every lane has read lse[li] */
    if (lane == 0) lse[li] = merged;
  }
}

}  // namespace fsdp_merge

#endif
