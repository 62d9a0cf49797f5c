"""Small programs whose verdict a gate must get right, one per case:

    python gate_cases.py shuffle       # random.shuffle (unseeded) of samples torch made, stacked
    python gate_cases.py scalar        # a scalar from Python's unseeded random passed to an op
    python gate_cases.py item          # .item() of a seeded tensor, printed
    python gate_cases.py garbage [--zeros-like]
                                       # a sum over torch.empty bytes no op wrote (the freed
                                       # memory held a run-dependent value), with or without an
                                       # unrelated zeros_like in between
    python gate_cases.py out-buffers   # resize_ and out= buffers over garbage, all overwritten
    python gate_cases.py set-order     # seeded parameters created while iterating a set of
                                       # names: their order follows Python's hash randomization;
                                       # one forward and backward, no optimizer (torch 2's
                                       # imports torch._dynamo, seconds of CPU a run)
    python gate_cases.py overwritten [--read-first] [--out] [--after-training]
                                       # the CPU index_put_(accumulate=True) race writes a
                                       # scratch buffer, overwritten in full (copy_, or an out=
                                       # op) before any op reads it, unless --read-first; with
                                       # --after-training, three seeded SGD steps first and the
                                       # race in an evaluation after them (no_grad), from the
                                       # trained weight
Each prints what the test compares with the verdict. Several cases run one after the other in
one process, in the order given: cases with the same verdict share one recorded pair.

    python gate_cases.py overwritten item out-buffers set-order
"""
import hashlib
import random
import sys
import time

import numpy as np
import torch


def md5(t):
    return hashlib.md5(t.detach().contiguous().numpy().tobytes()).hexdigest()


def shuffle():
    torch.manual_seed(0)
    samples = [torch.randn(16) for _ in range(64)]
    random.shuffle(samples)  # the bug: Python's random is not seeded
    w = torch.randn(16, 4)
    for step in range(2):
        batch = torch.stack(samples[step * 8:(step + 1) * 8])
        print(f"step {step} batch md5 {md5(batch)} out {(batch @ w).sum().item():.6f}")


def scalar():
    torch.manual_seed(0)
    x = torch.randn(1000)
    factor = random.random()  # the bug
    y = x.mul(factor)
    print(f"factor {factor!r} sum {y.sum().item():.6f}")


def item():
    torch.manual_seed(0)
    x = torch.randn(100)
    print(f"item {x.sum().item()!r}")


def garbage(zeros_like):
    n = 16384
    a = np.full(n, float(time.time_ns() % 100000), dtype=np.float32)
    del a  # its block is free again, holding a run-dependent value
    buf = torch.empty(n)
    if zeros_like:
        z = torch.zeros_like(torch.ones(8))  # unrelated to buf
    print(f"garbage sum {buf.sum().item()!r}")


def set_order():
    torch.manual_seed(0)
    names = {"alpha", "beta", "gamma", "delta", "epsilon"}
    params = {n: torch.nn.Parameter(torch.randn(8)) for n in names}
    w = torch.nn.Parameter(torch.randn(8, 8))
    # The first forward reads the parameters: the divergence is there, no later step is needed.
    loss = (torch.addmm(params["alpha"], torch.ones(4, 8), w) * params["beta"]).sum()
    loss.backward()
    print(f"step 0 order {','.join(names)} loss {loss.item():.9f}")


def out_buffers():
    torch.manual_seed(0)
    w = torch.randn(64, 64)
    out = torch.empty(0)
    acc = torch.empty(64, 64)
    for step in range(3):
        x = torch.randn(32, 64)
        torch.matmul(x, w, out=out)        # resize_ of an empty out= buffer, then written
        acc.resize_(32, 64).copy_(out)     # resize_ over garbage, then fully overwritten
        torch.add(acc, 1.0, out=acc)
        print(f"step {step} md5 {md5(acc)}")


def train_a_little():
    """Three seeded SGD steps of a linear model, bit for bit the same in every run."""
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def overwritten(read_first, out, after_training):
    torch.set_num_threads(2)  # the race needs two intra-op threads
    torch.manual_seed(0)
    model = train_a_little() if after_training else None
    torch.set_grad_enabled(not after_training)  # an evaluation
    n = 1 << 17
    # 4M values: each thread's share outlasts a time slice, so the two interleave even on a loaded
    # machine (with 1M, one often ran before the other: the same bits in every run).
    idx = torch.randint(0, n // 64, (1 << 22,))
    vals = torch.randn(idx.numel())
    if model is not None:
        vals = vals * model.weight.sum()
    base = torch.randn(n)
    scratch = torch.zeros(n)
    for step in range(3):
        scratch.index_put_((idx,), vals, accumulate=True)
        # Through NumPy, not an op: the test learns whether the race fired without a read.
        print(f"step {step} raced md5 {hashlib.md5(scratch.numpy().tobytes()).hexdigest()}")
        if read_first:
            print(f"step {step} raced sum {scratch.sum().item()!r}")
        if out:
            torch.mul(base, 2.0, out=scratch)
        else:
            scratch.copy_(base)
    print(f"final md5 {md5(scratch + 1)}")


CASES = {
    "shuffle": lambda flags: shuffle(),
    "scalar": lambda flags: scalar(),
    "item": lambda flags: item(),
    "garbage": lambda flags: garbage("--zeros-like" in flags),
    "set-order": lambda flags: set_order(),
    "out-buffers": lambda flags: out_buffers(),
    "overwritten": lambda flags: overwritten("--read-first" in flags, "--out" in flags,
                                             "--after-training" in flags),
}


def main():
    cases = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    unknown = [c for c in cases if c not in CASES]
    if not cases or unknown:
        sys.exit(f"unknown case {unknown or '(none)'}; cases: {', '.join(CASES)}")
    for case in cases:
        CASES[case](flags)


if __name__ == "__main__":
    main()
