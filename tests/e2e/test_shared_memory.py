"""Processes that train one model through shared memory (Hogwild, programs/hogwild.py), recorded
under the real interposer: two torch.multiprocessing workers update share_memory() parameters.

- At once, with no lock: whose update lands first follows timing. When the final parameters
  differ, the first divergence is in a worker, class shared-memory, with the other worker named
  as the writer and a remedy about sharing, not data loading.
- One after the other: the parent reads, at the end, what the workers wrote (the recorder marks
  those bytes "changed elsewhere"), the same every run: identical, and the same result as
  unrecorded.

    cd build && ctest -R e2e.*test_shared_memory --output-on-failure
"""
import os
import re
import unittest

from detaudit_testlib import (PYTHON, TmpDirCase, export_records, output_log, program,
                              record_pair, run_program, tensors)

HOGWILD = [PYTHON, program("hogwild.py")]
RACE_ATTEMPTS = 3


def final(run):
    found = re.findall(r"^final ([0-9a-f]{32})", output_log(run), re.M)
    return found[0] if len(found) == 1 else None


class SharedMemoryTraining(TmpDirCase):
    def test_hogwild_workers_racing_are_shared_memory_with_the_writer_named(self):
        self.check_race(HOGWILD, "hogwild")

    def test_a_late_workers_first_read_is_shared_memory(self):
        # Worker 0 starts while worker 1 trains: the first op that differs is its first forward,
        # addmm reading the bias through a stride-0 expanded view of 64 elements' bytes (torch
        # 1.13), whose writer wrote 64 elements, not the view's 2,048.
        self.check_race(HOGWILD + ["--late-worker", "0.3"], "late")

    def check_race(self, command, name):
        differed = 0
        for attempt in range(RACE_ATTEMPTS):
            out = os.path.join(self.tmp, f"{name}-{attempt}")
            proc, report = record_pair(out, command)
            a, b = (final(os.path.join(out, f"run-{i}")) for i in (0, 1))
            self.assertTrue(a and b, proc.stderr)
            if a == b:
                self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
                continue
            differed += 1
            self.assertEqual(report["verdict"], "divergent", proc.stdout)
            self.assertEqual(proc.returncode, 1, proc.stderr)
            first = report["first_divergence"]
            self.assertEqual(first["class"], "shared-memory", first)
            self.assertIn(first["process"], ("r0.main.0", "r0.main.1"), first)
            other = "r0.main.1" if first["process"] == "r0.main.0" else "r0.main.0"
            self.assertTrue(first["shared_writer"].startswith(other + ".t-main at aten::"), first)
            self.assertIn("shared memory", first["cause"])
            self.assertIn("do not share parameters", first["remedy"])
            self.assertNotIn("DataLoader", first["remedy"])
            break
        if not differed:
            self.skipTest(f"the workers' updates landed alike in {RACE_ATTEMPTS} pairs")

    def test_workers_one_after_the_other_are_identical(self):
        self.check_sequential("file_descriptor")

    def test_the_same_shared_through_files(self):
        # torch.multiprocessing's file_system strategy: libshm's allocator, not a descriptor.
        self.check_sequential("file_system")

    def check_sequential(self, sharing):
        command = HOGWILD + ["--sequential", "--sharing", sharing]
        out = os.path.join(self.tmp, sharing)
        proc, report = record_pair(out, command)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        run = os.path.join(out, "run-0")
        # The parent read the parameters before the workers and after them: in shared memory,
        # changed by other processes in between.
        records = export_records(run, stream="r0.main.t-main")
        shared = [t.get("shared") for r in records if r["record"] == "op"
                  for t in tensors(r["inputs"])]
        self.assertIn("memory", shared)
        self.assertIn("changed elsewhere", shared, "no read of the workers' writes was marked")
        # Recording changed nothing the program computed.
        plain = run_program(command)
        self.assertEqual(plain.returncode, 0, plain.stderr)
        self.assertEqual(final(run), re.findall(r"^final ([0-9a-f]{32})", plain.stdout, re.M)[0])


if __name__ == "__main__":
    unittest.main()
