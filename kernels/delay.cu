// delay.cu: one thread that waits on the GPU's global timer, so tests can
// make a stream busy for a known time and observe ordering between streams.
#include <cstdint>

#include "kernels.h"

__device__ static uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void delay_kernel(uint64_t ns) {
  uint64_t start = global_ns();
  while (global_ns() - start < ns) __nanosleep(1000);
}

extern "C" int fsdp_kernel_delay(int64_t microseconds, void *stream) {
  delay_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<uint64_t>(microseconds) * 1000u);
  return static_cast<int>(cudaGetLastError());
}
