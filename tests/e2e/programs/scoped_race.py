"""The CPU index_put_(accumulate=True) race (examples/nondet_index_put.py) inside user scopes, as
real training code is written: `record_function` around the forward and the backward, and a
scope that encloses the whole step.

    python scoped_race.py --steps 4
"""
import argparse

import torch
from torch.autograd.profiler import record_function


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    n = 1 << 17
    w = torch.nn.Parameter(torch.randn(n))
    idx = torch.randint(0, n // 64, (1 << 22,), dtype=torch.long)  # as nondet_index_put.py
    target = torch.randn(idx.numel())
    opt = torch.optim.SGD([w], lr=0.1)
    for step in range(args.steps):
        with record_function("train_step"):
            opt.zero_grad()
            with record_function("forward_block"):
                loss = ((w[idx] - target) ** 2).mean()
            with record_function("backward_block"):
                loss.backward()
            opt.step()
        print(f"step {step} grad {w.grad.double().sum().item().hex()}")


if __name__ == "__main__":
    main()
