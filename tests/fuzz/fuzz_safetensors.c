/* fuzz_safetensors.c: libFuzzer target for the safetensors header parser
 * (src/io/safetensors.c). Any input must be either rejected with a status
 * and a message, or accepted with entries that keep the format's promises:
 * every tensor's bytes inside the file, the tensors tiling the data after
 * the header exactly. Built with clang -fsanitize=fuzzer,address,undefined
 * by tests/fuzz.cmake; CI runs it for a bounded time (tests/fuzz/run.sh). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fsdp_safetensors *st = NULL;
  int rc = fsdp_safetensors_parse(data, size, (int64_t)size, "fuzz", &st);
  if (rc != 0) {
    if (st || rc > 0 || !fsdp_last_error()[0]) abort(); /* a failure has a message and no result */
    return 0;
  }
  int n = fsdp_safetensors_count(st);
  int64_t lo = INT64_MAX, hi = 0, sum = 0;
  for (int i = 0; i < n; i++) {
    fsdp_safetensors_entry e;
    if (fsdp_safetensors_entry_get(st, i, &e) != 0) abort();
    if (e.begin < 8 || e.end < e.begin || e.end > (int64_t)size || !e.name || !e.dtype) abort();
    int at = -1;
    if (fsdp_safetensors_find(st, e.name, &at) != 0 || at < 0) abort();
    if (e.begin < lo) lo = e.begin;
    if (e.end > hi) hi = e.end;
    sum += e.end - e.begin;
  }
  if (n && (hi != (int64_t)size || sum != hi - lo)) abort(); /* tiled, up to the end */
  fsdp_safetensors_metadata(st, "format");
  fsdp_safetensors_close(st);
  return 0;
}
