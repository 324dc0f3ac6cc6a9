"""pytest setup for the Python side of latentq: this directory on sys.path (its test-only helpers
dump_checks and engine_refs), 2 torch threads. The package itself comes from the environment: the
venv's latentq.pth (scripts/setup.sh) or PYTHONPATH (ctest sets <source>/python:<build>/python)."""

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

torch.set_num_threads(2)
