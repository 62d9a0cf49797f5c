"""torch.compile on CUDA: the Triton kernel inductor generates with atomic adds (the backward of a
gather, programs/compiled_index_add_cuda.py) is recorded as inductor_kernel::<kernel>; two
recorded runs whose gradients differ name it, class nondeterministic-op, with its aten origin and
the catalog's inductor-cuda-atomic-add; with use_deterministic_algorithms(True) the runs are
identical. Up to DETAUDIT_GPU_RACE_PAIRS pairs, as the catalog races are."""
import os
import subprocess

import pytest

import gpulib

PAIRS = int(os.environ.get("DETAUDIT_GPU_RACE_PAIRS", "3"))
PROGRAM = gpulib.program("compiled_index_add_cuda.py")
CHECKSUM = r"step (\d+) .* checksum (\w+)"


def has_triton():
    return subprocess.run([gpulib.PYTHON, "-c", "import triton"], capture_output=True).returncode == 0


def test_a_triton_race_is_named_at_its_kernel(gpu):
    if not has_triton():
        pytest.skip("torch.compile on CUDA needs triton, not importable by " + gpulib.PYTHON)
    with gpulib.TempDir() as tmp:
        for attempt in range(PAIRS):
            out = os.path.join(tmp, f"pair-{attempt}")
            proc, report = gpulib.record_pair(out, [gpulib.PYTHON, PROGRAM],
                                              flags=["--digest", "device"])
            assert report is not None, gpulib.describe(proc)
            a, b = (gpulib.printed(os.path.join(out, f"run-{i}"), CHECKSUM) for i in (0, 1))
            assert a, gpulib.output_log(os.path.join(out, "run-0"))[-3000:]
            if a == b:
                assert report["verdict"] == "identical", gpulib.describe(proc, report)
                continue
            fd = report["first_divergence"]
            assert fd["op"].startswith("inductor_kernel::triton_"), gpulib.describe(proc, report)
            assert fd["class"] == "nondeterministic-op", gpulib.describe(proc, report)
            assert "atomic adds" in (fd["kernel_origin"] or ""), fd["kernel_origin"]
            assert fd["catalog"] and fd["catalog"]["id"] == "inductor-cuda-atomic-add", fd["catalog"]
            assert not any(t["differs"] for t in fd["inputs"]), fd["inputs"]
            return
        pytest.fail(f"not reproduced: the gradients agreed in {PAIRS} recorded pairs")


def test_deterministic_mode_makes_the_compiled_runs_identical(gpu):
    if not has_triton():
        pytest.skip("torch.compile on CUDA needs triton, not importable by " + gpulib.PYTHON)
    with gpulib.TempDir() as tmp:
        proc, report = gpulib.record_pair(tmp, [gpulib.PYTHON, PROGRAM, "--deterministic"],
                                          flags=["--digest", "device"])
        assert proc.returncode == 0 and report["verdict"] == "identical", \
            gpulib.describe(proc, report)
        kernels = sum(s["compiled_kernels"] for s in report["streams"])
        assert kernels > 0, "no generated kernel was recorded"
