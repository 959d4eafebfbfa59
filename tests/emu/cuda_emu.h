// cuda_emu.h: enough of CUDA to run a kernel's source on the CPU, for
// tests that check a kernel's logic where no GPU exists. Each CUDA thread of
// a block is a fiber (ucontext) on the test's one OS thread, run in turn
// until it waits at a barrier or ends (blocks one after another);
// __syncthreads and __syncwarp are barriers; __shfl_xor_sync goes through a
// per-warp slot array; a WMMA fragment is the whole 16x16 tile, computed
// redundantly by every lane of the warp, with the warp synchronised around
// loads and stores (the collective semantics of *_matrix_sync); bf16 rounds
// to nearest even. Fibers, not threads: a barrier of 128 OS threads cost
// the kernel's futex wake-ups and context switches (20 of the 23 CPU
// seconds of test_attention_tc_emu were the kernel's), and a kernel whose
// threads can never all reach a barrier (a __syncthreads in a branch some
// threads skip) is reported, where threads hung.
// Slow all the same (thousands of threads), so tests keep their shapes small.
#ifndef FSDP_TESTS_CUDA_EMU_H
#define FSDP_TESTS_CUDA_EMU_H

#include <sys/mman.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "../../src/base/bf16.h"

namespace cuda_emu {

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct Barrier;
struct Thread {
  dim3 thread, block, block_dim, grid_dim;
  unsigned char *smem;
  Barrier *block_bar, *warp_bar;
  float *warp_slots;
};

struct Fiber {
  ucontext_t ctx;
  Thread t;
  bool done;
};

inline Thread self;              /* the running fiber's (the scheduler sets it before each switch) */
inline Fiber *current;           /* the running fiber */
inline ucontext_t scheduler;     /* where a fiber goes when it waits or ends */
inline unsigned long progress;   /* barrier arrivals and ended fibers: a round without any is a deadlock */
inline const std::function<void()> *kernel;

inline void yield() { swapcontext(&current->ctx, &scheduler); }

struct Barrier {
  int n, count = 0;
  unsigned long gen = 0;
  explicit Barrier(int n_) : n(n_) {}
  void wait() {
    unsigned long g = gen;
    progress++;
    if (++count == n) {
      count = 0;
      gen++;
      return;
    }
    while (gen == g) yield();
  }
};

inline void fiber_main() {
  (*kernel)();
  current->done = true;
  progress++;
} /* uc_link: back to the scheduler */

/* getcontext and swapcontext return twice, as setjmp does: kept in frames
 * of their own, so that no variable of launch() lives across them */
__attribute__((noinline)) inline void start_fiber(Fiber &f, unsigned char *stack, size_t size) {
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack;
  f.ctx.uc_stack.ss_size = size;
  f.ctx.uc_link = &scheduler;
  makecontext(&f.ctx, fiber_main, 0);
}
__attribute__((noinline)) inline void resume(Fiber &f) {
  current = &f;
  self = f.t;
  swapcontext(&scheduler, &f.ctx);
}

/* runs kern() on every thread of every block of grid */
inline void launch(dim3 grid, int threads, size_t smem, const std::function<void()> &kern) {
  const size_t stack = 1u << 20; /* a kernel's fragments live on its stack */
  std::vector<unsigned char *> stacks(threads);
  for (auto &st : stacks) {
    void *m = mmap(nullptr, stack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      perror("cuda_emu: mmap of a fiber's stack");
      abort();
    }
    st = (unsigned char *)m;
  }
  kernel = &kern;
  std::vector<Fiber> fibers(threads);
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        std::vector<unsigned char> sm(smem + 128);
        unsigned char *base = sm.data() + (128 - (uintptr_t)sm.data() % 128) % 128; /* __align__(128) */
        Barrier block(threads);
        int nw = (threads + 31) / 32;
        std::vector<Barrier> wb(nw, Barrier(32));
        std::vector<std::vector<float>> slots(nw, std::vector<float>(32));
        for (int t = 0; t < threads; t++) {
          Fiber &f = fibers[t];
          f.done = false;
          f.t = Thread{};
          f.t.thread.x = t;
          f.t.block.x = x, f.t.block.y = y, f.t.block.z = z;
          f.t.block_dim.x = threads;
          f.t.grid_dim = grid;
          f.t.smem = base;
          f.t.block_bar = &block;
          f.t.warp_bar = &wb[t / 32];
          f.t.warp_slots = slots[t / 32].data();
          start_fiber(f, stacks[t], stack);
        }
        for (int left = threads; left > 0;) {
          unsigned long before = progress;
          left = 0;
          for (auto &f : fibers) {
            if (f.done) continue;
            resume(f);
            left += !f.done;
          }
          if (left > 0 && progress == before) {
            fprintf(stderr, "cuda_emu: block (%u, %u, %u): %d of %d threads wait at a barrier the others never reach\n",
                    x, y, z, left, threads);
            abort();
          }
        }
      }
  for (auto *st : stacks) munmap(st, stack);
}

}  // namespace cuda_emu

#define threadIdx (cuda_emu::self.thread)
#define blockIdx (cuda_emu::self.block)
#define blockDim (cuda_emu::self.block_dim)
#define gridDim (cuda_emu::self.grid_dim)
#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(x)
#define FSDP_TC_SHARED(name) unsigned char *name = cuda_emu::self.smem
#define __expf expf

inline void __syncthreads() { cuda_emu::self.block_bar->wait(); }
inline void __syncwarp() { cuda_emu::self.warp_bar->wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  int lane = threadIdx.x % 32;
  cuda_emu::self.warp_slots[lane] = v;
  cuda_emu::self.warp_bar->wait();
  float r = cuda_emu::self.warp_slots[lane ^ o];
  cuda_emu::self.warp_bar->wait();
  return r;
}

/* bf16 as the engine rounds it (src/base/bf16.h: nearest even, as the GPU's __float2bfloat16_rn) */
struct __nv_bfloat16 {
  uint16_t x;
};
inline float __bfloat162float(__nv_bfloat16 b) { return fsdp_bf16_load(b.x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{fsdp_bf16_round(f)}; }
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }

namespace nvcuda {
namespace wmma {
inline float as_float(float v) { return v; }
inline float as_float(__nv_bfloat16 v) { return __bfloat162float(v); }
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
/* the whole tile, row-major: x[row * 16 + col] (matrix_b: x[k * 16 + n]) */
template <class Use, int M, int N, int K, class T, class L = void>
struct fragment {
  float x[256];
};
template <class F>
void fill_fragment(F &f, float v) {
  for (int i = 0; i < 256; i++) f.x[i] = v;
}
template <class T>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, row_major> &f, const T *p, unsigned ldm) {
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = as_float(p[r * ldm + c]);
  __syncwarp();
}
template <class T>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, row_major> &f, const T *p, unsigned ldm) {
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 16; n++) f.x[k * 16 + n] = as_float(p[k * ldm + n]);
  __syncwarp();
}
template <class T>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, col_major> &f, const T *p, unsigned ldm) {
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 16; n++) f.x[k * 16 + n] = as_float(p[n * ldm + k]);
  __syncwarp();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm, layout_t l) {
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  __syncwarp();
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t l) {
  __syncwarp(); /* every lane has loaded what this overwrites */
  if (threadIdx.x % 32 == 0)
    for (int r = 0; r < 16; r++)
      for (int c = 0; c < 16; c++) (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
  __syncwarp();
}
template <class A, class B>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const A &a, const B &b,
              const fragment<accumulator, 16, 16, 16, float> &c) {
  float t[256];
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 16; n++) {
      float s = c.x[r * 16 + n];
      for (int k = 0; k < 16; k++) s += a.x[r * 16 + k] * b.x[k * 16 + n];
      t[r * 16 + n] = s;
    }
  memcpy(d.x, t, sizeof t);
}
}  // namespace wmma
}  // namespace nvcuda

#endif
