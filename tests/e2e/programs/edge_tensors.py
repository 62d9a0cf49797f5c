"""Tensors the interposer cannot or must not hash naively: sparse, quantized, meta, inference-mode,
complex, non-contiguous, and a parameter changed through `.data`. Prints MD5 digests (of the
logical, contiguous bytes) of tensors the tests look up in the trace, and results that must not
change under the interposer.

    /usr/bin/python3 tests/e2e/programs/edge_tensors.py
"""
import hashlib
import struct

import torch
import torch.nn as nn


def md5(t):
    return hashlib.md5(t.detach().contiguous().numpy().tobytes()).hexdigest()


def tree_md5(t):
    """detaudit's MD5 as docs/trace-format.md defines it: plain up to 1 MiB, then a tree."""
    data = t.detach().contiguous().numpy().tobytes()
    leaf = 1 << 20
    if len(data) <= leaf:
        return hashlib.md5(data).hexdigest()
    root = hashlib.md5(b"detaudit-tree-1\0" + struct.pack("<QQ", leaf, len(data)))
    for off in range(0, len(data), leaf):
        root.update(hashlib.md5(data[off:off + leaf]).digest())
    return root.hexdigest()


def main():
    torch.manual_seed(0)
    results = []

    # Sparse COO in the forward pass, with a backward through it.
    i = torch.tensor([[0, 1, 3], [2, 0, 1]])
    v = torch.tensor([1.0, -2.0, 0.5])
    sp = torch.sparse_coo_tensor(i, v, (4, 3))
    w = torch.randn(3, 2, requires_grad=True)
    out = torch.sparse.mm(sp, w)
    out.sum().backward()
    results.append(("sparse", out.detach(), w.grad))

    # Quantized.
    q = torch.quantize_per_tensor(torch.linspace(-1, 1, 12), 0.05, 10, torch.quint8)
    results.append(("quantized", q.dequantize() * 2))

    # Meta: shapes only, no data.
    m = torch.empty(6, 2, device="meta")
    mm = (m + m).sum(dim=0)
    print(f"meta shape {list(mm.shape)} device {mm.device}")

    # Inference mode.
    lin = nn.Linear(4, 3)
    xi = torch.randn(5, 4)
    with torch.inference_mode():
        yi = torch.relu(lin(xi)) * 3
    results.append(("inference", yi))

    # Complex.
    c = torch.randn(7, dtype=torch.cfloat)
    cc = c * c.conj() + c
    results.append(("complex", torch.view_as_real(cc)))

    # Non-contiguous: a transpose, then an op that reads it.
    a = torch.randn(11, 13)
    at = a.t()
    print(f"noncontig input md5 {md5(at)}")
    nc = torch.tanh(at)
    print(f"noncontig output md5 {md5(nc)}")
    results.append(("noncontig", nc))

    # Layouts the gather must walk in logical order, each read by aten::sum; over 1 MiB, the
    # tree digest, through the strided path and through the parallel contiguous one.
    layouts = {
        "double_t": torch.randn(7, 5, dtype=torch.float64).t(),
        "int16_perm": torch.arange(24, dtype=torch.int16).reshape(2, 3, 4).permute(2, 0, 1),
        "int8_step": torch.arange(50, dtype=torch.int8)[::3],
        "bool_t": (torch.randn(6, 4) > 0).t(),
        "expand": torch.randn(3, 1).expand(3, 1000),
        "big_t": torch.randn(1024, 600).t(),
        "big": torch.randn(1024, 600) * 2,
        # A few leaves and many: one by one on torch's threads or in MD5's vector lanes,
        # whichever is sooner on this CPU.
        "leaves_4": torch.randn(1152, 1024),
        "leaves_17": torch.randn(4480, 1024),
    }
    torch.set_num_threads(2)
    for name, t in layouts.items():
        torch.sum(t)
        print(f"layout {name} md5 {tree_md5(t)}")

    # A parameter changed behind autograd's back through .data, then used.
    lin2 = nn.Linear(9, 2)
    x2 = torch.randn(3, 9)
    first = lin2(x2)
    print(f"param before md5 {md5(lin2.weight)}")
    lin2.weight.data.add_(1)
    print(f"param after md5 {md5(lin2.weight)}")
    second = lin2(x2)
    results.append(("data", first, second))

    # The same through .data of an op's output, then read by another op.
    made = torch.tanh(torch.randn(2, 9) * 2)
    made.data.mul_(-3)
    print(f"made after md5 {md5(made)}")
    third = nn.functional.linear(x2, made)
    results.append(("made", third))

    # And through NumPy, which shares the memory and knows nothing of version counters.
    shared = torch.tanh(torch.randn(2, 9) * 2)
    shared.numpy()[0, 0] = 42.0
    print(f"numpy after md5 {md5(shared)}")
    fourth = nn.functional.linear(x2, shared)
    results.append(("numpy", fourth))

    # Ops that overwrite an argument without reading it; here its old bytes are garbage.
    garbage = torch.empty(3000)
    garbage.zero_()
    filled = torch.empty(4, 5).fill_(2.5)
    out = torch.empty(4, 5)
    torch.add(filled, filled, out=out)
    print(f"overwrite zero {md5(garbage)} fill {md5(filled)} out {md5(out)}")

    # The same bytes read as another dtype: a float tensor, then an int32 view of it.
    floats = torch.linspace(-2, 2, 24).exp()
    as_int = floats.view(torch.int32)
    shifted = torch.bitwise_right_shift(as_int, 23)  # the exponent bits
    print(f"intview input md5 {md5(as_int)} min {as_int.min().item()} max {as_int.max().item()}")
    results.append(("intview", shifted))

    for name, *ts in results:
        print(name, " ".join(md5(t) for t in ts))


if __name__ == "__main__":
    main()
