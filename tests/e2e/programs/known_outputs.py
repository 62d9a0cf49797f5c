"""Fills and copies whose outputs a CPU digest knows from their arguments (a copy's source as
read, a fill's value remembered): zero_, fill_, a contiguous copy of a transposed view, and the
copies it must still read (a broadcast, another dtype, an overlapping source), in a few SGD steps.

  known_outputs.py [--steps N] [--plant-step K]

--plant-step K: the buffer filled each step is filled with 1 + 1e-3 at step K instead of 1: the
remembered fill must not stand for it.
"""
import argparse

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--plant-step", type=int, default=-1)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    w = torch.randn(256, 512, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01, momentum=0.9)
    x = torch.randn(64, 256)
    scale = torch.empty(64, 512)
    wide = torch.empty(64, 512, dtype=torch.float64)
    for step in range(a.steps):
        opt.zero_grad()
        scale.fill_(1.0 + (1e-3 if step == a.plant_step else 0.0))
        h = (x @ w).t().contiguous().t()       # a copy of a transposed view: its source's digest
        h = h * scale
        wide.copy_(h.detach())                 # another dtype: read
        rows = torch.empty(64, 512)
        rows.copy_(h.detach()[:1])             # a broadcast: read
        ring = torch.arange(16.0)
        ring[1:].copy_(ring[:-1].clone())      # a source made apart: its digest
        ring.zero_()
        loss = F.mse_loss(h + wide.float() + rows, torch.zeros(64, 512)) + ring.sum()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
