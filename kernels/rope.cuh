// rope.cuh: the rotary-embedding kernel (rope.cu says what it computes), the
// source nvcc (rope.cu) and tests/emu/test_attention_docs_emu.cpp share.
// The includer provides ld(p, i) / st(p, i, v) for float and __nv_bfloat16.
#ifndef FSDP_KERNELS_ROPE_CUH
#define FSDP_KERNELS_ROPE_CUH

namespace fsdp_rope {

// x1' = x1 c - x2 s, x2' = x2 c + x1 s (forward); sign = -1 undoes it. AT:
// row (b, t) turns by table row pos[b * seq + t] (packed rows), else by t
template <typename T, bool AT>
__global__ void rope_kernel(T *x, const float *cos_t, const float *sin_t, const int32_t *pos, int64_t rows, int64_t seq,
                            int64_t heads, int64_t hd, float sign) {
  int64_t half = hd / 2, total = rows * half;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
    int64_t row = k / half, j = k % half;  // row = (b, t, h)
    int64_t t = AT ? (int64_t)pos[row / heads] : (row / heads) % seq;
    float c = cos_t[t * hd + j], sn = sign * sin_t[t * hd + j];
    T *p = x + row * hd;
    float x1 = ld(p, j), x2 = ld(p, j + half);
    st(p, j, x1 * c - x2 * sn);
    st(p, j + half, x2 * c + x1 * sn);
  }
}

}  // namespace fsdp_rope

#endif
