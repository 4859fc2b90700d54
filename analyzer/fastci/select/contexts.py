"""Comparing context signatures across runs: which parts are configuration, which are data.

A context signature (:mod:`fastci.evidence.record.contexts`) records *how* a unit ran: its
arguments abstracted (``args(x=T(bf16,3d,cpu,s);cfg=Cfg(tp=2,layers=4))``), its
caller, the process's labels. Two runs can only be compared after setting aside what
differs for reasons other than how the code was exercised:

* **per-call data** (:func:`varying_numbers`): a number, or a short list of numbers,
  that takes several values across one unit's contexts in one run (a sample index,
  a sampler position, a step counter). Another run necessarily sees other values.
* **a workload dimension's own value** (``without_reduced_values`` in
  :mod:`fastci.plan.reduce`): used when the runs differ in workload on purpose.

Used by workload reduction (:mod:`fastci.plan.reduce`) and equivalent-context pruning
(:mod:`fastci.select.prune`).
"""

from __future__ import annotations

import re
from typing import Iterable

__all__ = ["TOKEN", "NUMERIC", "varying_numbers", "without_data_values"]

#: A ``name=value`` token whose value is an atom: no nested ``name=`` inside (a number,
#: a string, ``T(f32,2d,cpu,s)``, ``list(1,2,3)``).
TOKEN = re.compile(r"(?<=[(;,{|])([A-Za-z_]\w*)=([^(),;{}|=]*(?:\([^()=;|{}]*\))?)(?=[),;}|]|$)")
_NUMBER = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
#: A number, or a short list or tuple of numbers (``list(132,633)``): what per-call data
#: looks like in a signature (:func:`fastci.evidence.record.contexts.abstract`).
NUMERIC = re.compile(rf"(?:{_NUMBER}|(?:list|tuple)\((?:{_NUMBER}(?:,{_NUMBER})*)?\))$")


def varying_numbers(contexts: Iterable[str]) -> frozenset[str]:
    """Names of the numeric tokens that take more than one value across ``contexts``.

    ``contexts`` are one unit's contexts in one run. A number that already varies within
    that run (``index=175``, ``index=684``; ``position=0``, ``position=16``; a step
    counter) is per-call data, not a context. A number constant over the run (a
    parallel degree, a size, a flag) is configuration. Strings, dtypes, tensors,
    booleans and enums are never data.
    """
    seen: dict[str, set[str]] = {}
    for sig in contexts:
        for m in TOKEN.finditer(sig):
            if NUMERIC.match(m.group(2)):
                seen.setdefault(m.group(1), set()).add(m.group(2))
    return frozenset(name for name, values in seen.items() if len(values) > 1)


def without_data_values(contexts: Iterable[str], names: frozenset[str]) -> frozenset[str]:
    """``contexts`` with the numeric value of every token named in ``names`` written ``#``."""
    if not names:
        return frozenset(contexts)

    def blank(m: re.Match[str]) -> str:
        if m.group(1) in names and NUMERIC.match(m.group(2)):
            return f"{m.group(1)}=#"
        return m.group(0)

    return frozenset(TOKEN.sub(blank, sig) for sig in contexts)
