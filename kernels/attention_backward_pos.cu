// attention_backward_pos.cu: the backward kernels of queries at given
// positions (attention.cuh's POS_DOCS_ROWS instances, both the _pos and
// the _pos_docs calls'), compiled apart from their forward and entry
// points in attention_pos.cu so that nvcc builds the two side by side.
// (Named to sort before the other attention files: the build starts the
// sources in the order CMake lists them, and the longest should go first.)
#include "attention_launch.cuh"

FSDP_ATTN_BACKWARD_INSTANCES(, POS_DOCS_ROWS)
