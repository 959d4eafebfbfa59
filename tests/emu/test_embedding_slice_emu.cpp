// test_embedding_slice_emu: the vocab-parallel embedding's CUDA kernels
// (kernels/embedding.cuh: the forward's row copy of a slice, the sorted
// ids made the slice's rows; kernels/grad_sums.cuh: the backward's sums)
// run on the CPU under tests/emu/cuda_emu.h against the CPU op
// (fsdp_embedding_forward_slice / _backward_slice, src/ops/embedding.c)
// on the same inputs, bf16 ones given to the CPU op as floats. Slices of a
// vocabulary of 60: the whole (tp 1) and each rank's of tp 2, 3 and 4;
// ids over the whole vocabulary (most of them another rank's), runs
// longer than the backward's windows of 32 sorted rows, on and off their
// boundaries, a slice's first and last rows.
//   * forward: equal bit for bit (a copy, zeros for another rank's ids);
//   * backward, max |error| / max |CPU op|: fp32 1e-5 (the same fp32
//     terms summed in another order: each id's rows first, then into the
//     table); bf16 4e-3 (one rounding, 2^-9, of an fp32 sum of bf16
//     inputs). Rows of ids another rank holds stay as they were, exactly.
// The GPU sorts (id, row) pairs stably by id with CUB; here the host does.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

#include "emu_kit.h"

#include "../../kernels/embedding.cuh"
#include "../../kernels/grad_sums.cuh"
#include "../../src/fsdp_ops.h"

static EmuKit kit{"test_embedding_slice_emu"};

template <typename T>
static const char *dtype_name() { return sizeof(T) == 4 ? "fp32" : "bf16"; }

/* the kernels' forward and backward of rows [first, first + rows) against the CPU op's */
template <typename T>
static void slice_case(const char *name, const std::vector<int32_t> &ids, int64_t vocab, int64_t first, int64_t rows,
                       double tol) {
  const int64_t n = (int64_t)ids.size(), dim = 40;
  const int threads = 32;
  uint32_t s = (uint32_t)(first * 7 + rows * 3 + n);
  std::vector<T> table((size_t)(rows * dim)), dy((size_t)(n * dim)), y((size_t)(n * dim), from<T>(NAN));
  for (auto &v : table) v = from<T>(rnd(s));
  for (auto &v : dy) v = from<T>(rnd(s));
  const std::vector<float> tf = widen(table), dyf = widen(dy);
  char what[200];
  /* forward */
  cuda_emu::launch({(unsigned)n, 1, 1}, threads, 0,
                   [&] { fsdp_emb::embedding_fwd<T>(y.data(), ids.data(), table.data(), first, rows, dim); });
  std::vector<float> yref((size_t)(n * dim), NAN);
  int rc = fsdp_embedding_forward_slice(yref.data(), ids.data(), tf.data(), n, vocab, first, rows, dim);
  kit.expect(rc == 0, "the CPU forward runs", rc, 0);
  int64_t differ = 0;
  for (int64_t i = 0; i < n * dim; i++) differ += ld(y.data(), i) != yref[(size_t)i];
  snprintf(what, sizeof what, "%s, %s: forward equals the CPU op's bit for bit", dtype_name<T>(), name);
  kit.expect(differ == 0, what, (double)differ, 0);
  /* backward: sorted ids (stably, as CUB), made the slice's rows, then the sums */
  std::vector<int32_t> order((size_t)n), sorted((size_t)n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ids[(size_t)a] < ids[(size_t)b]; });
  for (int64_t k = 0; k < n; k++) sorted[(size_t)k] = ids[(size_t)order[(size_t)k]];
  if (first) cuda_emu::launch({2, 1, 1}, threads, 0, [&] { fsdp_emb::ids_to_rows(sorted.data(), n, first); });
  int64_t windows = (n + fsdp_sums::EMB_WIN - 1) / fsdp_sums::EMB_WIN;
  std::vector<float> part_first((size_t)(windows * dim), NAN), part_last((size_t)(windows * dim), NAN);
  std::vector<T> got = table;
  cuda_emu::dim3 grid{(unsigned)windows, (unsigned)((dim + threads - 1) / threads), 1};
  cuda_emu::launch(grid, threads, 0, [&] {
    fsdp_sums::embedding_bwd_windows<T>(got.data(), part_first.data(), part_last.data(), dy.data(), sorted.data(),
                                        order.data(), n, rows, dim);
  });
  cuda_emu::launch(grid, threads, 0, [&] {
    fsdp_sums::embedding_bwd_spans<T>(got.data(), part_first.data(), part_last.data(), sorted.data(), n, rows, dim);
  });
  std::vector<float> ref = tf;
  rc = fsdp_embedding_backward_slice(ref.data(), dyf.data(), ids.data(), n, vocab, first, rows, dim);
  kit.expect(rc == 0, "the CPU backward runs", rc, 0);
  double big = 0, worst = 0;
  int64_t moved = 0; /* rows no id of this slice reaches: exactly as they were */
  std::vector<bool> hit((size_t)rows, false);
  for (int32_t id : ids)
    if (id >= first && id < first + rows) hit[(size_t)(id - first)] = true;
  for (int64_t i = 0; i < rows * dim; i++) {
    double g = ld(got.data(), i);
    big = std::fmax(big, std::fabs((double)ref[(size_t)i]));
    worst = std::isfinite(g) ? std::fmax(worst, std::fabs(g - ref[(size_t)i])) : 1e30;
    if (!hit[(size_t)(i / dim)]) moved += ld(got.data(), i) != ld(table.data(), i);
  }
  snprintf(what, sizeof what, "%s, %s: backward against the CPU op's", dtype_name<T>(), name);
  kit.expect(worst / big <= tol, what, worst / big, tol);
  snprintf(what, sizeof what, "%s, %s: backward leaves the rows no id reaches as they were", dtype_name<T>(), name);
  kit.expect(moved == 0, what, (double)moved, 0);
}

template <typename T>
static void all(double tol) {
  const int64_t V = 60, W = fsdp_sums::EMB_WIN;
  std::vector<int32_t> ids;
  /* runs W + 3, 2W, 1, W - 1 of the slices' edges (0, 14/15, 19/20, 29/30, 59), then a text-like spread */
  const int32_t edges[] = {0, 14, 15, 19, 20, 29, 30, 44, 45, 59};
  const int64_t lens[] = {W + 3, 2 * W, 1, W - 1, 3, W, 2, 5, W + 1, 7};
  for (int i = 0; i < 10; i++) ids.insert(ids.end(), (size_t)lens[i], edges[i]);
  uint32_t s = 5;
  for (int i = 0; i < 400; i++) ids.push_back((int32_t)(std::floor(std::exp(std::fabs(rnd(s)) * std::log((double)V)))) - 1);
  std::rotate(ids.begin(), ids.begin() + 37, ids.end()); /* the runs not at the rows' start */
  for (int64_t tp : {1, 2, 3, 4}) {
    for (int64_t r = 0; r < tp; r++) {
      char name[96];
      snprintf(name, sizeof name, "%zu ids, tp %lld rank %lld (rows [%lld, %lld) of %lld)", ids.size(), (long long)tp,
               (long long)r, (long long)(r * V / tp), (long long)((r + 1) * V / tp), (long long)V);
      slice_case<T>(name, ids, V, r * V / tp, V / tp, tol);
    }
  }
  slice_case<T>("one id over a slice's every row", std::vector<int32_t>(3 * W + 5, 31), V, 30, 15, tol);
  slice_case<T>("no id in the slice", std::vector<int32_t>(70, 2), V, 30, 15, tol);
}

int main() {
  all<float>(1e-5);
  all<__nv_bfloat16>(4e-3);
  return kit.finish();
}
