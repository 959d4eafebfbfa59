// emu_rows.h: what the cross-entropy kernels' headers (kernels/
// cross_entropy.cuh, cross_entropy_vocab.cuh) take from their includer
// under the emulation, beside emu_kit.h: atomicAdd for the loss sum and
// count, the block's shared memory, and a count of the 16-byte accesses
// the GPU would fault on (misaligned; a test checks it and sets it back
// to 0). Include it before the kernel's header.
#ifndef FSDP_TESTS_EMU_ROWS_H
#define FSDP_TESTS_EMU_ROWS_H

#include <atomic>

#include "emu_kit.h"

/* one thread of a block adds (the emulation runs blocks one after another) */
static inline void atomicAdd(double *p, double v) { *p += v; }
static inline void atomicAdd(unsigned long long *p, unsigned long long v) { *p += v; }
#define FSDP_CE_SHARED(name) FSDP_TC_SHARED(name)
/* a 16-byte access the GPU would fault on */
static std::atomic<long> misaligned;
#define FSDP_VEC_ALIGNED(p) (void)((uintptr_t)(p) % 16 ? misaligned++ : 0)

/* a case's last checks: its gradient (worst error over the largest
 * reference value, within tol; grad false: none written) and the 16-byte
 * accesses, whose count goes back to 0 */
static inline void expect_grad_aligned(EmuKit &kit, const char *what, bool grad, double worst, double big, double tol) {
  char line[256];
  if (grad) {
    snprintf(line, sizeof line, "%s: dlogits", what);
    kit.expect(worst / big <= tol, line, worst / big, tol);
  }
  snprintf(line, sizeof line, "%s: 16-byte loads and stores aligned", what);
  kit.expect(misaligned == 0, line, (double)misaligned, 0);
  misaligned = 0;
}

#endif
