/* comm_cast_chunks.c: a reduce-scatter of bf16/fp16 values into fp32 sums
 * over a transport that reduces in its input type (NCCL): the input is
 * cast to fp32 first. Casting a whole unit at once would take an fp32 copy
 * of it (1.96 GiB for Llama 3 8B's embedding), kept by the device's pool;
 * instead each rank's slice goes in chunks of `fsdp_comm_cast_chunk`
 * elements: chunk [a, a + len) of every slice is cast into a [size][len]
 * staging block (one strided pass), which is reduce-scattered into
 * out[a, a + len). The chunks run one after another on the comm's stream,
 * which orders the reuse of the block. */
#include "../base/error.h"
#include "comm_impl.h"

/* fp32 elements the staging block holds at most, unless one rank's share
 * of it would be under FSDP_CAST_MIN_PER_RANK: a ring reduce-scatter pays a
 * latency per rank and chunk, so many ranks get chunks of at least 4 MB
 * each (a bigger block) rather than many thin ones */
enum { FSDP_CAST_STAGE_ELEMS = 64 << 20, FSDP_CAST_MIN_PER_RANK = 1 << 20 };

size_t fsdp_comm_cast_chunk(size_t count, int size) {
  if (size < 1) size = 1;
  size_t per = FSDP_CAST_STAGE_ELEMS / (size_t)size;
  if (per < FSDP_CAST_MIN_PER_RANK) per = FSDP_CAST_MIN_PER_RANK;
  return count < per ? count : per;
}

int fsdp_comm_cast_reduce_scatter(size_t count, int size, size_t chunk, size_t in_elem_bytes, float *stage, float *out,
                                  const void *in, const comm_cast_steps *steps) {
  if (chunk == 0 && count > 0) return fsdp_fail(FSDP_EINVAL, "cast_reduce_scatter: chunks of 0 elements");
  for (size_t a = 0; a < count; a += chunk) {
    const size_t len = count - a < chunk ? count - a : chunk;
    /* row r of the block: in[r * count + a, r * count + a + len) */
    FSDP_CHECK(steps->cast_rows(steps->ctx, stage, (const char *)in + a * in_elem_bytes, (size_t)size, len, count));
    FSDP_CHECK(steps->reduce_scatter(steps->ctx, out + a, stage, len));
  }
  return FSDP_OK;
}
