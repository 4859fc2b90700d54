"""The compiled-code rule: which tests may run a changed function that a compiler traces.

A compiled function's body never produces Python line events, so line evidence alone
cannot say which tests ran it. For compilers whose frames nobody records (triton,
TorchScript, numba, jax, cupy) the rule stays wide: every test whose evidence touches
the function's module. Dynamo (``torch.compile``, ``torch._dynamo.optimize`` /
``explain``, ``nn.Module.compile``, and partials or wrappers of them) is different: the
recorder records every frame dynamo traces (:mod:`fastci.evidence.record.traced`), and dynamo
compiles on the first *call*, never on the wrap. So for a test whose evidence was
recorded that way and is complete, the rule narrows to what its evidence shows
(issue 38 item 4): the test executed a *witness* of the changed function — the compiled
function itself (run eagerly, or its converted frame), or the function holding the
compile call — or its traced frames hold the changed unit (then the ordinary
"executes a changed unit" rule selects it). Evidence that cannot tell (recorded before
traced frames were recorded, or incomplete) keeps the wide rule, and says so.
"""

from __future__ import annotations

from typing import Any, Mapping

from fastci.changes.semantic_diff import ChangeKind, FileDiff, UnitChange
from fastci.changes.compiled_code import Compiled, compiled_units
from fastci.changes.versions import Versions
from fastci.evidence.record.traced import TRACED_BY_DYNAMO, TRACED_FRAMES_KEY
from fastci.select.decisions import DecisionKind, Reason
from fastci.select.test_rules import kinds_of
from fastci.types import RelPath, TestId, UnitId


def compiled_of(fd: FileDiff, old: bytes | None, versions: Versions) -> dict[UnitId, Compiled]:
    """How each COMPILED unit of ``fd`` is compiled, from both sides of the diff."""
    units = [u for u in fd.units if ChangeKind.COMPILED in u.kinds]
    if not units:
        return {}
    wrappers, external = versions.compiles(fd.path) if versions.compiles else ({}, {})
    got = compiled_units(old, fd.path, wrappers=wrappers, external=external)
    for qual, c in compiled_units(versions.now(fd.path), fd.path, wrappers=wrappers,
                                  external=external).items():
        got[qual] = got[qual].join(c) if qual in got else c
    return {u.unit: got[u.qualname] for u in units if u.qualname in got}


def records_traced_frames(run: Any) -> bool:
    """Whether a run's evidence is complete and its recorder recorded traced frames."""
    env = getattr(run, "environment", None) or {}
    return run is not None and bool(run.complete) and \
        env.get(TRACED_FRAMES_KEY) == TRACED_BY_DYNAMO


def compiled_reason(test: TestId, path: RelPath, u: UnitChange, compiled: Compiled | None,
                    run: Any, executed: Mapping[UnitId, set[TestId]]) -> Reason | None:
    """The reason ``test`` runs the changed compiled unit ``u``, None when its evidence
    shows it does not (see the module docstring)."""
    if compiled is None or not compiled.lazy:
        why = "a compiler other than dynamo compiles it" if compiled is not None else \
            "how it is compiled is not known"
    elif not records_traced_frames(run):
        why = "its evidence was recorded before FastCI recorded the frames dynamo traces" \
            if run is not None and run.complete else "its evidence is incomplete"
    else:
        ran = sorted(w for w in compiled.witnesses if test in executed.get(w, ()))
        if not ran:
            return None
        return Reason(
            DecisionKind.COMPILED_CODE,
            f"executes {ran[0]}, where {u.qualname} runs compiled by dynamo ({u.detail})",
            unit=u.unit, change=kinds_of(u), path=path,
            via=f"evidence: the test executed {', '.join(ran)}; static rule: a test runs "
                "dynamo-compiled code only through the compiled function or the code that "
                "compiles it (its traced frames are evidence)")
    return Reason(
        DecisionKind.COMPILED_CODE,
        f"its evidence touches {path}, where {u.qualname} changed and is compiled or "
        f"traced ({u.detail}): compiled code never produces Python line events, so no "
        "evidence records which tests run it", unit=u.unit, change=kinds_of(u),
        path=path, via=f"static rule: a change to compiled code reaches every test whose "
                       f"evidence touches its module ({why})")


__all__ = ["compiled_of", "compiled_reason", "records_traced_frames"]
