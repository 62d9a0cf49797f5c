#!/usr/bin/env bash
# Builds the interposer, the device digest's kernels (hooks/device/) and the GPU check against
# pip's CUDA torch 2.14.1: compile and link only (there is no GPU here), so that what is built
# for CUDA cannot rot on machines without one. The reference's unit test, compiled by nvcc, runs
# on the CPU: nvcc's host pass must give the bits g++ gives. The wheels (about
# 5.5 GB) install from the local disk into <source>/.venv-cuda; nvcc is /usr/local/cuda's. The
# interposer lands beside the others, in build/lib/detaudit/torch/2.14.1+cu130/.
# --venv-only makes the environment and stops: CI does that while the other tests run, since
# unpacking the wheels waits on the disk, not the cores.
#   tests/cuda_build.sh [--venv-only]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv_only=0
[ "${1:-}" = --venv-only ] && venv_only=1
((venv_only)) || "$root/tests/install_deps.sh"
[ -x /usr/local/cuda/bin/nvcc ] || { echo "cuda_build: no nvcc in /usr/local/cuda" >&2; exit 1; }
venv="$root/.venv-cuda"
if ! "$venv/bin/python" -c 'import torch; assert torch.__version__.startswith("2.14.1")
assert torch.version.cuda' 2>/dev/null; then
  echo "cuda_build: creating $venv with torch 2.14.1 (CUDA)" >&2
  python3 -m venv "$venv" 2>/dev/null || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check torch==2.14.1
fi
((venv_only)) && exit 0
build="$root/build/torch/cuda"
# The recording core ./build already has (tests/build.sh), when it has one.
recording="$root/build/src/libdetaudit_recording.a"
[ -f "$recording" ] || recording=""
cmake -S "$root/hooks" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "-DDETAUDIT_TORCH=$venv/bin/python" "-DDETAUDIT_INTERPOSER_DIR=$root/build/lib/detaudit" \
      "-DDETAUDIT_RECORDING_LIBRARY=$recording" >/dev/null
cmake --build "$build" --target detaudit_hooks detaudit_device detaudit_device_digest_check \
      detaudit_device_digest_test_nvcc -j "$(nproc)"
"$build/bin/detaudit_device_digest_test_nvcc" --gtest_brief=1
version=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
lib="$root/build/lib/detaudit/torch/$version/libdetaudit_hooks.so"
# Linked for real against the CUDA libtorch, not a CPU one found elsewhere.
readelf -d "$lib" | grep -q 'NEEDED.*libtorch_cuda' ||
  { echo "cuda_build: $lib does not link libtorch_cuda" >&2; exit 1; }
echo "cuda_build: built $lib against torch $version (CUDA $("$venv/bin/python" -c 'import torch; print(torch.version.cuda)'))"
