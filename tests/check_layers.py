#!/usr/bin/env python3
"""The rooms of the code, bottom to top, and a check that no file includes a room above its own.

Written once, here; docs/how-it-works.md ("The rooms") shows the same order. A file may include
headers of its own room and of the rooms below it. `#include <...>` (system, torch) is not
checked. Exit 1 with one line per include that climbs:

    tests/check_layers.py [--root DIR]
"""
import argparse
import os
import re
import sys

# (room, what it is for), bottom first. "src" alone is src/'s top-level headers (run_layout.h).
ROOMS = [
    ("src", "where a run's files live, for every part (run_layout.h)"),
    ("src/util", "errors as values"),
    ("src/trace", "the trace format, its reader and writer, and the .status file"),
    ("src/digest", "digests and statistics of tensor bytes, on the CPU and as the GPU computes them"),
    ("src/config", "the config file and its checks"),
    ("src/catalog", "the catalog of nondeterministic ops and settings"),
    ("src/summary", "one run read back: show, export, the timeline"),
    ("src/diff", "the comparator: two runs to a verdict"),
    ("src/report", "a verdict rendered: text, JSON, JUnit, Markdown, HTML"),
    ("src/replay", "replay's judgement of an op called again, and coverage's of each op type"),
    ("src/run", "a run launched: the program, its environment, the interposer chosen"),
    ("src/preload", "the preload shim, libc only"),
    # The interposer: torch-free where it can be, above the core's recording half.
    ("hooks/include", "the marker header C++ programs include"),
    ("hooks/stream", "records on their way to the file: buffers, held records, the writer thread"),
    ("hooks/device", "the device digest on a GPU: launches and the kernel"),
    ("hooks/tensors", "tensors: which versions were described, and their digests"),
    ("hooks/collectives", "c10d collectives: what a rank sends and receives"),
    ("hooks/ops", "what an op is: schema, phase, step, scopes, generator; torch's versions"),
    ("hooks/process", "what a process and its threads are: names, Python, the environment"),
    ("hooks/capture", "replay's, coverage's and the self-test's side: ops' inputs captured, the replayer, plants"),
    ("hooks/recorder", "the op path: from the callbacks to the OP records"),
    ("hooks/attach", "loading into the process: callbacks, exit and signal safety nets"),
    ("cli", "the detaudit executable, one file per verb"),
]
ORDER = {room: i for i, (room, _) in enumerate(ROOMS)}
# Each interposer room's main header opens with "// <room>: <what the room is for>".
MAIN_HEADERS = {
    "hooks/include": "hooks/include/detaudit/marker.h",
    "hooks/stream": "hooks/stream/stream_writer.h",
    "hooks/device": "hooks/device/digest_pipeline.h",
    "hooks/tensors": "hooks/tensors/tensor_cache.h",
    "hooks/collectives": "hooks/collectives/collectives.h",
    "hooks/ops": "hooks/ops/op_schema.h",
    "hooks/process": "hooks/process/stream_identity.h",
    "hooks/capture": "hooks/capture/op_capture.h",
    "hooks/recorder": "hooks/recorder/recorder.h",
    "hooks/attach": "hooks/attach/op_callback.h",
}
# Where `#include "x/y.h"` is looked for, by the tree of the including file.
SEARCH = {"src": ["src"], "hooks": ["hooks", "src"], "cli": [".", "src", "hooks"]}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(path):
    """The deepest room holding `path` (relative to the root), or None."""
    parts = path.split("/")
    for k in range(len(parts) - 1, 0, -1):
        candidate = "/".join(parts[:k])
        if candidate in ORDER:
            return candidate
    return None


def resolve(root, including, name):
    """The file an include names, relative to the root: beside the including file first, then
    along its tree's search path. None for a header outside the tree (a dependency's)."""
    here = os.path.dirname(including)
    candidates = [os.path.join(here, name)]
    candidates += [os.path.join(d, name) for d in SEARCH.get(including.split("/")[0], [])]
    for c in candidates:
        c = os.path.normpath(c)
        if os.path.isfile(os.path.join(root, c)):
            return c
    return None


def climbing_includes(root):
    out = []
    for tree in ("src", "hooks", "cli"):
        for dirpath, _, files in os.walk(os.path.join(root, tree)):
            for f in sorted(files):
                if not f.endswith((".h", ".cpp", ".c", ".cu", ".cuh")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root)
                own = room_of(path)
                if own is None:
                    out.append(f"{path}: in no room of tests/check_layers.py; add its folder there")
                    continue
                with open(os.path.join(root, path), errors="replace") as fh:
                    text = fh.read()
                for m in INCLUDE.finditer(text):
                    target = resolve(root, path, m.group(1))
                    if target is None:
                        continue
                    theirs = room_of(target)
                    if theirs is not None and ORDER[theirs] > ORDER[own]:
                        line = text.count("\n", 0, m.start()) + 1
                        out.append(f"{path}:{line}: {own} includes {target}, of {theirs}, a room "
                                   f"above it")
    return out


def unexplained_rooms(root):
    """Interposer rooms whose main header does not open by saying what the room is for."""
    out = []
    for room, header in MAIN_HEADERS.items():
        if room == "hooks/include":
            continue  # the public header speaks to users of the marker, not of the layout
        path = os.path.join(root, header)
        first = open(path).readline() if os.path.isfile(path) else ""
        if not first.startswith(f"// {room}: "):
            out.append(f"{header}: its first line must say what {room} is for (\"// {room}: ...\")")
    return out


def doc_order_problems(root):
    """The rooms table of docs/how-it-works.md, when its order is not ROOMS' order."""
    path = os.path.join(root, "docs", "how-it-works.md")
    text = open(path).read() if os.path.isfile(path) else ""
    table = text.split("<!-- rooms:", 1)[-1].split("<!-- /rooms -->", 1)[0]
    documented = re.findall(r"^\| `([a-z/]+)/` \|", table, re.M)
    if documented != [room for room, _ in ROOMS]:
        return [f"docs/how-it-works.md: its rooms table ({', '.join(documented) or 'none'}) is not "
                f"the order of tests/check_layers.py: copy ROOMS there"]
    return []


def self_test():
    """The check fails on a tree with an include that climbs, and passes once it is gone."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        for d in ("src/trace", "src/diff"):
            os.makedirs(os.path.join(root, d))
        with open(os.path.join(root, "src/diff/diff.h"), "w") as f:
            f.write('#include "trace/format.h"\n')
        with open(os.path.join(root, "src/trace/format.h"), "w") as f:
            f.write('#include "diff/diff.h"\n')
        found = climbing_includes(root)
        assert len(found) == 1 and "src/trace/format.h:1" in found[0], found
        with open(os.path.join(root, "src/trace/format.h"), "w") as f:
            f.write("#include <string>\n")
        assert climbing_includes(root) == [], climbing_includes(root)
    print("layers: self-test passed (a climbing include is found, and only that)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--self-test", action="store_true", help="check the check on a made-up tree")
    args = ap.parse_args()
    if args.self_test:
        self_test()
    root = os.path.abspath(args.root)
    problems = climbing_includes(root) + unexplained_rooms(root) + doc_order_problems(root)
    for p in problems:
        print(f"layers: {p}", file=sys.stderr)
    if problems:
        print(f"layers: {len(problems)} include(s) climb; the order is in tests/check_layers.py",
              file=sys.stderr)
        return 1
    print(f"layers: no include climbs ({len(ROOMS)} rooms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
