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

#endif
