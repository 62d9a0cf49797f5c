#!/usr/bin/env bash
# Installs, builds and runs every test: core unit tests, then the end-to-end tests on real
# programs once per torch, pip's torch 2.13 and Debian's libtorch 1.13, then the sanitizer builds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# The rooms' order and the code's format first: seconds, and they say at once what to fix.
"$root/tests/install_deps.sh" clang-format-14
python3 "$root/tests/check_layers.py" --self-test
"$root/tests/check_format.sh"
# chromium renders the HTML report for its test; python3-jsonschema checks the timeline's schema;
# clang-14 and its runtimes build the sanitizers and libFuzzer.
"$root/tests/build.sh" --debian-torch --training-loops chromium python3-jsonschema clang-14 \
  libclang-rt-14-dev
(cd "$root/build" && ctest --output-on-failure -j "$(nproc)" --timeout 900)
# ASan + UBSan: the unit tests, one end-to-end recording, 20 s of each fuzzer (docs/fuzzing.md).
"$root/tests/sanitize.sh"
# TSan: the unit tests, the diff's reading threads and the interposer's writer thread among them.
"$root/tests/tsan.sh"
