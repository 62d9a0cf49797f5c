"""A small MLP trained a few steps on the CPU, for numerics across builds and settings.

    numerics_mlp.py [--threads N] [--tanh-gelu-at STEP] [--steps N]

--tanh-gelu-at STEP: from that step on, the second layer's activation is GELU's tanh
approximation instead of the exact one: one layer changed to another algorithm."""
import argparse

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=1)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--tanh-gelu-at", type=int, default=-1)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(args.threads)
layers = torch.nn.ModuleList([torch.nn.Linear(32, 64), torch.nn.Linear(64, 64),
                              torch.nn.Linear(64, 10)])
opt = torch.optim.SGD(layers.parameters(), lr=0.1)
data = torch.Generator().manual_seed(1)
for step in range(args.steps):
    x = torch.randn(128, 32, generator=data)
    y = torch.randint(0, 10, (128,), generator=data)
    h = F.gelu(layers[0](x))
    tanh = 0 <= args.tanh_gelu_at <= step
    h = F.gelu(layers[1](h), approximate="tanh") if tanh else F.gelu(layers[1](h))
    loss = F.cross_entropy(layers[2](h), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
