// vec16.cuh: 16-byte loads and stores of fp32 (4) or bf16 (8) elements as
// floats, for the memory-bound kernels whose source nvcc and the CPU
// emulation (tests/emu) share: cross_entropy.cuh, token_logprobs.cuh,
// elementwise.cuh; and where a row's whole vectors start and end (split).
// The includer provides f32_of_bits(unsigned), bits_of_f32(float),
// bf16_bits(float) (round to nearest even) and FSDP_VEC_ALIGNED(p) (nothing
// on the GPU, where a misaligned 16-byte access faults; the emulation
// counts them).
#ifndef FSDP_KERNELS_VEC16_CUH
#define FSDP_KERNELS_VEC16_CUH

namespace fsdp_vec {

/* the 16-byte vector of T at p as floats: 8 bf16 or 4 fp32 */
template <typename T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int n = 4;
  __device__ static void load(const float *p, float *v) {
    FSDP_VEC_ALIGNED(p);
    uint4 u = *(const uint4 *)p;
    v[0] = f32_of_bits(u.x), v[1] = f32_of_bits(u.y), v[2] = f32_of_bits(u.z), v[3] = f32_of_bits(u.w);
  }
  __device__ static void store(float *p, const float *v) {
    FSDP_VEC_ALIGNED(p);
    *(uint4 *)p = make_uint4(bits_of_f32(v[0]), bits_of_f32(v[1]), bits_of_f32(v[2]), bits_of_f32(v[3]));
  }
};
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int n = 8;
  __device__ static void load(const __nv_bfloat16 *p, float *v) {
    FSDP_VEC_ALIGNED(p);
    uint4 u = *(const uint4 *)p;
    unsigned w[4] = {u.x, u.y, u.z, u.w};
    for (int i = 0; i < 4; i++) v[2 * i] = f32_of_bits(w[i] << 16), v[2 * i + 1] = f32_of_bits(w[i] & 0xffff0000u);
  }
  __device__ static void store(__nv_bfloat16 *p, const float *v) {
    unsigned w[4];
    for (int i = 0; i < 4; i++) w[i] = bf16_bits(v[2 * i]) | (bf16_bits(v[2 * i + 1]) << 16);
    FSDP_VEC_ALIGNED(p);
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

/* a row of n elements at x in three parts: [0, head) scalar, [head, tail)
 * whole 16-byte vectors, [tail, n) scalar */
template <typename T>
__device__ __forceinline__ void split(const T *x, int64_t n, int64_t &head, int64_t &tail) {
  const int64_t w = Vec<T>::n;
  head = (int64_t)(((16 - ((uintptr_t)x & 15)) & 15) / sizeof(T));
  if (head > n) head = n;
  tail = head + (n - head) / w * w;
}

}  // namespace fsdp_vec

#endif
