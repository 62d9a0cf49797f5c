"""Takes another path on every other run: the inputs of its `aten::mul` alternate between two
values, counted in a file. A stand-in, without chance, for a race upstream of the op to replay,
which sends some runs down another path and not others.

    /usr/bin/python3 tests/e2e/programs/every_other_run.py COUNTER_FILE
"""
import os
import sys

import torch

counter = sys.argv[1]
runs = int(open(counter).read()) if os.path.exists(counter) else 0
with open(counter, "w") as f:
    f.write(str(runs + 1))
x = torch.full((64,), float(runs % 2))
print(f"run {runs}: sum {(x * 3.0).sum().item()}")
