"""Real CPU nondeterminism: the backward of w[idx] with repeated indices is
index_put_(accumulate=True), which with 2 intra-op threads adds floats with parallel atomics in
an order that changes from run to run. Runs differ often but not always.

    /usr/bin/python3 examples/nondet_index_put.py --steps 5
"""
import argparse

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = 1 << 17  # 131072 float32 values: well above the parallel threshold
    w = torch.nn.Parameter(torch.randn(n))
    # Many duplicate indices so several threads add into the same slots.
    idx = torch.randint(0, n // 64, (1 << 20,), dtype=torch.long)
    target = torch.randn(idx.numel())
    opt = torch.optim.SGD([w], lr=0.1)
    loss = torch.tensor(0.0)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = ((w[idx] - target) ** 2).mean()
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.9f} w checksum {w.detach().double().sum().item():.12f}")


if __name__ == "__main__":
    main()
