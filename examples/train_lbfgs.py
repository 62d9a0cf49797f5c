"""Seeded LBFGS: the optimizer calls a closure several times a step, so one step holds several
forward and backward passes.

    /usr/bin/python3 examples/train_lbfgs.py --steps 3
"""
import argparse
import hashlib

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--params-out", help="write the sha256 of the final parameters here")
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
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    print(f"final loss {loss.item():.6f} after {evaluations} closure calls params sha256 "
          f"{h.hexdigest()}")
    if args.params_out:
        with open(args.params_out, "w") as f:
            f.write(h.hexdigest() + "\n")


if __name__ == "__main__":
    main()
