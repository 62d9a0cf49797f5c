"""The cause a gate reports, on real programs under the real interposer (programs/gate_cases.py):
a Python shuffle of tensors torch made is data order, and so are parameters created in a set's
order (seen through addmm's view of its bias) with PYTHONHASHSEED named, an unseeded Python
scalar is external, a real read of torch.empty's garbage is uninitialized memory whatever ran in
between, a scalar return is recorded, resize_/out= buffers over garbage are identical, and a race
whose result is overwritten before any op reads it is not a divergence.

Each recorded pair costs two Python processes that import torch: the cases whose verdict is
identical (item, out-buffers, set-order with PYTHONHASHSEED=0, overwritten with copy_) share one
pair of one process running them all, and every pair is recorded once for the tests that read it.

    cd build && ctest -R e2e.*test_gate_causes --output-on-failure
"""
import os
import re
import unittest

from detaudit_testlib import (PYTHON, TmpDirCase, export_records, load_report, output_log,
                              program, record_pair, run_detaudit)

CASES = [PYTHON, program("gate_cases.py")]
# Budgets for what changes run to run only by chance: when it never changed, the test did not see
# its case and fails.
GARBAGE_ATTEMPTS = 3
RACE_ATTEMPTS = 3
HASH_ORDER_ATTEMPTS = 4  # alpha and beta keep their places in 1 pair of 20
# Identical verdicts, one process: the race first, so the first unread difference is its.
IDENTICAL_CASES = ["overwritten", "item", "out-buffers", "set-order"]
HASH_SEED_FIXED = {"PYTHONHASHSEED": "0"}


def raced_md5s(run):
    return re.findall(r"raced md5 (\w+)", output_log(run))


class GateCauses(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.recorded = {}  # name -> (proc, report, run-0, run-1), for every test that reads it

    def pair(self, name, *args, env=None):
        """The pair of gate_cases.py ARGS recorded as NAME, recorded on first use."""
        if name not in self.recorded:
            out = os.path.join(self.tmp, name)
            proc, report = record_pair(out, CASES + list(args), env=env)
            self.recorded[name] = (proc, report, os.path.join(out, "run-0"),
                                   os.path.join(out, "run-1"))
        return self.recorded[name]

    def pair_until(self, name, args, differs, attempts, what, env=None):
        """The first of ATTEMPTS pairs for which DIFFERS(proc, report, run_a, run_b); the test
        fails when none did, saying WHAT did not happen."""
        for attempt in range(attempts):
            pair = self.pair(f"{name}{attempt}", *args, env=env)
            if differs(*pair):
                return pair
        self.fail(f"{what} in {attempts} pairs")

    def raced_pair(self, name, *args, env=None):
        """A pair in which the index_put_ race made the scratch buffers differ."""
        def raced(proc, report, a, b):
            md5s = [raced_md5s(r) for r in (a, b)]
            self.assertEqual(len(md5s[0]), 3, output_log(a))
            return md5s[0] != md5s[1]
        return self.pair_until(name, args, raced, RACE_ATTEMPTS,
                               "the index_put race did not fire", env=env)

    def identical_cases(self):
        """The first pair of IDENTICAL_CASES: what every case but the race reads, raced or not."""
        return self.pair("identical0", *IDENTICAL_CASES, env=HASH_SEED_FIXED)

    def test_python_shuffle_of_torch_tensors_is_data_order(self):
        proc, report, a, b = self.pair("shuffle", "shuffle")
        batch_a = re.findall(r"step 0 batch md5 (\w+)", output_log(a))
        batch_b = re.findall(r"step 0 batch md5 (\w+)", output_log(b))
        # 8 of 64 samples in the same order twice: 1 in 10^14.
        self.assertNotEqual(batch_a, batch_b, "Python's unseeded shuffle gave the same order")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        f = report["first_divergence"]
        self.assertEqual(f["class"], "external-input", f)
        self.assertTrue(f["data_order"], f)
        self.assertIn(f["op"], ("aten::cat", "aten::stack"), f)
        self.assertIn("random.seed", f["remedy"])
        self.assertIn("generator=", f["remedy"])

    def test_parameters_created_in_set_order_are_data_order_with_pythonhashseed(self):
        # Only the places of alpha and beta matter: they are the parameters the loss reads, and
        # each takes the randn drawn at its place in the set's order.
        def used_places(run):
            order = re.findall(r"step 0 order (\S+)", output_log(run))
            self.assertEqual(len(order), 1, output_log(run))
            names = order[0].split(",")
            return names.index("alpha"), names.index("beta")

        def places_differ(proc, report, a, b):
            if used_places(a) != used_places(b):
                return True
            # The parameters the loss reads got the same values: identical, rightly.
            self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
            return False
        proc, report, a, b = self.pair_until(
            "set-order", ["set-order"], places_differ, HASH_ORDER_ATTEMPTS,
            "hash randomization put alpha and beta in the same places",
            env={"PYTHONHASHSEED": None})
        self.assertEqual(proc.returncode, 1, proc.stderr)
        f = report["first_divergence"]
        self.assertEqual(f["class"], "external-input", f)
        self.assertTrue(f["data_order"], f)
        # alpha reaches addmm as its expanded bias (a view), beta reaches mul as it is: which
        # one differs first depends on the two set orders.
        self.assertIn(f["chain"][0], ("aten::addmm", "aten::mul"), f)
        self.assertEqual(f["data_order_through_view"], f["chain"][0] == "aten::addmm", f)
        self.assertTrue(f["hash_seed_unset"], f)
        self.assertIsNone(f["catalog"], f)  # MKL's entry would explain the wrong thing
        self.assertIn("PYTHONHASHSEED", f["cause"])
        self.assertIn("sorted(", f["remedy"])
        # The remedy, verified: with the hash seed fixed, the runs are identical (set-order runs
        # last in the identical cases' process, under PYTHONHASHSEED=0).
        proc, report, a, b = self.identical_cases()
        self.assertEqual(used_places(a), used_places(b))
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))

    def test_unseeded_python_scalar_is_external_with_its_values(self):
        proc, report, a, b = self.pair("scalar", "scalar")
        factors = [re.search(r"factor (\S+)", output_log(r)).group(1) for r in (a, b)]
        self.assertNotEqual(factors[0], factors[1])
        self.assertEqual(proc.returncode, 1, proc.stderr)
        f = report["first_divergence"]
        self.assertEqual(f["class"], "external-input", f)
        # The values the program drew, as the op received them.
        self.assertEqual(f["scalar_argument"],
                         f"{float(factors[0]):.17g} vs {float(factors[1]):.17g}")
        self.assertIn("random.seed", f["remedy"])

    def test_item_returns_are_recorded_and_identical_when_seeded(self):
        proc, report, a, _ = self.identical_cases()
        self.assertEqual(report["verdict"], "identical", proc.stdout)
        printed = float(re.search(r"^item (\S+)", output_log(a), re.M).group(1))
        items = [op for op in export_records(a) if op["record"] == "op"
                 and op["name"] in ("aten::item", "aten::_local_scalar_dense")]
        self.assertTrue(items)
        self.assertIn(printed, [op["outputs"][0] for op in items], items)

    def test_garbage_read_is_uninitialized_memory_with_or_without_zeros_like(self):
        def sums_differ(proc, report, a, b):
            sums = [re.search(r"garbage sum (\S+)", output_log(r)).group(1) for r in (a, b)]
            return sums[0] != sums[1]
        for zeros_like in (False, True):
            flags = ["--zeros-like"] if zeros_like else []
            with self.subTest(zeros_like=zeros_like):
                proc, report, a, b = self.pair_until(
                    f"garbage{zeros_like}", ["garbage", *flags], sums_differ, GARBAGE_ATTEMPTS,
                    "torch.empty returned the same bytes")
                f = report["first_divergence"]
                self.assertEqual(proc.returncode, 1)
                self.assertEqual(f["op"], "aten::sum", f)
                self.assertEqual(f["class"], "uninitialized-memory", f)
                self.assertIn("aten::empty (op #", f["detail"])

    def test_resize_and_out_buffers_over_garbage_are_identical(self):
        proc, report, a, b = self.identical_cases()
        # What out-buffers printed (its steps' md5s; the race's lines say "raced").
        printed = [re.findall(r"^step \d+ md5 \w+$", output_log(r), re.M) for r in (a, b)]
        self.assertEqual(len(printed[0]), 3, output_log(a))
        self.assertEqual(printed[0], printed[1])
        self.assertEqual(report["verdict"], "identical",
                         f"{report.get('first_divergence')}\n{proc.stdout}")
        self.assertEqual(proc.returncode, 0)

    def test_a_race_overwritten_before_any_read_is_identical(self):
        # copy_ overwrites in the identical cases' process; an out= op in a process of its own.
        for name, args, env, writer in (
                ("identical", IDENTICAL_CASES, HASH_SEED_FIXED, "aten::copy_"),
                ("unread-out", ["overwritten", "--out"], None, "aten::mul")):
            with self.subTest(writer=writer):
                proc, report, a, b = self.raced_pair(name, *args, env=env)
                # The programs computed the same: the raced bytes never reached a result.
                finals = [re.search(r"final md5 (\w+)", output_log(r)).group(1) for r in (a, b)]
                self.assertEqual(finals[0], finals[1])
                self.assertEqual(report["verdict"], "identical",
                                 f"{report.get('first_divergence')}\n{proc.stdout}")
                self.assertEqual(proc.returncode, 0, proc.stderr)
                unread = report["unread_differences"]
                self.assertGreaterEqual(unread["count"], 1, unread)
                self.assertIn("index_put", unread["first"]["op"], unread)
                self.assertTrue(unread["first"]["overwritten_by"].startswith(writer), unread)

    def test_a_race_read_before_it_is_overwritten_is_the_divergence(self):
        # In an evaluation after three training steps: what differs reaches no training state.
        # The default gate fails on it all the same; the training gate passes.
        proc, report, a, b = self.raced_pair("read", "overwritten", "--read-first",
                                             "--after-training")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        f = report["first_divergence"]
        self.assertEqual(f["op"], "aten::_index_put_impl_", f)
        self.assertEqual(f["class"], "nondeterministic-op", f)
        self.assertEqual(f["catalog"]["id"], "index-put-accumulate-cpu", f)
        self.assertTrue(f["confirmed_by"].startswith("read by aten::sum"), f)
        self.assertIs(f["reaches_training"], False, f)
        # Made with autograd off, reaching no training state: an evaluation's own role.
        self.assertEqual([o.get("tensor_role") for o in f["outputs"] if o["differs"]],
                         ["evaluation"], f["outputs"])
        self.assertIn("an evaluation's, computed with autograd off", f["cause"], f)
        training = report["training"]
        self.assertTrue(training["identical"], training)
        self.assertGreater(training["writes_compared"], 0, training)
        self.assertEqual(training["divergent_writes"], 0, training)
        out = os.path.join(self.tmp, "read-training.json")
        r = run_detaudit(["diff", a, b, "--fail-on", "training", "--format", "json", "-o", out])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(load_report(out)["exit_code"], 0)
        r = run_detaudit(["diff", a, b, "--fail-on", "training"])
        self.assertTrue(r.stdout.startswith("TRAINING IDENTICAL"), r.stdout)


if __name__ == "__main__":
    unittest.main()
