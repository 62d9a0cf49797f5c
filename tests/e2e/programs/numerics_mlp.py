"""A small MLP trained a few steps on the CPU, for numerics across builds and settings.

    numerics_mlp.py [--threads N] [--tanh-gelu-at STEP] [--lr-at STEP] [--steps N] [--form FORM]

--tanh-gelu-at STEP: from that step on, the second layer's activation is GELU's tanh
approximation instead of the exact one: one layer changed to another algorithm.
--lr-at STEP: from that step on, the learning rate is 0.11 instead of 0.1 (a schedule changed).
--form: how each layer is applied, the same parameters and arithmetic written three ways: the
module (`module`), `F.linear(h, W, b)` (`functional`) or `h @ W.t() + b` (`matmul`), a refactor
that runs other ops; `float64` computes the layer in double precision, other ops and other bits."""
import argparse

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=1)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--tanh-gelu-at", type=int, default=-1)
p.add_argument("--lr-at", type=int, default=-1)
p.add_argument("--form", choices=["module", "functional", "matmul", "float64"], default="module")
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(args.threads)
layers = torch.nn.ModuleList([torch.nn.Linear(32, 64), torch.nn.Linear(64, 64),
                              torch.nn.Linear(64, 10)])
opt = torch.optim.SGD(layers.parameters(), lr=0.1)
data = torch.Generator().manual_seed(1)


def layer(i, h):
    if args.form == "functional":
        return F.linear(h, layers[i].weight, layers[i].bias)
    if args.form == "matmul":
        return h @ layers[i].weight.t() + layers[i].bias
    if args.form == "float64":
        return (h.double() @ layers[i].weight.double().t() + layers[i].bias.double()).float()
    return layers[i](h)


for step in range(args.steps):
    x = torch.randn(128, 32, generator=data)
    y = torch.randint(0, 10, (128,), generator=data)
    h = F.gelu(layer(0, x))
    tanh = 0 <= args.tanh_gelu_at <= step
    h = F.gelu(layer(1, h), approximate="tanh") if tanh else F.gelu(layer(1, h))
    loss = F.cross_entropy(layer(2, h), y)
    if step == args.lr_at:
        for group in opt.param_groups:
            group["lr"] = 0.11
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
