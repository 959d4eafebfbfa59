// attention_pos_backward.cu: the backward kernels of queries at given
// positions (attention.cuh's POS_DOCS_ROWS instances, both the _pos and
// the _pos_docs calls'), compiled apart from their forward and entry
// points in attention_pos.cu so that nvcc builds the two side by side.
#include "attention_launch.cuh"

FSDP_ATTN_BACKWARD_INSTANCES(, POS_DOCS_ROWS)
