"""Data-parallel training over real gloo: two CPU ranks of DistributedDataParallel, launched with
RANK/WORLD_SIZE/MASTER_* and with torch.multiprocessing.spawn, recorded under the real interposer.
The collectives' recorded results are checked against the MD5s the program printed, and the
cross-rank verdict against a race that only rank 1 runs.

    cd build && ctest -R e2e.*test_ddp --output-on-failure
"""
import os
import re
import unittest

from detaudit_testlib import (PYTHON, TORCH_VERSION, TmpDirCase, collectives, digests,
                              export_records, free_port, output_log, outputs_of_pair, program,
                              read_json, record_pair, run_detaudit, run_program, tensors)

DDP = [PYTHON, program("ddp_train.py")]
RACE_ATTEMPTS = 3


class SeededDdp(TmpDirCase):
    def check_identical_pair(self, launch):
        out = os.path.join(self.tmp, launch)
        proc, report = record_pair(out, DDP + ["--launch", launch, "--steps", "3"])
        self.assertEqual(report["verdict"], "identical",
                         f"{report.get('first_divergence')} {report.get('not_compared')}\n"
                         f"{proc.stdout}\n{proc.stderr[-3000:]}\n{outputs_of_pair(out)}")
        self.assertEqual(proc.returncode, 0, f"{proc.stderr}\n{outputs_of_pair(out)}")
        for check in report["replicas"]:
            self.assertTrue(check["replicas"], check)
            self.assertEqual(check["ranks"], [0, 1])
            self.assertEqual(check["divergence"], None, check)
            self.assertGreaterEqual(check["steps_checked"], 3)
        return os.path.join(out, "run-0")

    def check_ranks_and_allreduce(self, run):
        records = export_records(run)
        printed = output_log(run)
        for rank in (0, 1):
            stream = f"r{rank}.main.t-main"
            header = [r for r in records if r["record"] == "header" and r["stream"] == stream]
            self.assertEqual(len(header), 1, f"no stream {stream}")
            self.assertEqual(header[0]["rank"], rank)
            calls = collectives(records, stream)
            names = [op["name"] for op, _ in calls]
            self.assertIn("c10d::allreduce_", names)
            for op, c in calls:
                self.assertEqual(c["group_rank"], rank, op["name"])
                self.assertEqual(c["group_size"], 2)
                self.assertTrue(c["completed"], op["name"])
            # Sequence numbers count the group's collectives: the same on both ranks.
            self.assertEqual([c["seq"] for _, c in calls], list(range(1, len(calls) + 1)))
            # Receive buffers are geometry when the op returns, never compared there.
            for op, _ in calls:
                if op["name"] == "c10d::allgather_":
                    for t in tensors(op["inputs"][:1]):
                        self.assertTrue(t["not_read"], t)
            # Each all-reduce's recorded result is what the program saw after it: the summed
            # loss, and DDP's gradient bucket.
            reduced = set()
            for op, c in calls:
                if op["name"] == "c10d::allreduce_":
                    reduced.update(digests(c["received"]))
            lines = re.findall(rf"rank {rank} step \d+ loss-sum \S+ loss-sum-md5 ([0-9a-f]{{32}}) "
                               rf"bucket-md5 ([0-9a-f]{{32}}) ([0-9a-f]{{32}})", printed)
            self.assertEqual(len(lines), 3, printed)
            for loss_md5, bucket_rev, bucket_fwd in lines:
                self.assertIn(loss_md5, reduced)
                self.assertTrue({bucket_rev, bucket_fwd} & reduced,
                                f"no all-reduce result is the bucket {bucket_rev}/{bucket_fwd}")

    def test_seeded_ddp_launched_with_rank_variables_is_identical(self):
        run = self.check_identical_pair("env")
        self.check_ranks_and_allreduce(run)
        # Recording changes nothing the ranks compute: the same final parameters as a plain run.
        plain = run_program(DDP + ["--launch", "env", "--steps", "3"])
        self.assertEqual(plain.returncode, 0, plain.stderr)
        final = r"rank \d final [0-9a-f]{32}"
        self.assertEqual(sorted(re.findall(final, plain.stdout)),
                         sorted(re.findall(final, output_log(run))))

    def test_seeded_ddp_under_mp_spawn_is_identical_and_ranked(self):
        run = self.check_identical_pair("spawn")
        self.check_ranks_and_allreduce(run)

    @unittest.skipIf(TORCH_VERSION.startswith("1."),
                     "Debian's torchrun (1.13) fails under Python 3.11 before starting a rank")
    def test_seeded_ddp_under_torchrun_is_identical_and_ranked(self):
        torchrun = os.path.join(os.path.dirname(PYTHON), "torchrun")
        out = os.path.join(self.tmp, "torchrun")
        proc, report = record_pair(out, [torchrun, "--nproc-per-node", "2", "--master-port",
                                         str(free_port()), program("ddp_train.py"),
                                         "--steps", "3"])
        self.assertEqual(report["verdict"], "identical",
                         f"{report.get('not_compared')} {report.get('first_divergence')}")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        run = os.path.join(out, "run-0")
        self.check_ranks_and_allreduce(run)
        # The launcher recorded nothing and claimed its name last: the workers are r0 and r1.
        self.assertTrue(os.path.exists(os.path.join(run, "streams", "r0.main~1.status")))


class ReplicasInOneRun(TmpDirCase):
    CORRUPT_STEP = 1

    def check(self, launch):
        out = os.path.join(self.tmp, launch)
        report = os.path.join(out, "risk.json")
        proc = run_detaudit(["run", "--out", out, "-q", "--format", "json", "--output", report,
                             "--", *DDP, "--launch", launch, "--steps", "4",
                             "--corrupt-rank", "1", "--corrupt-step", str(self.CORRUPT_STEP)])
        self.assertEqual(proc.returncode, 1, proc.stderr)
        d = read_json(report)["replicas"]["divergence"]
        self.assertIsNotNone(d, read_json(report)["replicas"])
        self.assertEqual(d["class"], "replica-divergence")
        # The program changes fc1.bias on rank 1 after the optimizer step of iteration 1, which
        # ends step 1: the next update, in step 2, is the first the replicas disagree on.
        self.assertEqual(d["step"], self.CORRUPT_STEP + 1, d)
        self.assertEqual(d["rank"], 1, d)
        self.assertEqual(d["op"], "aten::add_", d)
        self.assertEqual(d["sizes"], [32], d)  # fc1.bias
        self.assertEqual(d["position"], 2, d)  # table, fc1.weight, fc1.bias, ...
        self.assertEqual(d["input_differs"], "parameter", d)
        # Where the streams part: rank 1's own add_ on the parameter, with no collective.
        self.assertRegex(d["parted_at"], r"^r1\.main\.t-main op #\d+ aten::add_, step 2, forward")

    def test_a_parameter_changed_on_one_rank_is_found_in_one_run(self):
        self.check("env")

    def test_the_same_under_mp_spawn(self):
        self.check("spawn")

    def test_ranks_training_on_their_own_are_not_replicas(self):
        # two_ranks.py: two seeded processes with RANK set and no collective; rank 1 reseeds,
        # so their parameters part after step 0. Not a replica divergence: not data parallel.
        out = os.path.join(self.tmp, "own")
        report = os.path.join(out, "risk.json")
        proc = run_detaudit(["run", "--out", out, "-q", "--format", "json", "--output", report,
                             "--", PYTHON, program("two_ranks.py"), "--steps", "3"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        check = read_json(report)["replicas"]
        self.assertEqual(check["ranks"], [0, 1])
        self.assertFalse(check["replicas"], check)
        self.assertIn("no all-reduce", check["not_checked"])
        self.assertIsNone(check["divergence"])


class RaceOnOneRank(TmpDirCase):
    def test_origin_is_rank_1s_race_and_rank_0s_allreduce_is_where_it_spread(self):
        for attempt in range(RACE_ATTEMPTS):
            out = os.path.join(self.tmp, f"race{attempt}")
            proc, report = record_pair(out, DDP + ["--launch", "env", "--steps", "3",
                                                   "--race-rank", "1"])
            finals = [sorted(re.findall(r"rank \d final ([0-9a-f]{32})",
                                       output_log(os.path.join(out, f"run-{i}"))))
                      for i in (0, 1)]
            if finals[0] != finals[1]:
                break
        else:
            self.skipTest(f"the index_put race did not fire in {RACE_ATTEMPTS} pairs")
        self.assertEqual(report["verdict"], "divergent", proc.stdout)
        self.assertEqual(proc.returncode, 1)
        first = report["first_divergence"]
        self.assertEqual(first["rank"], 1, first)
        self.assertEqual(first["phase"], "backward", first)
        self.assertEqual(first["op"], "aten::_index_put_impl_", first)
        self.assertEqual(first["class"], "nondeterministic-op", first)
        self.assertEqual(first["catalog"]["id"], "index-put-accumulate-cpu", first)
        spread = first["propagated_through"]
        self.assertTrue(any(s.startswith("c10d::allreduce_ #") and "to rank 0" in s
                            for s in spread), spread)
        # Before collectives ordered ranks, rank 0's all-reduce (step first, then rank) won.
        self.assertNotEqual(first["op"], "c10d::allreduce_")


if __name__ == "__main__":
    unittest.main()
