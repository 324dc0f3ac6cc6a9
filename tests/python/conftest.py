"""pytest setup for the Python side of latentq: data/ and this directory on sys.path, 2 torch threads."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(REPO, "data")
for p in (DATA, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

torch.set_num_threads(2)
