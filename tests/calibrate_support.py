"""The code the calibration tests run at each rung (``pkg/work.py`` / ``cal/work.py``),
and the test module that declares its workload (:data:`TRAIN_TESTS`).

``train(steps)`` takes a branch only when ``steps > 4`` and sleeps in proportion to
``steps``, so the rungs of a ``steps`` ladder differ both in what they execute and in
what they cost. Line numbers matter: ``prepare``'s body is lines 5-6; the branch taken
only when ``steps > 4`` is lines 14-15.
"""

from __future__ import annotations


def work_source(sleep_per_step: float) -> str:
    """The module's text, sleeping ``sleep_per_step`` seconds per step."""
    return f'''import time


def prepare(seed):
    base = seed * 3
    return base + 1


def train(steps):
    total = prepare(7)
    for i in range(steps):
        total += i
    if steps > 4:
        total = total * 2
        total = total - 1
    time.sleep({sleep_per_step} * steps)
    return total
'''


#: ``tests/test_w.py`` of the calibrated pytest projects: ``test_train`` declares
#: ``steps`` (full 8, floor 2) and reads what a plan or rung gives it from
#: ``FASTCI_WORKLOAD``; ``test_plain`` declares nothing.
TRAIN_TESTS = '''import json
import os

import pytest

from pkg.work import train

FULL = {"steps": 8}


def workload():
    return {**FULL, **json.loads(os.environ.get("FASTCI_WORKLOAD") or "{}")}


@pytest.mark.fastci_workload(workload=FULL, floors={"steps": 2}, reference="relational")
def test_train():
    assert train(workload()["steps"]) > 0


def test_plain():
    assert train(1) > 0
'''
