"""Prints one draw of each random generator a training script may use, unseeded: under
`detaudit run --seed N` (docs/config.md: "Seed torch, numpy and random") two runs print the same.

    /usr/bin/python3 tests/e2e/programs/print_random.py
"""
import random

import numpy
import torch

print(f"torch {torch.rand(1).item()!r}")
print(f"numpy {numpy.random.rand()!r}")
print(f"random {random.random()!r}")
