#!/usr/bin/env bash
# The 1B (or with --offload the 4.4B) model, this engine against PyTorch
# FSDP2 alone: bench/llama_vs_peer.sh with the peer fsdp2, which says the
# rest (the other peers: bench/llama_vs_peer.sh megatron_fsdp deepspeed).
#   bench/llama_vs_fsdp2.sh [BUILD_DIR] [STEPS] [--offload]
exec bash "$(dirname "$0")/llama_vs_peer.sh" "$@" fsdp2
