"""Recording must not change what a CUDA program computes, bit for bit: the small CNN and
transformer of programs/bench_step.py in deterministic mode, run plain and recorded (the device
digest, and MD5's copy path), end with the same loss and the same parameter bits.

Deterministic mode because cuDNN may choose nondeterministic convolution backward algorithms:
without it, two plain runs of the CNN can already differ, and nothing could be said about the
recorder."""
import json

import pytest

import gpulib

PROGRAM = gpulib.program("bench_step.py")


def final_state(text, what):
    lines = [l for l in text.splitlines() if l.startswith("BENCH ")]
    assert lines, f"{what}: no BENCH line in:\n{text[-3000:]}"
    r = json.loads(lines[-1][len("BENCH "):])
    return r["final_loss"], r["params_checksum"]


@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_recording_leaves_the_results_alone(model, gpu):
    argv = [gpulib.PYTHON, PROGRAM, "--model", model, "--steps", "5", "--warmup", "1",
            "--deterministic"]
    plain = gpulib.run_plain(argv)
    assert plain.returncode == 0, f"plain {model}: {plain.stderr[-3000:]}"
    want = final_state(plain.stdout, f"plain {model}")
    for digest in ("device", "md5"):
        with gpulib.TempDir() as tmp:
            proc, run_dir = gpulib.record_one(tmp, argv, flags=["--digest", digest])
            assert proc.returncode == 0, f"recorded {model} ({digest}): {gpulib.describe(proc)}"
            got = final_state(gpulib.output_log(run_dir), f"recorded {model} ({digest})")
        assert got == want, (f"{model} recorded with --digest {digest} ends with loss and "
                             f"parameter checksum {got}, plain {want}")
