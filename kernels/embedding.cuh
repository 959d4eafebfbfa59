// embedding.cuh: the embedding kernels' source that nvcc (embedding.cu)
// and tests/emu/test_embedding_slice_emu.cpp share: the forward's row
// copy, for the whole table or a vocab-parallel slice of it, and the
// slice backward's step from sorted ids to the slice's rows (the rows'
// sums are grad_sums.cuh's). The includer provides ld(p, i) / st(p, i, v).
#ifndef FSDP_KERNELS_EMBEDDING_CUH
#define FSDP_KERNELS_EMBEDDING_CUH

namespace fsdp_emb {

// y[i] = table[ids[i] - first], a block per row; zeros where ids[i] - first
// is outside [0, rows): the whole table (first 0, rows = vocab: a bad id,
// refused on the host, gives zeros) or a vocab-parallel slice of it (the
// ids another rank holds give zeros, summed over the tp group)
template <typename T>
__global__ void embedding_fwd(T *y, const int32_t *ids, const T *table, int64_t first, int64_t rows, int64_t dim) {
  int64_t row = blockIdx.x;
  int64_t r = (int64_t)ids[row] - first;
  bool ok = r >= 0 && r < rows;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) st(y, row * dim + j, ok ? ld(table, r * dim + j) : 0.0f);
}

// ids[k] -= first, in place: sorted ids as rows of a slice starting at
// first (still sorted; the ids outside it fall outside [0, rows), which
// the sums skip)
__global__ void ids_to_rows(int32_t *ids, int64_t n, int64_t first) {
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x)
    ids[k] = (int32_t)((int64_t)ids[k] - first);
}

}  // namespace fsdp_emb

#endif
