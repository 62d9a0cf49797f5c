#!/usr/bin/env python3
"""`detaudit diff` at many ranks: time, peak memory and the causal origin, whole and split.

For each rank count it writes two runs with bench_gen_trace (R ranks x N ops, an all-reduce a
step; in run B one rank's optimizer write differs in the middle step and the all-reduce carries
it to every rank), then:
  - times `detaudit diff` of the whole runs (wall seconds, peak RSS, streams compared at once);
  - checks the verdict names the origin rank, its op and step, and every other rank's spread;
  - splits the diff into --parts parts by rank (`diff --ranks a-b --part`), merges them
    (`detaudit merge`), and checks the merged verdict equals the whole one.

    tests/bench/scale_diff.py --build build --ranks 64,256,1024 --ops 100000 --dir /tmp/scale

Each run of 1,024 ranks x 100,000 ops is 12 GB: --dir needs 2x that per size (sizes are written
one at a time and removed after, unless --keep).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time


def timed(cmd):
    """(exit code, wall seconds, peak RSS in MiB) of a command, its own rusage (wait4)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    code = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read()
    proc.stderr.close()
    if code not in (0, 1):
        sys.exit(f"{' '.join(cmd)}: exit {code}\n{err}")
    return code, wall, usage.ru_maxrss / 1024


def verdict_key(report):
    f = report["first_divergence"]
    return {
        "verdict": report["verdict"],
        "exit_code": report["exit_code"],
        "first": f and [f["stream"], f["index"], f["step"], f["op"], f["class"]],
        "spread": f and sorted(f["propagated_through"]),
        "divergent_ops": report["spread"]["divergent_ops"],
        "ops_compared": report["totals"]["ops_compared"],
        "replicas": [r["divergence"] and r["divergence"]["detail"] for r in report["replicas"]],
        "not_compared": report["not_compared"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--ops", type=int, default=100000, help="ops a rank")
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--dir", default="/tmp/detaudit_scale")
    ap.add_argument("--keep", action="store_true", help="keep the runs written")
    args = ap.parse_args()
    detaudit = os.path.join(args.build, "bin", "detaudit")
    gen = os.path.join(args.build, "bin", "bench_gen_trace")
    rows, failures = [], []
    for ranks in [int(r) for r in args.ranks.split(",")]:
        d = os.path.join(args.dir, f"r{ranks}")
        if not os.path.isdir(os.path.join(d, "run-1")):
            subprocess.run([gen, d, str(args.ops), str(ranks)], check=True,
                           stdout=subprocess.DEVNULL)
        run_a, run_b = os.path.join(d, "run-0"), os.path.join(d, "run-1")
        size = sum(os.path.getsize(os.path.join(run_a, "streams", f))
                   for f in os.listdir(os.path.join(run_a, "streams")))
        whole_json = os.path.join(d, "whole.json")
        _, wall, peak = timed([detaudit, "diff", run_a, run_b, "--no-catalog", "--format", "json",
                               "-o", whole_json])
        whole = json.load(open(whole_json))
        key = verdict_key(whole)
        origin = ranks // 2
        first = whole["first_divergence"] or {}
        spread = {int(s.split(" to rank ")[1].split(",")[0]) for s in first.get("propagated_through", [])}
        right = (first.get("rank") == origin and first.get("op") == "aten::add_" and
                 first.get("class") == "nondeterministic-op" and
                 spread == set(range(ranks)) - {origin})
        if not right:
            failures.append(f"{ranks} ranks: origin {first.get('rank')} {first.get('op')}, "
                            f"spread to {len(spread)} ranks")
        # The same diff split by ranks over --parts parts, then merged.
        per = (ranks + args.parts - 1) // args.parts
        part_files, part_walls, part_peaks = [], [], []
        for k in range(args.parts):
            lo, hi = k * per, min(ranks, (k + 1) * per) - 1
            if lo > hi:
                continue
            path = os.path.join(d, f"part-{k}.json")
            _, w, p = timed([detaudit, "diff", run_a, run_b, "--no-catalog", "--ranks",
                             f"{lo}-{hi}", "--part", path])
            part_files.append(path)
            part_walls.append(w)
            part_peaks.append(p)
        merged_json = os.path.join(d, "merged.json")
        _, merge_wall, merge_peak = timed([detaudit, "merge", *part_files, "--no-catalog",
                                           "--format", "json", "-o", merged_json])
        same = verdict_key(json.load(open(merged_json))) == key
        if not same:
            failures.append(f"{ranks} ranks: the merged verdict differs from the whole one")
        rows.append({
            "ranks": ranks, "ops_per_rank": args.ops, "trace_gb_per_run": size / 1e9,
            "wall_s": wall, "peak_mib": peak, "threads": os.cpu_count(),
            "ops_per_s_millions": whole["totals"]["ops_compared"] / wall / 1e6,
            "origin_right": right, "parts": len(part_files),
            "part_wall_s_max": max(part_walls), "part_peak_mib_max": max(part_peaks),
            "merge_wall_s": merge_wall, "merge_peak_mib": merge_peak, "merged_equals_whole": same,
        })
        print(json.dumps(rows[-1]), flush=True)
        if not args.keep:
            shutil.rmtree(d)
    print("\n| ranks | trace a run | diff | peak memory | ops compared/s | origin right | "
          f"{args.parts} parts: slowest | merge | merged = whole |")
    print("|---:|---:|---:|---:|---:|---|---:|---:|---|")
    for r in rows:
        print(f"| {r['ranks']:,} | {r['trace_gb_per_run']:.1f} GB | {r['wall_s']:.1f} s | "
              f"{r['peak_mib']:.0f} MiB | {r['ops_per_s_millions']:.2f}M | "
              f"{'yes' if r['origin_right'] else 'NO'} | {r['part_wall_s_max']:.1f} s | "
              f"{r['merge_wall_s']:.1f} s, {r['merge_peak_mib']:.0f} MiB | "
              f"{'yes' if r['merged_equals_whole'] else 'NO'} |")
    if failures:
        sys.exit("\n".join(failures))


if __name__ == "__main__":
    main()
