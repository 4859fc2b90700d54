"""Domain aliases shared across the package (one place, like coverage.py's types.py)."""

from __future__ import annotations

from typing import Mapping, Union

#: A test's stable id: a Bazel label (``//examples/microllm/tests:tp_parity_test``)
#: or a pytest node id (``examples/microllm/tests/test_x.py::test_y``).
TestId = str

#: A unit's id: ``<repo-relative posix path>::<qualname>``; the module top level
#: is ``path::<module>``, a class body ``path::Class``, a method ``path::Class.meth``.
UnitId = str

#: A repo-relative POSIX path.
RelPath = str

#: A hex digest of a unit's normalized source.
Checksum = str

#: A context signature: a short stable string describing how a unit was exercised.
ContextSig = str

#: A workload dimension's value as declared in BUILD or overridden by a plan.
WorkloadValue = Union[int, float, str, bool]

#: Workload dimension name -> value.
Workload = Mapping[str, WorkloadValue]
