"""torch.empty returns uninitialized memory, but every element is written before it is read:
the runs are identical and detaudit must say so (the empty's own output digest is not a
divergence).

    /usr/bin/python3 examples/uninitialized.py --steps 3
"""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    torch.manual_seed(0)
    net = nn.Linear(32, 4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        buf = torch.empty(64, 32)  # garbage until the next line
        buf.copy_(torch.linspace(-1, 1, 64 * 32).reshape(64, 32) * (step + 1))
        out = torch.empty(64, 4)
        torch.matmul(buf, net.weight.detach().t(), out=out)  # fully overwritten too
        opt.zero_grad()
        loss = (net(buf) - out).pow(2).mean() + net(buf).pow(2).mean()
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
