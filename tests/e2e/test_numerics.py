"""Runs not meant to match bit for bit (issue 61): one training program under two torch builds
(pip's 2.13 and Debian's 1.13), with 1 and 2 intra-op threads, and with one layer's activation
changed to another algorithm, each diffed bit for bit and under a tolerance.

    cd build && ctest -R e2e.*test_numerics --output-on-failure
"""
import glob
import json
import os
import unittest

from detaudit_testlib import (BUILD_DIR, PYTHON, TORCH_VERSION, RecordedRuns, comparator_only,
                              program, run_detaudit)

MLP = program("numerics_mlp.py")
GEMMS = {"aten::addmm", "aten::mm", "aten::linear"}


def another_cpu_torch():
    """The Python of another torch the interposer was built for (Debian's), or None."""
    for desc in sorted(glob.glob(os.path.join(BUILD_DIR, "lib", "detaudit", "torch", "*",
                                              "torch.txt"))):
        fields = dict(line.split("=", 1) for line in open(desc).read().splitlines() if "=" in line)
        if fields.get("version") != TORCH_VERSION and not fields.get("cuda"):
            python = fields.get("python") or "/usr/bin/python3"
            if os.path.exists(python):
                return python, fields["version"]
    return None


OTHER = another_cpu_torch()


@comparator_only
class NumericsAcrossSettings(RecordedRuns):
    @classmethod
    def jobs_to_record(cls):
        jobs = {"base": [PYTHON, MLP],
                "two_threads": [PYTHON, MLP, "--threads", "2"],
                "tanh_gelu": [PYTHON, MLP, "--tanh-gelu-at", "2"]}
        if OTHER:
            jobs["other_torch"] = [OTHER[0], MLP]
        return jobs

    def diff(self, b, *flags):
        for name in ("base", b):
            self.records(name)  # recorded, or the test fails saying why
        r = run_detaudit(["diff", os.path.join(self.tmp, "base", "run-0"),
                          os.path.join(self.tmp, b, "run-0"), "--format", "json"] + list(flags))
        self.assertIn(r.returncode, (0, 1), r.stderr)
        return r.returncode, json.loads(r.stdout)

    def test_another_torch_build_is_the_cause_and_numerics_stay_within_a_few_ulp(self):
        if not OTHER:
            self.skipTest("no interposer built for a second CPU torch (tests/build.sh "
                          "--debian-torch builds Debian's)")
        code, report = self.diff("other_torch")
        self.assertEqual(code, 1)
        env = report["environment_differences"]
        self.assertEqual(env[0]["key"], "torch_version", env[:3])
        # The fingerprint's is libtorch's own version, without pip's local part ("+cpu").
        ours, theirs = TORCH_VERSION.split("+")[0], OTHER[1].split("+")[0]
        self.assertEqual((env[0]["a"], env[0]["b"]), (ours, theirs))
        keys = [d["key"] for d in env]
        self.assertNotIn("build_config", keys, "the whole build text is never one difference")
        self.assertIn("build_config.BLAS_INFO", keys)
        first = report["first_divergence"]
        self.assertEqual(first["class"], "torch-build", first)
        self.assertIn(first["op"], GEMMS, first)
        self.assertIn(f"torch {ours} in run A, {theirs} in run B", first["cause"])
        blas = next(d for d in env if d["key"] == "build_config.BLAS_INFO")
        self.assertIn(f"{blas['a']} in run A and {blas['b']} in run B", first["cause"])

        # Under a tolerance of 64 ulp the builds agree: the op sequence differences between
        # them (zero_grad's defaults, decompositions) are listed and not counted.
        code, report = self.diff("other_torch", "--fail-on", "tolerance", "--ulp", "64")
        self.assertEqual(code, 0, report["gate"])
        self.assertTrue(report["gate"]["structure_tolerated"], report["gate"])
        self.assertIsNone(report["numerics_change"])
        # Under half an ulp, the first GEMM whose inputs agree is where numerics change.
        code, report = self.diff("other_torch", "--fail-on", "tolerance", "--ulp", "0.5")
        self.assertEqual(code, 1)
        change = report["numerics_change"]
        self.assertIn(change["op"], GEMMS, change)
        self.assertEqual(change["step"], 0, change)
        self.assertGreater(change["output"]["ulps"], 0.5, change)

    def test_two_threads_differ_in_bits_within_a_tolerance(self):
        code, report = self.diff("two_threads")
        self.assertEqual(code, 1)
        self.assertEqual(report["environment_differences"][0]["key"], "intra_op_threads")
        self.assertIn("intra_op_threads differs: 1 vs 2", report["first_divergence"]["cause"])
        code, report = self.diff("two_threads", "--fail-on", "tolerance", "--ulp", "16")
        self.assertEqual(code, 0, report["gate"])
        self.assertEqual(report["verdict"], "divergent")
        self.assertIsNone(report["numerics_change"])
        self.assertFalse(report["gate"]["structure_tolerated"])

    def test_a_layer_changed_to_another_algorithm_is_named_at_that_layer(self):
        code, report = self.diff("tanh_gelu", "--fail-on", "tolerance", "--ulp", "16")
        self.assertEqual(code, 1)
        change = report["numerics_change"]
        self.assertEqual((change["op"], change["step"], change["phase"]),
                         ("aten::gelu", 2, "forward"), change)
        self.assertEqual(change["input"]["tensor"], "", "every input it read agreed")
        self.assertGreater(change["output"]["ulps"], 16, change)
        # Growth by step: nothing before step 2.
        steps = [p["step"] for p in report["spread"]["per_step"]]
        self.assertEqual(min(steps), 2, steps)


if __name__ == "__main__":
    unittest.main()
