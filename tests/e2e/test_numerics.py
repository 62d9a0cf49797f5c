"""The numerics matrix (issues 61, 82): one training program changed the ways users change it,
each pair diffed bit for bit and under a tolerance, with a known answer for each:

- refactors that hand on the same bits (F.linear, `h @ W.t() + b`, the weights transposed first
  and `b + h @ Wt`, an activation applied in a loop over chunks): IDENTICAL VALUES, exit 0;
- refactors that move values (a float64 layer, tanh-GELU, LayerNorm by hand, attention by hand
  against `F.scaled_dot_product_attention`, eager against torch.compile): named at their region,
  with their ulp, and within a tolerance;
- 1 against 2 intra-op threads, in the MLP and under Hugging Face's Trainer: the thread count
  listed first, then the first op whose values moved;
- torch builds (pip's 2.13 against Debian's 1.13, and against the CUDA 2.14.1 CI installs, on
  the CPU): the versions first, then the first op whose numbers changed;

in one process, on two DDP ranks and on two FSDP2 ranks; and this run checked against a
baseline stored in the repository.

    cd build && ctest -R e2e.*test_numerics --output-on-failure
"""
import glob
import json
import os
import unittest

from detaudit_testlib import (BUILD_DIR, HAS_COMPILE, PYTHON, SOURCE_DIR, TORCH_VERSION,
                              RecordedRuns, comparator_only, program, python_answer, run_detaudit)

MLP = program("numerics_mlp.py")
TRAINER = [PYTHON, program("hf_trainer.py"), "--steps", "3", "--race-from", "99"]
HAS_SDPA = HAS_COMPILE  # F.scaled_dot_product_attention: torch 2
HAS_TRANSFORMERS = python_answer(
    "import importlib.util as u;print(all(u.find_spec(m) for m in ('transformers', 'accelerate')))"
) == "True\n"
GEMMS = {"aten::addmm", "aten::mm", "aten::linear"}


def torch_builds():
    """{version: (python, cuda)} of the other torch builds the interposer was built for whose
    Python is here: Debian's 1.13, pip's CUDA 2.14.1 (tests/cuda_build.sh, on the CPU)."""
    builds = {}
    for desc in sorted(glob.glob(os.path.join(BUILD_DIR, "lib", "detaudit", "torch", "*",
                                              "torch.txt"))):
        fields = dict(line.split("=", 1) for line in open(desc).read().splitlines() if "=" in line)
        python = fields.get("python") or "/usr/bin/python3"
        if fields.get("version") != TORCH_VERSION and os.path.exists(python):
            builds[fields["version"]] = (python, fields.get("cuda", ""))
    return builds


BUILDS = torch_builds()
OTHER = next(((python, v) for v, (python, cuda) in BUILDS.items() if not cuda), None)
CUDA_TORCH = next(((python, v) for v, (python, cuda) in BUILDS.items() if cuda), None)
# CI's stage after the CUDA build (.ci/run) requires it.
REQUIRE_CUDA_TORCH = os.environ.get("DETAUDIT_REQUIRE_CUDA_TORCH") == "1"


class PairDiffs(RecordedRuns):
    """Diffs of a recorded job against a base job, and the answers the matrix expects."""

    @classmethod
    def jobs_to_record(cls):
        raise NotImplementedError

    def diff(self, b, *flags, base="base"):
        for name in (base, b):
            self.records(name)  # recorded, or the test fails saying why
        r = run_detaudit(["diff", os.path.join(self.tmp, base, "run-0"),
                          os.path.join(self.tmp, b, "run-0"), "--format", "json"] + list(flags))
        self.assertIn(r.returncode, (0, 1), r.stderr)
        return r.returncode, json.loads(r.stdout)

    def assert_identical_values(self, b, base="base"):
        """Other ops, the same bits: exit 0, `identical-values`, every region the same bits and
        at least one listed. Returns the report."""
        code, report = self.diff(b, base=base)
        self.assertEqual((code, report["verdict"], report["headline"]),
                         (0, "identical-values", "identical values (other ops)"),
                         report["first_divergence"])
        structural = report["structural_differences"]
        self.assertGreater(structural["count"], 0)
        self.assertEqual(report["gate"]["structure_same_bits"], structural["count"])
        return report

@comparator_only
class NumericsAcrossSettings(PairDiffs):
    @classmethod
    def jobs_to_record(cls):
        jobs = {"base": [PYTHON, MLP],
                "two_threads": [PYTHON, MLP, "--threads", "2"],
                "tanh_gelu": [PYTHON, MLP, "--tanh-gelu-at", "2"],
                "functional": [PYTHON, MLP, "--form", "functional"],
                "matmul": [PYTHON, MLP, "--form", "matmul"],
                "float64": [PYTHON, MLP, "--form", "float64"],
                "reordered": [PYTHON, MLP, "--form", "reordered"],
                "unrolled": [PYTHON, MLP, "--form", "unrolled"],
                "layernorm": [PYTHON, MLP, "--block", "layernorm"],
                "layernorm_by_hand": [PYTHON, MLP, "--block", "layernorm-by-hand"],
                # Two gloo ranks under DDP (torch.multiprocessing.spawn): the backward runs the
                # refactor's gradients in autograd's other order, between DDP's bucket copies.
                "ddp": [PYTHON, MLP, "--ranks", "2"],
                "ddp_matmul": [PYTHON, MLP, "--ranks", "2", "--form", "matmul"],
                "ddp_matmul_lr": [PYTHON, MLP, "--ranks", "2", "--form", "matmul", "--lr-at", "2"],
                "ddp_float64": [PYTHON, MLP, "--ranks", "2", "--form", "float64"]}
        if HAS_COMPILE:  # FSDP2's fully_shard: torch 2
            jobs["fsdp"] = [PYTHON, MLP, "--ranks", "2", "--shard"]
            jobs["fsdp_matmul"] = [PYTHON, MLP, "--ranks", "2", "--shard", "--form", "matmul"]
        if HAS_SDPA:
            jobs["sdpa"] = [PYTHON, MLP, "--block", "sdpa"]
            jobs["attention_by_hand"] = [PYTHON, MLP, "--block", "attention-by-hand"]
        if HAS_COMPILE:
            jobs["compiled"] = [PYTHON, MLP, "--compile"]
        if HAS_TRANSFORMERS:
            jobs["trainer"] = TRAINER + ["--threads", "1"]
            jobs["trainer_two_threads"] = TRAINER + ["--threads", "2"]
            jobs["trainer_eager_attention"] = TRAINER + ["--threads", "1", "--attention", "eager"]
        if OTHER:
            jobs["other_torch"] = [OTHER[0], MLP]
        return jobs

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
        self.assertEqual(report["environment_differences"][0]["key"], "intra_op_threads")
        if report["verdict"] == "identical":
            # Some hosts' kernels block these GEMMs alike on 1 and 2 threads (an AVX-512 Xeon
            # did): then the same bits, and no alarm.
            self.assertEqual(code, 0, report)
            self.assertEqual(report["spread"]["divergent_ops"], 0, report["spread"])
            return
        self.assertEqual(code, 1)
        self.assertIn("intra_op_threads differs: 1 vs 2", report["first_divergence"]["cause"])
        code, report = self.diff("two_threads", "--fail-on", "tolerance", "--ulp", "16")
        self.assertEqual(code, 0, report["gate"])
        self.assertEqual(report["verdict"], "divergent")
        self.assertIsNone(report["numerics_change"])
        self.assertFalse(report["gate"]["structure_tolerated"])
        # The first op whose values moved: a GEMM of step 0 (its backward's, on this host), its
        # inputs and arguments the same.
        code, report = self.diff("two_threads")
        first = report["first_divergence"]
        self.assertEqual(first["step"], 0, first)
        self.assertIn(first["op"], GEMMS, first)
        self.assertIn("identical inputs and arguments, different outputs", first["detail"])

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

    def test_a_refactor_to_f_linear_runs_the_same_ops_bit_for_bit(self):
        code, report = self.diff("functional")
        self.assertEqual((code, report["verdict"]), (0, "identical"), report["first_divergence"])

    def test_a_refactor_to_other_ops_is_matched_by_the_values_it_hands_on(self):
        # `h @ W.t() + b` against nn.Linear: mm and add for addmm, in the forward and the
        # backward. Bit for bit, another op sequence; the values handed on are the same bits.
        # It passes the default gate, its regions listed: the headline says what it is.
        report = self.assert_identical_values("matmul")
        first = report["first_divergence"]
        self.assertEqual(first["class"], "structural", first)
        self.assertIn("other ops for the same values", first["cause"])
        structural = report["structural_differences"]
        self.assertGreater(structural["count"], 0)
        for d in structural["first"]:
            self.assertTrue(d["values"]["matched"], d)
            self.assertEqual(d["values"]["exact"], d["values"]["handed_on"], d)
        self.assertEqual(report["gate"]["structure_matched"], structural["count"])
        code, report = self.diff("matmul", "--fail-on", "tolerance")
        self.assertEqual(code, 0, report["gate"])
        self.assertTrue(report["gate"]["structure_tolerated"])
        self.assertIsNone(report["numerics_change"])

    def test_layers_computed_in_float64_are_within_a_few_ulp_and_named_at_their_regions(self):
        # Every layer in float64: the forward is one region. It hands on the logits, a fraction
        # of an ulp apart (its activations were saved for the gradient, compared through it);
        # the gradients its backward's region hands on move a few ulp.
        self.assert_within("float64", 16, base="base")
        # Which region moves first past half an ulp is the host's BLAS: the backward's gradients
        # on an AMD EPYC, the forward's logits (0.81 ulp) on an Intel Xeon's MKL (2026-12-08).
        change = self.assert_beyond_at("float64", 0.5, ("aten::mm", "aten::linear"), base="base",
                                       phase=("backward", "forward"))
        self.assertIn(change["replaced_by"], ("aten::to", "aten::_to_copy"), change)
        # The first layer's result: nn.Linear's in run A, the cast back to float32 in run B.
        change = self.assert_beyond_at("float64", 0.01, "aten::linear", base="base")
        self.assertIn(change["replaced_by"], ("aten::to", "aten::_to_copy"), change)

    def test_a_refactor_under_ddp_passes_its_backward_matched_in_autograds_order(self):
        # nn.Linear's AddmmBackward0 makes both gradients before the bias's sum and DDP's bucket
        # copy; `h @ W.t() + b` hands the bias's on first. The final parameters agree bit for bit.
        report = self.assert_identical_values("ddp_matmul", base="ddp")
        backward = [d for d in report["structural_differences"]["first"]
                    if d["phase"] == "backward"]
        self.assertTrue(backward, report["structural_differences"])
        for d in backward:
            self.assertEqual(d["values"]["exact"], d["values"]["handed_on"], d)
            self.assertGreater(d["values"]["handed_on"], 0, d)

    @unittest.skipUnless(HAS_COMPILE, f"torch {TORCH_VERSION} has no FSDP2")
    def test_a_refactor_under_fsdp2_passes_between_its_all_gathers_and_reduce_scatters(self):
        report = self.assert_identical_values("fsdp_matmul", base="fsdp")
        structural = report["structural_differences"]
        self.assertEqual({d["stream"].split(".")[0] for d in structural["first"]}, {"r0", "r1"})
        self.assertTrue([d for d in structural["first"] if d["phase"] == "backward"], structural)

    def test_a_learning_rate_changed_after_a_refactor_under_ddp_is_found_at_its_step(self):
        code, report = self.diff("ddp_matmul_lr", base="ddp")
        self.assertEqual(code, 1)
        first = report["first_divergence"]
        self.assertEqual((first["step"], first["phase"]), (2, "optimizer"), first)
        # The value reaches a parameter: a hyperparameter, with its two values.
        self.assertIn("a hyperparameter differs (-0.10000000000000001 vs -0.11)", first["cause"])
        self.assertIn("param_groups", first["remedy"])

    def test_float64_layers_under_ddp_are_within_16_ulp_and_named_at_their_forward(self):
        self.assert_within("ddp_float64", 16, base="ddp")
        self.assert_beyond_at("ddp_float64", 0.01, "aten::linear", base="ddp")

    def assert_beyond_at(self, b, ulp, op, base, phase="forward"):
        """Under --ulp ULP: exit 1, the change named at OP's region in step 0, beyond ULP. OP and
        PHASE may be tuples of the (op, phase) pairs a host's numerics can name."""
        code, report = self.diff(b, "--fail-on", "tolerance", "--ulp", str(ulp), base=base)
        self.assertEqual((code, report["headline"]), (1, "beyond tolerance"), report["gate"])
        change = report["numerics_change"]
        pairs = list(zip(op, phase)) if isinstance(op, tuple) else [(op, phase)]
        self.assertIn((change["op"], change["phase"]), pairs, change)
        self.assertEqual(change["step"], 0, change)
        self.assertTrue(change["replaced_by"], change)
        self.assertGreater(change["output"]["ulps"], ulp, change)
        return change

    def assert_within(self, b, ulp, base):
        code, report = self.diff(b, "--fail-on", "tolerance", "--ulp", str(ulp), base=base)
        self.assertEqual((code, report["headline"]), (0, "within tolerance"),
                         (report["gate"], report["numerics_change"]))
        self.assertGreater(report["gate"]["structure_matched"], 0)

    def test_bit_identical_refactors_pass_the_default_gate_with_their_regions_listed(self):
        # The weights transposed first and `b + h @ Wt`; the activations applied chunk by chunk
        # in a Python loop and concatenated. Other ops, the same bits handed on.
        for form in ("reordered", "unrolled"):
            with self.subTest(form=form):
                self.assert_identical_values(form)

    def test_layernorm_by_hand_is_named_at_its_region_with_its_ulp(self):
        code, report = self.diff("layernorm_by_hand", base="layernorm")
        self.assertEqual((code, report["headline"]), (1, "divergent"))
        self.assertEqual(report["first_divergence"]["class"], "structural")
        self.assert_within("layernorm_by_hand", 16, base="layernorm")
        self.assert_beyond_at("layernorm_by_hand", 0.5, "aten::layer_norm", base="layernorm")

    @unittest.skipUnless(HAS_SDPA, f"torch {TORCH_VERSION} has no scaled_dot_product_attention")
    def test_attention_by_hand_against_sdpa_is_named_at_its_region_with_its_ulp(self):
        # The attention's output moves a fraction of an ulp in its statistics (the tolerance
        # compares statistics, docs/report.md), the first layer after it about one.
        self.assert_within("attention_by_hand", 16, base="sdpa")
        change = self.assert_beyond_at("attention_by_hand", 0.01,
                                       "aten::scaled_dot_product_attention", base="sdpa")
        self.assertLess(change["output"]["ulps"], 16, change)

    @unittest.skipUnless(HAS_COMPILE, f"torch {TORCH_VERSION} has no torch.compile")
    def test_eager_against_compiled_names_the_kernel_and_the_eager_ops_it_replaced(self):
        code, report = self.diff("compiled")
        self.assertEqual((code, report["headline"]), (1, "divergent"))
        kernels = [(s["compiled_kernels"], s["compiled_kernels_b"]) for s in report["streams"]]
        self.assertEqual(sum(a for a, _ in kernels), 0, kernels)
        self.assertGreater(sum(b for _, b in kernels), 0, kernels)
        self.assert_within("compiled", 16, base="base")
        code, report = self.diff("compiled", "--fail-on", "tolerance", "--ulp", "0.5")
        self.assertEqual((code, report["headline"]), (1, "beyond tolerance"), report["gate"])
        change = report["numerics_change"]
        self.assertTrue(change["replaced_by"].startswith("inductor_kernel::cpp_fused_"), change)
        self.assertTrue(change["op"].startswith("aten::"), change)
        self.assertEqual(change["step"], 0, change)
        self.assertGreater(change["output"]["ulps"], 0.5, change)
        # The text says what was recorded: the kernels, in run B.
        r = run_detaudit(["diff", os.path.join(self.tmp, "base", "run-0"),
                          os.path.join(self.tmp, "compiled", "run-0"), "--fail-on", "tolerance",
                          "--ulp", "0.5"])
        self.assertEqual(r.returncode, 1, r.stderr)
        headline = r.stdout.splitlines()[0]
        self.assertTrue(headline.startswith(f"BEYOND TOLERANCE at rank 0 step 0 {change['phase']} "
                                            f"{change['op']} ({change['replaced_by']} in run B)"),
                        headline)
        self.assertRegex(r.stdout, r"compiled: torch.compile regions ran \(.*\); their generated "
                         r"kernel calls were recorded as inductor_kernel::<kernel>, 0 in run A "
                         r"and [1-9]\d* in run B")
        self.assertNotIn("opaque:", r.stdout)

    @unittest.skipUnless(HAS_TRANSFORMERS, "transformers and accelerate are not installed")
    def test_trainer_on_two_threads_lists_the_thread_count_then_the_first_op_that_moved(self):
        code, report = self.diff("trainer_two_threads", base="trainer")
        self.assertEqual(report["environment_differences"][0]["key"], "intra_op_threads")
        if report["verdict"] == "identical":  # kernels blocked alike on this host's threads
            self.assertEqual(code, 0, report)
            return
        self.assertEqual(code, 1)
        self.assertIn("intra_op_threads differs: 1 vs 2", report["first_divergence"]["cause"])
        # Within 64 ulp, as another torch build: fused AdamW's step 1 moved 22.5 ulp from a
        # gradient 3.1 ulp apart on an Intel Xeon's MKL, under 16 on an AMD EPYC (2026-12-08).
        code, report = self.diff("trainer_two_threads", "--fail-on", "tolerance", "--ulp", "64",
                                 base="trainer")
        self.assertEqual((code, report["headline"]), (0, "within tolerance"),
                         (report["gate"], report["numerics_change"]))
        # The first op whose values moved while every input it read agreed bit for bit (a
        # LayerNorm's backward, on this host; its kernel's inner allocations differ by thread
        # count, which the tolerance lets pass as the op's outputs are compared).
        code, report = self.diff("trainer_two_threads", "--fail-on", "tolerance", "--ulp", "0.5",
                                 base="trainer")
        self.assertEqual((code, report["headline"]), (1, "beyond tolerance"), report["gate"])
        change = report["numerics_change"]
        self.assertEqual((change["step"], change["input"]["tensor"]), (0, ""), change)


    @unittest.skipUnless(HAS_TRANSFORMERS, "transformers and accelerate are not installed")
    def test_trainer_with_eager_attention_against_sdpa_hands_on_the_same_bits(self):
        # transformers' eager attention builds a causal mask first and runs matmul, softmax and
        # matmul; its sdpa one calls F.scaled_dot_product_attention: other ops, the same bits
        # (the scale, 1/sqrt(16), is a power of two), and the same final parameters.
        report = self.assert_identical_values("trainer_eager_attention", base="trainer")
        structural = report["structural_differences"]
        details = " ".join(d["detail"] for d in structural["first"])
        self.assertIn("aten::scaled_dot_product_attention", details)
        self.assertIn("run B has", details, "the mask only the eager attention builds")
        self.assertIn("read after it reach the ops compared there", details)
        self.assertEqual(report["spread"]["divergent_ops"], 0)
        self.assertGreater(report["totals"]["ops_compared"], 1000)


@comparator_only
class AgainstTheCudaTorch(PairDiffs):
    """pip's CPU torch against the CUDA 2.14.1 CI installs for its CUDA build, both on the CPU:
    the versions first, then the first op whose numbers changed, or IDENTICAL when none did.
    CI runs it after that build (.ci/run: tests/e2e/run_one.py)."""

    @classmethod
    def jobs_to_record(cls):
        jobs = {"base": [PYTHON, MLP]}
        if CUDA_TORCH:
            jobs["cuda_torch"] = [CUDA_TORCH[0], MLP]
        return jobs

    def test_the_versions_come_first_then_the_first_op_that_changed_or_identical(self):
        if not CUDA_TORCH:
            if REQUIRE_CUDA_TORCH:
                self.fail("no interposer built for the CUDA torch (tests/cuda_build.sh)")
            self.skipTest("no interposer built for the CUDA torch (tests/cuda_build.sh builds it)")
        code, report = self.diff("cuda_torch")
        env = report["environment_differences"]
        ours, theirs = TORCH_VERSION.split("+")[0], CUDA_TORCH[1].split("+")[0]
        self.assertEqual((env[0]["key"], env[0]["a"], env[0]["b"]),
                         ("torch_version", ours, theirs), env[:3])
        self.assertGreater(report["totals"]["ops_compared"], 0)
        if report["verdict"] == "identical":
            # The same CPU kernels in both builds: every op agrees bit for bit, and says so.
            self.assertEqual(code, 0, report)
            self.assertEqual(report["spread"]["divergent_ops"], 0, report["spread"])
            return
        self.assertEqual(code, 1)
        first = report["first_divergence"]
        self.assertEqual(first["class"], "torch-build", first)
        self.assertIn(f"torch {ours} in run A, {theirs} in run B", first["cause"])


BASELINE = os.path.join(SOURCE_DIR, "tests", "e2e", "data", "baselines", "numerics_mlp")


@comparator_only
class StoredBaseline(RecordedRuns):
    """A sentinel run stored in the repository once (data/baselines/record.sh), checked against
    this CI run's: on another day, host or checkout path, within 16 ulp; and a learning rate
    changed from step 2 found there."""

    @classmethod
    def jobs_to_record(cls):
        return {"now": (["--sentinel"], [PYTHON, MLP]),
                "lr_changed": (["--sentinel"], [PYTHON, MLP, "--lr-at", "2"])}

    def check(self, name):
        self.records(name)
        r = run_detaudit(["diff", BASELINE, os.path.join(self.tmp, name, "run-0"), "--format",
                          "json", "--fail-on", "tolerance", "--ulp", "16"])
        self.assertIn(r.returncode, (0, 1), f"{r.stderr}: if the trace format changed, record "
                      f"the baseline again (tests/e2e/data/baselines/record.sh)")
        return r.returncode, json.loads(r.stdout)

    def test_this_run_matches_the_stored_baseline_within_16_ulp(self):
        code, report = self.check("now")
        self.assertEqual(code, 0, (report["first_divergence"], report["numerics_change"]))
        self.assertGreater(report["totals"]["ops_compared"], 0)

    def test_a_learning_rate_changed_at_step_2_is_found_there(self):
        code, report = self.check("lr_changed")
        self.assertEqual(code, 1)
        change = report["numerics_change"]
        self.assertEqual((change["step"], change["phase"], change["op"]),
                         (2, "optimizer", "Optimizer.step#SGD.step"), change)
        # The same gradients in, other parameters out: the update itself changed.
        self.assertTrue(change["output"]["tensor"].startswith("output "), change)
        self.assertGreater(change["output"]["ulps"], 16, change)
        # Bit for bit, another host may part sooner: torch picks its kernels by the CPU's vector
        # width (the baseline's host ran AVX2 ones; on an AVX-512 host the step-0 gradients
        # differ by ~1e-9, and the diff's environment says "CPU capability usage: AVX2 vs
        # AVX512"), within the tolerance. Never later than the change.
        first = report["first_divergence"]
        self.assertLessEqual(first["step"], 2, first)
        if first["step"] == 2:
            self.assertIn("optimizer update differs: the same gradients in", first["detail"])

    def test_a_baseline_of_the_sentinel_before_its_step_records_is_refused_in_one_line(self):
        # Recorded by the detaudit whose sentinel recorded each optimizer op (trace format 8):
        # its records do not pair with this one's, which is said, not reported as a divergence.
        self.records("now")
        r = run_detaudit(["diff", BASELINE + "_format8", os.path.join(self.tmp, "now", "run-0")])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("numerics_mlp_format8 is a sentinel run of an older detaudit (trace format "
                      "8", r.stderr)
        self.assertIn("record it again with this detaudit", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_a_full_recording_is_not_compared_with_a_sentinel_baseline(self):
        self.records("now")
        full = os.path.join(self.tmp, "full")
        r = run_detaudit(["record", "--out", full, "-q", "--", PYTHON, MLP, "--steps", "1"])
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_detaudit(["diff", BASELINE, full])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("recorded with --sentinel", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    unittest.main()
