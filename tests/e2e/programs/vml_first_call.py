"""The first call of a oneMKL VML function, made by two intra-op threads at once.

oneMKL resolves a VML function's kernel on its first call, without a lock; with the oneMKL 2024.2
of torch's wheels, threads that make that call together can run a low-accuracy kernel on their
chunk (pytorch#188792). Here that call is an LSTM cell's first tanh_, as in pytorch/examples'
time_sequence_prediction: the cell-gate columns of a [97, 204] float64 tensor, which ATen hands
to VML row by row, split between two threads.

Prints whether the first call agreed with a second one on the same input ("first call clean" or
"first call raced"), then the digest of its result.
"""
import hashlib

import torch

torch.set_num_threads(2)
torch.manual_seed(0)
cell = torch.nn.LSTMCell(1, 51).double()
x = torch.randn(100, 1000, dtype=torch.float64)[3:, :1]
state = (torch.zeros(97, 51, dtype=torch.float64), torch.zeros(97, 51, dtype=torch.float64))
with torch.no_grad():
    first, _ = cell(x, state)
    again, _ = cell(x, state)
print("first call", "clean" if torch.equal(first, again) else "raced")
print("result md5", hashlib.md5(first.numpy().tobytes()).hexdigest())
