/* fma_rate.c: the fp32 FLOP/s of one core's fused multiply-adds, timed. The
 * MFU's CPU peak is clock x FLOP per cycle, and the FLOP per cycle of a core
 * is not in its flags: Zen 4 runs AVX-512 on 256-bit units (half of Zen 5's
 * rate), some Xeons have one 512-bit FMA unit where others have two, and a
 * VM's CPUID may name another CPU than the one under it. So lua/fsdp/peak.lua
 * divides this rate by the measured clock (core_clock.c) and takes the
 * nearest power of two, no more than the widest unit the flags name.
 *
 * Twelve independent accumulators, more than latency x issue rate (4 cycles
 * x 2 units on the cores of both vendors), so the units, not the latency, bound
 * the rate; the fastest of 7 runs of ~1 ms (a run the scheduler interrupts,
 * or AVX-512's warm-up on Intel, only reads lower). */
#include "../fsdp_base.h"
#if defined(__x86_64__)
#include <immintrin.h>

/* The whole loop is one asm statement: a += m * k on each of 12
 * accumulators, then the counter. Written as C the compiler saw that chains
 * from the same start are one chain and kept one (16 chains became one, read
 * as 128 FLOP a cycle); with the loop in C around an asm of the 12 steps, an
 * unoptimised build (the sanitizers' Debug) kept the accumulators in memory
 * between iterations, and each chain's store-to-load forwarding read 8.8
 * FLOP a cycle on a core that does 32. Here they live in registers from the
 * first iteration to the last, in any build; early-clobbered ("&"), since
 * an optimising build otherwise gives an accumulator equal to k on entry
 * k's register (one asm pass reads its inputs first; a loop does not) and
 * the rate reads 2/3 of the units'. 12 accumulators, since an asm takes 30
 * operands at most: 12 x 2 + the counter's 2 + m and k. */
#define FMA_STEP(i) "vfmadd231ps %[m], %[k], %[a" #i "]\n\t"
#define FMA_KERNEL(name, isa, vec, set1, storeu)                                                                  \
  __attribute__((target(isa))) static float name(unsigned long iterations) {                                      \
    vec m = set1(1.0f), k = set1(0x1p-20f);                                                                        \
    vec a0 = k, a1 = k, a2 = k, a3 = k, a4 = k, a5 = k, a6 = k, a7 = k, a8 = k, a9 = k, a10 = k, a11 = k;         \
    if (iterations)                                                                                                \
      __asm__ volatile("1:\n\t" FMA_STEP(0) FMA_STEP(1) FMA_STEP(2) FMA_STEP(3) FMA_STEP(4) FMA_STEP(5)           \
                           FMA_STEP(6) FMA_STEP(7) FMA_STEP(8) FMA_STEP(9) FMA_STEP(10) FMA_STEP(11)               \
                       "dec %[n]\n\t"                                                                              \
                       "jnz 1b"                                                                                    \
                       : [a0] "+&v"(a0), [a1] "+&v"(a1), [a2] "+&v"(a2), [a3] "+&v"(a3), [a4] "+&v"(a4), [a5] "+&v"(a5), \
                         [a6] "+&v"(a6), [a7] "+&v"(a7), [a8] "+&v"(a8), [a9] "+&v"(a9), [a10] "+&v"(a10),             \
                         [a11] "+&v"(a11), [n] "+r"(iterations)                                                     \
                       : [m] "v"(m), [k] "v"(k)                                                                    \
                       : "cc");                                                                                    \
    float lanes[sizeof(vec) / sizeof(float)], sum = 0;                                                             \
    storeu(lanes, a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11);                                    \
    for (size_t i = 0; i < sizeof lanes / sizeof *lanes; i++) sum += lanes[i];                                     \
    return sum;                                                                                                    \
  }
FMA_KERNEL(fma512, "avx512f", __m512, _mm512_set1_ps, _mm512_storeu_ps) /* 12 x 16 lanes x 2: 384 FLOP */
FMA_KERNEL(fma256, "avx2,fma", __m256, _mm256_set1_ps, _mm256_storeu_ps) /* 12 x 8 lanes x 2: 192 FLOP */
#undef FMA_KERNEL
#undef FMA_STEP
#endif

double fsdp_core_fma_flops(int bits) {
#if defined(__x86_64__)
  int avx, avx2_fma, avx512;
  fsdp_cpu_vector_features(&avx, &avx2_fma, &avx512);
  if (!((bits == 512 && avx512) || (bits == 256 && avx2_fma))) return 0; /* the flags' rule stands */
  float (*kernel)(unsigned long) = bits == 512 ? fma512 : fma256;
  double flop_per_iteration = 12.0 * (bits / 32) * 2;
  unsigned long iterations = 1ul << 19;
  double best = 0;
  volatile float sink = 0;
  for (int run = 0; run < 7; run++) {
    double t0 = fsdp_time_now();
    sink += kernel(iterations);
    double dt = fsdp_time_now() - t0;
    if (dt > 0 && flop_per_iteration * (double)iterations / dt > best) best = flop_per_iteration * (double)iterations / dt;
  }
  (void)sink;
  return best;
#else
  (void)bits;
  return 0;
#endif
}
