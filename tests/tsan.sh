#!/usr/bin/env bash
# The ThreadSanitizer build of the torch-free code and its unit tests, in ./build-tsan with
# clang: the diff's two reading threads, and the interposer's writer thread with op threads
# handing it records and a stop signal freezing them (tests/unit/stream_writer_test.cpp). The
# interposer itself is not built: inside an uninstrumented libtorch TSan cannot see torch's own
# threads and atomics (docs/fuzzing.md). Any report fails it.
#   tests/tsan.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tests/install_deps.sh" clang-14 libclang-rt-14-dev
build="$root/build-tsan"
jobs=$(nproc)
# A report exits 86, apart from every exit code detaudit documents.
export TSAN_OPTIONS=halt_on_error=1:exitcode=86:second_deadlock_stack=1

start=$SECONDS
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
      -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" \
      -DDETAUDIT_BUILD_HOOKS=OFF -DDETAUDIT_SANITIZE=thread >/dev/null
cmake --build "$build" -j "$jobs" --target detaudit_unit_tests
echo "tsan: built in $((SECONDS - start)) s"
# TSan's runtime needs the address layout it knows; kernels with more ASLR bits break it.
run=("$build/bin/detaudit_unit_tests")
if ! "${run[@]}" --gtest_filter=StreamWriterTest.EveryThreadsRecordsReachItsFileInOrder \
     >/dev/null 2>&1; then
  run=(setarch "$(uname -m)" -R "${run[@]}")
fi
"${run[@]}" --gtest_brief=1
echo "tsan: no report ($((SECONDS - start)) s)"
