/* fsdp_io.h: data readers, checkpoints and safetensors (src/io/). Part of
 * the public API: included by fsdp.h, read by ffi.lua, FFI-clean like it. */
#ifndef FSDP_IO_API_H
#define FSDP_IO_API_H

#include <stdint.h>

#endif /* FSDP_IO_API_H */
