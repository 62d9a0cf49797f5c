"""Times a whole `detaudit run --runs 2 --sentinel` audit against what it replaces, side by side.

    .venv/bin/python tests/bench/sentinel_audit.py --build build [--steps 1000] [--race-from 900]

The program is tests/e2e/programs/long_run.py: a seeded loop whose CPU index_put race starts at
--race-from. In each repeat, interleaved: two plain runs; the sentinel audit (two sentinel runs,
then two runs recording the divergent step and the one before it in full); a pair recording only
that window in full (`--steps k-1-k`, what a user who knew the step would run); and a pair
recording every step in full. The goal (issue 48): audit <= 1.2 x (two plain runs + the window
pair).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def timed(cmd):
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    return seconds, proc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True)
    p.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--race-from", type=int, default=900)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    detaudit = os.path.join(a.build, "bin", "detaudit")
    program = [a.python, os.path.join(ROOT, "tests", "e2e", "programs", "long_run.py"),
               "--steps", str(a.steps), "--race-from", str(a.race_from)]
    times = {"plain x2": [], "sentinel audit": [], "window pair": [], "full pair": []}
    found = []
    with tempfile.TemporaryDirectory(prefix="detaudit_sentinel_bench_") as tmp:
        for r in range(a.repeats):
            plain = sum(timed(program)[0] for _ in range(2))
            times["plain x2"].append(plain)
            report = os.path.join(tmp, f"report{r}.json")
            s, proc = timed([detaudit, "run", "--runs", "2", "--sentinel", "--force", "-q",
                             "--out", os.path.join(tmp, "audit"), "--format", "json",
                             "--output", report, "--"] + program)
            times["sentinel audit"].append(s)
            with open(report) as f:
                verdict = json.load(f)
            sentinel = verdict.get("sentinel") or {}
            window = sentinel.get("full_steps") or f"{a.race_from - 1}-{a.race_from}"
            found.append((sentinel.get("step"), (verdict.get("first_divergence") or {}).get("op")))
            s, _ = timed([detaudit, "run", "--runs", "2", "--steps", window, "--force", "-q",
                          "--out", os.path.join(tmp, "window"), "--"] + program)
            times["window pair"].append(s)
            s, _ = timed([detaudit, "run", "--runs", "2", "--force", "-q",
                          "--out", os.path.join(tmp, "full"), "--"] + program)
            times["full pair"].append(s)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"long_run.py --steps {a.steps} --race-from {a.race_from}, {a.repeats} repeats, "
          f"medians; found (sentinel step, op): {found}")
    print("| what | seconds |\n|---|---:|")
    for k, v in med.items():
        print(f"| {k} | {v:.2f} |")
    budget = med["plain x2"] + med["window pair"]
    print(f"\naudit / (plain x2 + window pair) = {med['sentinel audit'] / budget:.2f} "
          f"(goal <= 1.2); audit / full pair = {med['sentinel audit'] / med['full pair']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
