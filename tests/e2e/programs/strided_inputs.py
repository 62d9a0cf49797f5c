"""Ops on inputs laid out unlike a compact tensor: a slice with an offset and gaps, and an
input expanded with stride 0. `detaudit replay` must hand the op the same layout."""
import torch

torch.manual_seed(0)
base = torch.randn(6, 8)
view = base[1:, ::2]  # storage offset 8, strides (8, 2)
scaled = view.mul(3.0)
column = torch.randn(5, 1).expand(5, 4)  # strides (1, 0)
total = torch.zeros(5, 4).add_(column)
print(f"{scaled.sum().item():.6f} {total.sum().item():.6f}")
