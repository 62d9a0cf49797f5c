#!/usr/bin/env bash
# Audits three unchanged programs from a checkout of the public pytorch/examples repository and
# checks detaudit's verdicts:
#   word_language_model/main.py  seeds itself            -> IDENTICAL
#   regression/main.py           unseeded                -> DIVERGENT, rng-state at aten::randn > aten::normal_
#   cpp/regression               unseeded (C++, libtorch) -> DIVERGENT, rng-state at aten::randn > aten::normal_
#   distributed/FSDP2/example.py 2 gloo ranks on the CPU (two lines changed: the GPU-count check,
#                                and device_id=) -> DIVERGENT, uninitialized-memory where FSDP's
#                                all-gather reads a parameter that to_empty() left as garbage
#                                (Transformer.reset_parameters() skips its layers)
#   the same with the remedy     every layer's reset_parameters() called -> IDENTICAL
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

# distributed/FSDP2 on the CPU: the two lines that insist on GPUs, and, for the remedy, the
# layers' initialisation that Transformer.reset_parameters() leaves out.
for variant in fsdp2 fsdp2-remedy; do
  mkdir -p "$work/$variant-src" && cp "$examples"/distributed/FSDP2/*.py "$work/$variant-src/" || exit 2
  "$python" - "$work/$variant-src" "$variant" <<'EOF' || exit 2
import sys
d, variant = sys.argv[1:]
p = d + "/example.py"; s = open(p).read()
s = s.replace("    if not verify_min_gpu_count(", "    if torch.accelerator.is_available() and not verify_min_gpu_count(")
s = s.replace("init_process_group(backend=backend, device_id=device)", "init_process_group(backend=backend)")
open(p, "w").write(s)
if variant == "fsdp2-remedy":
    p = d + "/model.py"; s = open(p).read()
    old = "        self.tok_embeddings.reset_parameters()\n"
    assert old in s, "model.py changed: no tok_embeddings.reset_parameters()"
    s = s.replace(old, old + "        for layer in self.layers:\n            layer.reset_parameters()\n")
    open(p, "w").write(s)
EOF
done

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

# Each run in its own folder: the example resumes from the checkpoints it finds. A shell runs
# it, so the interposer is chosen for the Python first on PATH.
fsdp2() {
  local name=$1; shift
  PATH="$(dirname "$python"):$PATH" audit "$name" "$@" -- bash -c 'mkdir -p "$DETAUDIT_RUN_DIR/work" &&
    cd "$DETAUDIT_RUN_DIR/work" && exec "$0" -m torch.distributed.run --nproc-per-node 2 "$1"' \
    "$python" "$work/$name-src/example.py"
}
fsdp2 fsdp2 1 uninitialized-memory "fsdp::all_gather_copy_in > aten::_foreach_copy_ > aten::copy_"
fsdp2 fsdp2-remedy 0 - -

((failed)) && echo "some verdicts were not the expected ones (reports: $work/*.txt)" || echo "all verdicts as expected"
exit "$failed"
