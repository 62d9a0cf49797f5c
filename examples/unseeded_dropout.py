"""Seeded model, unseeded dropout: torch.seed() after init reseeds from the OS, so the first
dropout mask (and everything after it) differs between runs.

    /usr/bin/python3 examples/unseeded_dropout.py --steps 3
"""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 2))
    x = torch.randn(args.steps, 8, 16)
    y = torch.randint(0, 2, (args.steps, 8))
    torch.seed()  # the bug: a nondeterministic seed after a seeded init
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x[step]), y[step])
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
