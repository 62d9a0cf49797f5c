"""One real program audited on the GPU: pytorch/examples' word_language_model (LSTM, seeded by
the program itself) with --accel, on a generated corpus, unchanged. It needs a checkout of the
public pytorch/examples repository (CI cannot fetch one), named by DETAUDIT_GPU_EXAMPLES; without
it the test skips saying so.

Two runs recorded with the device digest give a verdict; a third run, plain, gives the step time
the program itself prints (ms/batch), set against the recorded run's. The verdict, the first
divergence if any, and both step times go to <results>/gpu-real-program.json.

What is asserted is what a user relies on: detaudit exits 0 (identical) or 1 (divergent) with a
report that says the same, and a divergence comes with its class, op, step and phase; one called
a nondeterministic op has inputs that agree.
"""
import json
import os
import random
import re
import statistics

import pytest

import gpulib

pytestmark = pytest.mark.timing

EXAMPLES = os.environ.get("DETAUDIT_GPU_EXAMPLES", "")
MS_PER_BATCH = re.compile(r"ms/batch\s+([\d.]+)")


def write_corpus(d, lines=4000, vocab=2000):
    """A seeded corpus of wikitext-2's shape: train/valid/test.txt, one sentence a line."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(vocab)]
    os.makedirs(d, exist_ok=True)
    for name, n in (("train", lines), ("valid", lines // 8), ("test", lines // 8)):
        with open(os.path.join(d, f"{name}.txt"), "w") as f:
            for _ in range(n):
                f.write(" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) + "\n")


def step_ms(text, what):
    """The median of the ms/batch the program printed, its first report (warm-up) left out."""
    values = [float(v) for v in MS_PER_BATCH.findall(text)]
    assert len(values) >= 3, f"{what}: fewer than 3 'ms/batch' reports in:\n{text[-3000:]}"
    return statistics.median(values[1:])


def test_word_language_model_on_cuda(gpu):
    main = os.path.join(EXAMPLES, "word_language_model", "main.py")
    if not os.path.isfile(main):
        pytest.skip(f"no pytorch/examples checkout: set DETAUDIT_GPU_EXAMPLES "
                    f"(now {EXAMPLES or 'unset'}) to one")
    with gpulib.TempDir() as tmp:
        corpus = os.path.join(tmp, "corpus")
        write_corpus(corpus)

        def argv(save):
            return [gpulib.PYTHON, main, "--accel", "--data", corpus, "--epochs", "1",
                    "--log-interval", "10", "--save", os.path.join(tmp, save)]

        plain = gpulib.run_plain(argv("plain.pt"))
        assert plain.returncode == 0, f"plain run: {plain.stderr[-3000:]}"
        assert "Using device: cuda" in plain.stdout, plain.stdout[-2000:]
        out = os.path.join(tmp, "audit")
        proc, report = gpulib.record_pair(out, argv("recorded.pt"), flags=["--digest", "device"])
        assert report is not None, f"no report: {gpulib.describe(proc)}"
        assert (proc.returncode, report["verdict"]) in ((0, "identical"), (1, "divergent")), \
            gpulib.describe(proc, report)
        recorded = gpulib.output_log(os.path.join(out, "run-0"))
        plain_ms, recorded_ms = step_ms(plain.stdout, "plain"), step_ms(recorded, "recorded")
        fd = report.get("first_divergence")
        result = {
            "program": "pytorch/examples word_language_model/main.py --accel (LSTM, 1 epoch)",
            "device": gpu.get("name"), "torch": gpu.get("torch"),
            "exit": proc.returncode, "verdict": report["verdict"],
            "first_divergence": None if fd is None else {
                k: fd.get(k) for k in ("class", "op", "chain", "step", "phase", "rank",
                                       "args_differ")} | {
                "catalog": (fd.get("catalog") or {}).get("id")},
            "plain_ms_per_batch": plain_ms, "recorded_ms_per_batch": recorded_ms,
            "ratio": recorded_ms / plain_ms,
            "summary": proc.stdout.strip().splitlines()[:3],
        }
        print(json.dumps(result))
        with open(os.path.join(gpulib.results_dir(), "gpu-real-program.json"), "w") as f:
            json.dump(result, f, indent=1)
        if report["verdict"] == "divergent":
            assert fd and fd.get("class") and fd.get("op") and fd.get("phase"), fd
            if fd["class"] == "nondeterministic-op":
                assert not any(t["differs"] for t in fd["inputs"]), fd["inputs"]
