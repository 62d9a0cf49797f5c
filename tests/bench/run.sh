#!/usr/bin/env bash
# The benchmark, one command: builds, then times every mode side by side (docs/performance.md).
#   tests/bench/run.sh [--quick] [--repeats N] [--only cnn,lstm,embed] [--no-diff]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
"$root/tests/build.sh"
exec /usr/bin/python3 "$root/tests/bench/bench.py" --build "$root/build" "$@"
