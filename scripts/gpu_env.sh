# gpu_env.sh BUILD_DIR (sourced): the environment for running a build made
# elsewhere on a GPU machine: the engine's libraries, those in .devlibs/,
# and NCCL / cuBLASLt / cuDNN from wherever the machine has them.
build=${1:-build}
# a library's folder: the system's loader cache, else anywhere on the disk
# (the GPU machines have NCCL and cuBLASLt in Python's nvidia-* packages)
lib_dir() {
  local d
  d=$(dirname "$(ldconfig -p | awk -v l="$1" '$1 == l {print $NF; exit}')" 2>/dev/null)
  if [ -z "$d" ] || [ "$d" = . ]; then
    d=$(dirname "$(find / -name "$1" -not -path '/proc/*' 2>/dev/null | head -1)")
  fi
  [ "$d" = . ] || echo "$d" # nothing when the library is nowhere
}
nccl_dir=$(lib_dir libnccl.so.2)
cublas_dir=$(lib_dir libcublasLt.so.13)
# cuDNN is opened at run time (kernels/attention_cudnn.cpp): without it the
# attention runs on our own kernels, and the run's first lines say so.
# Python's nvidia-cudnn package comes first where it is there: torch refuses
# to start beside an older cuDNN found earlier on LD_LIBRARY_PATH
# (bench/attention_vs_torch.py loads both).
cudnn_dir=$(python3 -c 'import nvidia.cudnn as c; print(list(c.__path__)[0] + "/lib")' 2>/dev/null)
[ -n "$cudnn_dir" ] && [ -e "$cudnn_dir/libcudnn.so.9" ] || cudnn_dir=$(lib_dir libcudnn.so.9)
export LD_LIBRARY_PATH="$PWD/$build:$PWD/.devlibs:${cudnn_dir:+$cudnn_dir:}$nccl_dir:$cublas_dir:${LD_LIBRARY_PATH:-}"
# the GPU machine may have another PMIx whose plugins do not load into ours
export PMIX_MCA_mca_base_component_show_load_errors=0
export FSDP_LIB="$PWD/$build/libfsdp.so" FSDP_HEADER="$PWD/src/fsdp.h" FSDP_LUA_PATH="$PWD/lua"
