"""Step time of a small CUDA CNN and a small transformer, and of two of real size (ResNet-50 and a
GPT-2-small-shaped transformer, bf16 autocast): plain, recorded with the device digest,
with the fused kernel (DETAUDIT_DEVICE_KERNEL=fused), and loaded but recording step 0 only
(the callbacks' floor), written as JSON to
DETAUDIT_GPU_BENCH_OUT (default <results>/gpu-bench.json; run.sh's results are $OUT on the
device). A benchmark, not a timed test: nothing is asserted about speed, only that the runs ran
and produced figures.

The file also holds the bytes one step's ops write, the GPU's copy bandwidth and the digest
pipeline's counters (launches, tensors, peak bytes held by open batches, why each launch), the
figures docs/performance.md needs to set the digest's cost against the memory bandwidth and the
launches. The goals (issue 42), checked here by a person reading the figures: at most 1.15x on
the two big models, at most 2x on the small ones."""
import re
import json
import os

import pytest

import gpulib

pytestmark = pytest.mark.timing

PROGRAM = gpulib.program("bench_step.py")
STEPS = os.environ.get("DETAUDIT_GPU_BENCH_STEPS", "30")
FUSED = os.environ.get("DETAUDIT_GPU_BENCH_FUSED", "1") != "0"
RESULTS = {}


def bench_line(text, what):
    lines = [l for l in text.splitlines() if l.startswith("BENCH ")]
    assert lines, f"{what}: no BENCH line in:\n{text[-3000:]}"
    return json.loads(lines[-1][len("BENCH "):])


def status_lines(run_dir, prefix):
    """The interposer's counters (`.status` files: batches, waits for a full ring)."""
    d = os.path.join(run_dir, "streams")
    lines = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".status"):
            with open(os.path.join(d, name), errors="replace") as f:
                lines += [l.strip() for l in f if l.startswith(prefix)]
    return lines


def launches(lines):
    """Launches, tensors and peak bytes held, over the processes' "device digests:" lines."""
    total = {"launches": 0, "tensors": 0, "peak_held_bytes": 0}
    for line in lines:
        m = re.match(r"device digests: (\d+) launches, (\d+) tensors, .* peak held (\d+) bytes",
                     line)
        if m:
            total["launches"] += int(m.group(1))
            total["tensors"] += int(m.group(2))
            total["peak_held_bytes"] = max(total["peak_held_bytes"], int(m.group(3)))
    return total


@pytest.mark.parametrize("model", ["cnn", "transformer", "resnet50", "gpt2"])
def test_step_time(model, gpu):
    if model == "resnet50" and "torchvision" not in gpu:
        pytest.skip(f"torchvision does not import: {gpu.get('torchvision_error')}")
    argv = [gpulib.PYTHON, PROGRAM, "--model", model, "--steps", STEPS]
    plain = gpulib.run_plain(argv + ["--count-bytes"])
    assert plain.returncode == 0, f"plain {model}: {plain.stderr[-3000:]}"
    a = bench_line(plain.stdout, f"plain {model}")
    with gpulib.TempDir() as tmp:
        proc, run_dir = gpulib.record_one(tmp, argv, flags=["--digest", "device"])
        assert proc.returncode == 0, f"recorded {model}: {gpulib.describe(proc)}"
        b = bench_line(gpulib.output_log(run_dir), f"recorded {model}")
        streams = os.listdir(os.path.join(run_dir, "streams"))
        assert any(s.endswith(".dtr") for s in streams), f"no trace was written: {streams}"
        trace_bytes = sum(os.path.getsize(os.path.join(run_dir, "streams", s)) for s in streams)
        pipeline = status_lines(run_dir, "device digests:")
        # The fused kernel: one CUDA call a launch, completion read from a word it writes, views
        # read through their strides.
        fused = None
        if FUSED:
            proc, fused_dir = gpulib.record_one(os.path.join(tmp, "fused"), argv,
                                                flags=["--digest", "device"],
                                                env={"DETAUDIT_DEVICE_KERNEL": "fused"})
            assert proc.returncode == 0, f"recorded {model}, fused kernel: {gpulib.describe(proc)}"
            fused = bench_line(gpulib.output_log(fused_dir), f"recorded {model}, fused kernel")
            fused["device_digest_pipeline"] = status_lines(fused_dir, "device digests:")
        # Loaded, recording step 0 only: the timed steps pay the callbacks, not the recording.
        proc, run_dir = gpulib.record_one(os.path.join(tmp, "floor"), argv,
                                          flags=["--digest", "device", "--steps", "0"])
        assert proc.returncode == 0, f"{model} recording step 0 only: {gpulib.describe(proc)}"
        c = bench_line(gpulib.output_log(run_dir), f"{model} recording step 0 only")
    for r in (a, b, c):
        assert r["median_ms"] > 0 and r["steps"] == int(STEPS), r
    overhead_ms = b["median_ms"] - a["median_ms"]
    result = {
        "model": model, "device": a["device"], "torch": a["torch"], "steps_timed": a["steps"],
        "plain_median_ms": a["median_ms"], "recorded_median_ms": b["median_ms"],
        "ratio": b["median_ms"] / a["median_ms"], "overhead_ms_per_step": overhead_ms,
        "recorded_fused_median_ms": fused["median_ms"] if fused else None,
        "fused_ratio": fused["median_ms"] / a["median_ms"] if fused else None,
        "fused_device_digest_pipeline": fused["device_digest_pipeline"] if fused else None,
        "loaded_not_recording_median_ms": c["median_ms"],
        "loaded_not_recording_ratio": c["median_ms"] / a["median_ms"],
        "device_digest_pipeline": pipeline,
        # Every step recorded, plus the warm-up's: per step over all of them.
        "launches_per_step": launches(pipeline)["launches"] / (int(STEPS) + b.get("warmup", 0)),
        "peak_held_bytes": launches(pipeline)["peak_held_bytes"],
        "plain": a, "recorded": b, "trace_bytes": trace_bytes,
        "ops_per_step": a.get("ops_per_step"),
        "output_bytes_per_step": a.get("output_bytes_per_step"),
        "copy_bandwidth_gbs": a.get("copy_bandwidth_gbs"),
        # Bytes written per step over the time recording added: a lower bound on how fast the
        # recorder digests (its host work is in the added time too).
        "digest_gbs_lower_bound": (a["output_bytes_per_step"] / (overhead_ms * 1e-3) / 1e9
                                   if a.get("output_bytes_per_step") and overhead_ms > 0 else None),
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("plain", "recorded")}))
    RESULTS[model] = result
    path = os.environ.get("DETAUDIT_GPU_BENCH_OUT") or os.path.join(gpulib.results_dir(),
                                                                    "gpu-bench.json")
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1)
