"""Helpers of the GPU tests: where detaudit and the CUDA Python are, running the CLI, reading
reports and what the programs printed.

tests/gpu/run.sh sets the same variables as the end-to-end tests (tests/e2e/detaudit_testlib.py):
DETAUDIT_BIN, DETAUDIT_PYTHON (the Python whose torch has CUDA), DETAUDIT_TORCH_BIN (the bin/ of
the interposer's build), DETAUDIT_SOURCE_DIR; and DETAUDIT_GPU_RESULTS, where figures are written.
Nothing here imports torch or looks for an interposer when imported: collection must work on a
machine without a GPU, without a build.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SOURCE_DIR = os.environ.get(
    "DETAUDIT_SOURCE_DIR",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def _default_build_dir():
    gpu = os.path.join(SOURCE_DIR, "build", "gpu", "cli")
    return gpu if os.path.isdir(gpu) else os.path.join(SOURCE_DIR, "build")


def _default_python():
    venv = os.path.join(SOURCE_DIR, ".venv-cuda", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


BUILD_DIR = os.environ.get("DETAUDIT_BUILD_DIR", _default_build_dir())
BIN = os.environ.get("DETAUDIT_BIN", os.path.join(BUILD_DIR, "bin", "detaudit"))
PYTHON = os.environ.get("DETAUDIT_PYTHON") or _default_python()
TORCH_BIN = os.environ.get("DETAUDIT_TORCH_BIN",
                           os.path.join(SOURCE_DIR, "build", "gpu", "hooks", "bin"))
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")
CATALOG = os.path.join(SOURCE_DIR, "configs", "catalog.json")
TIMEOUT = 600


def program(name):
    return os.path.join(PROGRAMS, name)


def results_dir():
    """Where figures go: $DETAUDIT_GPU_RESULTS (run.sh: $OUT), else the build's results/."""
    d = os.environ.get("DETAUDIT_GPU_RESULTS") or os.path.join(SOURCE_DIR, "build", "gpu", "results")
    os.makedirs(d, exist_ok=True)
    return d


def run_detaudit(args, env=None, timeout=TIMEOUT):
    """`detaudit ARGS...`; the CompletedProcess, text output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([BIN] + [str(a) for a in args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def run_plain(argv, timeout=TIMEOUT):
    """A program without detaudit."""
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout)


def record_pair(out, command, flags=()):
    """`detaudit run --runs 2 --format json --output OUT/report.json FLAGS -- COMMAND`.

    Returns (CompletedProcess, report dict or None when no report was written, e.g. when the
    program failed)."""
    report = os.path.join(out, "report.json")
    r = run_detaudit(["run", "--runs", "2", "--out", out, "--format", "json", "--output",
                      report, "-q", *flags, "--", *command])
    return r, (read_json(report) if os.path.exists(report) else None)


def record_one(out, command, flags=(), env=None):
    """`detaudit run --runs 1 --out OUT -q FLAGS -- COMMAND`; (CompletedProcess, run-0 path)."""
    r = run_detaudit(["run", "--runs", "1", "--out", out, "-q", *flags, "--", *command], env=env)
    return r, os.path.join(out, "run-0")


def export_ops(run_dir):
    """The op records of a run (`detaudit export`)."""
    r = run_detaudit(["export", run_dir])
    if r.returncode != 0:
        raise AssertionError(f"detaudit export {run_dir}: exit {r.returncode}\n{r.stderr}")
    recs = (json.loads(line) for line in r.stdout.splitlines() if line.strip())
    return [rec for rec in recs if rec.get("record") == "op"]


def tensors(values):
    """The tensor values of an inputs/outputs list, nested lists flattened."""
    out = []
    for v in values:
        if isinstance(v, list):
            out.extend(tensors(v))
        elif isinstance(v, dict) and "tensor" in v:
            out.append(v)
    return out


def output_log(run_dir):
    path = os.path.join(run_dir, "output.log")
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def device_digest_status(run_dir):
    """The first `device digests: ...` line of a run's .status files ("" if none)."""
    d = os.path.join(run_dir, "streams")
    for name in sorted(os.listdir(d)):
        if name.endswith(".status"):
            with open(os.path.join(d, name), errors="replace") as f:
                for line in f:
                    if line.startswith("device digests:"):
                        return line.strip()
    return ""


def printed(run_dir, pattern):
    """re.findall(pattern) over what the recorded program printed."""
    return re.findall(pattern, output_log(run_dir))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def catalog_entry(entry_id):
    for e in read_json(CATALOG)["entries"]:
        if e["id"] == entry_id:
            return e
    raise AssertionError(f"no catalog entry {entry_id} in {CATALOG}")


def describe(proc, report=None, limit=4000):
    """What to show when an assertion about a detaudit run fails."""
    text = f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-limit:]}\n--- stderr\n{proc.stderr[-limit:]}"
    if report is not None:
        text += "\n--- first_divergence\n" + json.dumps(report.get("first_divergence"), indent=1)[:limit]
    return text


class TempDir:
    """with TempDir() as d: ...  (kept when DETAUDIT_KEEP_TMP=1)"""

    def __enter__(self):
        self.path = tempfile.mkdtemp(prefix="detaudit_gpu_")
        return self.path

    def __exit__(self, *exc):
        if os.environ.get("DETAUDIT_KEEP_TMP") != "1":
            shutil.rmtree(self.path, ignore_errors=True)
        return False
