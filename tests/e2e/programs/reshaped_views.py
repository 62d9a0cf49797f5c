"""Bytes read again under another shape: a reshape of an op's output (linear on a 3-D input
returns a view of its addmm's product; matmul's _unsafe_view), and a transposed view larger than
the strided gather's first buffer. Prints each tensor's MD5 as hashlib computes it from its
logical bytes, for the test to set against the recorded digests."""
import hashlib

import torch


def md5(t):
    return hashlib.md5(t.detach().contiguous().numpy().tobytes()).hexdigest()


torch.manual_seed(0)
x = torch.randn(8, 64, 128)
linear = torch.nn.Linear(128, 256)
with torch.no_grad():
    y = linear(x)                        # addmm on x.view(-1, 128), then y = out.view(8, 64, 256)
    z = y.relu()                         # reads y: the addmm product under y's shape
    m = torch.matmul(x, x.transpose(1, 2))  # bmm, then _unsafe_view of the product
    w = m.mul(2.0)
    big = torch.randn(512, 384)          # 768 KiB
    bt = big.t()                         # transposed: gathered, then hashed as one message
    s = bt.mul(1.0)
print(f"linear-out {md5(y)}")
print(f"matmul-out {md5(m)}")
print(f"transposed {md5(bt)}")
