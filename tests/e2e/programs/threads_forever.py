"""Trains on the main thread while two Python threads run ops of their own, until it is stopped:
for the SIGTERM test (what a CI runner or a scheduler sends). Prints each step.

    python threads_forever.py
"""
import threading

import torch
import torch.nn as nn


def spin(k):
    x = torch.full((256,), float(k + 1))
    while True:
        x = (x * 1.0001).sin() + 1


def main():
    torch.manual_seed(0)
    for k in range(2):
        threading.Thread(target=spin, args=(k,), name=f"spin-{k}", daemon=True).start()
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(64, 32), torch.randn(64, 4)
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
