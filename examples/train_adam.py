"""Deterministic, seeded training of a small MLP with Adam.

    /usr/bin/python3 examples/train_adam.py --steps 5
"""
import argparse
import hashlib

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--params-out")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
    x = torch.randn(args.steps, 64, 32)
    y = torch.randn(args.steps, 64, 4)
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x[step]), y[step])
        loss.backward()
        opt.step()
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    print(f"final loss {loss.item():.6f} params sha256 {h.hexdigest()}")
    if args.params_out:
        with open(args.params_out, "w") as f:
            f.write(h.hexdigest() + "\n")


if __name__ == "__main__":
    main()
