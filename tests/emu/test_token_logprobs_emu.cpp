// test_token_logprobs_emu: the CUDA per-token log-probability kernel
// (kernels/token_logprobs.cuh: online max and sums in one read, 16-byte
// loads between a scalar head and tail, the gradient in a second) run on
// the CPU under tests/emu/cuda_emu.h against float64 of the stored logits.
// Vocabularies 37, 1000 and 32003 (37 and 32003: rows at every alignment,
// partial vectors at both ends; every 16-byte access must be aligned, as
// the GPU needs), fp32 and bf16 logits (bf16: the inputs are exact bf16
// values, and the reference is float64 of those values). Each case has
// eight rows: plain, shifted by +90 (no overflow without the max shift),
// some logits -inf, the target ignored, the target at vocab and at -1
// (outside [0, vocab): taken as ignored, the header says why), one logit
// 20 above the rest on the target (p_t near 1, the entropy near 0), the
// target at vocab - 1. Runs: all three outputs with dlogits in place, out
// of place at the logits' alignment (16-byte path) and at another
// (element by element), logp only, entropy only, dlogits only (128
// threads), and, at vocab 32003, the entry point's 1024 threads; logp and
// entropy the same bits in every 128-thread run. About 1.8 s of CPU.
// Tolerances, per element against float64:
//   logp     |err| <= 1e-6
//   entropy  |err| <= 1e-5 |ref| + 1e-6
//   dlogits  fp32: |err| <= 1e-5 |ref| + 1e-7;  bf16 (stored rounded):
//            1e-2 |ref| + 1e-6
// ignored rows: exactly 0 in all three; outputs are NaN before each run.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_kit.h"

#define FSDP_TL_SHARED(name) FSDP_TC_SHARED(name)
/* a 16-byte access the GPU would fault on */
static std::atomic<long> misaligned;
#define FSDP_VEC_ALIGNED(p) (void)((uintptr_t)(p) % 16 ? misaligned++ : 0)

#include "../../kernels/token_logprobs.cuh"

static EmuKit kit{"test_token_logprobs_emu"};

enum { ROWS = 8, IGN = -100 };

struct Ref {
  std::vector<double> logp, ent, grad;
};

/* float64 logp, entropy and coef (onehot - p) of every row of x */
template <typename T>
static Ref reference(const T *x, int64_t vocab, const int32_t *targets, const float *coef) {
  Ref r{std::vector<double>(ROWS, 0.0), std::vector<double>(ROWS, 0.0), std::vector<double>(ROWS * vocab, 0.0)};
  for (int64_t i = 0; i < ROWS; i++) {
    int32_t t = targets[i];
    if (t == IGN || t < 0 || t >= vocab) continue;
    const T *xi = x + i * vocab;
    double m = -INFINITY, s = 0, u = 0;
    for (int64_t j = 0; j < vocab; j++) m = std::fmax(m, (double)ld(xi, j));
    for (int64_t j = 0; j < vocab; j++) {
      double y = (double)ld(xi, j) - m, e = std::exp(y);
      s += e;
      if (e > 0) u += e * y;
    }
    r.logp[i] = (double)ld(xi, t) - m - std::log(s);
    r.ent[i] = std::log(s) - u / s;
    for (int64_t j = 0; j < vocab; j++)
      r.grad[i * vocab + j] = coef[i] * ((j == t ? 1.0 : 0.0) - std::exp((double)ld(xi, j) - m) / s);
  }
  return r;
}

/* the worst of |got - want| / (rel |want| + abs): > 1 is out of
 * tolerance, a non-finite value 1e30 */
static double worst_of(const float *got, const double *want, int64_t n, double rel, double abs) {
  double w = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = got[i];
    w = std::fmax(w, std::isfinite(g) ? std::fabs(g - want[i]) / (rel * std::fabs(want[i]) + abs) : 1e30);
  }
  return w;
}

enum Mode { ALL_IN_PLACE, ALL_OUT_SAME, ALL_OUT_OTHER, LOGP_ONLY, ENTROPY_ONLY, DLOGITS_ONLY, ALL_1024 };
static const char *mode_name[] = {"all three, dlogits in place",
                                  "all three, dlogits out of place (same alignment)",
                                  "all three, dlogits out of place (other alignment)",
                                  "logp only",
                                  "entropy only",
                                  "dlogits only, in place",
                                  "all three in place, 1024 threads"};

template <typename T>
static void check_case(const char *tname, int64_t vocab, int offset) {
  const bool bf16 = sizeof(T) == 2;
  uint32_t seed = (uint32_t)(vocab * 31 + offset * 7 + (bf16 ? 1 : 0));
  /* the logits, offset elements into their buffer */
  std::vector<T> orig(ROWS * vocab + 16);
  T *x0 = orig.data() + offset;
  for (int64_t i = 0; i < ROWS; i++)
    for (int64_t j = 0; j < vocab; j++) x0[i * vocab + j] = from<T>(3 * rnd(seed) + (i == 1 ? 90.0f : 0.0f));
  const int32_t v = (int32_t)vocab;
  int32_t targets[ROWS] = {(v * 2) / 3, 5 % v, 7 % v, IGN, v, -1, 11 % v, v - 1};
  x0[2 * vocab + 3 % v] = from<T>(-INFINITY), x0[2 * vocab + v - 1] = from<T>(-INFINITY);
  x0[6 * vocab + targets[6]] = from<T>(ld(x0, 6 * vocab + targets[6]) + 20.0f);
  const float coef[ROWS] = {0.75f, -1.25f, 0.5f, 2.0f, -0.5f, 1.0f, 0.5f, -0.3f};
  const Ref ref = reference(x0, vocab, targets, coef);
  const double grel = bf16 ? 1e-2 : 1e-5, gabs = bf16 ? 1e-6 : 1e-7;

  std::vector<float> first_logp, first_ent; /* run ALL_IN_PLACE's bits */
  /* the kernel's own 1024 threads once per dtype: 1024 fibers cost 0.2 s a run */
  for (int mode = ALL_IN_PLACE; mode <= (vocab == 32003 ? ALL_1024 : DLOGITS_ONLY); mode++) {
    std::vector<T> buf = orig, out(ROWS * vocab + 16);
    T *x = buf.data() + offset;
    const T nan = from<T>(NAN);
    for (auto &e : out) e = nan;
    T *d = nullptr;
    if (mode == ALL_IN_PLACE || mode == DLOGITS_ONLY || mode == ALL_1024) d = x;
    if (mode == ALL_OUT_SAME) d = out.data() + offset;
    if (mode == ALL_OUT_OTHER) d = out.data() + offset + 1;
    std::vector<float> lp(ROWS, NAN), en(ROWS, NAN);
    float *lpp = mode == ENTROPY_ONLY || mode == DLOGITS_ONLY ? nullptr : lp.data();
    float *enp = mode == LOGP_ONLY || mode == DLOGITS_ONLY ? nullptr : en.data();
    misaligned = 0;
    cuda_emu::launch({(unsigned)ROWS, 1, 1}, mode == ALL_1024 ? 1024 : 128, 96 * sizeof(float), [&] {
      fsdp_tl::token_logprobs_kernel<T>(lpp, enp, d, x, targets, d ? coef : nullptr, vocab, IGN);
    });
    char what[200];
    snprintf(what, sizeof what, "%s, vocab %lld, logits at +%d, %s", tname, (long long)vocab, offset, mode_name[mode]);
    char label[260];
    if (lpp) {
      double w = worst_of(lp.data(), ref.logp.data(), ROWS, 0, 1e-6);
      snprintf(label, sizeof label, "%s: logp", what);
      kit.expect(w <= 1, label, w, 1);
    }
    if (enp) {
      double w = worst_of(en.data(), ref.ent.data(), ROWS, 1e-5, 1e-6);
      snprintf(label, sizeof label, "%s: entropy", what);
      kit.expect(w <= 1, label, w, 1);
    }
    if (d) {
      std::vector<float> g(ROWS * vocab);
      for (int64_t i = 0; i < ROWS * vocab; i++) g[i] = ld(d, i);
      double w = worst_of(g.data(), ref.grad.data(), ROWS * vocab, grel, gabs);
      snprintf(label, sizeof label, "%s: dlogits", what);
      kit.expect(w <= 1, label, w, 1);
      /* ignored rows: +0 or -0, nothing else */
      long nonzero = 0;
      for (int64_t i = 0; i < ROWS; i++)
        if (targets[i] == IGN || targets[i] < 0 || targets[i] >= vocab)
          for (int64_t j = 0; j < vocab; j++) nonzero += g[i * vocab + j] != 0.0f;
      snprintf(label, sizeof label, "%s: ignored rows' dlogits 0", what);
      kit.expect(nonzero == 0, label, (double)nonzero, 0);
      if (d != x) { /* the logits untouched */
        bool same = std::memcmp(buf.data(), orig.data(), sizeof(T) * orig.size()) == 0;
        snprintf(label, sizeof label, "%s: logits unchanged", what);
        kit.expect(same, label, same ? 0 : 1, 0);
      }
    }
    long bad_zero = 0, bad_bits = 0;
    for (int64_t i = 0; i < ROWS; i++) {
      bool ign = targets[i] == IGN || targets[i] < 0 || targets[i] >= vocab;
      if (ign && ((lpp && lp[i] != 0.0f) || (enp && en[i] != 0.0f))) bad_zero++;
      if (mode != ALL_IN_PLACE && lpp && std::memcmp(&lp[i], &first_logp[i], 4)) bad_bits++;
      if (mode != ALL_IN_PLACE && enp && std::memcmp(&en[i], &first_ent[i], 4)) bad_bits++;
    }
    snprintf(label, sizeof label, "%s: ignored rows' logp and entropy 0", what);
    kit.expect(bad_zero == 0, label, (double)bad_zero, 0);
    if (mode == ALL_IN_PLACE) {
      first_logp = lp, first_ent = en;
    } else if (mode != ALL_1024) { /* the same sums in the same order: the same bits */
      snprintf(label, sizeof label, "%s: logp and entropy the same bits as in place", what);
      kit.expect(bad_bits == 0, label, (double)bad_bits, 0);
    }
    snprintf(label, sizeof label, "%s: 16-byte loads and stores aligned", what);
    kit.expect(misaligned == 0, label, (double)misaligned, 0);
  }
}

template <typename T>
static void all(const char *tname) {
  for (int64_t vocab : {37, 1000, 32003}) check_case<T>(tname, vocab, 0);
  check_case<T>(tname, 37, 3);
  check_case<T>(tname, 1000, 1); /* every row's head and tail scalar */
}

int main() {
  all<float>("fp32");
  all<__nv_bfloat16>("bf16");
  return kit.finish();
}
