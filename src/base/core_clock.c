/* core_clock.c: the clock this core runs at now, measured. In a VM, and
 * wherever cpufreq is absent, /proc/cpuinfo gives the nominal clock
 * ("cpu MHz": 2596 on the development machine's Zen 4) while the core runs
 * at its boost clock (3.7-4.2 GHz there), so a peak from cpuinfo alone is
 * too low and the MFU over it can pass 100%.
 *
 * Two chains of dependent instructions, timed, each the fastest of a few
 * short runs:
 * - register-to-register adds, one cycle each on every x86-64 and AArch64
 *   core (an add of an immediate is no clock: Intel's cores since Golden
 *   Cove fold chains of them in the renamer, and such a chain read 5.3 to
 *   15.9 GHz on a 2.1 GHz Xeon of family 6 model 207);
 * - on x86-64, 64-bit multiplies, three cycles each on Intel's cores since
 *   Nehalem and AMD's since Zen.
 * Where the two disagree by more than 10%, or a chain reads above 7 GHz,
 * one of them is no clock on this core: nothing is returned, and the
 * kernel's clock stands. */
#include "../fsdp_base.h"

/* Each chain's whole loop is one asm statement, so its value stays in a
 * register in any build: with the loop in C, an unoptimised build (the
 * sanitizers' Debug) stores and reloads it each iteration, which lengthens
 * the chain and reads a slower clock. The loop's counter runs beside it. */
#define ADD16(op) op op op op op op op op op op op op op op op op

/* 16 dependent adds of a register per iteration (its value hidden from the
 * compiler and from any renamer) */
static void add_chain(unsigned long iterations) {
  unsigned long x = 0, one = 1;
  if (!iterations) return;
#if defined(__x86_64__)
  __asm__ volatile("1:\n\t" ADD16("add %[one],%[x]\n\t") "dec %[n]\n\tjnz 1b"
                   : [x] "+r"(x), [n] "+r"(iterations)
                   : [one] "r"(one)
                   : "cc");
#elif defined(__aarch64__)
  __asm__ volatile("1:\n\t" ADD16("add %[x],%[x],%[one]\n\t") "subs %[n],%[n],#1\n\tb.ne 1b"
                   : [x] "+r"(x), [n] "+r"(iterations)
                   : [one] "r"(one)
                   : "cc");
#else
  (void)x, (void)one;
#endif
}
#undef ADD16

#if defined(__x86_64__)
/* 8 dependent 64-bit multiplies per iteration: 24 cycles */
static void mul_chain(unsigned long iterations) {
  unsigned long x = 3;
  if (!iterations) return;
  __asm__ volatile("1:\n\t"
                   "imul %[x],%[x]\n\timul %[x],%[x]\n\timul %[x],%[x]\n\timul %[x],%[x]\n\t"
                   "imul %[x],%[x]\n\timul %[x],%[x]\n\timul %[x],%[x]\n\timul %[x],%[x]\n\t"
                   "dec %[n]\n\tjnz 1b"
                   : [x] "+r"(x), [n] "+r"(iterations)
                   :
                   : "cc");
}
#endif

/* cycles per second of a chain of `cycles` cycles per iteration: the
 * fastest of a few ~2 ms runs (a run the scheduler or the hypervisor
 * interrupts only reads lower; the first also wakes the core from idle) */
static double rate(void (*chain)(unsigned long), double cycles, unsigned long iterations) {
  double best = 0;
  for (int run = 0; run < 7; run++) {
    double t0 = fsdp_time_now();
    chain(iterations);
    double dt = fsdp_time_now() - t0;
    if (dt > 0 && cycles * (double)iterations / dt > best) best = cycles * (double)iterations / dt;
  }
  return best;
}

double fsdp_core_clock_pick(double by_add, double by_mul) {
  if (!(by_add > 0 && by_mul > 0) || by_add > 7e9 || by_mul > 7e9) return 0;
  if (by_add > 1.1 * by_mul || by_mul > 1.1 * by_add) return 0;
  return by_add > by_mul ? by_add : by_mul;
}

double fsdp_core_clock_hz(void) {
#if defined(__x86_64__)
  /* a busy machine can slow all of one chain's runs: try again before
   * calling them disagreeing */
  for (int attempt = 0; attempt < 4; attempt++) {
    double by_add = rate(add_chain, 16, 125000), by_mul = rate(mul_chain, 24, 83000);
    if (by_add > 7e9 || by_mul > 7e9) return 0;
    double hz = fsdp_core_clock_pick(by_add, by_mul);
    if (hz > 0) return hz;
  }
  return 0;
#elif defined(__aarch64__)
  double by_add = rate(add_chain, 16, 125000);
  return by_add > 7e9 ? 0 : by_add;
#else
  return 0; /* no measurement on this architecture: cpuinfo's clock stands */
#endif
}
