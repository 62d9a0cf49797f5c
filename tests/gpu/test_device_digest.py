"""The device digest and statistics equal the CPU reference, bit for bit, for every dtype and for
non-contiguous inputs: detaudit_device_digest_check (built by hooks/ when torch has CUDA) runs
the kernel on the GPU and the shared __host__ __device__ code on the host copy, and exits 0 only
when every case matches. Its THROUGHPUT line (the kernel's GB/s against a copy's) goes to
<results>/gpu-digest.json."""
import json
import os
import subprocess

import pytest

import gpulib

pytestmark = pytest.mark.timing  # its throughput is measured alone

CHECK = os.path.join(gpulib.TORCH_BIN, "detaudit_device_digest_check")


def test_device_digest_equals_cpu_reference(gpu):
    if not os.access(CHECK, os.X_OK):
        pytest.skip(f"{CHECK} is not built (hooks/ builds it against a CUDA torch)")
    r = subprocess.run([CHECK], capture_output=True, text=True, timeout=600)
    print(r.stdout[-8000:], r.stderr[-4000:])
    assert r.returncode == 0, (
        f"{CHECK} exit {r.returncode}: device digests or statistics differ from the CPU "
        f"reference\n--- stdout\n{r.stdout[-6000:]}\n--- stderr\n{r.stderr[-3000:]}")
    line = [l for l in r.stdout.splitlines() if l.startswith("THROUGHPUT ")]
    assert line, f"{CHECK} printed no THROUGHPUT line"
    figures = json.loads(line[-1][len("THROUGHPUT "):])
    assert figures["digest_1gib_gbs"] > 0 and figures["copy_1gib_read_write_gbs"] > 0, figures
    with open(os.path.join(gpulib.results_dir(), "gpu-digest.json"), "w") as f:
        json.dump(figures, f, indent=1)
