#!/usr/bin/env python3
"""Splits a recorded run's callgrind profile into the recorder's stages, per recorded op.

    callgrind_stages.py RECORDED.out PLAIN.out OPS [--json]

RECORDED.out and PLAIN.out are callgrind outputs of the same C++ workload (bench.py's
--instructions runs make them), OPS the recorded ops they cover. The stages are inclusive costs
of the recorder's functions and of the call edges between them; what libtorch spends because a
callback is on (RecordFunction, boxed inputs, per-task callback lists) is the recorded run's total
less the plain one's, less the recorder's own.
"""
import json
import re
import sys
from collections import defaultdict


def own(name):
    """A function's name without the callers callgrind's --separate-callers appends ('f'g'h)."""
    return name.split("'", 1)[0]


def context(name):
    return name.split("'", 1)[1] if "'" in name else ""


class Profile:
    """Self cost per function and inclusive cost per call edge, from callgrind's format."""

    def __init__(self, path):
        self.self_cost = defaultdict(int)
        self.edges = defaultdict(int)  # (caller, callee) -> inclusive cost of the calls
        self.total = 0
        names = {}
        fn = None
        callee = None
        pending_call = False

        def name(spec):
            m = re.match(r"\((\d+)\)(?:\s+(.*))?", spec)
            if not m:
                return spec
            if m.group(2) is not None:
                names[m.group(1)] = m.group(2)
            return names.get(m.group(1), spec)

        with open(path) as f:
            for line in f:
                line = line.rstrip("\n")
                if line.startswith("fn="):
                    fn = name(line[3:])
                elif line.startswith("cfn="):
                    callee = name(line[4:])
                elif line.startswith("calls="):
                    pending_call = True
                elif line[:1].isdigit() or line[:1] in "+-*":
                    parts = line.split()
                    cost = int(parts[1]) if len(parts) > 1 else 0
                    if fn is None:
                        continue
                    if pending_call:
                        if callee != fn:  # recursion: already inside fn's own inclusive cost
                            self.edges[(fn, callee)] += cost
                        pending_call = False
                    else:
                        self.self_cost[fn] += cost
                elif line.startswith(("summary:", "totals:")):
                    self.total = int(line.split()[1])
        self._index_callers()

    def _index_callers(self):
        self.callers = defaultdict(list)
        for (a, b), c in self.edges.items():
            self.callers[b].append(a)

    def __sub__(self, other):
        """What this run spent beyond `other`'s: the same program run for fewer steps leaves the
        cost of the steps in between, without start-up and first steps."""
        out = Profile.__new__(Profile)
        out.self_cost, out.edges = defaultdict(int), defaultdict(int)
        for name in set(self.self_cost) | set(other.self_cost):
            out.self_cost[name] = self.self_cost.get(name, 0) - other.self_cost.get(name, 0)
        for edge in set(self.edges) | set(other.edges):
            out.edges[edge] = self.edges.get(edge, 0) - other.edges.get(edge, 0)
        out.total = self.total - other.total
        out._index_callers()
        return out

    def functions(self, pattern):
        rx = re.compile(pattern)
        return [f for f in set(self.self_cost) | {b for _, b in self.edges} if rx.search(own(f))]

    def inclusive(self, pattern):
        """Inclusive cost of the matching functions, not counting calls between them twice."""
        matched = set(self.functions(pattern))
        cost = 0
        for f in matched:
            cost += self.self_cost.get(f, 0)
        for (a, b), c in self.edges.items():
            if a in matched and b not in matched:
                cost += c
        return cost

    def edge(self, caller_pattern, callee_pattern, caller_context=None):
        """Calls from callers matching caller_pattern (and, for a function profiled by its callers,
        whose context matches caller_context) to callees matching callee_pattern."""
        rc, re_ = re.compile(caller_pattern), re.compile(callee_pattern)
        rx = re.compile(caller_context) if caller_context else None
        return sum(c for (a, b), c in self.edges.items()
                   if rc.search(own(a)) and re_.search(own(b)) and (not rx or rx.search(context(a))))


R = r"detaudit::hooks::ThreadRecorder::"


def stages(rec, plain_total):
    entry = rec.inclusive(r"detaudit::hooks::\(anonymous namespace\)::on_op_(start|end)\(")
    hash_in = rec.edge(R + r"(capture_tensor|capture_value)\(", R + r"describe_contents\(")
    hash_out = rec.edge(R + r"(emit_output_tensor|emit_output|emit_pending_output)\(",
                        R + r"describe_contents\(")
    capture = rec.inclusive(R + r"capture_value\(") - hash_in
    outputs = rec.inclusive(R + r"emit_output\(") + rec.inclusive(R + r"emit_pending_output\(") - hash_out
    # The hand-over is the record sink's (hooks/stream/record_sink.h), once the recorder's own.
    sink = r"detaudit::hooks::(ThreadRecorder|RecordSink)::"
    handover = (rec.edge(R + r"write_record\(", sink + r"(after_record|release_held)\(") +
                rec.edge(R + r"write_record\(", r"detaudit::hooks::StreamWriter::"))
    encode = rec.inclusive(R + r"write_record\(") - outputs - hash_out - handover
    # A device batch that an add fills is launched inside the add: that launch, and the host
    # queue's digest under it, go to their own rows below, not to the hashing that added the
    # tensor. bench.py runs callgrind with --separate-callers3=*DeviceBatch::add*, so each add's
    # context names whether an input's capture or an output's description made it.
    launch = r"DeviceBatch::launch_locked\("
    hash_in -= rec.edge(r"DeviceBatch::add\(", launch, R + r"capture_(tensor|value)\(")
    hash_out -= rec.edge(r"DeviceBatch::add\(", launch, R + r"emit_(output|pending_output)")
    describe = (rec.edge(R + r"on_start\(", R + r"(op_info|rng_state)\(") +
                rec.edge(R + r"begin_op\(", R + r"rng_state\("))
    # The device digest through the host queue (DETAUDIT_DEVICE_QUEUE=host) digests a batch when
    # it is launched, on the op's thread: what a GPU does on its stream. Launches come from the
    # op callback's guards (in place, enclosing kernel, ...): counted apart, out of that stage.
    device = rec.inclusive(r"HostQueue::enqueue\(")
    batches = rec.inclusive(r"detaudit::hooks::(DeviceBatch::(launch|launch_locked)|"
                            r"launch_batches_holding|launch_open_batches)\(") - device
    callback = (entry - capture - hash_in - outputs - hash_out - encode - handover - describe -
                device - batches)
    libtorch = rec.total - plain_total - entry
    rows = []
    if device:
        rows = [("device digest: the GPU's work, done by the host queue", device),
                ("device batches: launches and their guards", batches)]
    return rows + [
        ("libtorch: RecordFunction, boxed inputs, callback lists", libtorch),
        ("callback entry, frames, phases", callback),
        ("op description (schema, name, RNG state)", describe),
        ("input capture and cache lookup", capture),
        ("hashing and statistics, inputs", hash_in),
        ("output description and cache", outputs),
        ("hashing and statistics, outputs", hash_out),
        ("record encoding", encode),
        ("buffer hand-over", handover),
    ]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 3:
        sys.exit(__doc__)
    rec, plain = Profile(args[0]), Profile(args[1])
    ops = float(args[2])
    rows = stages(rec, plain.total)
    if "--json" in sys.argv:
        print(json.dumps({name: cost / ops for name, cost in rows}))
        return
    print("| stage | instructions/op | share |")
    print("|---|---:|---:|")
    total = sum(c for _, c in rows)
    for name, cost in rows:
        print(f"| {name} | {cost / ops:,.0f} | {100 * cost / total:.0f}% |")
    print(f"| **all** (recorded - plain) | **{(rec.total - plain.total) / ops:,.0f}** | |")


if __name__ == "__main__":
    main()
