"""Control flow that depends on a flag: --branch a and --branch b run different ops in the
forward pass, and --steps changes how many steps run. For structural differences.

    /usr/bin/python3 examples/branchy.py --steps 3 --branch a
"""
import argparse

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, branch):
        super().__init__()
        self.branch = branch
        self.a = nn.Linear(12, 12)
        self.b = nn.Linear(12, 12)
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.branch == "b":
            h = torch.tanh(self.b(h)) + h  # an extra residual block only on branch b
        return self.head(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--branch", choices=["a", "b"], default="a")
    args = ap.parse_args()

    torch.manual_seed(0)
    net = Net(args.branch)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(16, 12)
    y = torch.randint(0, 3, (16,))
    loss = torch.tensor(0.0)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
    print(f"branch {args.branch} final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
