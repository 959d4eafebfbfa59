// attention_docs.cu: attention.cuh's packed-row kernels (DOCS_ROWS: query
// i sees keys doc_start[i] .. i), compiled here alone so that nvcc builds
// each kind of rows in parallel (attention_launch.cuh); attention.cu calls
// them.
#include "attention_launch.cuh"

FSDP_ATTN_INSTANCES(, DOCS_ROWS)
