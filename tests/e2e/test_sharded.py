"""Sharded training over real gloo on CPU ranks: FSDP2's fully_shard, HSDP and DTensor tensor
parallelism (programs/sharded_train.py), recorded under the real interposer.

- FSDP2 with uneven shards pads every shard, so its all-gather buffers hold garbage in the other
  rank's slots, and gloo's runloop threads split the collectives' work as timing allows. Fully
  initialised, the runs must be identical: neither the garbage slots nor the runloop threads are
  differences.
- With reset_parameters() missing a layer after to_empty() (pytorch/examples' FSDP2 bug), the
  origin is that layer's garbage shard where FSDP's all-gather first reads it, and the remedy is
  to initialise every parameter. The program's own MD5 of its shards says when the garbage
  differed; the fully initialised run above is that remedy, verified.
- DTensor tensor parallel, seeded: identical.
- HSDP on 4 ranks (2 replicas of 2 shards): the replica check pairs each shard's replicas and
  never compares one shard with the other; a replica changed on one rank is found in one run.

    cd build && ctest -R e2e.*test_sharded --output-on-failure
"""
import os
import re
import unittest

from detaudit_testlib import (PYTHON, TmpDirCase, output_log, program, python_answer, read_json,
                              record_pair, run_detaudit)

SHARDED = [PYTHON, program("sharded_train.py")]
GARBAGE_ATTEMPTS = 3


def has(feature):
    probe = {"fsdp2": "from torch.distributed.fsdp import fully_shard",
             "dtensor": "from torch.distributed.tensor.parallel import parallelize_module"}[feature]
    return python_answer(probe) is not None


def printed(run, what):
    """rank -> the MD5 a rank printed for `what` (init or final)."""
    return dict(re.findall(rf"rank (\d) {what} ([0-9a-f]{{32}})", output_log(run)))


class ShardedTraining(TmpDirCase):
    def record(self, name, *args):
        out = os.path.join(self.tmp, name)
        proc, report = record_pair(out, SHARDED + list(args))
        runs = [os.path.join(out, f"run-{i}") for i in (0, 1)]
        for run in runs:
            self.assertEqual(len(printed(run, "final")), 2, output_log(run))
        return proc, report, runs

    def check_identical(self, proc, report, runs):
        self.assertEqual(report["verdict"], "identical",
                         f"{report.get('first_divergence')}\n{proc.stdout}")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(report["structural_differences"]["count"], 0)
        self.assertEqual(printed(runs[0], "final"), printed(runs[1], "final"))

    @unittest.skipUnless(has("fsdp2"), "this torch has no FSDP2 (torch.distributed.fsdp.fully_shard)")
    def test_fsdp2_uneven_shards_fully_initialised_are_identical(self):
        proc, report, runs = self.record("fsdp-full", "--mode", "fsdp", "--init", "full")
        self.check_identical(proc, report, runs)
        # The garbage slots of the padded all-gather buffers were overwritten, never read.
        self.assertGreater(report["unread_differences"]["count"], 0, report["unread_differences"])
        # gloo's runloop threads: compared as one set per rank, every op matched, said once.
        pools = report["library_threads"]
        self.assertEqual(sorted(p["process"] for p in pools), ["r0.main", "r1.main"], pools)
        for p in pools:
            self.assertEqual(p["threads"], "pt_gloo_runloop")
            self.assertGreater(p["ops_a"], 0, p)
            self.assertEqual((p["matched"], p["unmatched_a"], p["unmatched_b"]),
                             (p["ops_a"], 0, 0), p)
        notes = [n for n in report["notes"] if "pt_gloo_runloop" in n]
        self.assertEqual(len(notes), 1, report["notes"])
        self.assertIn("compared as one set per process", notes[0])
        # Shards are not replicas: FSDP reduce-scatters, and no rank's shard is another's.
        for check in report["replicas"]:
            self.assertFalse(check["replicas"], check)
            self.assertEqual(check["groups"], [], check)

    @unittest.skipUnless(has("fsdp2"), "this torch has no FSDP2 (torch.distributed.fsdp.fully_shard)")
    def test_fsdp2_parameter_left_uninitialised_is_the_origin(self):
        differed = 0
        for attempt in range(GARBAGE_ATTEMPTS):
            proc, report, runs = self.record(f"fsdp-partial-{attempt}", "--mode", "fsdp",
                                             "--init", "partial")
            init = [printed(run, "init") for run in runs]
            if init[0] == init[1]:
                # The allocator handed both runs the same bytes: nothing differed.
                self.check_identical(proc, report, runs)
                continue
            differed += 1
            self.assertEqual(report["verdict"], "divergent", proc.stdout)
            self.assertEqual(proc.returncode, 1, proc.stderr)
            first = report["first_divergence"]
            self.assertEqual(first["class"], "uninitialized-memory", first)
            # The first reader is FSDP's all-gather of fc1's shard, on a rank whose shard differed.
            self.assertEqual(first["chain"][0], "fsdp::all_gather_copy_in", first)
            self.assertIn("(fc1)", first["scope_path"], first)
            self.assertNotEqual(init[0][str(first["rank"])], init[1][str(first["rank"])], init)
            self.assertIn("aten::empty_like", first["detail"], first)
            self.assertIn("to_empty()", first["remedy"], first)
            self.assertIn("reset_parameters()", first["remedy"], first)
            break
        if not differed:
            self.skipTest(f"to_empty() got the same bytes in {GARBAGE_ATTEMPTS} pairs: nothing to find")

    @unittest.skipUnless(has("dtensor"), "this torch has no DTensor tensor parallel")
    def test_dtensor_tensor_parallel_is_identical(self):
        proc, report, runs = self.record("tp", "--mode", "tp")
        self.check_identical(proc, report, runs)
        ranks = printed(runs[0], "final")
        self.assertEqual(ranks["0"], ranks["1"])  # the full parameters, gathered on each rank


@unittest.skipUnless(has("fsdp2"), "this torch has no FSDP2 (torch.distributed.fsdp.fully_shard)")
class HybridSharded(TmpDirCase):
    """HSDP over a 2x2 mesh: ranks 0 and 2 hold one shard of every parameter, 1 and 3 the other."""

    def test_replicas_of_each_shard_are_checked_and_the_runs_identical(self):
        out = os.path.join(self.tmp, "hsdp")
        proc, report = record_pair(out, SHARDED + ["--mode", "hsdp"])
        self.assertEqual(report["verdict"], "identical",
                         f"{report.get('first_divergence')}\n{proc.stdout}")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        runs = [os.path.join(out, f"run-{i}") for i in (0, 1)]
        self.assertEqual(printed(runs[0], "final"), printed(runs[1], "final"))
        self.assertEqual(len(report["replicas"]), 2, report["replicas"])
        for check in report["replicas"]:
            self.assertTrue(check["replicas"], check)
            self.assertEqual(check["ranks"], [0, 1, 2, 3], check)
            self.assertEqual(check["groups"], [[0, 2], [1, 3]], check)
            self.assertIsNone(check["divergence"], check)
            self.assertEqual(check["steps_checked"], 3, check)

    def test_a_shard_changed_on_one_replica_is_found_in_one_run(self):
        out = os.path.join(self.tmp, "drift")
        report = os.path.join(out, "risk.json")
        proc = run_detaudit(["run", "--out", out, "-q", "--format", "json", "--output", report,
                             "--", *SHARDED, "--mode", "hsdp", "--drift-rank", "2",
                             "--drift-step", "1"])
        self.assertEqual(proc.returncode, 1, proc.stderr)
        check = read_json(report)["replicas"]
        self.assertEqual(check["groups"], [[0, 2], [1, 3]], check)
        d = check["divergence"]
        self.assertIsNotNone(d, check)
        self.assertEqual(d["class"], "replica-divergence")
        # Rank 2 changed its shard of fc2.bias ([3] of 5, padded) after step 1's update: step 2's
        # update is the first its twin, rank 0, disagrees with. Rank 1 (the other shard) is never
        # its reference.
        self.assertEqual((d["rank"], d["reference_rank"]), (2, 0), d)
        self.assertEqual(d["step"], 2, d)
        self.assertEqual(d["sizes"], [3], d)
        self.assertEqual(d["input_differs"], "parameter", d)
        self.assertRegex(d["parted_at"], r"^r2\.main\.t-main op #\d+ aten::add_, step 2, forward")
        finals = printed(os.path.join(out, "run-0"), "final")
        self.assertNotEqual(finals["0"], finals["2"])


if __name__ == "__main__":
    unittest.main()
