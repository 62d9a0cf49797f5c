"""Seeded model, unseeded data order: Python's random is never seeded, so random.shuffle picks a
different first batch in each run.

    /usr/bin/python3 examples/unseeded_shuffle.py --steps 3
"""
import argparse
import random

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 1))
    data = torch.randn(64, 10)
    target = data.sum(dim=1, keepdim=True)
    order = list(range(64))
    random.shuffle(order)  # the bug: `random` was never seeded
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        batch = torch.tensor(order[step * 8:(step + 1) * 8])
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(data[batch]), target[batch])
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
