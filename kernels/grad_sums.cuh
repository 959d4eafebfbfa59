// grad_sums.cuh: the kernels that sum many rows of a gradient in fp32
// and add the sum to a (possibly bf16) grad once: the embedding table's
// rows by id (embedding.cu sorts the rows by id first, then runs the two
// window passes) and RMSNorm's
// weight (rmsnorm.cu). A header so that two builds share one source:
// nvcc's, and tests/emu/test_grad_sums_emu.cpp, which runs them on the
// CPU under tests/emu/cuda_emu.h against float64. The includer provides
// ld(p, i) / st(p, i, v) for its element types (fp32 arithmetic).
#ifndef FSDP_KERNELS_GRAD_SUMS_CUH
#define FSDP_KERNELS_GRAD_SUMS_CUH

namespace fsdp_sums {

// The embedding backward in two passes over windows of EMB_WIN sorted
// positions, so that a frequent id (one long run of equal ids) is summed by
// many blocks instead of one (a batch of one repeated token took 2.1 ms on
// an H100 with a block per run). rows[] maps sorted positions to rows of
// dy; ids outside [0, vocab) are skipped. Sums are fp32, in a fixed order,
// added to the (possibly bf16) table once per id.
constexpr int EMB_WIN = 32;

// Pass 1, grid (windows, column blocks of blockDim): each piece of equal
// ids in window w summed over its rows; a piece whose run lies wholly in
// the window is added at once (no other block touches that id); the
// window's first piece, when its run began in an earlier window, goes to
// first[w]; its last piece, when its run begins here and goes on into the
// next window, to last[w].
template <typename T>
__global__ void embedding_bwd_windows(T *dtable, float *first, float *last, const T *dy, const int32_t *ids,
                                      const int32_t *rows, int64_t n, int64_t vocab, int64_t dim) {
  int64_t w = blockIdx.x, j = blockIdx.y * (int64_t)blockDim.x + threadIdx.x;
  if (j >= dim) return;
  int64_t lo = w * EMB_WIN, hi = lo + EMB_WIN < n ? lo + EMB_WIN : n;
  for (int64_t k = lo; k < hi;) {
    int32_t id = ids[k];
    int64_t e = k + 1;
    while (e < hi && ids[e] == id) e++;
    float acc = 0;
    for (int64_t r = k; r < e; r++) acc += ld(dy, (int64_t)rows[r] * dim + j);
    if (id >= 0 && id < vocab) {
      if (k == lo && lo > 0 && ids[lo - 1] == id) {
        first[w * dim + j] = acc;
      } else if (e == hi && hi < n && ids[hi] == id) {
        last[w * dim + j] = acc;
      } else {
        int64_t o = (int64_t)id * dim + j;
        st(dtable, o, ld(dtable, o) + acc);
      }
    }
    k = e;
  }
}

// Pass 2, same grid: the run that begins in window w and goes on: last[w]
// plus first[] of every later window it reaches, in order, added once.
template <typename T>
__global__ void embedding_bwd_spans(T *dtable, const float *first, const float *last, const int32_t *ids, int64_t n,
                                    int64_t vocab, int64_t dim) {
  int64_t w = blockIdx.x, j = blockIdx.y * (int64_t)blockDim.x + threadIdx.x;
  int64_t lo = w * EMB_WIN, hi = lo + EMB_WIN;
  if (j >= dim || hi >= n) return;
  int32_t id = ids[hi - 1];
  if (ids[hi] != id || id < 0 || id >= vocab) return; /* the last piece ends here */
  int64_t s = hi - 1;
  while (s > lo && ids[s - 1] == id) s--;
  if (s == lo && lo > 0 && ids[lo - 1] == id) return; /* begun in an earlier window: added there */
  float acc = last[w * dim + j];
  for (int64_t v = w + 1; v * EMB_WIN < n && ids[v * EMB_WIN] == id; v++) acc += first[v * dim + j];
  int64_t o = (int64_t)id * dim + j;
  st(dtable, o, ld(dtable, o) + acc);
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
