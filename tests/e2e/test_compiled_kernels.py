"""Inside torch.compile (inductor on the CPU, torch 2.x): each kernel inductor generates is recorded
as an op, inductor_kernel::<kernel>, so a race in generated code is named at its kernel, with the
aten ops it came from and its catalog entry, and its remedy is verified. Deterministic compiled
programs (deterministic mode, one thread with a seeded dropout, DataLoader workers) stay
identical, and recording changes no bits. Each program compiles once, plain, into a cache its
recorded runs load (warm_compile_cache): kernels are recorded on a hit as on a miss, and each run
starts from its own copy of that cache. Skipped where torch has no torch.compile (1.13).

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_compiled_kernels
"""
import json
import os
import re
import unittest

from detaudit_testlib import (HAS_COMPILE, PYTHON, TORCH_VERSION, export_records, in_parallel,
                              load_report, make_temp_dir, ops, params_sha, program, remove_dir,
                              run_detaudit, warm_compile_cache)

SCRIPT = program("compiled_gather.py")
ATTEMPTS = 3  # a race may leave the bits alone in a pair


def checksums(run_dir):
    with open(os.path.join(run_dir, "output.log")) as f:
        return re.findall(r"^step \d+ grad checksum \w+$", f.read(), flags=re.M)


@unittest.skipUnless(HAS_COMPILE, f"torch {TORCH_VERSION} has no torch.compile")
class CompiledKernels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        # Each program compiles once, plain, and the recorded runs load that: a cold compile is
        # most of a minute on 2 cores. Every run starts from its own copy of the cache, so the
        # race's --verify-remedy runs both compile the remedy's kernels: were the cache shared,
        # the first would compile and the second load, and a run that compiles records ops one
        # that loads does not (a false structural divergence).
        workers = [PYTHON, SCRIPT, "--deterministic", "--workers", "2", "--dropout"]
        one_thread = [PYTHON, SCRIPT, "--threads", "1", "--dropout"]
        compiled, plain = warm_compile_cache(cls.tmp, workers, one_thread, [PYTHON, SCRIPT])
        cls.plain = plain[0]

        def pair(name, command):
            out = os.path.join(cls.tmp, name)
            return lambda: (out, run_detaudit(
                ["run", "--runs", "2", "--out", out, "-q", "--format", "json", "--output",
                 out + ".json", "--", *command], timeout=900, env=compiled))

        cls.race, cls.one_thread, cls.workers = in_parallel([
            lambda: cls.record_race([PYTHON, SCRIPT], compiled),
            pair("one-thread-dropout", one_thread),
            pair("deterministic-workers", workers),
        ])

    @classmethod
    def record_race(cls, command, env):
        """Pairs of the racing program, with --verify-remedy, until one's checksums differ."""
        tried = []
        for attempt in range(ATTEMPTS):
            out = os.path.join(cls.tmp, f"race-{attempt}")
            r = run_detaudit(["run", "--runs", "2", "--out", out, "-q", "--verify-remedy",
                              "--format", "json", "--output", out + ".json", "--", *command],
                             timeout=900, env=env)
            differ = checksums(os.path.join(out, "run-0")) != checksums(os.path.join(out, "run-1"))
            tried.append((out, r, differ))
            if differ:
                break
        return tried

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def the_race(self):
        for out, r, differ in self.race:
            if not differ:  # the bits agreed: no false alarm allowed
                self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-2000:])
                self.assertEqual(load_report(out + ".json")["verdict"], "identical")
        out, r, differ = self.race[-1]
        if not differ:
            self.fail(f"not reproduced: the atomic adds left the gradient's bits alone in "
                      f"{ATTEMPTS} pairs, so the verdict could not be checked")
        return out, r

    def test_the_race_is_named_at_its_generated_kernel(self):
        out, r = self.the_race()
        self.assertEqual(r.returncode, 1, r.stdout[-3000:] + r.stderr[-2000:])
        fd = load_report(out + ".json")["first_divergence"]
        about = json.dumps(fd, indent=1)[:3000]
        self.assertTrue(fd["op"].startswith("inductor_kernel::cpp_fused_"), about)
        self.assertEqual(fd["class"], "nondeterministic-op", about)
        self.assertEqual(fd["phase"], "backward", about)
        self.assertIn("aten::index_put", fd["kernel_origin"], about)
        self.assertIn("atomic adds", fd["kernel_origin"], about)
        self.assertFalse(any(t["differs"] for t in fd["inputs"]), about)
        self.assertTrue(any(t["differs"] for t in fd["outputs"]), about)
        self.assertEqual(fd["catalog"]["id"], "inductor-cpu-atomic-add", about)
        self.assertIn("use_deterministic_algorithms(True)", fd["remedy"], about)
        # The race fires in most steps, not in every one: the first step its gradient's bits
        # differ at, by the checksums the program printed.
        sums = [checksums(os.path.join(out, f"run-{i}")) for i in (0, 1)]
        first = next(k for k, (a, b) in enumerate(zip(*sums)) if a != b)
        self.assertEqual(fd["step"], first, about)

    def test_the_remedy_is_verified(self):
        out, _ = self.the_race()
        with open(os.path.join(out, "remedy.json")) as f:
            remedy = json.load(f)
        self.assertTrue(remedy["verified"], remedy)
        self.assertIn("--deterministic", remedy["flags"], remedy)

    def test_kernel_records_hold_origin_inputs_and_outputs(self):
        out, _ = self.the_race()
        kernels = [o for o in ops(export_records(os.path.join(out, "run-0")))
                   if o["name"].startswith("inductor_kernel::")]
        # Two kernels a step (the loss, its backward), two steps.
        self.assertGreaterEqual(len(kernels), 4, [o["name"] for o in kernels])
        backward = [o for o in kernels if o["phase"] == "backward"]
        self.assertTrue(backward, [o["name"] for o in kernels])
        for o in backward:
            self.assertIn("atomic adds", json.dumps(o["inputs"]), o["name"])
            self.assertTrue(o["outputs"], o["name"])

    def test_replay_says_why_a_kernel_cannot_be_replayed(self):
        out, _ = self.the_race()
        r = run_detaudit(["replay", "--first-divergence", out], timeout=120)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("cannot be replayed alone", r.stderr)
        self.assertIn("--verify-remedy", r.stderr)

    def test_deterministic_compiled_programs_stay_identical(self):
        for name, r in (("one thread, seeded dropout", self.one_thread[1]),
                        ("deterministic mode, DataLoader workers", self.workers[1])):
            out = self.one_thread[0] if r is self.one_thread[1] else self.workers[0]
            self.assertEqual(r.returncode, 0, f"{name}: {r.stdout[-3000:]}{r.stderr[-2000:]}")
            report = load_report(out + ".json")
            self.assertEqual(report["verdict"], "identical", name)
            self.assertGreater(sum(s["compiled_kernels"] for s in report["streams"]), 0,
                               f"{name}: no generated kernel was recorded")

    def test_recording_does_not_change_the_compiled_result(self):
        self.assertEqual(self.plain.returncode, 0, self.plain.stderr[-3000:])
        plain = params_sha(self.plain.stdout)
        self.assertIsNotNone(plain, self.plain.stdout[-2000:])
        for run in ("run-0", "run-1"):
            with open(os.path.join(self.workers[0], run, "output.log")) as f:
                self.assertEqual(params_sha(f.read()), plain, run)


if __name__ == "__main__":
    unittest.main()
