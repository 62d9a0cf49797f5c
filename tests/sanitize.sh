#!/usr/bin/env bash
# The AddressSanitizer + UndefinedBehaviorSanitizer build and what runs on it (docs/fuzzing.md),
# in ./build-san with clang: the unit tests, one end-to-end recording that the sanitized CLI
# runs, diffs and reads, and each libFuzzer harness for a bounded time. Any finding fails it.
#   tests/sanitize.sh [--fuzz-seconds N] [--optimize] [--interposer]
# --fuzz-seconds: per harness (default 20; 0: no fuzzing). -O0 by default: it builds in a third
# of -O1's time, and the fuzzers run half as fast; --optimize builds with -O1, for long fuzzing.
# The end-to-end part needs ./build (tests/build.sh): its interposer records the program.
# --interposer also builds the interposer and train_cnn with ASan and UBSan (gcc,
# ./build-san-hooks, about 5 CPU minutes) and records with them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz_seconds=20
opt=-O0
interposer=0
while (($#)); do
  case $1 in
    --fuzz-seconds) fuzz_seconds=$2; shift 2;;
    --optimize) opt=-O1; shift;;
    --interposer) interposer=1; shift;;
    -h|--help) sed -n '2,10p' "$0"; exit 0;;
    *) echo "usage: tests/sanitize.sh [--fuzz-seconds N] [--optimize] [--interposer]" >&2; exit 2;;
  esac
done
"$root/tests/install_deps.sh" clang-14 libclang-rt-14-dev
build="$root/build-san"
jobs=$(nproc)

# A finding exits 86, apart from every exit code detaudit documents; leaks count too.
export ASAN_OPTIONS=detect_leaks=1:exitcode=86:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=86

start=$SECONDS
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
      -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=$opt -gline-tables-only" \
      -DDETAUDIT_BUILD_HOOKS=OFF -DDETAUDIT_BUILD_BENCH=OFF -DDETAUDIT_SANITIZE=address,undefined \
      -DDETAUDIT_FUZZ=ON >/dev/null
cmake --build "$build" -j "$jobs"
echo "sanitize: built in $((SECONDS - start)) s"

(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 300)

# End to end: the sanitized CLI runs train_cnn twice (--race: an index_put race on 2 threads)
# under the interposer of ./build, which records in the child, not instrumented. Then the
# diff in every format, show, export and the timelines, all by the sanitized CLI.
venv_python="$root/.venv/bin/python"
hooks=""
for t in "$root"/build/lib/detaudit/torch/*/torch.txt; do
  if [ -f "$t" ] && grep -qx "python=$venv_python" "$t"; then
    hooks="$(dirname "$t")/libdetaudit_hooks.so"
  fi
done
slug=$(printf '%s' "$venv_python" | sed 's/[^A-Za-z0-9_]/_/g; s/^_*//')
train_cnn="$root/build/torch/$slug/bin/train_cnn"
if [ -z "$hooks" ] || [ ! -f "$hooks" ] || [ ! -x "$train_cnn" ]; then
  echo "sanitize: no end-to-end recording: ./build has no interposer and train_cnn for" \
       "$venv_python (tests/build.sh builds them)" >&2
  exit 1
fi
e2e=$(mktemp -d)
trap 'rm -rf "$e2e"' EXIT
cli="$build/bin/detaudit"
# Runs the sanitized CLI; its exit code must be one of the expected ones (a finding is 86).
check() {
  local want=$1; shift
  local rc=0
  "$cli" "$@" >"$e2e/out.txt" 2>"$e2e/err.txt" || rc=$?
  if ! [[ " $want " == *" $rc "* ]] || grep -qE 'Sanitizer|runtime error' "$e2e/err.txt"; then
    echo "sanitize: detaudit $* exited $rc (expected $want)" >&2
    cat "$e2e/err.txt" >&2
    exit 1
  fi
}
audit="$e2e/audit"
# 1: divergent when the race fires, 0 when it did not this time.
DETAUDIT_HOOKS="$hooks" check "0 1" run --runs 2 --out "$audit" --format html \
  --output "$e2e/run.html" -- "$train_cnn" --steps 2 --race --threads 2
for format in text json junit markdown html; do
  check "0 1" diff "$audit/run-0" "$audit/run-1" --format "$format" --output "$e2e/diff.$format"
done
check "0 1" diff "$audit/run-0" "$audit/run-1" --fail-on tolerance --atol 1e-3 \
  --perfetto "$e2e/diff.perfetto.json"
check 0 show "$audit/run-0"
check 0 show "$audit/run-0" --step 1 --json
check 0 export "$audit/run-0" --output "$e2e/run-0.jsonl"
check 0 export "$audit/run-0" --perfetto "$e2e/run-0.perfetto.json"
check 0 catalog index_put --json
echo "sanitize: end to end: run --runs 2 of train_cnn, diff in 5 formats, show, export," \
     "timelines: no finding"

if ((interposer)); then
  # The interposer and the program both link gcc's libasan, the program first; LD_PRELOAD puts
  # the interposer ahead of it, which is harmless here, hence verify_asan_link_order=0.
  hooks_build="$root/build-san-hooks"
  cmake -S "$root/hooks" -B "$hooks_build" -G Ninja "-DDETAUDIT_TORCH=$venv_python" \
        "-DDETAUDIT_INTERPOSER_DIR=$hooks_build/lib/detaudit" \
        -DDETAUDIT_SANITIZE=address,undefined >/dev/null
  cmake --build "$hooks_build" -j "$jobs" --target detaudit_hooks train_cnn
  san_hooks=$(ls "$hooks_build"/lib/detaudit/torch/*/libdetaudit_hooks.so)
  ASAN_OPTIONS=$ASAN_OPTIONS:verify_asan_link_order=0 DETAUDIT_HOOKS="$san_hooks" \
    check "0 1" run --runs 2 --out "$e2e/audit-san-hooks" -- "$hooks_build/bin/train_cnn" \
    --steps 2 --race --threads 2
  for run in run-0 run-1; do
    if grep -qE 'Sanitizer|runtime error' "$e2e/audit-san-hooks/$run/output.log" ||
       ! grep -q attached "$e2e/audit-san-hooks/$run/streams/r0.main.status"; then
      echo "sanitize: the sanitized interposer in $run:" >&2
      cat "$e2e/audit-san-hooks/$run/output.log" "$e2e/audit-san-hooks/$run"/streams/*.status >&2
      exit 1
    fi
  done
  echo "sanitize: the interposer and train_cnn under ASan and UBSan recorded 2 runs: no finding"
fi

if ((fuzz_seconds > 0)); then
  # The recording just made joins the trace seeds: a real trace, in this build's format.
  mkdir -p "$build/fuzz/trace_seeds"
  for t in "$audit"/run-0/streams/*.dtr; do
    cp "$t" "$build/fuzz/trace_seeds/recorded-$(basename "$t")"
  done
  "$root/tests/fuzz/run.sh" --build "$build" --seconds "$fuzz_seconds"
fi
echo "sanitize: done in $((SECONDS - start)) s"
