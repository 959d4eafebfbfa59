// attention_causal.cu: attention.cuh's causal kernels (CAUSAL), compiled
// here alone so that nvcc builds each kind of rows in parallel
// (attention_launch.cuh); attention.cu calls them.
#include "attention_launch.cuh"

FSDP_ATTN_INSTANCES(, CAUSAL)
