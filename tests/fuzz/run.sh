#!/usr/bin/env bash
# Runs each libFuzzer harness for a bounded time over its committed corpus (docs/fuzzing.md) and
# prints how many inputs it executed. A crash, hang (-timeout), leak, ASan or UBSan finding
# fails the run and leaves the input in <build>/fuzz/artifacts/. New inputs the fuzzer keeps go
# to <build>/fuzz/corpus/, never into the committed corpus.
#   tests/fuzz/run.sh [--seconds N] [--build DIR] [harness...]   (default: 30 s each, build-san)
# The build is tests/sanitize.sh's: clang, -DDETAUDIT_SANITIZE=address,undefined -DDETAUDIT_FUZZ=ON.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build-san"
seconds=30
harnesses=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2;;
    --build) build=$(cd "$2" && pwd); shift 2;;
    -h|--help) sed -n '2,8p' "$0"; exit 0;;
    *) harnesses+=("$1"); shift;;
  esac
done
((${#harnesses[@]})) || harnesses=(fuzz_trace_reader fuzz_config fuzz_catalog)

work="$build/fuzz"
mkdir -p "$work/artifacts"
# The harnesses write each input to a file: in memory, that is 20 times faster than on a disk.
scratch=$(mktemp -d /dev/shm/detaudit-fuzz.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# Trace seeds in the format this build writes, beside the committed ones (older formats, if the
# format moved on, are rejected at the header and add nothing).
mkdir -p "$work/trace_seeds"
"$build/bin/fuzz_make_corpus" "$work/trace_seeds" >/dev/null

# One harness per core at a time: each keeps a whole core for its time, as alone, and the set
# takes the time of ceil(harnesses / cores) of them.
fuzz_one() {
  local h=$1 dict=() corpora
  mkdir -p "$work/corpus/$h"
  corpora=("$work/corpus/$h" "$root/tests/fuzz/corpus/$h")
  [ "$h" = fuzz_trace_reader ] && corpora+=("$work/trace_seeds")
  case $h in
    fuzz_config) dict=(-dict="$root/tests/fuzz/config.dict");;
    fuzz_catalog) dict=(-dict="$root/tests/fuzz/catalog.dict");;
  esac
  local rc=0
  TMPDIR="$scratch" "$build/bin/$h" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/$h-" "${dict[@]}" "${corpora[@]}" \
    >"$work/$h.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$h.rc"
}
cores=$(nproc)
for h in "${harnesses[@]}"; do
  rm -f "$work/$h.rc"
  while (($(jobs -rp | wc -l) >= cores)); do sleep 0.2; done
  fuzz_one "$h" &
done
wait
failed=0
for h in "${harnesses[@]}"; do
  log="$work/$h.log"
  if [ "$(cat "$work/$h.rc" 2>/dev/null)" = 0 ]; then
    execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    echo "fuzz: $h: ${execs:-?} executions in ${seconds} s, ${cov:-?} coverage points, no finding"
  else
    failed=1
    echo "fuzz: $h: FAILED (log: $log, input in $work/artifacts/)" >&2
    grep -E -A30 '^==[0-9]+==ERROR|runtime error|^SUMMARY|Test unit written|deadly signal|ALARM' \
      "$log" | head -60 >&2
  fi
done
exit $failed
