"""Unit tests of microllm's pieces (fast, CPU). Puts the suite's harness on sys.path."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

with warnings.catch_warnings():
    # torch warns at import when numpy is absent; microllm does not use numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))
torch.set_num_threads(1)
