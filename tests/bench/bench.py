"""Times detaudit's recorder against plain runs and the peer approaches, side by side in one run.

For each workload (cnn, embed, lstm in Python and C++; gpt2, a GPT-2-shaped transformer, in Python;
with --only, hf-gpt2, the same shape as Hugging Face's GPT2LMHeadModel with its Trainer's fused
AdamW, where transformers is installed), every mode runs as its own process, the
modes interleaved in each repeat so drift hits them alike; the median ms/step is reported with its
ratio to plain, and the fastest repeats' ratio (load from other guests only adds time). The peers (Python only): a TorchDispatchMode hashing with MD5, and PyTorch's own
DebugMode where the interpreter's torch has it (--python picks the interpreter). Also: bytes
hashed per step against the digest's raw throughput (the floor), trace bytes per tensor record,
peak RSS; and the diff's records/s and memory on 10M-op runs.
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import callgrind_stages

HERE = os.path.dirname(os.path.abspath(__file__))

MODES = [
    ("plain", None),
    ("loaded, recording off", {"select": {"steps": [999999999]}}),
    ("md5 + stats", {"digest": "md5"}),
    ("md5", {"digest": "md5", "record": {"stats": False}}),
    ("sha256 + stats", {"digest": "sha256"}),
    ("sha256", {"digest": "sha256", "record": {"stats": False}}),
    ("xxh3 + stats", {"digest": "xxh3"}),
    ("xxh3", {"digest": "xxh3", "record": {"stats": False}}),
    # torch.compile's generated kernels not recorded: the regions alone, as before issue 43.
    ("xxh3 + stats, compiled kernels not recorded",
     {"digest": "xxh3", "record": {"compiled_kernels": False}}),
    # `run --sentinel`: each step's optimizer ops and loss only, to find the first divergent step.
    ("sentinel, md5 + stats", {"digest": "md5", "record": {"sentinel": True}}),
    ("sentinel, xxh3 + stats", {"digest": "xxh3", "record": {"sentinel": True}}),
    # The device digest's pipeline driven on the CPU (DETAUDIT_DEVICE_QUEUE=host): one launch for
    # many ops' tensors, and the per-op batches before it; "_env" goes to the environment.
    ("device, host queue", {"digest": "device", "_env": {"DETAUDIT_DEVICE_QUEUE": "host"}}),
    ("device, host queue, a batch per op", {"digest": "device", "record": {"device_batch_mib": 0},
                                            "_env": {"DETAUDIT_DEVICE_QUEUE": "host"}}),
    # As CudaQueue's fused kernel: strided views read in place, one CUDA call a launch.
    ("device, host queue, fused kernel",
     {"digest": "device", "_env": {"DETAUDIT_DEVICE_QUEUE": "host",
                                   "DETAUDIT_DEVICE_KERNEL": "fused"}}),
    # libtorch's own cost of a callback that needs every op's inputs and outputs: no recorder
    # on RecordFunction goes below it (callback_floor.cpp).
    ("floor: empty callback (inputs + outputs)", "floor"),
    # The op thread's share of a recorder whose work runs on another core: identity, geometry
    # and a copy of small new tensors' bytes (capture_floor.cpp).
    ("floor: capture only, hashed on another core", "capture-floor"),
    # The same, holding each new small tensor until the worker hashed it, instead of a copy;
    # and hashing it on the op's thread (the worker gets the heads alone).
    ("floor: capture only, held and hashed on another core", "capture-floor-held"),
    ("floor: capture only, hashed on the op's thread", "capture-floor-inline"),
    # Every new tensor version read once where it lies, large ones on torch's threads: the floor
    # for workloads of large tensors, where the modes above leave tensors over 64 KiB unread.
    ("floor: every new tensor hashed once, no statistics", "capture-floor-inline-all"),
    ("peer: TorchDispatchMode + MD5", "md5"),
    # What a user wanting bitwise per-op hashes picks: torch.hash_tensor of inputs and outputs.
    ("peer: DebugMode hash_tensor (inputs + outputs)", "debugmode"),
    ("peer: DebugMode norm (outputs)", "debugmode-norm"),
]
CPP_WORKLOADS = ("cnn", "embed", "lstm")  # workloads.cpp's; workloads.py also has gpt2
PEERS = ("md5", "debugmode", "debugmode-norm")  # a string config: workloads.py --peer, no interposer
# Preloaded libraries, no interposer: the floors above, and the variables that pick a variant.
FLOORS = {"floor": ("libbench_callback_floor.so", {}),
          "capture-floor": ("libbench_capture_floor.so", {}),
          "capture-floor-held": ("libbench_capture_floor.so", {"DETAUDIT_BENCH_CAPTURE": "reference"}),
          "capture-floor-inline": ("libbench_capture_floor.so", {"DETAUDIT_BENCH_CAPTURE": "inline"}),
          "capture-floor-inline-all": ("libbench_capture_floor.so",
                                       {"DETAUDIT_BENCH_CAPTURE": "inline-all"})}


def is_floor(mode_config):
    return isinstance(mode_config, str) and mode_config in FLOORS


def run_measured(cmd, env):
    """Runs cmd, returns (its JSON line, peak RSS in MB)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    _, status, usage = os.wait4(proc.pid, 0) if proc.returncode is None else (0, 0, None)
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed: {err.decode()[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


def peak_rss_mb(cmd, env):
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.execve(cmd[0], cmd, env)
    _, status, usage = os.wait4(pid, 0)
    return usage.ru_maxrss / 1024.0


# Timed steps a workload runs by default: about a second of its plain steps here, since a
# window of a few tiny-op steps moves by more than the 5% the sentinel's bar is (2026-12-08: 5 steps
# of C++ lstm gave the sentinel 1.12x; 300 steps, three pairs, 0.97-1.05x).
TIMED_STEPS = {"cnn": 12, "embed": 45, "lstm": 80, "gpt2": 20, "gpt2-compiled": 20, "hf-gpt2": 16}


def timed_steps(args, workload):
    return args.steps or TIMED_STEPS.get(workload, 5)


def workload_cmd(args, lang, workload, peer=None, steps=None, warmup=None):
    common = ["--workload", workload, "--steps", str(steps or timed_steps(args, workload)),
              "--warmup", str(args.warmup if warmup is None else warmup), "--threads", "2"]
    if lang == "python":
        peer_args = ["--peer", peer] if peer else []
        return [args.python, os.path.join(HERE, "workloads.py")] + common + peer_args
    return [os.path.join(args.torch_bin, "bench_workloads")] + common


def probe_python(python):
    """The interpreter's torch: version, the libtorch_cpu it maps, and whether it has DebugMode's
    per-op hashes."""
    code = ("import json, torch\n"
            "try:\n"
            "    from torch.utils._debug_mode import DebugMode\n"
            "    dm = hasattr(DebugMode, 'log_tensor_hashes')\n"
            "except ImportError:\n"
            "    dm = False\n"
            "lib = next((l.split()[-1] for l in open('/proc/self/maps') if '/libtorch_cpu' in l), '')\n"
            "print(json.dumps({'torch': torch.__version__, 'debugmode': dm, 'libtorch': lib}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench: {python} cannot import torch: {out.stderr[-2000:]}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    info["libtorch"] = os.path.realpath(info["libtorch"]) if info["libtorch"] else ""
    return info


def default_hooks(build, py):
    """The interposer built for this torch, as `detaudit run` picks it: the same libtorch file,
    else the same version (lib/detaudit/torch/<version>/torch.txt)."""
    for desc in sorted(glob.glob(os.path.join(build, "lib", "detaudit", "torch", "*", "torch.txt"))):
        with open(desc) as f:
            fields = dict(l.split("=", 1) for l in f.read().splitlines() if "=" in l)
        if fields.get("libtorch_cpu") == py["libtorch"] or fields.get("version") == py["torch"]:
            return os.path.join(os.path.dirname(desc), "libdetaudit_hooks.so")
    sys.exit(f"bench: no interposer in {build} for torch {py['torch']}: build one for it "
             "(docs/config.md, DETAUDIT_TORCH) or pass --hooks")


def default_torch_bin(build, python, py):
    """The C++ workloads built against the same torch: hooks/ builds them once per DETAUDIT_TORCH
    entry, in build/torch/<entry>/bin."""
    system = py["libtorch"].startswith("/usr/lib")
    for cache in sorted(glob.glob(os.path.join(build, "torch", "*", "CMakeCache.txt"))):
        with open(cache) as f:
            entry = next((l.split("=", 1)[1].strip() for l in f if l.startswith("DETAUDIT_TORCH:")), "")
        if entry == python or (system and entry == "system"):
            return os.path.join(os.path.dirname(cache), "bin")
    sys.exit(f"bench: no C++ workloads in {build}/torch/*/bin for {python}; pass --torch-bin")


BASELINE = " [baseline]"  # a recording mode run with --baseline-hooks' interposer


def with_baselines(args, modes):
    """Each recording mode, then its twin on the baseline interposer, when there is one."""
    if not args.baseline_hooks:
        return modes
    out = []
    for name, cfg in modes:
        out.append((name, cfg))
        if isinstance(cfg, dict):
            out.append((name + BASELINE, cfg))
    return out


def mode_env(args, mode_config, run_dir, name=""):
    env = dict(os.environ)
    if is_floor(mode_config):
        library, extra = FLOORS[mode_config]
        env["LD_PRELOAD"] = os.path.join(args.torch_bin, library)
        env.update(extra)
        return env
    if mode_config is None or mode_config in PEERS:
        return env
    os.makedirs(run_dir, exist_ok=True)
    config_path = os.path.join(run_dir, "config.json")
    config = dict(mode_config)
    env.update(config.pop("_env", {}))
    with open(config_path, "w") as f:
        json.dump(config, f)
    hooks = args.baseline_hooks if name.endswith(BASELINE) else args.hooks
    # As `detaudit run` starts a program: the preload shim above torch/<version>/ loads the
    # interposer (docs/how-it-works.md, "Launch"); a library placed by hand is preloaded itself.
    shim = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(hooks))),
                        "libdetaudit_preload.so")
    if os.path.exists(shim):
        env["LD_PRELOAD"] = shim
        env["DETAUDIT_INTERPOSER"] = hooks
    else:
        env["LD_PRELOAD"] = hooks
    # and its Python side first on PYTHONPATH (torch.compile's kernels, the backward's mark).
    python_hooks = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(hooks))), "python")
    if os.path.exists(os.path.join(python_hooks, "sitecustomize.py")):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (python_hooks, env.get("PYTHONPATH")) if p)
    env["DETAUDIT_RUN_DIR"] = run_dir
    env["DETAUDIT_CONFIG"] = config_path
    return env


def device_launches(run_dir):
    """Launches and tensors of the device digest's batches, over every process's .status."""
    launches = tensors = calls = 0
    streams = os.path.join(run_dir, "streams")
    for name in os.listdir(streams) if os.path.isdir(streams) else []:
        if name.endswith(".status"):
            with open(os.path.join(streams, name)) as f:
                for line in f:
                    m = re.match(r"device digests: (\d+) launches, (\d+) tensors", line)
                    if m:
                        launches += int(m.group(1))
                        tensors += int(m.group(2))
                    m = re.search(r"; (\d+) CUDA calls to launch them", line)
                    if m:
                        calls += int(m.group(1))
    return {"launches": launches, "tensors_launched": tensors, "cuda_calls": calls}


def trace_stats(args, run_dir):
    out = subprocess.run([os.path.join(args.build, "bin", "bench_trace_stats"), run_dir],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def bench_workload(args, lang, workload, raw, tmp):
    modes = with_baselines(args, [m for m in MODES if m[0] in args.modes and not (m[1] in PEERS and lang == "cpp")])
    times = {name: [] for name, _ in modes}
    cpu_times = {name: [] for name, _ in modes}
    by_thread = {name: [] for name, _ in modes}  # workloads.py's CPU ms and waits by thread
    extra = {}
    for rep in range(args.repeats):
        for name, cfg in modes:
            run_dir = os.path.join(tmp, f"{lang}-{workload}-{len(extra)}-{rep}-{abs(hash(name))}")
            env = mode_env(args, cfg, run_dir, name)
            cmd = workload_cmd(args, lang, workload, peer=cfg if cfg in PEERS else None)
            result = run_measured(cmd, env)
            times[name].append(result["ms_per_step"])
            cpu_times[name].append(result["cpu_ms_per_step"])
            if "cpu_ms_by_thread" in result:
                by_thread[name].append((result["cpu_ms_by_thread"], result["waits_by_thread"]))
            if rep == 0:
                info = {"rss_mb": peak_rss_mb(cmd, mode_env(args, cfg, run_dir + "-rss", name))}
                if isinstance(cfg, dict) and not name.startswith("loaded, recording off"):
                    info.update(trace_stats(args, run_dir))
                if isinstance(cfg, dict) and "_env" in cfg:
                    info.update(device_launches(run_dir))
                if cfg == "md5":
                    info["bytes_hashed_per_step"] = result["peer_bytes_per_step"]
                if result.get("peer_calls_per_step"):
                    info["calls_per_step"] = result["peer_calls_per_step"]
                extra[name] = info
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(run_dir + "-rss", ignore_errors=True)
    plain = statistics.median(times["plain"])
    plain_cpu = statistics.median(cpu_times["plain"])
    rows = []
    total_steps = timed_steps(args, workload) + args.warmup
    for name, cfg in modes:
        ms = statistics.median(times[name])
        info = extra.get(name, {})
        cpu = statistics.median(cpu_times[name])
        # The fastest repeats' ratio too: another guest's load only ever adds time.
        row = {"workload": f"{workload} ({lang})", "mode": name, "ms": ms, "ratio": ms / plain,
               "min_ratio": min(times[name]) / min(times["plain"]),
               "cpu_ms": cpu, "cpu_ratio": cpu / plain_cpu, "rss_mb": info.get("rss_mb"),
               "ms_samples": times[name]}  # every repeat, to judge the noise
        if by_thread[name]:
            groups = sorted({g for cpu_ms, _ in by_thread[name] for g in cpu_ms})
            row["cpu_ms_by_thread"] = {g: statistics.median(c.get(g, 0.0) for c, _ in by_thread[name])
                                       for g in groups}
            row["waits_by_thread"] = {g: statistics.median(w.get(g, 0) for _, w in by_thread[name])
                                      for g in groups}
        if "bytes_hashed" in info:
            per_step = info["bytes_hashed"] / total_steps
            algo = cfg.get("digest", "md5")
            floor_ms = per_step / (raw[algo] * 1e6) * 1e3 if algo in raw else 0
            row["mb_hashed_per_step"] = per_step / 1e6
            row["overhead_vs_floor"] = (ms - plain) / floor_ms if floor_ms > 0 else None
            row["achieved_mbps"] = per_step / 1e6 / ((ms - plain) / 1e3) if ms > plain else None
            row["raw_mbps"] = raw.get(algo)
            row["bytes_per_tensor_record"] = info["trace_bytes"] / max(1, info["tensor_records"])
            row["ns_per_op"] = (ms - plain) * 1e6 / (info["ops"] / total_steps) if info["ops"] else None
            row["ops_per_step"] = info["ops"] / total_steps
        if info.get("launches") and info.get("ops"):
            row["launches_per_op"] = info["launches"] / info["ops"]
            row["tensors_per_launch"] = info["tensors_launched"] / info["launches"]
            row["cuda_calls_per_launch"] = info["cuda_calls"] / info["launches"]
        if "bytes_hashed_per_step" in info:
            row["mb_hashed_per_step"] = info["bytes_hashed_per_step"] / 1e6
        if "calls_per_step" in info:
            row["ops_per_step"] = info["calls_per_step"]
        rows.append(row)
    return rows


INSTRUCTION_MODES = "plain,loaded, recording off,md5 + stats,xxh3 + stats"


def callgrind_instructions(args, lang, workload, name, mode_config, run_dir, steps):
    """Instructions a workload's process executes, every thread's, under callgrind: exact, and
    unmoved by other guests on a shared host, unlike time. (Callgrind's toggle on the step
    function would count the op's thread alone; the start-up, the same in both runs of a pair,
    is subtracted instead.)"""
    out = os.path.join(run_dir + "-cg", "callgrind.out")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           # A launch inside an add is told apart by who added (callgrind_stages.py).
           "--separate-callers3=*DeviceBatch::add*"]
    cmd += workload_cmd(args, lang, workload, steps=steps, warmup=1)
    env = mode_env(args, mode_config, run_dir, name)
    # Valgrind runs one thread at a time: an OpenMP worker spinning at a barrier would count the
    # turns it is given, work that time on a free core does not show. Sleeping waits leave work.
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    env["PYTHONHASHSEED"] = "0"  # the same start-up in both runs of a pair
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out


def bench_instructions(args, tmp):
    """Per workload and mode: instructions per step and per recorded op, two runs at a time, and
    for each recording mode the recorder's stages (callgrind_stages.py). Each is run for STEPS and
    for 2 x STEPS steps after one warm-up: the difference is STEPS steady steps, without start-up
    and the first step (which a sentinel records in full)."""
    steps = 3
    configs = dict(MODES)
    configs.update({name + BASELINE: cfg for name, cfg in MODES})
    wanted = ["plain"] + [n for n in re.split(r",(?! )", args.instruction_modes) if n and n != "plain"]
    names = [name for name, _ in with_baselines(args, [(n, configs[n]) for n in wanted])]
    jobs = []
    for workload in [w for w in args.only.split(",") if w]:
        for lang in args.langs.split(","):
            if lang == "cpp" and workload not in CPP_WORKLOADS:
                continue
            for name in names:
                for n in (steps, 2 * steps):
                    jobs.append((lang, workload, name, n,
                                 os.path.join(tmp, f"cg-{lang}-{workload}-{n}-{abs(hash(name))}")))
    runs = {}
    for i in range(0, len(jobs), 2):
        started = [((lang, workload, name, n, run_dir),
                    *callgrind_instructions(args, lang, workload, name, configs[name], run_dir, n))
                   for lang, workload, name, n, run_dir in jobs[i:i + 2]]
        for (lang, workload, name, n, run_dir), proc, out in started:
            if proc.wait() != 0:
                sys.exit(f"bench: callgrind failed for {workload} ({lang}) {name}")
            ops = None
            if isinstance(configs[name], dict) and not name.startswith("loaded, recording off"):
                ops = trace_stats(args, run_dir)["ops"]
            runs[(lang, workload, name, n)] = (callgrind_stages.Profile(out), ops)
            print(f"done instructions {workload} ({lang}) {name} {n} steps", file=sys.stderr, flush=True)
    rows = []
    for lang, workload, name, n, _ in jobs:
        if n != steps:
            continue
        (short, short_ops), (long, long_ops) = runs[(lang, workload, name, steps)], runs[(lang, workload, name, 2 * steps)]
        plain_short, plain_long = runs[(lang, workload, "plain", steps)][0], runs[(lang, workload, "plain", 2 * steps)][0]
        steady, plain_steady = long - short, plain_long - plain_short
        per_step, plain_per_step = steady.total / steps, plain_steady.total / steps
        ops = (long_ops - short_ops) / steps if short_ops is not None else None
        row = {"workload": f"{workload} ({lang})", "mode": name, "instructions_per_step": per_step,
               "ratio": per_step / plain_per_step, "ops_per_step": ops,
               "instructions_per_op": (per_step - plain_per_step) / ops if ops else None}
        if ops:
            row["stages_per_op"] = {stage: cost / (ops * steps) for stage, cost in
                                    callgrind_stages.stages(steady, plain_steady.total)}
        rows.append(row)
    return rows


def bench_diff(args, n_ops, tmp):
    d = os.path.join(tmp, f"diff-{n_ops}")
    subprocess.run([os.path.join(args.build, "bin", "bench_gen_trace"), d, str(n_ops)], check=True,
                   capture_output=True)
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
    cmd = [args.detaudit, "diff", f"{d}/run-0", f"{d}/run-1", "--no-catalog"]
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.execv(cmd[0], cmd)
    _, status, usage = os.wait4(pid, 0)
    elapsed = time.perf_counter() - t0
    shutil.rmtree(d, ignore_errors=True)
    records = 2 * n_ops
    return {"ops_per_run": n_ops, "seconds": elapsed, "records_per_s": records / elapsed,
            "mb_per_s": size / 1e6 / elapsed, "rss_mb": usage.ru_maxrss / 1024.0,
            "exit": os.waitstatus_to_exitcode(status)}


FIGURES = os.path.join(HERE, "figures.json")
REGRESSION = 1.10  # a mode this much slower than its committed ratio fails the bench


def check_figures(rows, path, update):
    """Each row's ratio against the committed one (figures.json, beside the bench): a row fails
    when both its median and its fastest repeats' ratios are 10% above the committed ratio (load
    from other guests only ever adds time, so a row slow in every repeat is slow). --update-figures
    writes the rows' ratios instead. Returns the failing rows' lines."""
    committed = {}
    if os.path.exists(path):
        with open(path) as f:
            committed = json.load(f)["ratios"]
    if update:
        committed.update({f"{r['workload']} | {r['mode']}": round(r["ratio"], 3)
                          for r in rows if r["mode"] != "plain"})
        with open(path, "w") as f:
            json.dump({"about": "x plain per workload and mode, median of paired repeats; "
                                "tests/bench/run.sh fails on a row 10% above its figure "
                                "(docs/performance.md)", "ratios": committed}, f, indent=1,
                      sort_keys=True)
            f.write("\n")
        return []
    failing = []
    for r in rows:
        figure = committed.get(f"{r['workload']} | {r['mode']}")
        if figure and min(r["ratio"], r["min_ratio"]) > figure * REGRESSION:
            failing.append(f"| {r['workload']} | {r['mode']} | {r['ratio']:.2f} | "
                           f"{r['min_ratio']:.2f} | {figure:.2f} |")
    return failing


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True)
    p.add_argument("--python", default=os.path.join(HERE, "..", "..", ".venv", "bin", "python"),
                   help="the interpreter of the Python workloads (default: <source>/.venv's); "
                        "the C++ workloads use the same torch")
    p.add_argument("--hooks", help="the interposer (default: the build's, for --python's torch)")
    p.add_argument("--baseline-hooks", help="another interposer (the one before a change): each "
                   "recording mode also runs on it, interleaved, as '<mode> [baseline]'")
    p.add_argument("--torch-bin", help="the C++ workloads' directory (default: the build's, "
                                       "for --python's torch)")
    p.add_argument("--detaudit", help="the CLI whose diff is timed (default: the build's)")
    p.add_argument("--modes", help="comma-separated mode names to run, plain always; default all")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each mode; 0: none (--instructions alone)")
    p.add_argument("--steps", type=int, help="timed steps a run (default: TIMED_STEPS, about 1 s of each)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--only", default="cnn,embed,lstm,gpt2")
    p.add_argument("--langs", default="python,cpp")
    p.add_argument("--quick", action="store_true", help="1 repeat, 3 steps, 1M-op diff")
    p.add_argument("--no-diff", action="store_true")
    p.add_argument("--diff-ops", type=int, default=10_000_000)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--figures", default=FIGURES, help="the committed ratios a run is checked "
                   "against (default: tests/bench/figures.json)")
    p.add_argument("--update-figures", action="store_true",
                   help="write this run's ratios into --figures instead of checking them")
    p.add_argument("--instruction-modes", default=INSTRUCTION_MODES,
                   help="the modes --instructions counts, comma-separated (plain always)")
    p.add_argument("--instructions", action="store_true",
                   help="also count instructions per steady step under callgrind, each workload in "
                        "--only and --langs")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.steps, args.diff_ops = 1, 3, 1_000_000
    names = [name for name, _ in MODES]
    # A comma followed by a space is inside a name ("loaded, recording off").
    chosen = names if args.modes is None else ["plain"] + [m.strip() for m in re.split(r",(?! )", args.modes)]
    args.modes = {m for m in chosen if m}
    if args.modes - set(names):
        sys.exit(f"bench: unknown modes {sorted(args.modes - set(names))}; known: {names}")
    args.python = os.path.abspath(args.python) if os.sep in args.python else args.python
    py = probe_python(args.python)
    print(f"python workloads: {args.python}, torch {py['torch']}", flush=True)
    if not py["debugmode"] and "python" in args.langs.split(","):
        # DebugMode and its log_tensor_hashes are torch 2.x prototypes; older torch skips that peer.
        dropped = {name for name, cfg in MODES if cfg in ("debugmode", "debugmode-norm")} & args.modes
        if dropped:
            print(f"DebugMode unavailable in torch {py['torch']}: skipping {sorted(dropped)}", flush=True)
        args.modes -= dropped
    args.hooks = args.hooks or default_hooks(args.build, py)
    if "cpp" in args.langs.split(",") or any(is_floor(cfg) for name, cfg in MODES if name in args.modes):
        args.torch_bin = args.torch_bin or default_torch_bin(args.build, args.python, py)
    if not os.path.exists(args.hooks):
        sys.exit(f"bench: no interposer at {args.hooks}")
    args.detaudit = args.detaudit or os.path.join(args.build, "bin", "detaudit")

    raw = json.loads(subprocess.run([os.path.join(args.build, "bin", "bench_hash_speed")],
                                    check=True, capture_output=True, text=True).stdout)
    print(f"raw throughput on this machine, MB/s: {raw}", flush=True)
    tmp = tempfile.mkdtemp(prefix="detaudit-bench-")
    rows = []
    try:
        timed = [w for w in args.only.split(",") if w] if args.repeats else []  # --only "": the diff alone
        for workload in timed:
            for lang in args.langs.split(","):
                if lang == "cpp" and workload not in CPP_WORKLOADS:
                    continue  # Python only: the transformer is the Hugging Face run's shape
                rows += bench_workload(args, lang, workload, raw, tmp)
                print(f"done {workload} ({lang})", file=sys.stderr, flush=True)
        diffs = [] if args.no_diff else [bench_diff(args, n, tmp) for n in (args.diff_ops // 10, args.diff_ops)]
        instructions = bench_instructions(args, tmp) if args.instructions else []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print("\n| workload | mode | ms/step | x plain | x plain, fastest | CPU ms/step | CPU x plain | MB hashed/step | overhead / floor | achieved MB/s (raw) | B/tensor record | ns/op | peak RSS MB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        achieved = ("-" if r.get("achieved_mbps") is None or r.get("raw_mbps") is None
                    else f"{r['achieved_mbps']:.0f} ({r['raw_mbps']:.0f})")
        print(f"| {r['workload']} | {r['mode']} | {r['ms']:.1f} | {r['ratio']:.2f} | {r['min_ratio']:.2f} | "
              f"{r['cpu_ms']:.1f} | {r['cpu_ratio']:.2f} | "
              f"{fmt(r.get('mb_hashed_per_step'), '.1f')} | {fmt(r.get('overhead_vs_floor'), '.2f')} | "
              f"{achieved} | {fmt(r.get('bytes_per_tensor_record'), '.1f')} | {fmt(r.get('ns_per_op'), '.0f')} | "
              f"{fmt(r.get('rss_mb'), '.0f')} |")
    split = [r for r in rows if r.get("cpu_ms_by_thread")]
    if split:
        # Where the CPU time goes (Python workloads): the op's thread, detaudit's own threads, and
        # the rest (torch's OpenMP workers, which spin between parallel regions).
        print("\n| workload | mode | CPU ms/step: main | detaudit-writer | detaudit-md5 | other "
              "(OpenMP) | writer sleeps/step |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for r in split:
            c, w = r["cpu_ms_by_thread"], r["waits_by_thread"]
            print(f"| {r['workload']} | {r['mode']} | {c.get('main', 0):.1f} | "
                  f"{c.get('detaudit-writer', 0):.1f} | {c.get('detaudit-md5', 0):.1f} | "
                  f"{c.get('other', 0):.1f} | {w.get('detaudit-writer', 0):.1f} |")
    launched = [r for r in rows if r.get("launches_per_op") is not None]
    if launched:
        print("\n| workload | mode | recorded ops/step | launches per recorded op | tensors per launch "
              "| CUDA calls per launch |")
        print("|---|---|---:|---:|---:|---:|")
        for r in launched:
            print(f"| {r['workload']} | {r['mode']} | {r['ops_per_step']:.0f} | "
                  f"{r['launches_per_op']:.3f} | {r['tensors_per_launch']:.1f} | "
                  f"{r['cuda_calls_per_launch']:.2f} |")
    if diffs:
        print("\n| diff: ops per run | seconds | records/s | MB/s | peak RSS MB | exit |")
        print("|---:|---:|---:|---:|---:|---:|")
        for d in diffs:
            print(f"| {d['ops_per_run']:,} | {d['seconds']:.2f} | {d['records_per_s'] / 1e6:.2f}M | "
                  f"{d['mb_per_s']:.0f} | {d['rss_mb']:.0f} | {d['exit']} |")
    if instructions:
        print("\n| workload | mode | instructions/step, all threads | x plain | recorded ops/step | "
              "instructions/op |")
        print("|---|---|---:|---:|---:|---:|")
        for r in instructions:
            print(f"| {r['workload']} | {r['mode']} | {r['instructions_per_step'] / 1e6:.1f}M | "
                  f"{r['ratio']:.3f} | {fmt(r['ops_per_step'], '.0f')} | {fmt(r['instructions_per_op'], '.0f')} |")
        staged = [r for r in instructions if r.get("stages_per_op")]
        if staged:
            print("\nInstructions per recorded op, by stage (tests/bench/callgrind_stages.py):\n")
            print("| stage | " + " | ".join(f"{r['workload']} {r['mode']}" for r in staged) + " |")
            print("|---|" + "---:|" * len(staged))
            names = []
            for r in staged:
                names += [n for n in r["stages_per_op"] if n not in names]
            for stage in names:
                print(f"| {stage} | " + " | ".join(fmt(r["stages_per_op"].get(stage), ",.0f")
                                                  for r in staged) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"raw": raw, "rows": rows, "diff": diffs, "instructions": instructions}, f, indent=1)
    # Baseline rows are another interposer's: not this build's figures.
    failing = check_figures([r for r in rows if not r["mode"].endswith(BASELINE)], args.figures,
                            args.update_figures)
    if failing:
        print(f"\nREGRESSION: slower than the committed figures ({args.figures}) by more than "
              f"{REGRESSION - 1:.0%}:\n")
        print("| workload | mode | x plain | x plain, fastest | committed |")
        print("|---|---|---:|---:|---:|")
        print("\n".join(failing))
        sys.exit(1)


if __name__ == "__main__":
    main()
