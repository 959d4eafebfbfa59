/* cpu_features.c: the vector instructions this CPU and its OS can run, by
 * CPUID and by the register state the OS saves (XGETBV), never by vendor or
 * model. Read by the choice of OpenBLAS's kernels (src/ops/blas_core.c) and
 * by the timed fused multiply-adds of the MFU's peak (fma_rate.c). */
#include "../fsdp_base.h"
#if defined(__x86_64__)
#include <cpuid.h>
#endif

void fsdp_cpu_vector_features(int *avx, int *avx2_fma, int *avx512) {
  *avx = *avx2_fma = *avx512 = 0;
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  int osxsave = (c >> 27) & 1, has_avx = (c >> 28) & 1, fma = (c >> 12) & 1;
  if (!osxsave || !has_avx) return;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  (void)hi;
  int ymm = (lo & 0x6) == 0x6, zmm = ymm && (lo & 0xe0) == 0xe0; /* the OS saves YMM, and opmask + ZMM */
  if (!ymm) return;
  *avx = 1;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
  int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
  *avx2_fma = avx2 && fma;
  *avx512 = zmm && f && dq && bw && vl && *avx2_fma;
#endif
}
