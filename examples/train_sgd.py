"""Deterministic, seeded training of a small CNN with SGD: the reference workload.

Prints the final loss and, with --params-out, writes the SHA-256 of the final parameters, so a
run under detaudit can be shown to give bit-identical results to a run without it.

    /usr/bin/python3 examples/train_sgd.py --steps 5 --params-out params.sha256
"""
import argparse
import hashlib

import torch
import torch.nn as nn


def model():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 10))


def params_digest(net):
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--params-out", help="write the sha256 of the final parameters here")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    data = torch.randn(args.steps, 16, 3, 16, 16)
    labels = torch.randint(0, 10, (args.steps, 16))
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(data[step]), labels[step])
        loss.backward()
        opt.step()
    digest = params_digest(net)
    print(f"final loss {loss.item():.6f} params sha256 {digest}")
    if args.params_out:
        with open(args.params_out, "w") as f:
            f.write(digest + "\n")


if __name__ == "__main__":
    main()
