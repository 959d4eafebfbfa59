// grad_sums.cuh: the kernels that sum many rows of a gradient in fp32
// and add the sum to a (possibly bf16) grad once: the embedding table's
// rows by id (embedding.cu sorts the rows by id first) and RMSNorm's
// weight (rmsnorm.cu). A header so that two builds share one source:
// nvcc's, and tests/emu/test_grad_sums_emu.cpp, which runs them on the
// CPU under tests/emu/cuda_emu.h against float64. The includer provides
// ld(p, i) / st(p, i, v) for its element types (fp32 arithmetic).
#ifndef FSDP_KERNELS_GRAD_SUMS_CUH
#define FSDP_KERNELS_GRAD_SUMS_CUH

namespace fsdp_sums {

// block k: if sorted position k starts a run of equal ids, that run's rows
// of dy (rows[] maps sorted positions to rows) summed in fp32, added to the
// id's row of the table; ids outside [0, vocab) are skipped
template <typename T>
__global__ void embedding_bwd_runs(T *dtable, const T *dy, const int32_t *ids, const int32_t *rows, int64_t n, int64_t vocab,
                                   int64_t dim) {
  int64_t k = blockIdx.x;
  int32_t id = ids[k];
  if ((k > 0 && ids[k - 1] == id) || id < 0 || id >= vocab) return;
  int64_t end = k + 1;
  while (end < n && ids[end] == id) end++;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float acc = 0;
    for (int64_t r = k; r < end; r++) acc += ld(dy, (int64_t)rows[r] * dim + j);
    int64_t o = (int64_t)id * dim + j;
    st(dtable, o, ld(dtable, o) + acc);
  }
}

constexpr int DW_ROWS = 128; // rows per partial sum of RMSNorm's dw

// grid (columns / blockDim, chunks): part[chunk][j] = sum over the chunk's
// rows i of dy[i][j] x[i][j] rstd[i]
template <typename T>
__global__ void rmsnorm_dw_parts(float *part, const T *dy, const T *x, const float *rstd, int64_t n, int64_t dim) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= dim) return;
  int64_t r0 = (int64_t)blockIdx.y * DW_ROWS, r1 = r0 + DW_ROWS < n ? r0 + DW_ROWS : n;
  float acc = 0;
  for (int64_t i = r0; i < r1; i++) acc += ld(dy, i * dim + j) * ld(x, i * dim + j) * rstd[i];
  part[(int64_t)blockIdx.y * dim + j] = acc;
}

// dw[j] += the chunks' partial sums of column j, in fp32, rounded once
template <typename T>
__global__ void rmsnorm_dw_sum(T *dw, const float *part, int64_t chunks, int64_t dim) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= dim) return;
  float acc = 0;
  for (int64_t c = 0; c < chunks; c++) acc += part[c * dim + j];
  st(dw, j, ld(dw, j) + acc);
}

}  // namespace fsdp_sums

#endif
