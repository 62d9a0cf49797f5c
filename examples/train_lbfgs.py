"""Seeded LBFGS: the optimizer calls a closure several times a step, so one step holds several
forward and backward passes.

    /usr/bin/python3 examples/train_lbfgs.py --steps 3
"""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.LBFGS(net.parameters(), lr=0.5, max_iter=4, history_size=5)
    x = torch.randn(128, 8)
    y = x.sum(dim=1, keepdim=True).sin()
    evaluations = 0

    def closure():
        nonlocal evaluations
        evaluations += 1
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        return loss

    loss = None
    for _ in range(args.steps):
        loss = opt.step(closure)
    print(f"final loss {loss.item():.6f} after {evaluations} closure calls")


if __name__ == "__main__":
    main()
