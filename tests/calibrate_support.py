"""The code the calibration tests run at each rung (``pkg/work.py`` / ``cal/work.py``).

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
