/* core_clock.c: the clock this core runs at now, measured. In a VM, and
 * wherever cpufreq is absent, /proc/cpuinfo gives the nominal clock
 * ("cpu MHz": 2596 on the development machine's Zen 4) while the core runs
 * at its boost clock (3.7 GHz there), so a peak from cpuinfo alone is too
 * low and the MFU over it can pass 100%. A chain of dependent integer adds
 * retires one add per cycle on every x86-64 and AArch64 core made in the
 * last fifteen years, so adds per second is cycles per second. */
#include "../fsdp_base.h"

/* 16 dependent adds per iteration; the loop's own counter runs on other
 * ports beside them */
static void add_chain(unsigned long iterations) {
  unsigned long x = 0;
  for (unsigned long i = 0; i < iterations; i++) {
#if defined(__x86_64__)
    __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\t"
                     "add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\t"
                     "add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\t"
                     "add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0"
                     : "+r"(x));
#elif defined(__aarch64__)
    __asm__ volatile("add %0,%0,#1\n\tadd %0,%0,#1\n\tadd %0,%0,#1\n\tadd %0,%0,#1\n\t"
                     "add %0,%0,#1\n\tadd %0,%0,#1\n\tadd %0,%0,#1\n\tadd %0,%0,#1\n\t"
                     "add %0,%0,#1\n\tadd %0,%0,#1\n\tadd %0,%0,#1\n\tadd %0,%0,#1\n\t"
                     "add %0,%0,#1\n\tadd %0,%0,#1\n\tadd %0,%0,#1\n\tadd %0,%0,#1"
                     : "+r"(x));
#endif
  }
}

double fsdp_core_clock_hz(void) {
#if defined(__x86_64__) || defined(__aarch64__)
  /* the fastest of a few ~2 ms runs: a run the scheduler or the hypervisor
   * interrupts only reads lower; the first also wakes the core from idle */
  const unsigned long iterations = 125000; /* 2M cycles */
  double best = 0;
  for (int run = 0; run < 7; run++) {
    double t0 = fsdp_time_now();
    add_chain(iterations);
    double dt = fsdp_time_now() - t0;
    if (dt > 0 && 16.0 * (double)iterations / dt > best) best = 16.0 * (double)iterations / dt;
  }
  return best;
#else
  return 0; /* no measurement on this architecture: cpuinfo's clock stands */
#endif
}
