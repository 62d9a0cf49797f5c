"""`detaudit replay` of a CUDA op: index_add_ with 1024 duplicates of every index
(programs/race_index_add.py) recorded with the device digest, its inputs captured from a new run
on the GPU and the op called again there. The replayer's host digest of the CUDA inputs must be
the device digest the run recorded, the atomic adds must give more than one output in 20
replays, and use_deterministic_algorithms(True) (the catalog's remedy; index-add-cuda has a
deterministic implementation) must give one."""
import json
import os

import gpulib

MAIN = "r0.main.t-main"


def test_cuda_index_add_is_replayed(gpu):
    entry = gpulib.catalog_entry("index-add-cuda")
    with gpulib.TempDir() as tmp:
        proc, run = gpulib.record_one(os.path.join(tmp, "race"),
                                      [gpulib.PYTHON, gpulib.program("race_index_add.py"),
                                       "--steps", "1"], flags=["--digest", "device"])
        assert proc.returncode == 0, gpulib.describe(proc)
        ops = [op for op in gpulib.export_ops(run) if op["stream"] == MAIN]
        at = next(i for i, op in enumerate(ops) if op["name"] in entry["ops"])
        r = gpulib.run_detaudit(["replay", run, "--op", f"{MAIN}:{at}", "--replays", "20",
                                 "--format", "json"])
        assert r.returncode == 0, gpulib.describe(r)
        report = json.loads(r.stdout)
        with open(os.path.join(gpulib.results_dir(), "replay_index_add.json"), "w") as f:
            json.dump(report, f, indent=1)
        capture = report["capture"]
        assert capture["status"] == "saved" and capture["digest"] == "device", capture
        assert capture["inputs_match"], f"the replayer's digests of the CUDA inputs: {capture}"
        print(report["evidence_line"], "|", report["remedy_line"])
        assert report["evidence"] == "verified-nondeterministic", report
        remedy = next(s for s in report["series"] if s["setting"] == "under the remedy")
        assert remedy["error"] is None and remedy["distinct"] == 1, remedy
