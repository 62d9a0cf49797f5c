"""`detaudit run` options on a real training run: --runs 2 reports identical, show and export
read the run, --steps and --ops select what is recorded, --digest picks the digest (and its
length), --no-stats drops statistics, and --threads/--seed/--deterministic reach the program and
its environment fingerprint; a long run recorded in full says what it costs, and a disk about
to fill is said before it is.

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_run_options
"""
import fnmatch
import json
import os
import subprocess
import unittest

from detaudit_testlib import (BIN, RecordedRuns, PYTHON, example, export_records, in_parallel, make_temp_dir, ops,
                              output_log, program, read_json, record, remove_dir, run_detaudit,
                              sleeping_waits, steps, tensors)

SGD = [PYTHON, example("train_sgd.py")]


class RunOptions(RecordedRuns):
    @classmethod
    def jobs_to_record(cls):
        return {
            "twice": (["--runs", "2"], SGD + ["--steps", "2"]),
            "xxh3": (["--digest", "xxh3", "--no-stats"], SGD + ["--steps", "2"]),
            "sha256": (["--digest", "sha256", "--steps", "1-2"], SGD + ["--steps", "4"]),
            "ops": (["--ops", "aten::add*", "--threads", "2", "--seed", "7",
                     "--deterministic", "warn"], SGD + ["--steps", "2"]),
            "seeded": (["--runs", "2", "--seed", "7"], [PYTHON, program("print_random.py")]),
            "device": (["--runs", "2", "--digest", "device"], SGD + ["--steps", "2"]),
            "device_values": (["--digest", "device"], [PYTHON, program("device_digest_values.py")]),
        }

    def digests(self, recs):
        """Every digest that has contents: not uninitialized, not overwritten unread."""
        return [t["digest"] for o in ops(recs) for t in tensors(o["inputs"] + o["outputs"])
                if "digest" in t and not t.get("uninitialized") and not t.get("not_read")]

    def test_two_runs_are_identical(self):
        r, run0 = self.runs["twice"]
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("IDENTICAL", r.stdout)
        self.assertRegex(r.stdout, r"IDENTICAL \d+ ops compared")
        run1 = os.path.join(os.path.dirname(run0), "run-1")
        a, b = export_records(run0), export_records(run1)
        self.assertEqual(len(ops(a)), len(ops(b)))
        # Every input and output bit for bit, apart from what the empty family leaves in
        # uninitialized memory and what an op overwrites unread (the destination of fill_ or
        # copy_ may be garbage a kernel allocated without the dispatcher).
        self.assertEqual(self.digests(a), self.digests(b))
        self.assertGreater(len(self.digests(a)), 100)

    def test_show_and_export_a_real_run(self):
        recs = self.records("twice")
        run_dir = self.runs["twice"][1]
        s = run_detaudit(["show", run_dir, "--json"])
        self.assertEqual(s.returncode, 0, s.stderr)
        summary = json.loads(s.stdout)
        self.assertEqual(summary["ending"], "exit code 0")
        self.assertEqual(len(summary["streams"]), 1)
        stream = summary["streams"][0]
        self.assertEqual(stream["name"], "r0.main.t-main")
        self.assertTrue(stream["complete"])
        self.assertEqual(stream["ops"], len(ops(recs)))
        self.assertEqual(stream["end"]["ops"], len(ops(recs)))
        self.assertEqual(stream["steps"], len(steps(recs)))
        self.assertEqual(sum(stream["ops_by_phase"].values()), len(ops(recs)))
        for phase in ("forward", "backward", "optimizer"):
            self.assertEqual(stream["ops_by_phase"][phase], len(ops(recs, phase=phase)), phase)
        self.assertGreater(stream["end"]["bytes_hashed"], 0)
        text = run_detaudit(["show", run_dir])
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("r0.main.t-main", text.stdout)
        self.assertIn("most frequent ops", text.stdout)
        step1 = run_detaudit(["show", run_dir, "--step", "1", "--json"])
        self.assertEqual(step1.returncode, 0, step1.stderr)
        listed = json.loads(step1.stdout)
        self.assertEqual(sorted(x["order"] for x in listed),
                         sorted(o["order"] for o in ops(recs) if o["step"] == 1))
        # export --output writes the same lines as stdout.
        path = os.path.join(self.tmp, "twice.jsonl")
        e = run_detaudit(["export", run_dir, "--output", path])
        self.assertEqual(e.returncode, 0, e.stderr)
        with open(path) as f:
            self.assertEqual([json.loads(l) for l in f], recs)

    def test_steps_selects_steps(self):
        recs = self.records("sha256")
        self.assertEqual([s["step"] for s in steps(recs)], [1, 2])
        self.assertEqual({o["step"] for o in ops(recs)}, {1, 2})
        for k in (1, 2):
            phases = {o["phase"] for o in ops(recs) if o["step"] == k}
            self.assertEqual(phases, {"forward", "backward", "optimizer"}, k)

    def test_sha256_digests_are_32_bytes(self):
        recs = self.records("sha256")
        self.assertEqual(recs[0]["digest"], "sha256")
        ds = self.digests(recs)
        self.assertTrue(ds)
        for d in ds:
            self.assertRegex(d, r"^[0-9a-f]{64}$")
        env = read_json(os.path.join(self.runs["sha256"][1], "streams", "r0.main.env.json"))
        self.assertEqual(env["digest"], "sha256")

    def test_device_digests_are_8_bytes_with_stats_and_identical_twice(self):
        r, run0 = self.runs["device"]
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("IDENTICAL", r.stdout)
        recs = self.records("device")
        self.assertEqual(recs[0]["digest"], "device")
        ds = self.digests(recs)
        self.assertGreater(len(ds), 100)
        for d in ds:
            self.assertRegex(d, r"^[0-9a-f]{16}$")
        self.assertTrue(any("stats" in t for o in ops(recs) for t in tensors(o["outputs"])))
        # A run recorded with another digest is refused, not reported divergent everywhere.
        md5_run = self.runs["twice"][1]
        d = run_detaudit(["diff", md5_run, run0])
        self.assertEqual(d.returncode, 3, d.stdout + d.stderr)
        self.assertIn("--digest", d.stderr)

    def test_device_digest_is_the_specs(self):
        """What the recorder wrote equals the spec, computed independently in Python by the
        program, for an op's output and for a non-contiguous input (its logical order)."""
        r, run_dir = self.runs["device_values"]
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        want = json.loads([l for l in output_log(run_dir).splitlines() if l.startswith("{")][-1])
        recs = self.records("device_values")
        mul = [o for o in ops(recs, "aten::mul") if tensors(o["outputs"])]
        clone = ops(recs, "aten::clone")
        self.assertTrue(mul and clone, [o["name"] for o in ops(recs)])
        self.assertEqual(tensors(mul[0]["outputs"])[0]["digest"], want["mul_output"])
        self.assertEqual(tensors(clone[0]["inputs"])[0]["digest"], want["clone_input"])

    def test_xxh3_digests_are_16_bytes_and_no_stats(self):
        recs = self.records("xxh3")
        self.assertEqual(recs[0]["digest"], "xxh3")
        ds = self.digests(recs)
        self.assertTrue(ds)
        for d in ds:
            self.assertRegex(d, r"^[0-9a-f]{32}$")
        # Not MD5 under another name: the same run's MD5 digests differ.
        self.assertFalse(set(ds) & set(self.digests(self.records("twice"))))
        for o in ops(recs):
            for t in tensors(o["inputs"] + o["outputs"]):
                if "digest" in t:
                    self.assertIsNone(t["stats"], o["name"])
        # ...while the default run has them.
        self.assertTrue(any(t.get("stats") for o in ops(self.records("twice"))
                            for t in tensors(o["outputs"])))

    def test_ops_filter(self):
        recs = self.records("ops")
        names = {o["name"] for o in ops(recs)}
        self.assertIn("aten::addmm", names)
        self.assertIn("aten::add_", names)
        for n in names:
            self.assertTrue(fnmatch.fnmatchcase(n, "aten::add*"), n)

    def test_threads_seed_deterministic_reach_the_program(self):
        self.records("ops")
        streams = os.path.join(self.runs["ops"][1], "streams")
        env = read_json(os.path.join(streams, "r0.main.env.json"))
        self.assertEqual(env["intra_op_threads"], 2)
        self.assertIs(env["determinism"]["deterministic_algorithms"], True)
        self.assertIs(env["determinism"]["warn_only"], True)
        for s in steps(self.records("ops")):
            self.assertEqual(s["intra_op_threads"], 2)
            self.assertEqual(s["determinism_bits"] & 3, 3)  # algorithms, warn-only
        with open(os.path.join(streams, "r0.main.status")) as f:
            status = f.read()
        self.assertIn("seed=7", status)
        self.assertIn("deterministic_algorithms=warn", status)
        self.assertIn("intra_op_threads=2", status)
        config = read_json(os.path.join(self.runs["ops"][1], "config.json"))
        self.assertEqual(config["determinism"]["seed"], 7)
        # Without the flags: one thread (Debian's default here) and no determinism.
        plain = read_json(os.path.join(self.runs["twice"][1], "streams", "r0.main.env.json"))
        self.assertFalse(plain["determinism"]["deterministic_algorithms"])

    def seeded_draws(self):
        r, run0 = self.runs["seeded"]
        self.assertNotEqual(r.returncode, 4, r.stderr)  # both ran; the diff may differ
        draws = []
        for run in (run0, os.path.join(os.path.dirname(run0), "run-1")):
            with open(os.path.join(run, "output.log")) as f:
                draws.append(dict(l.split(" ", 1) for l in f.read().splitlines()
                                  if l.split(" ")[0] in ("torch", "numpy", "random")))
        self.assertEqual(len(draws[0]), 3, draws)
        return draws

    def test_seed_seeds_torch(self):
        a, b = self.seeded_draws()
        self.assertEqual(a["torch"], b["torch"])



class LongRunCost(unittest.TestCase):
    """A long run recorded in full says once, early, what a step costs and suggests --sentinel
    (record.warn_after_steps); a disk about to fill is said before it does."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        cls.config = os.path.join(cls.tmp, "warn.json")
        with open(cls.config, "w") as f:
            json.dump({"record": {"warn_after_steps": 100}}, f)

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    # The launcher reads the step every 200 ms, and says the cost once it has a rate: 800 steps
    # ran in 0.4 s on torch 1.13 (0.45 ms a step, recorded in full), too short to be said.
    def long_run(self, name, *flags, steps=3000):
        return run_detaudit(["run", "--config", self.config, "--out",
                             os.path.join(self.tmp, name), "-q", *flags, "--", PYTHON,
                             program("long_run.py"), "--steps", str(steps)])

    @sleeping_waits()
    def test_a_full_recording_says_its_cost_once(self):
        # (A sentinel run, or chosen steps, say nothing: tests/unit/recording_watch_test.cpp.)
        full = self.long_run("full", "--runs", "2")
        self.assertEqual(full.returncode, 0, full.stderr)
        said = [l for l in full.stderr.splitlines() if "steps in full" in l]
        self.assertEqual(len(said), 1, full.stderr)
        self.assertRegex(said[0], r"^detaudit: run-0 has recorded \d+ steps in full: \S+ \S+ so "
                         r"far, \S+ \S+ and \S+ \S+ a step; 1,000 steps would take .* in each of "
                         r"the 2 runs")
        self.assertIn("--sentinel", said[0])
        # The interposer's step, which the launcher read: the last step the program reached.
        with open(os.path.join(self.tmp, "full", "run-0", "streams", "r0.main.progress")) as f:
            word, step = f.read().split()
        self.assertEqual(word, "step")
        self.assertGreaterEqual(int(step), 2999)

    @sleeping_waits()
    def test_a_disk_about_to_fill_is_said_before_it_is_full(self):
        # --out on a 2 MiB tmpfs, in a mount namespace of the test's own (as test_faults does).
        mnt = os.path.join(self.tmp, "mnt")
        os.makedirs(mnt)
        script = ('mount -t tmpfs -o size=2m tmpfs "$1" || exit 90; '
                  '"$2" run --out "$1/audit" -q -- "$3" "$4" --steps 3000')
        r = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script,
                            "sh", mnt, BIN, PYTHON, program("long_run.py")],
                           capture_output=True, text=True, timeout=300)
        self.assertNotEqual(r.returncode, 90, "cannot mount a tmpfs here: " + r.stderr)
        self.assertEqual(r.returncode, 5, r.stderr[-3000:])
        lines = r.stderr.splitlines()
        warned = [i for i, l in enumerate(lines) if "it fills in about" in l]
        full = [i for i, l in enumerate(lines) if "is full" in l]
        self.assertEqual(len(warned), 1, r.stderr[-3000:])
        self.assertTrue(full and warned[0] < full[0], r.stderr[-3000:])
        self.assertIn("exit 5", lines[warned[0]])


if __name__ == "__main__":
    unittest.main()
