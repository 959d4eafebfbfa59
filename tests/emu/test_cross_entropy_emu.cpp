// test_cross_entropy_emu: the fused CUDA cross-entropy kernel
// (kernels/cross_entropy.cuh: online max and sum, 16-byte loads between a
// scalar head and tail) run on the CPU under tests/emu/cuda_emu.h against
// float64: the summed loss and the gradient written over the logits, in
// fp32 and bf16 storage, for vocabularies whose rows start at every
// alignment (1000: all rows 16-byte aligned in fp32; 1001, 37: rows at
// every offset; every 16-byte access aligned, as the GPU needs), an ignored row, a row of large logits (exp would overflow
// without the max shift), a row with -inf logits, and the gradient written
// out of place at another alignment. Tolerances, relative to the largest
// value: the loss 1e-5; gradients fp32 1e-5, bf16 4e-3 (one rounding,
// 2^-9, of a value computed in fp32 from bf16 inputs).
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_rows.h"

#include "../../kernels/cross_entropy.cuh"

static EmuKit kit{"test_cross_entropy_emu"};
static void expect(bool ok, const char *what, double value, double tol) { kit.expect(ok, what, value, tol); }


/* rows x vocab logits starting `offset` elements into their buffer; the
 * gradient in place, or (out_offset >= 0) into another buffer at that offset */
template <typename T>
static void check_case(double tol, const char *name, int64_t vocab, int offset, int out_offset) {
  const int64_t rows = 6;
  const int32_t ignore = -100;
  const float scale = 0.25f;
  uint32_t s = (uint32_t)(vocab * 31 + offset);
  std::vector<T> buf(rows * vocab + 16), out(rows * vocab + 16);
  T *x = buf.data() + offset;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < vocab; j++) x[r * vocab + j] = from<T>(3 * rnd(s) + (r == 2 ? 90.0f : 0.0f));
  x[3 * vocab + 5 % vocab] = from<T>(-INFINITY);
  x[3 * vocab + vocab - 1] = from<T>(-INFINITY);
  std::vector<int32_t> targets = {0, (int32_t)(vocab - 1), 7 % (int32_t)vocab, (int32_t)(4 % vocab), ignore, (int32_t)(vocab / 2)};
  /* float64 reference from the stored (rounded) logits */
  std::vector<double> ref(rows * vocab, 0.0);
  double loss_ref = 0;
  for (int64_t r = 0; r < rows; r++) {
    if (targets[r] == ignore) continue;
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < vocab; j++) m = std::fmax(m, (double)ld(x, r * vocab + j));
    for (int64_t j = 0; j < vocab; j++) sum += std::exp((double)ld(x, r * vocab + j) - m);
    double lse = m + std::log(sum);
    loss_ref += lse - ld(x, r * vocab + targets[r]);
    for (int64_t j = 0; j < vocab; j++)
      ref[r * vocab + j] = scale * (std::exp((double)ld(x, r * vocab + j) - lse) - (j == targets[r] ? 1.0 : 0.0));
  }
  T *d = out_offset >= 0 ? out.data() + out_offset : x;
  double loss = 0;
  unsigned long long count = 0;
  cuda_emu::launch({(unsigned)rows, 1, 1}, 64, 64 * sizeof(float), [&] {
    fsdp_ce::cross_entropy_kernel<T>(&loss, &count, d, x, targets.data(), vocab, ignore, scale);
  });
  char what[160];
  snprintf(what, sizeof what, "%s, vocab %lld, logits at +%d, gradient %s: loss", name, (long long)vocab, offset,
           out_offset >= 0 ? "out of place" : "in place");
  double el = std::fabs(loss - loss_ref) / std::fabs(loss_ref);
  expect(el <= 1e-5 && count == rows - 1, what, el, 1e-5);
  double worst = 0, big = 0;
  for (double v : ref) big = std::fmax(big, std::fabs(v));
  for (int64_t i = 0; i < rows * vocab; i++) {
    double g = ld(d, i);
    if (!std::isfinite(g)) worst = 1e30;
    worst = std::fmax(worst, std::fabs(g - ref[i]));
  }
  snprintf(what, sizeof what, "%s, vocab %lld, logits at +%d, gradient %s: gradient", name, (long long)vocab, offset,
           out_offset >= 0 ? "out of place" : "in place");
  expect(worst / big <= tol, what, worst / big, tol);
  snprintf(what, sizeof what, "%s, vocab %lld, logits at +%d: 16-byte loads and stores aligned", name, (long long)vocab, offset);
  expect(misaligned == 0, what, (double)misaligned, 0);
  misaligned = 0;
}

template <typename T>
static void all(double tol, const char *name) {
  for (int64_t vocab : {1000, 1001, 37, 3})
    for (int offset : {0, 1, 3}) check_case<T>(tol, name, vocab, offset, -1);
  check_case<T>(tol, name, 1000, 0, 1); /* out of place at another alignment: element by element */
  check_case<T>(tol, name, 1000, 2, 2);
}

int main() {
  all<float>(1e-5, "fp32");
  all<__nv_bfloat16>(4e-3, "bf16");
  return kit.finish();
}
