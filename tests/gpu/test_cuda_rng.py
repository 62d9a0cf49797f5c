"""A CUDA dropout left unseeded (programs/cuda_dropout_unseeded.py reseeds CUDA's generator from
the OS after a seeded init) is reported as rng-state at the dropout, not as a nondeterministic
op: each random op on CUDA records its generator's seed and offset."""
import os

import gpulib

PROGRAM = gpulib.program("cuda_dropout_unseeded.py")
RANDOM_OPS = ("aten::bernoulli_", "aten::bernoulli", "aten::dropout", "aten::native_dropout",
              "aten::rand_like", "aten::uniform_")


def test_unseeded_cuda_dropout_is_rng_state(gpu):
    with gpulib.TempDir() as tmp:
        proc, report = gpulib.record_pair(tmp, [gpulib.PYTHON, PROGRAM, "--steps", "2"],
                                          flags=["--digest", "device"])
        seeds = [gpulib.printed(os.path.join(tmp, f"run-{i}"), r"cuda seed (\d+)") for i in (0, 1)]
        assert seeds[0] and seeds[1], f"the program did not run: {gpulib.describe(proc)}"
        # Ground truth: the program's CUDA seeds differ (64 random bits: equal only by chance).
        assert seeds[0] != seeds[1], f"both runs drew CUDA seed {seeds[0]}"
        assert report is not None, gpulib.describe(proc)
        assert proc.returncode == 1 and report["verdict"] == "divergent", gpulib.describe(proc, report)
        fd = report["first_divergence"]
        assert fd["class"] == "rng-state", gpulib.describe(proc, report)
        assert fd["op"] in RANDOM_OPS or any(op in RANDOM_OPS for op in fd["chain"]), fd["chain"]
        assert fd["random"] is True
        assert fd["rng"]["a"] != fd["rng"]["b"], fd["rng"]
        assert (fd["step"], fd["phase"]) == (0, "forward"), (fd["step"], fd["phase"])
        assert any((t["a"] or {}).get("device", "").startswith("cuda") for t in fd["outputs"]), \
            fd["outputs"]
        assert "seed" in fd["remedy"], fd["remedy"]
