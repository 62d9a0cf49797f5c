"""A DataLoader with two worker processes: forked children that run ops of their own (each
needs its own stream). Seeded, so runs are identical.

    /usr/bin/python3 examples/dataloader_workers.py --steps 4
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        x = torch.full((8,), float(i) / 256).sin() * 2  # an op inside the worker
        return x, x.pow(2).sum(dim=0, keepdim=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = DataLoader(Squares(), batch_size=16, shuffle=False, num_workers=2)
    loss = torch.tensor(0.0)
    for step, (x, y) in enumerate(loader):
        if step >= args.steps:
            break
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
