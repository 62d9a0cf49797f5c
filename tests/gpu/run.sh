#!/usr/bin/env bash
# The GPU checks in one command, run from the repository root on a machine with an NVIDIA GPU:
#
#   bash tests/gpu/run.sh [--build-only] [--jobs N] [pytest arguments...]
#
# 1. Picks the Python whose torch has CUDA (DETAUDIT_GPU_PYTHON, else python3, python or
#    <source>/.venv-cuda/bin/python, the first whose torch was built with CUDA). Without a GPU it
#    prints "skipped: no GPU" and exits 0 before building anything (--build-only builds anyway).
# 2. Unpacks the Debian packages that tests/gpu/fetch_debs.sh put in <source>/.deb/ into a prefix
#    of its own (DETAUDIT_GPU_PREFIX, default /tmp/detaudit-prefix; never /): the GPU machine has
#    no package registry. Without .deb/ it builds against the system's packages.
# 3. Builds the CLI (build/gpu/cli) and the interposer for that torch (build/gpu/hooks), whose
#    interposer lands where the CLI looks: build/gpu/cli/lib/detaudit/torch/<version>/.
# 4. Runs `python -m pytest -v tests/gpu` with DETAUDIT_BIN, DETAUDIT_PYTHON, ... set. With
#    --jobs N (N > 1, pytest-xdist importable) the tests marked `timing` run first, alone, and
#    the others then N side by side: a lease's minutes go further.
#
# With $OUT set (the device tool), the log, the build log, a JUnit file, a summary and the
# benchmark's figures go there. Exit status: 0 when everything passed (or no GPU), else non-zero.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${DETAUDIT_GPU_BUILD_DIR:-$root/build/gpu}
prefix=${DETAUDIT_GPU_PREFIX:-/tmp/detaudit-prefix}
results=${OUT:-$build/results}
build_only=0
test_jobs=1
pytest_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --build-only) build_only=1;;
    --jobs) test_jobs=${2:?--jobs needs a number}; shift;;
    *) pytest_args+=("$1");;
  esac
  shift
done
mkdir -p "$results"
log=$results/gpu-run.log
build_log=$results/gpu-build.log
summary=$results/gpu-summary.txt
start=$SECONDS

say() { echo "gpu/run.sh: $*"; }
finish() {  # finish EXIT_CODE "summary line"
  echo "$2" >>"$summary"
  echo "$2"
  say "done in $((SECONDS - start)) s"
  exit "$1"
}

# A Python's torch, as "version cuda-version gpu-count" ("" when it cannot import torch).
torch_probe() {
  "$1" -c 'import sys, torch
print(torch.__version__, torch.version.cuda or "none",
      torch.cuda.device_count() if torch.cuda.is_available() else 0, sys.executable)' \
    2>/dev/null | tail -n 1
}

main() {
  : >"$summary"
  say "source $root, build $build, results $results"
  # 1. The Python, its torch and the GPU.
  local candidates=() py="" probe="" c p
  if [ -n "${DETAUDIT_GPU_PYTHON:-}" ]; then
    candidates=("$DETAUDIT_GPU_PYTHON")
  else
    for c in python3 python "$root/.venv-cuda/bin/python"; do
      command -v "$c" >/dev/null 2>&1 && candidates+=("$c")
    done
  fi
  # The first whose torch has CUDA; else the first that imports torch at all (it says why not).
  for c in "${candidates[@]}"; do
    p=$(torch_probe "$c")
    [ -n "$p" ] || continue
    [ -z "$py" ] && { py=$(echo "$p" | cut -d' ' -f4); probe=$p; }
    if [ "$(echo "$p" | cut -d' ' -f2)" != none ]; then
      py=$(echo "$p" | cut -d' ' -f4); probe=$p
      break
    fi
  done
  local gpus=0 nvsmi=""
  nvsmi=$(nvidia-smi -L 2>/dev/null | head -n 4)
  if [ -z "$py" ]; then
    [ -z "$nvsmi" ] && finish 0 "skipped: no GPU (and no Python here imports torch: ${candidates[*]})"
    finish 1 "FAILED: a GPU is here ($nvsmi) but no Python imports torch (${candidates[*]})"
  fi
  read -r torch_version torch_cuda gpus _ <<<"$probe"
  say "python $py, torch $torch_version (CUDA $torch_cuda), GPUs seen by torch: $gpus"
  [ -n "$nvsmi" ] && say "nvidia-smi: $nvsmi"
  echo "python=$py torch=$torch_version cuda=$torch_cuda gpus=$gpus" >>"$summary"
  if [ "$gpus" = 0 ] && [ $build_only = 0 ]; then
    # A GPU the driver lists but torch cannot use is a broken machine, not a machine without one.
    [ -n "$nvsmi" ] && finish 1 "FAILED: nvidia-smi lists a GPU but torch $torch_version cannot use it"
    finish 0 "skipped: no GPU (torch $torch_version at $py: torch.cuda.is_available() is False)"
  fi
  [ "$torch_cuda" = none ] && say "warning: torch $torch_version has no CUDA; the interposer is built without it"

  # 2. Build tools and libraries: the .deb prefix first, then the system's.
  local jobs cmake_bin ninja_bin dep_args=() cuda_args=()
  jobs=$(nproc 2>/dev/null || echo 4)
  export PATH="$PATH:$(dirname "$py")"  # a pip cmake or ninja beside the Python
  if compgen -G "$root/.deb/*.deb" >/dev/null; then
    setup_prefix || finish 1 "FAILED: unpacking $root/.deb into $prefix"
  else
    say "no $root/.deb/ (tests/gpu/fetch_debs.sh makes it): building against the system's packages"
  fi
  cmake_bin=$(command -v cmake) || finish 1 "FAILED: no cmake on PATH or beside $py"
  ninja_bin=$(command -v ninja) || finish 1 "FAILED: no ninja on PATH, beside $py or in .deb/"
  say "$("$cmake_bin" --version | head -n 1), ninja $("$ninja_bin" --version)"
  # CUDA's toolkit: hooks/CMakeLists.txt finds /usr/local/cuda itself; elsewhere, the toolkit
  # around the nvcc on PATH (which may be a wrapper script: its root must hold the headers).
  local nvcc cuda_root
  if [ ! -x /usr/local/cuda/bin/nvcc ] && nvcc=$(command -v nvcc); then
    cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
    if [ -f "$cuda_root/include/cuda_runtime.h" ]; then
      cuda_args=("-DCMAKE_CUDA_COMPILER=$cuda_root/bin/nvcc" "-DCUDA_TOOLKIT_ROOT_DIR=$cuda_root"
                 "-DCUDAToolkit_ROOT=$cuda_root")
    fi
  fi
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [ -x "$nvcc" ] && say "nvcc $nvcc: $("$nvcc" --version | tail -n 2 | head -n 1) ${cuda_args[*]}"

  # 3. Build. The output goes to the build log; its tail is shown on failure.
  : >"$build_log"
  local t0=$SECONDS
  say "building the CLI into $build/cli"
  run_logged "$cmake_bin" -S "$root" -B "$build/cli" -G Ninja "-DCMAKE_MAKE_PROGRAM=$ninja_bin" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDETAUDIT_BUILD_HOOKS=OFF -DDETAUDIT_BUILD_TESTS=OFF \
      -DCMAKE_INSTALL_LIBDIR=lib "${dep_args[@]}" &&
    run_logged "$cmake_bin" --build "$build/cli" -j "$jobs" ||
    build_failed "the CLI"
  say "building the interposer for torch $torch_version into $build/hooks"
  run_logged "$cmake_bin" -S "$root/hooks" -B "$build/hooks" -G Ninja \
      "-DCMAKE_MAKE_PROGRAM=$ninja_bin" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "-DDETAUDIT_TORCH=$py" "-DDETAUDIT_INTERPOSER_DIR=$build/cli/lib/detaudit" \
      "${dep_args[@]}" "${cuda_args[@]}" &&
    run_logged "$cmake_bin" --build "$build/hooks" -j "$jobs" ||
    build_failed "the interposer"
  local lib="$build/cli/lib/detaudit/torch/$torch_version/libdetaudit_hooks.so"
  [ -f "$lib" ] || finish 1 "FAILED: the build made no $lib"
  if [ "$torch_cuda" != none ] && command -v readelf >/dev/null &&
     ! readelf -d "$lib" | grep -q 'NEEDED.*libtorch_cuda'; then
    finish 1 "FAILED: $lib does not link libtorch_cuda"
  fi
  say "built in $((SECONDS - t0)) s: $build/cli/bin/detaudit and $lib"
  local check="$build/hooks/bin/detaudit_device_digest_check"
  [ -x "$check" ] && say "device digest check: $check" || say "no $check (its test will skip)"
  echo "built: $build/cli/bin/detaudit $lib" >>"$summary"
  [ $build_only = 1 ] && finish 0 "build-only: built, tests not run"

  # 4. The tests.
  if ! "$py" -m pytest --version >/dev/null 2>&1; then
    compgen -G "$root/.whl/*.whl" >/dev/null ||
      finish 1 "FAILED: $py has no pytest and there is no .whl/ (tests/gpu/fetch_debs.sh --pytest)"
    "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/detaudit-site \
      "$root"/.whl/*.whl || finish 1 "FAILED: installing pytest from .whl/"
    export PYTHONPATH=/tmp/detaudit-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export DETAUDIT_SOURCE_DIR="$root" DETAUDIT_BUILD_DIR="$build/cli"
  export DETAUDIT_BIN="$build/cli/bin/detaudit" DETAUDIT_PYTHON="$py"
  export DETAUDIT_TORCH_BIN="$build/hooks/bin" DETAUDIT_GPU_RESULTS="$results"
  export PYTHONUNBUFFERED=1
  t0=$SECONDS
  local rc=0 junits=()
  if [ "$test_jobs" -gt 1 ] && "$py" -c 'import xdist' 2>/dev/null; then
    run_pytest "$results/gpu-junit-timing.xml" -m timing || rc=$?
    junits+=("$results/gpu-junit-timing.xml")
    run_pytest "$results/gpu-junit.xml" -m "not timing" -n "$test_jobs" || rc=$?
  else
    [ "$test_jobs" -gt 1 ] && say "no pytest-xdist for $py: the tests run one by one"
    run_pytest "$results/gpu-junit.xml" || rc=$?
  fi
  junits+=("$results/gpu-junit.xml")
  say "pytest exit $rc in $((SECONDS - t0)) s"
  local counts
  counts=$("$py" - "${junits[@]}" <<'PY' 2>/dev/null
import sys, xml.etree.ElementTree as ET
keys = ("tests", "failures", "errors", "skipped")
total, skips = dict.fromkeys(keys, 0), []
for path in sys.argv[1:]:
    s = ET.parse(path).getroot()
    s = s if s.tag == "testsuite" else s[0]
    for k in keys:
        total[k] += int(s.get(k) or 0)
    for case in s.iter("testcase"):  # with a GPU, a skip is worth reading
        for sk in case.findall("skipped"):
            skips.append(f"  skipped {case.get('name')}: {sk.get('message')}")
print(" ".join(f"{k}={v}" for k, v in total.items()))
print("\n".join(skips))
PY
)
  [ $rc = 0 ] && finish 0 "passed: pytest tests/gpu ($counts)"
  finish "$rc" "FAILED: pytest tests/gpu exit $rc ($counts)"
}

run_pytest() {  # run_pytest JUNIT_FILE [pytest arguments...]
  local junit=$1; shift
  say "pytest tests/gpu $* ${pytest_args[*]}"
  (cd "$root" && "$py" -m pytest -v -rs -p no:cacheprovider --junitxml "$junit" tests/gpu \
     "$@" "${pytest_args[@]}")
  local rc=$?
  [ $rc = 5 ] && rc=0  # no test selected in this part
  return $rc
}

run_logged() {
  echo "+ $*" >>"$build_log"
  "$@" >>"$build_log" 2>&1
}

build_failed() {
  tail -n 40 "$build_log"
  finish 1 "FAILED: building $1 (log: $build_log)"
}

# Unpacks every .deb into $prefix and sets dep_args, CPATH, PATH, ... to use it. Debian's
# packages install under /usr with multiarch library directories; CMake's package configs are
# relocatable, pkg-config files name /usr and are rewritten, the rest is named explicitly.
setup_prefix() {
  case $prefix in /|/usr|/usr/*) say "refusing to unpack into $prefix"; return 1;; esac
  # Emptied before unpacking, so a package dropped from .deb/ leaves nothing behind; only a
  # folder this script made (its marker file) is ever removed.
  if [ -e "$prefix" ] && [ ! -e "$prefix/.detaudit-prefix" ] && [ -n "$(ls -A "$prefix")" ]; then
    say "refusing to empty $prefix: not made by this script"; return 1
  fi
  rm -rf "$prefix" && mkdir -p "$prefix" && touch "$prefix/.detaudit-prefix" || return 1
  local f n=0
  for f in "$root"/.deb/*.deb; do
    dpkg-deb -x "$f" "$prefix" 2>/dev/null || dpkg -x "$f" "$prefix" || unpack_deb "$f" || return 1
    n=$((n + 1))
  done
  local usr=$prefix/usr arch libdir
  arch=$(ls "$usr/lib" | grep -m1 -- '-linux-gnu$') || arch=""
  libdir=$usr/lib${arch:+/$arch}
  # .pc files say prefix=/usr: point them at the prefix, in place.
  local pc
  for pc in "$libdir"/pkgconfig/*.pc "$usr"/share/pkgconfig/*.pc; do
    [ -f "$pc" ] && sed -i -E "s#^(prefix|libdir|includedir)=/usr#\1=$usr#" "$pc"
  done
  export PKG_CONFIG_PATH="$libdir/pkgconfig:$usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  # OpenSSL's opensslconf.h is in the multiarch include directory, which only the system's
  # default search path names.
  export CPATH="$usr/include${arch:+:$usr/include/$arch}${CPATH:+:$CPATH}"
  # Tools the image may lack, after its own. pkgconf needs its libpkgconf: a wrapper names it,
  # so that no LD_LIBRARY_PATH reaches the programs the tests record. It moves out of usr/bin,
  # where CMake would find it before the image's own pkg-config.
  export PATH="$PATH:$usr/bin"
  if [ -x "$usr/bin/pkgconf" ]; then
    mkdir -p "$prefix/tools" && mv "$usr/bin/pkgconf" "$prefix/tools/pkgconf.bin" &&
      printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$libdir" "$prefix/tools/pkgconf.bin" \
        >"$prefix/tools/pkg-config" && chmod +x "$prefix/tools/pkg-config" || return 1
  fi
  # Named either way: a cache from an earlier run must not keep another one.
  local pkg_config
  pkg_config=$(command -v pkg-config || echo "$prefix/tools/pkg-config")
  dep_args+=("-DPKG_CONFIG_EXECUTABLE=$pkg_config")
  # The interposer is preloaded into programs that know nothing of the prefix: its libxxhash
  # and libcrypto are found through its RUNPATH, which CMake leaves out for a directory the
  # compiler reports as implicit.
  dep_args+=("-DCMAKE_PREFIX_PATH=$usr" "-DOPENSSL_ROOT_DIR=$usr" "-DCMAKE_BUILD_RPATH=$libdir")
  [ -f "$usr/include/openssl/ssl.h" ] && dep_args+=("-DOPENSSL_INCLUDE_DIR=$usr/include")
  [ -f "$libdir/libcrypto.so" ] && dep_args+=("-DOPENSSL_CRYPTO_LIBRARY=$libdir/libcrypto.so")
  [ -f "$libdir/libssl.so" ] && dep_args+=("-DOPENSSL_SSL_LIBRARY=$libdir/libssl.so")
  # Each package config by its directory: CMake searches lib/<arch>/cmake only where it
  # detected a multiarch system.
  local cfg name
  while IFS= read -r cfg; do
    name=$(basename "$cfg"); name=${name%Config.cmake}; name=${name%-config.cmake}
    dep_args+=("-D${name}_DIR=$(dirname "$cfg")")
  done < <(find "$usr" -path '*/cmake/*' \( -name '*Config.cmake' -o -name '*-config.cmake' \))
  say "unpacked $n packages into $prefix: ${dep_args[*]}"
}

# dpkg-deb's job by hand (ar + tar), for an image without dpkg.
unpack_deb() {
  local tmp member
  tmp=$(mktemp -d) || return 1
  (cd "$tmp" && ar x "$1") || { rm -rf "$tmp"; return 1; }
  member=$(ls "$tmp"/data.tar.* 2>/dev/null | head -n 1)
  [ -n "$member" ] && tar -xf "$member" -C "$prefix"
  local rc=$?
  rm -rf "$tmp"
  return $rc
}

main 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
