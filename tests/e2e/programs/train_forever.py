"""Trains a small MLP until it is killed: for the SIGKILL crash-safety test. Prints each step.

    /usr/bin/python3 tests/e2e/programs/train_forever.py
"""
import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(64, 32)
    y = torch.randn(64, 4)
    step = 0
    while True:
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        step += 1


if __name__ == "__main__":
    main()
