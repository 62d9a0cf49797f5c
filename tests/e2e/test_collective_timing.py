"""What a collective received is recorded as it was when the collective completed, whatever the
program does with the buffer next and however the threads are scheduled. Hashed later, DDP's own
next writes into its bucket were recorded instead: a deterministic DDP program was reported
divergent in 2 to 5 pairs of 6.

    cd build && ctest -R e2e.*test_collective_timing --output-on-failure

DETAUDIT_DDP_PAIRS (default 3) sets how many recorded pairs of the deterministic DDP program
must all be identical; run it with 20 before trusting a change to the collective path.
"""
import os
import re
import unittest

from detaudit_testlib import (PYTHON, TORCH_VERSION, TmpDirCase, collectives, digests,
                              export_records, ops, output_log, outputs_of_pair, program,
                              record_pair, run_program, tensors)

DDP_PAIRS = int(os.environ.get("DETAUDIT_DDP_PAIRS", "3"))
REWRITE_PAIRS = int(os.environ.get("DETAUDIT_REWRITE_PAIRS", "2"))
# The plain loop users write: DDP over a two-layer MLP, Adam, one thread a rank.
DDP = [PYTHON, program("ddp_train.py"), "--launch", "env", "--optimizer", "adam",
       "--threads", "1", "--steps", "4"]
REWRITE = [PYTHON, program("collective_rewrite.py"), "--launch", "env", "--calls", "40"]


def verdict_of(proc, report):
    first = report.get("first_divergence")
    return (f"verdict {report['verdict']} (exit {proc.returncode}): "
            f"{report.get('unexplained') or first} {report.get('not_compared')}\n{proc.stdout}\n"
            f"{proc.stderr[-3000:]}")


def identical_pairs(case, name, command, pairs):
    """Records `pairs` pairs of `command`; each must be identical. Returns every run's path."""
    runs = []
    for i in range(pairs):
        out = os.path.join(case.tmp, f"{name}{i}")
        proc, report = record_pair(out, command)
        case.assertEqual(report["verdict"], "identical",
                         f"pair {i}: {verdict_of(proc, report)}\n{outputs_of_pair(out)}")
        case.assertEqual(proc.returncode, 0, f"{proc.stderr}\n{outputs_of_pair(out)}")
        runs += [os.path.join(out, "run-0"), os.path.join(out, "run-1")]
    return runs


class DeterministicDdp(TmpDirCase):
    def test_every_recorded_pair_is_identical(self):
        finals = set()
        for run in identical_pairs(self, "ddp", DDP, DDP_PAIRS):
            finals.add(tuple(sorted(re.findall(r"rank \d final ([0-9a-f]{32})", output_log(run)))))
        # The program is deterministic, and recording changed nothing it computed.
        plain = run_program(DDP)
        self.assertEqual(plain.returncode, 0, plain.stderr)
        finals.add(tuple(sorted(re.findall(r"rank \d final ([0-9a-f]{32})", plain.stdout))))
        self.assertEqual(len(finals), 1, finals)
        self.assertEqual(len(next(iter(finals))), 2, finals)


class ResultRewrittenAtOnce(TmpDirCase):
    def test_recorded_result_is_the_collectives_whatever_comes_next(self):
        self.check_pairs("rewrite", REWRITE)

    @unittest.skipIf(TORCH_VERSION.startswith("1."), "functional collectives are torch 2.x's")
    def test_functional_collectives_return_their_buffer_before_it_is_filled(self):
        # _c10d_functional::all_reduce returns what its inner c10d::allreduce_ fills later: its
        # output is not read there unless the all-reduce already completed, and then it is the
        # result the COLLECTIVE record holds.
        runs = self.check_pairs("functional", REWRITE + ["--functional"])
        records = export_records(runs[0])
        results = {d for _, c in collectives(records, "r0.main.t-main")
                   for d in digests(c["received"])}
        outputs = [t for op in ops(records, "_c10d_functional::all_reduce", stream="r0.main.t-main")
                   for t in tensors(op["outputs"])]
        self.assertEqual(len(outputs), 40)
        for t in outputs:
            self.assertTrue(t.get("not_read") or t["digest"] in results, t)

    def check_pairs(self, name, command):
        runs = identical_pairs(self, name, command, REWRITE_PAIRS)
        for run in runs:
            self.check_received(run)
        return runs

    def check_received(self, run):
        # Each call's recorded result is the sum the program computed from both ranks' inputs,
        # not what it wrote into the buffer right after.
        records = export_records(run)
        printed = output_log(run)
        for rank in (0, 1):
            expected = re.findall(rf"rank {rank} call (\d+) (\w+) expected ([0-9a-f]{{32}}) "
                                  rf"after ([0-9a-f]{{32}})", printed)
            self.assertEqual(len(expected), 40, printed)
            calls = [c for op, c in collectives(records, f"r{rank}.main.t-main")
                     if op["name"] == "c10d::allreduce_"]
            self.assertEqual(len(calls), len(expected))
            for (call, mode, want, after), c in zip(expected, calls):
                self.assertTrue(c["completed"], c)
                self.assertNotEqual(want, after)  # the program did rewrite it
                self.assertEqual(digests(c["received"]), [want],
                                 f"rank {rank} call {call} ({mode}) in {run}")


if __name__ == "__main__":
    unittest.main()
