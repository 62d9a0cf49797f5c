#!/usr/bin/env bash
# Installs, builds and runs every test: core unit tests, then the end-to-end tests on real
# programs once per torch, pip's torch 2.13 and Debian's libtorch 1.13, then the sanitizer builds.
# Each stage is timed against its budget (tests/stages.sh; docs/testing.md, "Stages and budgets").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# The table of stages at the end, unless a caller (.ci/run) prints its own.
[ -n "${_stages_file:-}" ] || trap 'stages_report' EXIT
source "$root/tests/stages.sh"
# The rooms' order and the code's format first: seconds, and they say at once what to fix.
"$root/tests/install_deps.sh" clang-format-14
python3 "$root/tests/check_layers.py" --self-test
python3 "$root/tests/check_function_length.py" --self-test
python3 "$root/tests/bench/figures_test.py"  # the bench's regression row
"$root/tests/check_format.sh"
# chromium renders the HTML report for its test; python3-jsonschema checks the timeline's schema;
# clang-14 and its runtimes build the sanitizers and libFuzzer. The benchmark's programs are not
# built: no test runs them (tests/bench/run.sh builds them).
stage "install and build" 960 "$root/tests/build.sh" --debian-torch --training-loops --no-bench \
  chromium python3-jsonschema clang-14 libclang-rt-14-dev
ctest_log="$root/build/ctest.log"
STAGE_LONGEST_FROM=$ctest_log stage ctest 3300 \
  bash -c 'set -o pipefail; cd "$1/build" && ctest --output-on-failure -j "$(nproc)" -LE nightly \
           --timeout 900 | tee "$2"' \
  _ "$root" "$ctest_log"
# ASan + UBSan: the unit tests, one end-to-end recording, 20 s of each fuzzer (docs/fuzzing.md).
stage "asan and ubsan" 360 "$root/tests/sanitize.sh"
# TSan: the unit tests, the diff's reading threads and the interposer's writer thread among them.
stage tsan 240 "$root/tests/tsan.sh"
