"""Compare two runs of real programs under the real interposer and check the verdicts: no false
positives on deterministic training, the CPU index_put race found at its op with the catalog
entry, unseeded RNG and data order classified, the thread count named, structural differences
placed at the right step and op, the CI gate and the single-run risk report.

Every expectation is checked against evidence the test gathers itself (what the programs
printed, or the ops `detaudit export` lists), never against hard-coded results.

    cd build && ctest -R e2e.test_diff_verdicts --output-on-failure
"""
import os
import re
import sys
import unittest

from detaudit_testlib import (PYTHON, build_binary, comparator_only, example, export_ops,
                              in_parallel, output_log, record_pair, run_detaudit,
                              TmpDirCase)

# The index_put race is real: two runs may happen to agree. Each command's first run is diffed
# with up to this many more until one differs from it; when none did, the race tests fail.
RACE_ATTEMPTS = 4
INDEX_PUT_OPS = ("aten::_index_put_impl_", "aten::index_put_")
# Steps of nondet_index_put.py: each one's gradient is a chance for the race to show.
INDEX_PUT_STEPS = 4


def record_one(out, command, extra=()):
    r = run_detaudit(["run", "--runs", "1", "--out", out, "-q", *extra, "--", *command])
    if r.returncode != 0:
        raise AssertionError(f"detaudit run failed (exit {r.returncode}):\n{r.stderr}")
    return r


def diff_json(a, b, *extra):
    r = run_detaudit(["diff", a, b, "--format", "json", *extra])
    return r, (load_json(r.stdout) if r.stdout.strip() else None)


def load_json(text):
    import json
    return json.loads(text)


class VerdictCase(TmpDirCase):
    def assert_identical(self, proc, report, what):
        self.assertEqual(report["verdict"], "identical",
                         f"{what}: false positive: {report.get('first_divergence')}")
        self.assertEqual(proc.returncode, 0, f"{what}: {proc.stderr}")
        self.assertIsNone(report["first_divergence"])
        self.assertEqual(report["spread"]["divergent_ops"], 0)
        self.assertEqual(report["structural_differences"]["count"], 0)
        self.assertGreater(report["totals"]["ops_compared"], 50, f"{what}: too few ops compared")
        for s in report["streams"]:
            self.assertTrue(s["in_a"] and s["in_b"], s)
            self.assertEqual(s["ops_a"], s["ops_b"], s)
            self.assertEqual(s["compared"], s["ops_a"], s)


# 1. No false positives.
class DeterministicRunsAreIdentical(VerdictCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        commands = {"train_sgd": [PYTHON, example("train_sgd.py"), "--steps", "3"],
                    "uninitialized": [PYTHON, example("uninitialized.py"), "--steps", "3"],
                    "train_cnn": [build_binary("train_cnn"), "--steps", "3"]}
        outs = {name: os.path.join(cls.tmp, name) for name in commands}
        pairs = in_parallel([lambda n=n: record_pair(outs[n], commands[n]) for n in commands])
        cls.pairs = {n: (outs[n],) + pair for n, pair in zip(commands, pairs)}

    def check(self, name, result_pattern):
        out, proc, report = self.pairs[name]
        # The programs themselves agree: the ground truth for "identical".
        results = [re.findall(result_pattern, output_log(os.path.join(out, f"run-{i}")))
                   for i in (0, 1)]
        self.assertTrue(results[0], f"{name}: no result line in output.log")
        self.assertEqual(results[0], results[1], f"{name}: the programs' own results differ")
        self.assert_identical(proc, report, name)

    def test_train_sgd(self):
        self.check("train_sgd", r"final loss \S+ params sha256 \w+")

    def test_uninitialized_empty_is_not_a_divergence(self):
        self.check("uninitialized", r"final loss \S+")
        # The program did allocate with the empty family, and those outputs were compared.
        ops = export_ops(os.path.join(self.pairs["uninitialized"][0], "run-0"))
        empty = [o for o in ops if o["name"] == "aten::empty" and o["outputs"] and
                 isinstance(o["outputs"][0], dict) and o["outputs"][0].get("uninitialized") and
                 o["outputs"][0]["shape"] == [64, 32]]
        self.assertEqual(len(empty), 3, "one torch.empty(64, 32) a step")

    def test_train_cnn_cpp(self):
        self.check("train_cnn", r"step \d+ loss \S+")


def op_key(op):
    """What identifies an op for alignment (docs/report.md): name, phase, depth, tensor shapes."""
    def shapes(values):
        out = []
        for v in values:
            for t in (v if isinstance(v, list) else [v]):
                if isinstance(t, dict) and "shape" in t:
                    out.append((tuple(t["shape"]), t.get("dtype")))
        return tuple(out)
    return (op["name"], op["phase"], op["depth"], shapes(op["inputs"]), shapes(op["outputs"]))


def first_index_put_difference(run_a, run_b):
    """The first step whose recorded _index_put_impl_ outputs differ, or None: ground truth
    from the traces, independent of the comparator."""
    per_run = []
    for run in (run_a, run_b):
        per_run.append([(o["step"], tuple(t.get("digest") for t in o["outputs"]
                                          if isinstance(t, dict)))
                        for o in export_ops(run) if o["name"] == "aten::_index_put_impl_"])
    if len(per_run[0]) != len(per_run[1]):
        raise AssertionError(f"index_put counts differ: {len(per_run[0])} vs {len(per_run[1])}")
    for (step, da), (_, db) in zip(*per_run):
        if da != db:
            return step
    return None


# 2. The CPU index_put_(accumulate=True) race, and (7, 8) the risk report of a single run.
class IndexPutRace(VerdictCase):
    """Each command is recorded as single runs: the first is the risk report's run (Python) and
    run A of the pair, diffed with each further run until the race showed between them."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        python = [PYTHON, example("nondet_index_put.py"), "--steps", str(INDEX_PUT_STEPS)]
        cpp = [build_binary("train_cnn"), "--race", "--threads", "2", "--steps", "3"]
        cls.python, cls.cpp = in_parallel([
            lambda: cls.record_until_different("py", python, cls.python_truth),
            lambda: cls.record_until_different("cpp", cpp, cls.trace_truth)])

    @staticmethod
    def python_truth(run_a, run_b):
        """The first step whose gradient (printed by the program) differs, or None."""
        grads = [dict(re.findall(r"step (\d+) grad sha256 (\w+)", output_log(run)))
                 for run in (run_a, run_b)]
        if not grads[0] or grads[0].keys() != grads[1].keys():
            raise AssertionError(f"unexpected program output in {run_a}, {run_b}: {grads}")
        steps = sorted(int(k) for k in grads[0] if grads[0][k] != grads[1][k])
        return steps[0] if steps else None

    @staticmethod
    def trace_truth(run_a, run_b):
        return first_index_put_difference(run_a, run_b)

    @classmethod
    def record_until_different(cls, name, command, truth):
        out = os.path.join(cls.tmp, f"{name}-0")
        first = record_one(out, command)
        run_a = os.path.join(out, "run-0")
        for attempt in range(1, RACE_ATTEMPTS + 1):
            run_b = os.path.join(cls.tmp, f"{name}-{attempt}", "run-0")
            record_one(os.path.dirname(run_b), command)
            step = truth(run_a, run_b)
            if step is not None or attempt == RACE_ATTEMPTS:
                showed = f"showed at step {step}" if step is not None else "never showed"
                sys.stderr.write(f"{name}: {attempt + 1} runs recorded; the race {showed}\n")
                proc, report = diff_json(run_a, run_b)
                return {"a": run_a, "b": run_b, "proc": proc, "report": report, "step": step,
                        "attempts": attempt, "first": first}

    def assert_race_showed(self, pair):
        # A race that never showed is a test that did not see its case: it fails.
        self.assertIsNotNone(pair["step"], f"the index_put race did not show in "
                                           f"{pair['attempts']} pairs")

    def check_race(self, pair):
        proc, report, step = pair["proc"], pair["report"], pair["step"]
        self.assert_race_showed(pair)
        self.assertEqual(report["verdict"], "divergent")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        fd = report["first_divergence"]
        self.assertIsNotNone(fd)
        self.assertEqual(fd["class"], "nondeterministic-op", fd.get("detail"))
        self.assertIn(fd["op"], INDEX_PUT_OPS)
        self.assertEqual(fd["phase"], "backward")
        self.assertEqual(fd["step"], step, "first divergent step != first step whose "
                                           "index_put outputs differ")
        self.assertEqual(fd["chain"][0], "IndexBackward0", fd["chain"])
        self.assertEqual(fd["chain"][-1], fd["op"])
        self.assertFalse(fd["args_differ"])
        self.assertTrue(all(not t["differs"] for t in fd["inputs"]), fd["inputs"])
        self.assertTrue(any(t["differs"] for t in fd["outputs"]), fd["outputs"])
        cat = fd["catalog"]
        self.assertIsNotNone(cat, "no catalog entry for the index_put race")
        self.assertEqual(cat["id"], "index-put-accumulate-cpu")
        self.assertTrue(any("accumulate" in c for c in cat["conditions_met"]), cat)
        self.assertTrue(cat["remedy"])
        self.assertIn(cat["remedy"], fd["remedy"])
        self.assertTrue(fd["cause"])
        # The op is at the position the report gives: index-th op of run A's stream.
        ops = export_ops(pair["a"], fd["stream"])
        self.assertEqual(ops[fd["index"]]["name"], fd["op"])
        self.assertEqual(ops[fd["index"]]["step"], fd["step"])
        self.assertEqual(ops[fd["index"]]["offset"], fd["offset"]["a"])
        return True

    def test_python_index_put_race(self):
        self.check_race(self.python)

    def test_cpp_index_put_race(self):
        self.check_race(self.cpp)

    # 7. The gate: tiny float noise passes --fail-on tolerance, the report still says it differs.
    @comparator_only
    def test_tolerance_gate(self):
        self.assert_race_showed(self.python)
        a, b = self.python["a"], self.python["b"]
        r, rep = diff_json(a, b, "--fail-on", "tolerance", "--atol", "1e-3")
        strict, strict_rep = diff_json(a, b, "--fail-on", "tolerance", "--atol", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(rep["verdict"], "divergent")
        self.assertEqual(rep["exit_code"], 0)
        self.assertFalse(rep["gate"]["beyond_tolerance"])
        self.assertEqual(rep["gate"]["fail_on"], "tolerance")
        self.assertTrue(all(m["within_tolerance"] for m in rep["first_divergence"]["magnitude"]))
        self.assertEqual(strict.returncode, 1, strict.stderr)
        self.assertTrue(strict_rep["gate"]["beyond_tolerance"])
        # The headline is the gate's: never DIVERGENT with exit 0.
        self.assertEqual((rep["headline"], strict_rep["headline"]),
                         ("within tolerance", "beyond tolerance"))
        text = run_detaudit(["diff", a, b, "--fail-on", "tolerance", "--atol", "1e-3"])
        self.assertEqual(text.returncode, 0)
        self.assertRegex(text.stdout, r"^WITHIN TOLERANCE \d+ op\(s\) differ in their bits")
        self.assertNotIn("DIVERGENT", text.stdout)

    # 8. The risk report of a single run: the race's first Python run, `detaudit run --runs 1`.
    def test_single_run_risk_report(self):
        r, run = self.python["first"], self.python["a"]
        self.assertIn("RISK", r.stdout)
        line = next((l for l in r.stdout.splitlines()
                     if "aten::_index_put_impl_" in l and "index-put-accumulate-cpu" in l), None)
        self.assertIsNotNone(line, r.stdout)
        recorded = sum(1 for o in export_ops(run) if o["name"] == "aten::_index_put_impl_")
        self.assertEqual(recorded, INDEX_PUT_STEPS)
        self.assertIn(f" x{recorded} ", line)
        after = r.stdout.split(line, 1)[1]
        self.assertIn("conditions met:", after)
        self.assertIn("accumulate (input 3) == true", after)
        self.assertIn("intra-op threads >= 2", after)
        self.assertIn("remedy:", after)
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(run), "run-1")))


# 3. Unseeded RNG, unseeded data order, and the thread count.
class RandomnessAndEnvironment(VerdictCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.threads = {n: os.path.join(cls.tmp, f"threads{n}", "run-0") for n in (1, 2)}
        cls.dropout, cls.shuffle, _, _ = in_parallel([
            lambda: record_pair(os.path.join(cls.tmp, "dropout"),
                                [PYTHON, example("unseeded_dropout.py"), "--steps", "2"]),
            lambda: record_pair(os.path.join(cls.tmp, "shuffle"),
                                [PYTHON, example("unseeded_shuffle.py"), "--steps", "2"])] + [
            lambda n=n: record_one(os.path.dirname(cls.threads[n]),
                                   [PYTHON, example("threads.py"), "--threads", str(n)],
                                   ["--threads", str(n)]) for n in (1, 2)])

    def test_unseeded_dropout_is_rng_state(self):
        proc, report = self.dropout
        self.assertEqual(proc.returncode, 1, proc.stderr)
        fd = report["first_divergence"]
        self.assertEqual(fd["class"], "rng-state", fd["detail"])
        self.assertIn(fd["op"], ("aten::bernoulli_", "aten::bernoulli", "aten::dropout",
                                 "aten::native_dropout"))
        self.assertTrue(fd["random"])
        self.assertNotEqual(fd["rng"]["a"], fd["rng"]["b"])
        self.assertEqual(fd["step"], 0)
        self.assertEqual(fd["phase"], "forward")
        self.assertIn("seed", fd["remedy"])

    def test_unseeded_shuffle_is_external_input(self):
        proc, report = self.shuffle
        self.assertEqual(proc.returncode, 1, proc.stderr)
        fd = report["first_divergence"]
        self.assertEqual(fd["class"], "external-input", f"{fd['op']}: {fd['detail']}")
        self.assertEqual(fd["step"], 0)
        self.assertTrue(any(t["differs"] for t in fd["inputs"]) or
                        any(t["differs"] for t in fd["outputs"]))
        self.assertTrue(fd["remedy"])

    def test_thread_count_is_named_as_the_cause(self):
        self.assertIn("threads 1 ", output_log(self.threads[1]))
        self.assertIn("threads 2 ", output_log(self.threads[2]))
        r, report = diff_json(self.threads[1], self.threads[2])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(report["verdict"], "divergent")
        env = [d for d in report["environment_differences"] if d["key"] == "intra_op_threads"]
        self.assertEqual(len(env), 1, report["environment_differences"])
        self.assertEqual((env[0]["a"], env[0]["b"]), ("1", "2"))
        # Thread count first among the environment differences: the usual cause.
        self.assertEqual(report["environment_differences"][0]["key"], "intra_op_threads")
        fd = report["first_divergence"]
        self.assertIsNotNone(fd["cause"])
        self.assertIn("intra_op_threads", fd["cause"])
        self.assertIn("1 vs 2", fd["cause"])
        self.assertIn("thread", fd["remedy"])
        self.assertEqual(fd["step"], 0)
        # The first op that computes a different value is the 5M-element reduction.
        ops = export_ops(self.threads[1])
        first_sum = next(o for o in ops if o["name"] == "aten::sum")
        self.assertLessEqual(fd["order"]["a"], first_sum["order"] + 2)
        text = run_detaudit(["diff", self.threads[1], self.threads[2]])
        self.assertIn("intra_op_threads differs: 1 vs 2", text.stdout)


# 4. Structural differences: how the comparator aligns traces, whichever torch recorded them.
@comparator_only
class StructuralDifferences(VerdictCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        jobs = {"a3": ["--steps", "3"], "a4": ["--steps", "4"],
                "b3": ["--steps", "3", "--branch", "b"]}
        cls.runs = {name: os.path.join(cls.tmp, name, "run-0") for name in jobs}
        in_parallel([lambda n=n: record_one(os.path.dirname(cls.runs[n]),
                                            [PYTHON, example("branchy.py"), *jobs[n]])
                     for n in jobs])

    def test_extra_step(self):
        a, b = self.runs["a3"], self.runs["a4"]
        r, report = diff_json(a, b)
        self.assertEqual(r.returncode, 1, r.stderr)
        ops_b = export_ops(b)
        fourth = [i for i, o in enumerate(ops_b) if o["step"] == 3]
        fd = report["first_divergence"]
        self.assertEqual(fd["class"], "structural")
        self.assertEqual(fd["step"], 3)
        sd = report["structural_differences"]
        self.assertEqual(sd["count"], 1, sd)
        first = sd["first"][0]
        self.assertEqual(first["step"], 3)
        self.assertEqual(first["index"]["b"], fourth[0])
        self.assertEqual(first["index"]["a"], fourth[0])  # the same ops before it in both
        self.assertEqual(first["skipped"], {"a": 0, "b": len(fourth)})
        self.assertIn("extra", first["detail"])
        # What follows the extra step (the final loss.item()) is still compared.
        stream = report["streams"][0]
        self.assertEqual(stream["compared"], stream["ops_a"])
        self.assertEqual(stream["ops_b"] - stream["ops_a"], len(fourth))
        self.assertFalse(stream["alignment_lost"])

    def test_different_branch(self):
        a, b = self.runs["a3"], self.runs["b3"]
        r, report = diff_json(a, b)
        self.assertEqual(r.returncode, 1, r.stderr)
        keys_a = [op_key(o) for o in export_ops(a)]
        ops_b = export_ops(b)
        keys_b = [op_key(o) for o in ops_b]
        names_b = [o["name"] for o in ops_b]
        at = next(i for i, (x, y) in enumerate(zip(keys_a, keys_b)) if x != y)
        fd = report["first_divergence"]
        self.assertEqual(fd["class"], "structural")
        self.assertEqual(fd["step"], ops_b[at]["step"])
        self.assertEqual(fd["phase"], "forward")
        first = report["structural_differences"]["first"][0]
        self.assertEqual(first["index"]["a"], at)
        self.assertEqual(first["index"]["b"], at)
        self.assertEqual(first["skipped"]["a"], 0, first)  # branch b only adds ops
        extra = names_b[at:at + first["skipped"]["b"]]
        self.assertIn("aten::tanh", extra)
        self.assertIn("aten::add", extra)
        self.assertIn("aten::tanh", first["detail"] + fd["detail"])
        # Not a wall of mismatches: most ops still align and are compared.
        stream = report["streams"][0]
        self.assertGreaterEqual(stream["compared"], 0.8 * stream["ops_a"], stream)
        self.assertFalse(stream["alignment_lost"])
        # The different loss makes later values differ, and they are compared.
        self.assertGreater(report["spread"]["divergent_ops"], 0)


# 8. The catalog (the risk report is checked with the race above, on its first run).
@comparator_only
class Catalog(VerdictCase):
    def test_catalog_lists_index_put(self):
        r = run_detaudit(["catalog", "index_put"], check=0)
        self.assertIn("index-put-accumulate-cpu", r.stdout)
        self.assertIn("remedy:", r.stdout)
        r = run_detaudit(["catalog", "index_put", "--json"], check=0)
        ids = [e["id"] for e in load_json(r.stdout)]
        self.assertIn("index-put-accumulate-cpu", ids)


if __name__ == "__main__":
    unittest.main()
