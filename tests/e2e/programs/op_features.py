"""Seeded training (dropout included) followed by ops with non-tensor arguments, for the
recording e2e tests: index_put_(accumulate=True) into a torch.empty buffer, scatter_reduce with a
reduce string, add with an alpha scalar. Its ops after the last optimizer step make one more step.

    /usr/bin/python3 tests/e2e/programs/op_features.py --steps 2
"""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    y = torch.randint(0, 2, (4,))
    loss = torch.tensor(0.0)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()

    buf = torch.empty(5, 3)  # uninitialized until the fill
    buf.fill_(0.5)
    idx = torch.tensor([0, 0, 2])
    buf.index_put_((idx,), torch.ones(3, 3), accumulate=True)
    s = torch.zeros(5).scatter_reduce(0, torch.tensor([0, 1, 0]), torch.tensor([1.0, 2.0, 3.0]),
                                      reduce="amax")
    z = torch.add(s, buf.sum(dim=1), alpha=2.5)
    print(f"final loss {loss.item():.6f} z {z.tolist()}")


if __name__ == "__main__":
    main()
