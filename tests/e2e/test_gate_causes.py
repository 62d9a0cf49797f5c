"""The cause a gate reports, on real programs under the real interposer (programs/gate_cases.py):
a Python shuffle of tensors torch made is data order, an unseeded Python scalar is external, a
real read of torch.empty's garbage is uninitialized memory whatever ran in between, a scalar
return is recorded, and resize_/out= buffers over garbage are identical.

    cd build && ctest -R e2e.*test_gate_causes --output-on-failure
"""
import os
import re
import unittest

from detaudit_testlib import (PYTHON, TmpDirCase, export_records, in_parallel, output_log,
                              program, record_pair)

CASES = [PYTHON, program("gate_cases.py")]
GARBAGE_ATTEMPTS = 3


class GateCauses(TmpDirCase):
    def pair(self, name, *args):
        out = os.path.join(self.tmp, name)
        proc, report = record_pair(out, CASES + list(args))
        return proc, report, os.path.join(out, "run-0"), os.path.join(out, "run-1")

    def test_python_shuffle_of_torch_tensors_is_data_order(self):
        proc, report, a, b = self.pair("shuffle", "shuffle")
        batch_a = re.findall(r"step 0 batch md5 (\w+)", output_log(a))
        batch_b = re.findall(r"step 0 batch md5 (\w+)", output_log(b))
        if batch_a == batch_b:
            self.skipTest("Python's unseeded shuffle gave the same order twice")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        f = report["first_divergence"]
        self.assertEqual(f["class"], "external-input", f)
        self.assertTrue(f["data_order"], f)
        self.assertIn(f["op"], ("aten::cat", "aten::stack"), f)
        self.assertIn("random.seed", f["remedy"])
        self.assertIn("generator=", f["remedy"])

    def test_unseeded_python_scalar_is_external_with_its_values(self):
        proc, report, a, b = self.pair("scalar", "scalar")
        factors = [re.search(r"factor (\S+)", output_log(r)).group(1) for r in (a, b)]
        self.assertNotEqual(factors[0], factors[1])
        self.assertEqual(proc.returncode, 1, proc.stderr)
        f = report["first_divergence"]
        self.assertEqual(f["class"], "external-input", f)
        # The values the program drew, as the op received them.
        self.assertEqual(f["scalar_argument"], f"{float(factors[0]):.17g} vs {float(factors[1]):.17g}")
        self.assertIn("random.seed", f["remedy"])

    def test_item_returns_are_recorded_and_identical_when_seeded(self):
        proc, report, a, _ = self.pair("item", "item")
        self.assertEqual(report["verdict"], "identical", proc.stdout)
        printed = float(re.search(r"item (\S+)", output_log(a)).group(1))
        items = [op for op in export_records(a) if op["record"] == "op"
                 and op["name"] in ("aten::item", "aten::_local_scalar_dense")]
        self.assertTrue(items)
        self.assertIn(printed, [op["outputs"][0] for op in items], items)

    def test_garbage_read_is_uninitialized_memory_with_or_without_zeros_like(self):
        for zeros_like in (False, True):
            flags = ["--zeros-like"] if zeros_like else []
            for attempt in range(GARBAGE_ATTEMPTS):
                proc, report, a, b = self.pair(f"garbage{zeros_like}{attempt}", "garbage",
                                               *flags)
                sums = [re.search(r"garbage sum (\S+)", output_log(r)).group(1) for r in (a, b)]
                if sums[0] != sums[1]:
                    break
            else:
                self.skipTest(f"torch.empty returned the same bytes in {GARBAGE_ATTEMPTS} pairs")
            f = report["first_divergence"]
            with self.subTest(zeros_like=zeros_like):
                self.assertEqual(proc.returncode, 1)
                self.assertEqual(f["op"], "aten::sum", f)
                self.assertEqual(f["class"], "uninitialized-memory", f)
                self.assertIn("aten::empty (op #", f["detail"])

    def test_resize_and_out_buffers_over_garbage_are_identical(self):
        proc, report, a, b = self.pair("out", "out-buffers")
        self.assertEqual(output_log(a), output_log(b))
        self.assertEqual(report["verdict"], "identical",
                         f"{report.get('first_divergence')}\n{proc.stdout}")
        self.assertEqual(proc.returncode, 0)


if __name__ == "__main__":
    unittest.main()
