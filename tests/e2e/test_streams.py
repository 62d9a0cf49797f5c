"""One process, many streams: Python threads started in any order, user scopes, DataLoader worker
processes and recorded child processes, each recorded under the real interposer and compared with
`detaudit diff`. The verdicts are checked against what the programs printed (their threads'
start order, each batch's MD5) and against the ops `detaudit export` lists.

    cd build && ctest -R e2e.*test_streams --output-on-failure
"""
import json
import os
import re
import unittest

import detaudit_testlib
from detaudit_testlib import (PYTHON, TmpDirCase, export_ops, in_parallel, output_log, program,
                              read_json, run_detaudit, stream_files)

THREAD_PAIRS = 5
LOADER_PAIRS = 3
RACE_ATTEMPTS = 4


def record_pair(out, command, flags=()):
    """(proc, report, run-0, run-1) of `detaudit run --runs 2`."""
    r, report = detaudit_testlib.record_pair(out, command, flags)
    return r, report, os.path.join(out, "run-0"), os.path.join(out, "run-1")


def record_one(out, command, flags=()):
    r = run_detaudit(["run", "--runs", "1", "--out", out, "-q", *flags, "--", *command])
    if r.returncode != 0:
        raise AssertionError(f"detaudit run failed (exit {r.returncode}):\n{r.stderr}")
    return os.path.join(out, "run-0")


def diff(a, b):
    r = run_detaudit(["diff", a, b, "--format", "json"])
    return r, (json.loads(r.stdout) if r.stdout.strip() else None)


class StreamsCase(TmpDirCase):
    # Not test_diff_verdicts' check: a worker's stream is compared only up to its consumer's
    # last step, so its ops compared need not equal its ops recorded.
    def assert_identical(self, proc, report, what):
        self.assertEqual(report["verdict"], "identical",
                         f"{what}: {report.get('first_divergence')}\n{proc.stdout}")
        self.assertEqual(proc.returncode, 0, f"{what}: {proc.stderr}")


class PythonThreads(StreamsCase):
    THREADS = [PYTHON, program("python_threads.py")]

    def test_start_order_does_not_pair_streams(self):
        # Both orders forced, so the pairing cannot pass by luck of the scheduler.
        runs = in_parallel([
            lambda: record_one(os.path.join(self.tmp, "order01"), self.THREADS + ["--order", "0,1"]),
            lambda: record_one(os.path.join(self.tmp, "order10"), self.THREADS + ["--order", "1,0"]),
        ])
        self.assertIn("start order [0, 1]", output_log(runs[0]))
        self.assertIn("start order [1, 0]", output_log(runs[1]))
        for run in runs:
            self.assertEqual([f for f in stream_files(run) if "worker" in f],
                             ["r0.main.t-worker-0.dtr", "r0.main.t-worker-1.dtr"])
        r, report = diff(*runs)
        self.assert_identical(r, report, "threads started in opposite orders")
        compared = {s["name"]: s["compared"] for s in report["streams"]}
        self.assertGreater(compared["r0.main.t-worker-0"], 0)
        self.assertGreater(compared["r0.main.t-worker-1"], 0)

    def test_random_start_order_identical_in_every_pair(self):
        results = in_parallel([
            (lambda k=k: record_pair(os.path.join(self.tmp, f"threads{k}"), self.THREADS))
            for k in range(THREAD_PAIRS)])
        for k, (proc, report, a, b) in enumerate(results):
            self.assert_identical(proc, report, f"pair {k} ({output_log(a).splitlines()[0]} / "
                                                f"{output_log(b).splitlines()[0]})")

    def test_a_recorded_child_process_gets_its_own_files(self):
        run = record_one(os.path.join(self.tmp, "child"), self.THREADS + ["--spawn-child"])
        d = os.path.join(run, "streams")
        self.assertIn("r0.main.python-c.t-main.dtr", stream_files(run))
        parent = read_json(os.path.join(d, "r0.main.env.json"))
        child = read_json(os.path.join(d, "r0.main.python-c.env.json"))
        self.assertNotEqual(parent["pid"], child["pid"])
        self.assertEqual(child["process_role"], "main.python-c")
        self.assertIn("-c", child["command_line"])
        for name, env in (("r0.main", parent), ("r0.main.python-c", child)):
            with open(os.path.join(d, name + ".status")) as f:
                self.assertIn(f"pid {env['pid']}", f.read())
        child_ops = export_ops(run, "r0.main.python-c.t-main")
        self.assertIn("aten::sum", [o["name"] for o in child_ops])
        self.assertNotIn("aten::sin", [o["name"] for o in child_ops])  # the parent's threads' op


class Scopes(StreamsCase):
    def test_scopes_are_labels_not_ops(self):
        run = record_one(os.path.join(self.tmp, "scopes"),
                         [PYTHON, program("python_threads.py"), "--order", "0,1"])
        main = export_ops(run, "r0.main.t-main")
        self.assertFalse([o for o in main if o["name"].startswith("profiler::")])
        self.assertLess(max(o["depth"] for o in main), 32)
        by_scope = {}
        for o in main:
            by_scope.setdefault(o["scope_path"], []).append(o)
        self.assertEqual(set(by_scope), {"", "forward_block", "backward_block"})
        self.assertIn("aten::pow", [o["name"] for o in by_scope["forward_block"]])
        self.assertIn("backward", {o["phase"] for o in by_scope["backward_block"]})
        # After a scope closes, top-level ops are at depth 0 again, in the right phase and step.
        updates = [o for o in by_scope[""] if o["name"] == "aten::add_"]
        self.assertEqual([(o["depth"], o["phase"], o["step"]) for o in updates],
                         [(0, "optimizer", 0), (0, "optimizer", 1)])

    def test_race_inside_scopes_is_found_with_its_scope_path(self):
        for attempt in range(RACE_ATTEMPTS):
            out = os.path.join(self.tmp, f"race{attempt}")
            proc, report, a, b = record_pair(out, [PYTHON, program("scoped_race.py"), "--steps", "3"])
            truth_a = re.findall(r"grad (\S+)", output_log(a))
            truth_b = re.findall(r"grad (\S+)", output_log(b))
            if truth_a != truth_b:
                break
            self.assert_identical(proc, report, "a race that did not fire")
        else:
            self.skipTest(f"the index_put race did not fire in {RACE_ATTEMPTS} pairs")
        first = report["first_divergence"]
        self.assertEqual(first["class"], "nondeterministic-op", first)
        self.assertIn(first["op"], ("aten::_index_put_impl_", "aten::index_put_"))
        self.assertEqual(first["scope_path"], "train_step/backward_block")
        self.assertEqual(first["phase"], "backward")
        step = next(i for i, (x, y) in enumerate(zip(truth_a, truth_b)) if x != y)
        self.assertLessEqual(first["step"], step)
        ops = export_ops(a, "r0.main.t-main")
        op = next(o for o in ops if o["order"] == first["order"]["a"])
        self.assertEqual(op["name"], first["op"])
        self.assertLess(op["depth"], 8)
        self.assertEqual(len(first["chain"]), op["depth"] + 1)


class DataLoaderWorkers(StreamsCase):
    LOADER = [PYTHON, program("loader_workers.py"), "--steps", "4"]

    def test_seeded_loader_is_identical_in_every_pair(self):
        results = in_parallel([
            (lambda k=k: record_pair(os.path.join(self.tmp, f"loader{k}"), self.LOADER))
            for k in range(LOADER_PAIRS)])
        for k, (proc, report, a, b) in enumerate(results):
            self.assert_identical(proc, report, f"pair {k}")
            self.assertEqual(output_log(a), output_log(b))
            workers = [s for s in report["streams"] if s["consumer_last_step"] is not None]
            self.assertEqual(sorted(s["name"] for s in workers),
                             ["r0.main.0.t-main", "r0.main.1.t-main"])
            for s in workers:
                self.assertGreater(s["compared"], 0, s)

    def test_unseeded_augmentation_is_external_input_at_the_workers_op(self):
        proc, report, a, b = record_pair(os.path.join(self.tmp, "augment"),
                                         self.LOADER + ["--unseeded-augment"])
        self.assertEqual(proc.returncode, 1, proc.stderr)
        md5_a = re.findall(r"step (\d+) batch md5 (\S+)", output_log(a))
        md5_b = re.findall(r"step (\d+) batch md5 (\S+)", output_log(b))
        self.assertNotEqual(md5_a[0], md5_b[0], "the first batches should differ")
        first = report["first_divergence"]
        self.assertEqual(first["class"], "external-input", first)
        self.assertEqual(first["step"], 0)
        self.assertIn(first["process"], ("r0.main.0", "r0.main.1"))
        self.assertRegex(first["batch_read_by"], r"^r0\.main\.t-main at aten::")
        # The op is the worker's, made while it built batch 0 (what the main process trained on
        # in step 0 is the output of an op of that worker in step 0).
        worker_ops = export_ops(a, first["stream"])
        self.assertIn(first["op"], {o["name"] for o in worker_ops if o["step"] == 0})
        digests = {t["digest"] for o in worker_ops if o["step"] == 0 for t in outputs(o)}
        self.assertIn(md5_a[0][1], digests)

    def test_selected_steps_label_the_workers_batches(self):
        out = os.path.join(self.tmp, "steps")
        run = record_one(out, self.LOADER, flags=["--steps", "1-2"])
        batches = dict(re.findall(r"step (\d+) batch md5 (\S+)", output_log(run)))
        workers = [f[:-4] for f in stream_files(run) if f.startswith("r0.main.") and
                   f[len("r0.main."):].split(".")[0].isdigit()]
        self.assertEqual(len(workers), 2, stream_files(run))
        made = {}
        for w in workers:
            for o in export_ops(run, w):
                self.assertIn(o["step"], (1, 2), f"{w}: {o['name']} in step {o['step']}")
                for t in outputs(o):
                    made.setdefault(t["digest"], set()).add(o["step"])
        # Each selected step's batch was made by worker ops labelled with that step.
        for step in (1, 2):
            self.assertEqual(made.get(batches[str(step)]), {step}, f"batch of step {step}")
        main_steps = {o["step"] for o in export_ops(run, "r0.main.t-main")}
        self.assertEqual(main_steps, {1, 2})


def outputs(op):
    out = []
    for v in op["outputs"]:
        out.extend(v if isinstance(v, list) else [v])
    return [t for t in out if isinstance(t, dict) and "digest" in t]


if __name__ == "__main__":
    unittest.main()
