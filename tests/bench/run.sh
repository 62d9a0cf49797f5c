#!/usr/bin/env bash
# The benchmark, one command: builds, then times every mode side by side (docs/performance.md).
#   tests/bench/run.sh [--quick] [--repeats N] [--only cnn,lstm,embed] [--no-diff] [--instructions]
#                      [--modes NAMES] [--python PATH --hooks PATH]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# --instructions counts instructions under callgrind: valgrind, which the tests do not need.
for a in "$@"; do [ "$a" = --instructions ] && "$root/tests/install_deps.sh" valgrind; done
"$root/tests/build.sh"
# The Python workloads run on .venv's torch (pip's 2.13), the C++ ones against the same torch.
exec "$root/.venv/bin/python" "$root/tests/bench/bench.py" --build "$root/build" "$@"
