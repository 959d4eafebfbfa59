/* fsdp.h: the public API of the fsdp engine, the one header a user
 * includes: it includes the per-layer headers, one per layer of the engine
 * (docs/ARCHITECTURE.md), bottom to top. Inside the engine a layer includes
 * only its own public header and those below it (scripts/check_layers.py).
 *
 * FFI-clean on purpose: no macros inside declarations, no bit-fields, no
 * varargs, so that lua/fsdp/ffi.lua can hand these files (preprocessor lines
 * and the __cplusplus blocks stripped, each header once) straight to
 * ffi.cdef. tests/lua/test_ffi.lua checks the Lua view against the C one.
 *
 * Conventions
 * - Every call that can fail returns int: 0 (FSDP_OK) or a negative FSDP_E*
 *   status; fsdp_last_error() then holds a message (thread-local). The library
 *   never exits or aborts on a caller's mistake.
 * - A positive result is named (fsdp_result: FSDP_DEFERRED, FSDP_ABSENT)
 *   and is not an error; no message is set.
 * - Handles are opaque. Every destructor (*_destroy, *_close, *_free)
 *   returns int like the rest, and NULL is a no-op.
 * - dtypes pass as fsdp_dtype. Struct fields that hold one stay int32_t
 *   (an enum's size is the compiler's choice; the FFI needs a fixed
 *   layout). Fill config structs by field name (designated initializers;
 *   from Lua, ffi.new(ct, {name = value})) so a new field shifts nothing.
 * - Asynchronous work is enqueued on a stream and ordered by events, with the
 *   same meaning on CPU and CUDA: an event wait captures the event's most
 *   recent record at the time of the wait; waiting on a never-recorded event
 *   does not block.
 */
#ifndef FSDP_H
#define FSDP_H

/* Each part includes the ones below it and has its own extern "C". */
#include "fsdp_base.h"
#include "fsdp_device.h"
#include "fsdp_kernels.h"
#include "fsdp_dist.h"
#include "fsdp_shard.h"
#include "fsdp_ops.h"
#include "fsdp_io.h"

#endif /* FSDP_H */
