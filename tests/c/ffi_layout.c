/* ffi_layout: prints, as a Lua table, what C knows about the public header's
 * structs and constants, for tests/lua/test_ffi.lua to compare with the FFI's
 * view. A constant added to fsdp.h but not here makes that test fail. */
#include <stddef.h>
#include <stdio.h>

#include "fsdp.h"

#define SIZE(t) printf("  sizeof_%s = %zu,\n", #t, sizeof(t))
#define OFF(t, f) printf("  {\"%s\", \"%s\", %zu},\n", #t, #f, offsetof(t, f))
#define CONST(c) printf("  %s = %d,\n", #c, (int)(c))

int main(void) {
  printf("return {\nsizes = {\n");
  SIZE(fsdp_proc_info);
  SIZE(fsdp_layout_piece);
  SIZE(fsdp_adamw_config);
  SIZE(fsdp_init_rule);
  SIZE(fsdp_unit_memory);
  SIZE(fsdp_memory_stats);
  SIZE(fsdp_tensor);
  SIZE(fsdp_unit_config);
  SIZE(fsdp_unit_times);
  SIZE(fsdp_rope_scaling);
  SIZE(fsdp_safetensors_entry);
  printf("},\noffsets = {\n");
  OFF(fsdp_proc_info, rank);
  OFF(fsdp_proc_info, size);
  OFF(fsdp_proc_info, local_rank);
  OFF(fsdp_proc_info, local_size);
  OFF(fsdp_proc_info, node_rank);
  OFF(fsdp_proc_info, num_nodes);
  OFF(fsdp_proc_info, singleton);
  OFF(fsdp_proc_info, device_count);
  OFF(fsdp_proc_info, nspace);
  OFF(fsdp_memory_stats, allocated);
  OFF(fsdp_memory_stats, peak);
  OFF(fsdp_memory_stats, allocs);
  OFF(fsdp_memory_stats, frees);
  OFF(fsdp_memory_stats, reserved);
  OFF(fsdp_memory_stats, peak_reserved);
  OFF(fsdp_memory_stats, cached);
  OFF(fsdp_memory_stats, cache_hits);
  OFF(fsdp_unit_times, gather_begin);
  OFF(fsdp_unit_times, gather_end);
  OFF(fsdp_unit_times, reduce_begin);
  OFF(fsdp_unit_times, reduce_end);
  OFF(fsdp_unit_times, step_begin);
  OFF(fsdp_unit_times, step_end);
  OFF(fsdp_rope_scaling, factor);
  OFF(fsdp_rope_scaling, low_freq_factor);
  OFF(fsdp_rope_scaling, high_freq_factor);
  OFF(fsdp_rope_scaling, original_max_position_embeddings);
  OFF(fsdp_tensor, data);
  OFF(fsdp_tensor, dtype);
  OFF(fsdp_tensor, device);
  OFF(fsdp_tensor, ndim);
  OFF(fsdp_tensor, owns);
  OFF(fsdp_tensor, shape);
  OFF(fsdp_layout_piece, param);
  OFF(fsdp_layout_piece, rank);
  OFF(fsdp_layout_piece, begin);
  OFF(fsdp_layout_piece, end);
  OFF(fsdp_layout_piece, shard_offset);
  OFF(fsdp_init_rule, kind);
  OFF(fsdp_init_rule, pad);
  OFF(fsdp_init_rule, a);
  OFF(fsdp_init_rule, b);
  OFF(fsdp_adamw_config, lr);
  OFF(fsdp_adamw_config, beta1);
  OFF(fsdp_adamw_config, beta2);
  OFF(fsdp_adamw_config, eps);
  OFF(fsdp_adamw_config, weight_decay);
  OFF(fsdp_unit_config, zero);
  OFF(fsdp_unit_config, compute_dtype);
  OFF(fsdp_unit_config, reduce_dtype);
  OFF(fsdp_unit_config, grad_op);
  OFF(fsdp_unit_config, param_align);
  OFF(fsdp_unit_config, shard_align);
  OFF(fsdp_unit_config, hfsdp);
  OFF(fsdp_unit_config, offload);
  OFF(fsdp_unit_config, comm_register);
  OFF(fsdp_unit_memory, params_full);
  OFF(fsdp_unit_memory, params_shard);
  OFF(fsdp_unit_memory, main_params);
  OFF(fsdp_unit_memory, optimizer);
  OFF(fsdp_unit_memory, grads_full);
  OFF(fsdp_unit_memory, grads_main);
  OFF(fsdp_unit_memory, scratch);
  OFF(fsdp_unit_memory, shard_numel);
  OFF(fsdp_unit_memory, total_numel);
  OFF(fsdp_unit_memory, offloaded);
  OFF(fsdp_safetensors_entry, name);
  OFF(fsdp_safetensors_entry, dtype);
  OFF(fsdp_safetensors_entry, ndim);
  OFF(fsdp_safetensors_entry, shape);
  OFF(fsdp_safetensors_entry, begin);
  OFF(fsdp_safetensors_entry, end);
  printf("},\nconstants = {\n");
  CONST(FSDP_OFFLOAD_OPTIMIZER);
  CONST(FSDP_OFFLOAD_PARAMS);
  CONST(FSDP_OFFLOAD_GRADS);
  CONST(FSDP_REG_NONE);
  CONST(FSDP_REG_BUFFER);
  CONST(FSDP_REG_WINDOW);
  CONST(FSDP_ATTN_AUTO);
  CONST(FSDP_ATTN_SIMPLE);
  CONST(FSDP_ATTN_TENSOR_CORES);
  CONST(FSDP_OK);
  CONST(FSDP_EINVAL);
  CONST(FSDP_ENOMEM);
  CONST(FSDP_EIO);
  CONST(FSDP_ECOMM);
  CONST(FSDP_ETIMEOUT);
  CONST(FSDP_EPEER);
  CONST(FSDP_EUNSUPPORTED);
  CONST(FSDP_EDEVICE);
  CONST(FSDP_ESTATE);
  CONST(FSDP_ELAUNCH);
  CONST(FSDP_ECORRUPT);
  CONST(FSDP_FP32);
  CONST(FSDP_BF16);
  CONST(FSDP_FP16);
  CONST(FSDP_FP64);
  CONST(FSDP_INT32);
  CONST(FSDP_VIEW_PARAM);
  CONST(FSDP_VIEW_GRAD);
  CONST(FSDP_STATE_PARAM);
  CONST(FSDP_STATE_OPT1);
  CONST(FSDP_STATE_OPT2);
  CONST(FSDP_CPU);
  CONST(FSDP_CUDA);
  CONST(FSDP_SUM);
  CONST(FSDP_AVG);
  CONST(FSDP_LOG_ERROR);
  CONST(FSDP_LOG_WARN);
  CONST(FSDP_LOG_INFO);
  CONST(FSDP_LOG_DEBUG);
  CONST(FSDP_RNG_UNIFORM);
  CONST(FSDP_RNG_NORMAL);
  CONST(FSDP_INIT_NORMAL);
  CONST(FSDP_INIT_UNIFORM);
  CONST(FSDP_INIT_CONSTANT);
  printf("},\n}\n");
  return 0;
}
