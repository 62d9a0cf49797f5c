#!/usr/bin/env bash
# Audits three unchanged programs from a checkout of the public pytorch/examples repository and
# checks detaudit's verdicts:
#   word_language_model/main.py  seeds itself            -> IDENTICAL
#   regression/main.py           unseeded                -> DIVERGENT, rng-state at aten::randn > aten::normal_
#   cpp/regression               unseeded (C++, libtorch) -> DIVERGENT, rng-state at aten::randn > aten::normal_
# Each program runs a few seconds (tiny generated corpus, one epoch). Not part of the default
# test suite: it needs the checkout, which CI cannot fetch.
#
# Usage:
#   (check out pytorch/examples into /tmp/pytorch-examples)
#   DETAUDIT_PYTHON=/venv/bin/python tests/clients/audit_pytorch_examples.sh /tmp/pytorch-examples
# Environment:
#   DETAUDIT_PYTHON  a Python with torch 2.x (word_language_model uses torch.serialization.safe_globals);
#                    cpp/regression is built against its torch with cmake (default: python3)
#   DETAUDIT_BIN     the detaudit executable, built for that torch (default: build/bin/detaudit)
#   DETAUDIT_WORK    where the corpus, the C++ build and the runs go (default: a new temp dir, kept)
# Exit status: 0 if every verdict is the expected one, 1 otherwise, 2 on usage errors.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
examples=${1:?usage: $0 PATH_TO_PYTORCH_EXAMPLES_CHECKOUT}
examples=$(cd "$examples" && pwd) || exit 2
python=${DETAUDIT_PYTHON:-python3}
detaudit=${DETAUDIT_BIN:-$root/build/bin/detaudit}
work=${DETAUDIT_WORK:-$(mktemp -d /tmp/detaudit-examples.XXXXXX)}
mkdir -p "$work"
[[ -x $detaudit ]] || { echo "no detaudit at $detaudit (set DETAUDIT_BIN)" >&2; exit 2; }
echo "detaudit: $detaudit; python: $python; work dir: $work"

# A small seeded corpus for word_language_model: 200/50/50 lines over a 200-word vocabulary.
"$python" - "$work/corpus" <<'EOF' || exit 2
import os, random, sys
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
rng = random.Random(0); vocab = ["w%d" % i for i in range(200)]
for name, lines in (("train", 200), ("valid", 50), ("test", 50)):
    with open(os.path.join(out, name + ".txt"), "w") as f:
        for _ in range(lines):
            f.write(" ".join(rng.choice(vocab) for _ in range(rng.randint(5, 15))) + "\n")
EOF

# cpp/regression against the Python's torch. Both prefixes are needed: with only share/cmake,
# find_library may pick a system /usr/lib/libtorch.so of another version.
torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))') || exit 2
cmake -S "$examples/cpp/regression" -B "$work/cpp-regression" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$torch_dir;$torch_dir/share/cmake" >"$work/cpp-regression.log" 2>&1 &&
  cmake --build "$work/cpp-regression" >>"$work/cpp-regression.log" 2>&1 ||
  { echo "building cpp/regression failed, see $work/cpp-regression.log" >&2; exit 2; }

failed=0
# audit NAME EXPECTED_EXIT EXPECTED_CLASS EXPECTED_CHAIN -- PROGRAM ARGS...
# EXPECTED_CLASS and EXPECTED_CHAIN ("a > b", the first divergent op) are "-" for IDENTICAL.
audit() {
  local name=$1 want_rc=$2 want_class=$3 want_chain=$4; shift 5
  local out=$work/$name start=$SECONDS rc
  "$detaudit" run --runs 2 --out "$out" --force -q -- "$@" >"$out.txt" 2>&1
  rc=$?
  head -n 1 "$out.txt"
  if ((rc > 1)); then
    echo "  FAIL $name: detaudit exited $rc, see $out.txt"; failed=1; return
  fi
  "$detaudit" diff "$out/run-0" "$out/run-1" --format json --output "$out.json" >/dev/null
  "$python" - "$out.json" "$rc" "$want_rc" "$want_class" "$want_chain" "$name" \
             "$((SECONDS - start))" <<'EOF' || failed=1
import json, sys
path, rc, want_rc, want_class, want_chain, name, secs = sys.argv[1:]
first = json.load(open(path)).get("first_divergence") or {}
got_class, got_chain = first.get("class", "-"), " > ".join(first.get("chain", [])) or "-"
ok = (rc, got_class, got_chain) == (want_rc, want_class, want_chain)
print(f"  {'ok' if ok else 'FAIL'} {name} ({secs}s for 2 runs): exit {rc}, class {got_class}, op {got_chain}"
      + ("" if ok else f"; expected exit {want_rc}, class {want_class}, op {want_chain}"))
sys.exit(0 if ok else 1)
EOF
}

audit word_language_model 0 - - -- "$python" "$examples/word_language_model/main.py" \
  --data "$work/corpus" --emsize 16 --nhid 16 --epochs 1 --bptt 10 --batch_size 10 \
  --log-interval 10 --save "$work/word_language_model.pt"
audit regression 1 rng-state "aten::randn > aten::normal_" -- "$python" "$examples/regression/main.py"
audit cpp_regression 1 rng-state "aten::randn > aten::normal_" -- "$work/cpp-regression/regression"

((failed)) && echo "some verdicts were not the expected ones (reports: $work/*.txt)" || echo "all verdicts as expected"
exit "$failed"
