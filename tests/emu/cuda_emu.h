// cuda_emu.h: enough of CUDA to run a kernel's source on the CPU, for
// tests that check a kernel's logic where no GPU exists. One std::thread per
// CUDA thread of a block (blocks one after another); __syncthreads and
// __syncwarp are barriers; __shfl_xor_sync goes through a per-warp slot
// array; a WMMA fragment is the whole 16x16 tile, computed redundantly by
// every lane of the warp, with the warp synchronised around loads and stores
// (the collective semantics of *_matrix_sync); bf16 rounds to nearest even.
// Slow (thousands of threads), so tests keep their shapes small.
#ifndef FSDP_TESTS_CUDA_EMU_H
#define FSDP_TESTS_CUDA_EMU_H

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "../../src/base/bf16.h"

namespace cuda_emu {

struct Barrier {
  std::mutex m;
  std::condition_variable cv;
  int n, count = 0;
  unsigned long gen = 0;
  explicit Barrier(int n_) : n(n_) {}
  void wait() {
    std::unique_lock<std::mutex> l(m);
    unsigned long g = gen;
    if (++count == n) {
      count = 0;
      gen++;
      cv.notify_all();
    } else {
      cv.wait(l, [&] { return gen != g; });
    }
  }
};

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct Thread {
  dim3 thread, block, block_dim, grid_dim;
  unsigned char *smem;
  Barrier *block_bar, *warp_bar;
  float *warp_slots;
};
inline thread_local Thread self;

/* runs kern() on every thread of every block of grid */
inline void launch(dim3 grid, int threads, size_t smem, const std::function<void()> &kern) {
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        std::vector<unsigned char> sm(smem + 128);
        unsigned char *base = sm.data() + (128 - (uintptr_t)sm.data() % 128) % 128; /* __align__(128) */
        Barrier block(threads);
        int nw = (threads + 31) / 32;
        std::vector<Barrier *> wb;
        std::vector<std::vector<float>> slots(nw, std::vector<float>(32));
        for (int w = 0; w < nw; w++) wb.push_back(new Barrier(32));
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; t++)
          ts.emplace_back([&, t] {
            self.thread.x = t;
            self.block.x = x, self.block.y = y, self.block.z = z;
            self.block_dim.x = threads;
            self.grid_dim = grid;
            self.smem = base;
            self.block_bar = &block;
            self.warp_bar = wb[t / 32];
            self.warp_slots = slots[t / 32].data();
            kern();
          });
        for (auto &th : ts) th.join();
        for (auto *b : wb) delete b;
      }
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
