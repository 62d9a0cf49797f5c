#!/usr/bin/env bash
# Installs what is missing (Debian packages, and pip's torch 2.13 in .venv), builds and installs
# detaudit into .venv with pip (tests/build.sh --no-tests), and audits a built-in example: a
# Python training script whose backward pass races on float atomics (index_put_ with
# accumulate=True on 2 threads). Prints the verdict.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tests/build.sh" --no-tests
out=${1:-"$root/audit"}
set +e
"$root/.venv/bin/detaudit" run --runs 2 --out "$out" --force -- \
  "$root/.venv/bin/python" "$root/examples/nondet_index_put.py"
code=$?
set -e
# 0 identical, 1 divergent: both are answers. Anything else is a failure.
case $code in
  0) echo "quickstart: the two runs were identical this time (the race does not always fire)";;
  1) echo "quickstart: the two runs diverged; the report above says where and why";;
  *) exit "$code";;
esac
echo "quickstart: runs are in $out (try: .venv/bin/detaudit show $out/run-0)"
