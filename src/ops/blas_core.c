/* blas_core.c: which of OpenBLAS's kernel sets ("cores") the CPU GEMMs run
 * on, chosen by the CPU's features when OpenBLAS does not know the CPU.
 *
 * A DYNAMIC_ARCH OpenBLAS picks its kernels by CPU model as it loads. One
 * older than the CPU falls back to its oldest x86-64 kernels: Debian 12's
 * 0.3.21 takes an Intel Xeon of family 6 model 207 (Emerald Rapids, AVX-512)
 * for "Prescott" (SSE3) and runs the demo's GEMMs at 180-208 GFLOP/s where
 * its SkylakeX kernels reach 958 (bench/RESULTS.md, 2026-11-28). The rank
 * host (launcher/fsdp_main.c) asks fsdp_blas_core_choice before anything
 * else and, where it names a core, sets OPENBLAS_CORETYPE and runs itself
 * again (OpenBLAS reads it only as it loads); FSDP_BLAS_CORE_FROM then says
 * what OpenBLAS had picked, and fsdp_blas_verify checks the chosen kernels'
 * results once against float64. A core the user set (OPENBLAS_CORETYPE) is
 * never replaced.
 *
 * The choice goes by features alone (src/base/cpu_features.c: CPUID and the
 * OS's saved register state, never vendor or model): AVX-512
 * F/BW/DQ/VL -> SkylakeX, AVX2 + FMA -> Haswell, AVX -> Sandybridge. A core
 * is replaced only by one of a higher level; other CPUs (AArch64) keep
 * OpenBLAS's choice. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_ops.h"

/* 0: SSE-era kernels; 1: AVX; 2: AVX2 + FMA; 3: AVX-512. Cores not listed
 * (other architectures, names a later OpenBLAS adds) are never replaced. */
static const struct {
  const char *name;
  int level;
} core_levels[] = {
    {"Prescott", 0},   {"Core2", 0},       {"Penryn", 0},     {"Dunnington", 0}, {"Nehalem", 0},
    {"Atom", 0},       {"Opteron", 0},     {"Barcelona", 0},  {"Bobcat", 0},     {"Katmai", 0},
    {"Coppermine", 0}, {"Northwood", 0},   {"Banias", 0},     {"Athlon", 0},     {"Sandybridge", 1},
    {"Bulldozer", 1},  {"Piledriver", 1},  {"Steamroller", 1}, {"Excavator", 2}, {"Haswell", 2},
    {"Zen", 2},        {"SkylakeX", 3},    {"Cooperlake", 3}, {"SapphireRapids", 3},
};

int fsdp_blas_core_level(const char *core) {
  if (!core) return -1;
  for (size_t i = 0; i < sizeof core_levels / sizeof *core_levels; i++)
    if (!strcasecmp(core, core_levels[i].name)) return core_levels[i].level;
  return -1;
}

const char *fsdp_blas_core_for_features(int avx, int avx2_fma, int avx512) {
  return avx512 ? "SkylakeX" : avx2_fma ? "Haswell" : avx ? "Sandybridge" : NULL;
}

const char *fsdp_blas_core(void) {
  const char *test = getenv("FSDP_TEST_BLAS_CORE"); /* the tests: OpenBLAS "picked" this */
  if (test && test[0]) return test;
  const char *name = openblas_get_corename();
  return name ? name : "unknown";
}

const char *fsdp_blas_core_choice(void) {
  const char *set = getenv("OPENBLAS_CORETYPE");
  if (set && set[0]) return NULL; /* the user's (or this choice, after the run again) */
  int avx, avx2_fma, avx512;
  fsdp_cpu_vector_features(&avx, &avx2_fma, &avx512);
  const char *want = fsdp_blas_core_for_features(avx, avx2_fma, avx512);
  int have = fsdp_blas_core_level(fsdp_blas_core());
  if (!want || have < 0 || have >= fsdp_blas_core_level(want)) return NULL;
  return want;
}

const char *fsdp_blas_core_note(void) {
  static char note[256];
  const char *core = openblas_get_corename(), *from = getenv("FSDP_BLAS_CORE_FROM"),
             *set = getenv("OPENBLAS_CORETYPE");
  int avx, avx2_fma, avx512;
  fsdp_cpu_vector_features(&avx, &avx2_fma, &avx512);
  const char *isa = avx512 ? "AVX-512" : avx2_fma ? "AVX2" : avx ? "AVX" : "its";
  char version[32] = "?"; /* the library loaded, not the header built against */
  const char *config = openblas_get_config();
  if (config) sscanf(config, "OpenBLAS %31s", version);
  if (from && set)
    snprintf(note, sizeof note, "OpenBLAS %s kernels, chosen for this CPU's %s (OpenBLAS %s took it for %s)",
             core ? core : "?", isa, version, from);
  else if (set && set[0]) {
    const char *fits = fsdp_blas_core_for_features(avx, avx2_fma, avx512);
    int below = fits && fsdp_blas_core_level(core) >= 0 && fsdp_blas_core_level(core) < fsdp_blas_core_level(fits);
    snprintf(note, sizeof note, "OpenBLAS %s kernels (OPENBLAS_CORETYPE=%s%s%s%s)", core ? core : "?", set,
             below ? "; this CPU's " : "", below ? isa : "", below ? " runs faster ones: unset it to let fsdp choose" : "");
  }
  else
    snprintf(note, sizeof note, "OpenBLAS %s kernels (OpenBLAS's own choice)", core ? core : "?");
  return note;
}

int fsdp_blas_verify(void) {
  /* odd sizes (every kernel's edge paths), both transposes, alpha and beta */
  enum { M = 67, N = 45, K = 131 };
  static float a[K * M], b[N * K], c[M * N];
  unsigned s = 12345;
  for (int i = 0; i < K * M; i++) a[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
  for (int i = 0; i < N * K; i++) b[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
  for (int i = 0; i < M * N; i++) c[i] = 0.25f;
  /* c = 1.5 * a^T b^T + 0.5 c, with a stored K x M and b stored N x K */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, M, N, K, 1.5f, a, M, b, K, 0.5f, c, N);
  if (getenv("FSDP_TEST_BLAS_WRONG")) c[M * N / 2] += 1e-3f; /* the tests: kernels that compute wrong */
  double worst = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double ref = 0.125, mag = 0.125;
      for (int k = 0; k < K; k++) {
        ref += 1.5 * (double)a[k * M + i] * (double)b[j * K + k];
        mag += fabs(1.5 * (double)a[k * M + i] * (double)b[j * K + k]);
      }
      /* fp32 sums of K terms: within K units of rounding of their magnitudes */
      double err = fabs((double)c[i * N + j] - ref) / (mag * K * 6e-8);
      if (!(err <= worst)) worst = err; /* a NaN is the worst */
    }
  if (!(worst <= 1.0))
    return fsdp_fail(FSDP_EINVAL,
                     "%s give wrong results: a %dx%dx%d GEMM is off its float64 reference by %.3g times the fp32 "
                     "bound; set OPENBLAS_CORETYPE to a core that runs on this CPU (Haswell, Sandybridge, Prescott)",
                     fsdp_blas_core_note(), M, N, K, worst);
  return FSDP_OK;
}
