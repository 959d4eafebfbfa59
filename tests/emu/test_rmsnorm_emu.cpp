// test_rmsnorm_emu: RMSNorm's row kernels (kernels/rmsnorm.cuh: y and rstd
// forward, dx backward; 16 bytes per load where the rows are aligned, one
// element at a time otherwise) run on the CPU under tests/emu/cuda_emu.h
// against float64 from the stored inputs, for dims that are and are not a
// whole number of vectors (8, 64, 200, 1000; 100 and 37: not in bf16 or
// fp32 vectors), both paths, with the caller's thread counts and with fewer
// threads than vectors (every thread striding over several). Tolerances,
// relative to the largest value: fp32 2e-5 (fp32 sums of up to 1000 terms),
// bf16 8e-3 (one rounding of the output, 2^-8); rstd 2e-5 either way. No
// 16-byte access is misaligned and nothing is written past a row's end.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <vector>

#include "emu_kit.h"

static std::atomic<long> misaligned;
#define FSDP_VEC_ALIGNED(p) (void)((uintptr_t)(p) % 16 ? misaligned++ : 0)
#define FSDP_RMS_SHARED(name) FSDP_TC_SHARED(name)
static inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }

#include "../../kernels/rmsnorm.cuh"

static EmuKit kit{"test_rmsnorm_emu"};
static const float GUARD = 768.0f; /* exact in bf16 */

template <typename T>
static T *aligned(std::vector<T> &mem) {
  return (T *)(((uintptr_t)mem.data() + 15) / 16 * 16);
}

template <typename T>
static void check_case(const char *name, int64_t dim, int vec, unsigned threads, double tol) {
  const int64_t rows = 3;
  const float eps = 1e-5f;
  std::vector<T> xm(rows * dim + 16), wm(dim + 16), dym(rows * dim + 16), ym(rows * dim + 24), dxm(rows * dim + 24);
  T *x = aligned(xm), *w = aligned(wm), *dy = aligned(dym), *y = aligned(ym), *dx = aligned(dxm);
  uint32_t s = (uint32_t)(dim * 7 + vec);
  for (int64_t i = 0; i < rows * dim; i++) x[i] = from<T>(2 * rnd(s)), dy[i] = from<T>(rnd(s));
  for (int64_t j = 0; j < dim; j++) w[j] = from<T>(1 + 0.5f * rnd(s));
  for (int64_t i = 0; i < rows * dim + 8; i++) y[i] = from<T>(GUARD), dx[i] = from<T>(GUARD);
  std::vector<float> rstd(rows, -1.0f);
  misaligned = 0;
  cuda_emu::launch({(unsigned)rows, 1, 1}, (int)threads, 32 * sizeof(float),
                   [&] { fsdp_rms::rmsnorm_fwd_kernel<T>(y, rstd.data(), x, w, dim, eps, vec); });
  cuda_emu::launch({(unsigned)rows, 1, 1}, (int)threads, 32 * sizeof(float),
                   [&] { fsdp_rms::rmsnorm_bwd_dx_kernel<T>(dx, dy, x, w, rstd.data(), dim, vec); });
  double ey = 0, edx = 0, er = 0, by = 1e-30, bdx = 1e-30;
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0, dot = 0;
    for (int64_t j = 0; j < dim; j++) ss += (double)ld(x, r * dim + j) * ld(x, r * dim + j);
    const double rs = 1.0 / std::sqrt(ss / (double)dim + eps);
    er = std::fmax(er, std::fabs(rstd[r] - rs) / rs);
    for (int64_t j = 0; j < dim; j++) dot += (double)ld(w, j) * ld(dy, r * dim + j) * ld(x, r * dim + j);
    dot /= (double)dim;
    for (int64_t j = 0; j < dim; j++) {
      const double xv = ld(x, r * dim + j), yr = ld(w, j) * xv * rs;
      const double dxr = rs * ld(w, j) * ld(dy, r * dim + j) - rs * rs * rs * xv * dot;
      ey = std::fmax(ey, std::fabs(ld(y, r * dim + j) - yr)), by = std::fmax(by, std::fabs(yr));
      edx = std::fmax(edx, std::fabs(ld(dx, r * dim + j) - dxr)), bdx = std::fmax(bdx, std::fabs(dxr));
    }
  }
  bool guards = true;
  for (int64_t i = rows * dim; i < rows * dim + 8; i++) guards = guards && ld(y, i) == GUARD && ld(dx, i) == GUARD;
  char what[160];
  snprintf(what, sizeof what, "%s, dim %lld, %s, %u threads: y", name, (long long)dim, vec ? "16-byte loads" : "one at a time",
           threads);
  kit.expect(ey / by <= tol, what, ey / by, tol);
  snprintf(what, sizeof what, "%s, dim %lld, %s, %u threads: rstd", name, (long long)dim, vec ? "vectors" : "scalar", threads);
  kit.expect(er <= 2e-5, what, er, 2e-5);
  snprintf(what, sizeof what, "%s, dim %lld, %s, %u threads: dx", name, (long long)dim, vec ? "vectors" : "scalar", threads);
  kit.expect(edx / bdx <= tol, what, edx / bdx, tol);
  snprintf(what, sizeof what, "%s, dim %lld: no misaligned access, nothing past the last row", name, (long long)dim);
  kit.expect(misaligned == 0 && guards, what, (double)misaligned, 0);
}

template <typename T>
static void check_dims(const char *name, double tol) {
  const int V = fsdp_vec::Vec<T>::n;
  for (int64_t dim : {8, 64, 200, 1000, 100, 37}) {
    const int vec = dim % V == 0;
    check_case<T>(name, dim, vec, fsdp_rms::row_threads(dim, vec, V), tol);
    check_case<T>(name, dim, 0, fsdp_rms::row_threads(dim, 0, V), tol);
    check_case<T>(name, dim, vec, 32, tol); /* fewer threads than vectors */
  }
}

int main() {
  check_dims<float>("fp32", 2e-5);
  check_dims<__nv_bfloat16>("bf16", 8e-3);
  return kit.finish();
}
