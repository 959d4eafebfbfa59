/* host_device.h: FSDP_HOST_DEVICE marks an inline function that the CUDA
 * kernels and the CPU loops share (one formula, the same bits on both). */
#ifndef FSDP_BASE_HOST_DEVICE_H
#define FSDP_BASE_HOST_DEVICE_H

#ifdef __CUDACC__
#define FSDP_HOST_DEVICE __host__ __device__
#else
#define FSDP_HOST_DEVICE
#endif

#endif
