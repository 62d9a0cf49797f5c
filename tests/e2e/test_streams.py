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
from detaudit_testlib import (PYTHON, TmpDirCase, export_ops, in_parallel, load_report,
                              make_tmpdir, output_log, program, read_json, remove_tmpdir,
                              run_detaudit, stream_files)

# Comparisons of a program's runs, all in one `detaudit run --runs N+1`: it diffs run-0 with each
# other run, so N comparisons cost N+1 runs, not 2N.
THREAD_PAIRS = 5
LOADER_PAIRS = 3
# Pairs of the scoped race recorded until its gradients differed; never: the test fails.
RACE_ATTEMPTS = 4
THREADS = [PYTHON, program("python_threads.py")]


def record_pair(out, command, flags=()):
    """(proc, report, run-0, run-1) of `detaudit run --runs 2`."""
    r, report = detaudit_testlib.record_pair(out, command, flags)
    return r, report, os.path.join(out, "run-0"), os.path.join(out, "run-1")


def record_runs(out, command, runs):
    """(proc, {k: report of run-0 vs run-k}, [run dirs]) of `detaudit run --runs RUNS` (> 2),
    its JSON reports written beside the runs (report.run-K.json)."""
    r = run_detaudit(["run", "--runs", str(runs), "--out", out, "--format", "json",
                      "--output", os.path.join(out, "report.json"), "-q", "--", *command])
    reports = {}
    for k in range(1, runs):
        path = os.path.join(out, f"report.run-{k}.json")
        if not os.path.exists(path):
            raise AssertionError(f"no {path} from detaudit run (exit {r.returncode}):\n{r.stderr}")
        reports[k] = load_report(path)
    return r, reports, [os.path.join(out, f"run-{k}") for k in range(runs)]


def record_one(out, command, flags=()):
    r = run_detaudit(["run", "--runs", "1", "--out", out, "-q", *flags, "--", *command])
    if r.returncode != 0:
        raise AssertionError(f"detaudit run failed (exit {r.returncode}):\n{r.stderr}")
    return os.path.join(out, "run-0")


def diff(a, b):
    r = run_detaudit(["diff", a, b, "--format", "json"])
    return r, (json.loads(r.stdout) if r.stdout.strip() else None)


# Recorded once on first use (each run costs seconds of CPU): PythonThreads compares the two
# forced start orders, Scopes reads the ops of order 0,1.
_shared = {}


def forced_order_runs():
    """{order: run-0} of python_threads.py --order ORDER, for "0,1" and "1,0"."""
    if "orders" not in _shared:
        _shared["tmp"] = make_tmpdir()
        orders = ("0,1", "1,0")
        runs = in_parallel([
            lambda o=o: record_one(os.path.join(_shared["tmp"], "order" + o.replace(",", "")),
                                   THREADS + ["--order", o]) for o in orders])
        _shared["orders"] = dict(zip(orders, runs))
    return _shared["orders"]


def tearDownModule():
    remove_tmpdir(_shared.get("tmp"))


class StreamsCase(TmpDirCase):
    # Not test_diff_verdicts' check: a worker's stream is compared only up to its consumer's
    # last step, so its ops compared need not equal its ops recorded.
    def assert_identical(self, proc, report, what):
        self.assertEqual(report["verdict"], "identical",
                         f"{what}: {report.get('first_divergence')}\n{proc.stdout}")
        self.assertEqual(proc.returncode, 0, f"{what}: {proc.stderr}")


class PythonThreads(StreamsCase):
    def test_start_order_does_not_pair_streams(self):
        # Both orders forced, so the pairing cannot pass by luck of the scheduler.
        forced = forced_order_runs()
        runs = [forced["0,1"], forced["1,0"]]
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
        proc, reports, runs = record_runs(os.path.join(self.tmp, "threads"), THREADS,
                                          THREAD_PAIRS + 1)
        self.assertEqual(len(reports), THREAD_PAIRS)
        for k, report in reports.items():
            self.assert_identical(proc, report, f"run-0 vs run-{k} "
                                                f"({output_log(runs[0]).splitlines()[0]} / "
                                                f"{output_log(runs[k]).splitlines()[0]})")

    def test_a_recorded_child_process_gets_its_own_files(self):
        run = record_one(os.path.join(self.tmp, "child"), THREADS + ["--spawn-child"])
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
        run = forced_order_runs()["0,1"]  # PythonThreads' run: the same command
        main = export_ops(run, "r0.main.t-main")
        self.assertFalse([o for o in main if o["name"].startswith("profiler::")])
        self.assertLess(max(o["depth"] for o in main), 32)
        by_scope = {}
        for o in main:
            by_scope.setdefault(o["scope_path"], []).append(o)
        # Inside each optimizer step, on torch 2.x, the label detaudit's hooks open naming the
        # optimizer (docs/trace-format.md): the program's one SGD over one tensor.
        labels = {p for p in by_scope if p.startswith("detaudit::optimizer_step ")}
        expected = {"detaudit::optimizer_step 1 SGD 1"} if detaudit_testlib.HAS_COMPILE else set()
        self.assertEqual(labels, expected)
        self.assertEqual(set(by_scope) - labels, {"", "forward_block", "backward_block"})
        self.assertIn("aten::pow", [o["name"] for o in by_scope["forward_block"]])
        self.assertIn("backward", {o["phase"] for o in by_scope["backward_block"]})
        # After a scope closes, top-level ops are at depth 0 again, in the right phase and step.
        updates = [o for o in main
                   if o["scope_path"] in labels | {""} and o["name"] == "aten::add_"]
        self.assertEqual([(o["depth"], o["phase"], o["step"]) for o in updates],
                         [(0, "optimizer", 0), (0, "optimizer", 1)])

    def test_race_inside_scopes_is_found_with_its_scope_path(self):
        for attempt in range(RACE_ATTEMPTS):
            out = os.path.join(self.tmp, f"race{attempt}")
            proc, report, a, b = record_pair(out, [PYTHON, program("scoped_race.py"),
                                                   "--steps", "3"])
            truth_a = re.findall(r"grad (\S+)", output_log(a))
            truth_b = re.findall(r"grad (\S+)", output_log(b))
            if truth_a != truth_b:
                break
            self.assert_identical(proc, report, "a race that did not fire")
        else:
            self.fail(f"the index_put race did not fire in {RACE_ATTEMPTS} pairs")
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
        proc, reports, runs = record_runs(os.path.join(self.tmp, "loader"), self.LOADER,
                                          LOADER_PAIRS + 1)
        self.assertEqual(len(reports), LOADER_PAIRS)
        for k, report in reports.items():
            self.assert_identical(proc, report, f"run-0 vs run-{k}")
            self.assertEqual(output_log(runs[0]), output_log(runs[k]))
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
