"""Real CPU nondeterminism: the backward of w[idx] with repeated indices is
index_put_(accumulate=True), which with 2 intra-op threads adds floats with parallel atomics in
an order that changes from run to run: runs differ in nearly every step.

    /usr/bin/python3 examples/nondet_index_put.py [--steps 5] [--threads 2] [--values 4194304]
"""
import argparse
import hashlib

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    # 4M indices: each thread adds for ~15 ms, longer than a time slice, so the two interleave
    # even on a loaded machine (with 1M, one often ran before the other: the same bits each run).
    ap.add_argument("--values", type=int, default=1 << 22)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = 1 << 17  # 131072 float32 values: well above the parallel threshold
    w = torch.nn.Parameter(torch.randn(n))
    # Many duplicate indices so several threads add into the same slots.
    idx = torch.randint(0, n // 64, (args.values,), dtype=torch.long)
    target = torch.randn(idx.numel())
    opt = torch.optim.SGD([w], lr=0.1)
    loss = torch.tensor(0.0)
    # Every step's gradient, hashed: a race that changes only the last bits of a gradient can be
    # rounded away by the update, so the final weights alone do not show whether runs differed.
    grads = hashlib.sha256()
    for step in range(args.steps):
        opt.zero_grad()
        loss = ((w[idx] - target) ** 2).mean()
        loss.backward()
        grad_bytes = w.grad.numpy().tobytes()
        grads.update(grad_bytes)
        print(f"step {step} grad sha256 {hashlib.sha256(grad_bytes).hexdigest()}")
        opt.step()
    print(f"final loss {loss.item():.9f} w checksum {w.detach().double().sum().item():.12f}")
    print(f"grads sha256 {grads.hexdigest()}")


if __name__ == "__main__":
    main()
