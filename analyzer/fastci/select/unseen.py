"""The structural safety net: changed code that no recording ever saw executing.

The recorder sees what Python's tracer sees. It does not see a function run on a
thread that ``threading`` did not start (``_thread.start_new_thread``, a C
library's callback or worker pool; autograd's device threads on CUDA), nor the
original lines of a frame dynamo traced. Such a function is absent from every
test's evidence, so a change to it reaches no test by the evidence rules, and a
plan that trusted the evidence alone would skip every test that fails.

The net does not list names. A changed function or method (body, signature or
decorators; a new one excluded, see below) that *no* test's held evidence
executed, at whatever commit it was recorded, in a module whose other code
recorded tests do run, selects those tests:

* **who reaches the module**: the tests whose evidence executed a function or
  method of that file. Only when no recorded test ran any function of it (its
  code ran at import only, e.g. callbacks registered with a C library when the
  module is imported), the tests whose evidence touches it at all (its top level
  or class bodies: its importers). Importing is a weaker signal than calling, and
  far broader (a package's ``__init__`` chain imports most modules in every
  test), so it is the fallback, not the rule.
* **per test, against its own baseline**: only tests whose recorded version of
  the file differs from the head's (the groups :mod:`fastci.select.change_rules`
  builds), so a test recorded after the edit is not selected again for it.
* **at full workload**: the reason kind (:attr:`DecisionKind.UNSEEN_CODE`) names
  no code the test's evidence executed, so reduction keeps the full workload,
  line granularity never sets the test aside and pruning never drops it (each
  acts only on tests whose every reason is an executed changed unit).

A new function (no old version) is not "unseen" in this sense: nothing old ran
it, and whatever calls it changed too (the caller's change is what selects, or
the import-time rules when it is registered at import). A compiled or traced
function is left to the compiled-code rule, which already reaches every test
touching its module. A deleted function cannot run any more: its callers'
changes select. Dead-code edits cost the runs of the tests that reach the
module; that is the price of never skipping a test that runs unseen code.
"""

from __future__ import annotations

import ast
import logging
from typing import Mapping

from fastci.changes.semantic_diff import ChangeKind, FileDiff, UnitChange
from fastci.changes.versions import Versions
from fastci.select.decisions import DecisionKind, Reason
from fastci.select.test_rules import EvidenceReader, Hits, add_hit, kinds_of
from fastci.types import RelPath, TestId, UnitId
from fastci.units.index import FileUnits, UnitKind, unit_id
from fastci.units.lines import scoped_defs, scoped_qualname

LOG = logging.getLogger(__name__)

#: Kinds of change only a function or method has (a class's and a module's are their own),
#: so the net needs no index of the file until it fires.
_FUNCTION_KINDS = frozenset({ChangeKind.BODY, ChangeKind.SIGNATURE, ChangeKind.DECORATOR})
#: Kinds of a function's change that leave it out of the net (see the module docstring).
_NOT_UNSEEN = frozenset({ChangeKind.ADDED, ChangeKind.DELETED, ChangeKind.COMPILED})
#: What the recorder may not see, for the reason's sentence.
BLIND_SPOTS = "native threads, autograd device threads, compiled frames"


def unseen_changes(fd: FileDiff, executed: Mapping[UnitId, set[TestId]]) -> list[UnitChange]:
    """The changed functions of ``fd`` that no held evidence executed.

    Args:
        fd: a semantic diff (from some test's recorded version of a file to the head).
        executed: unit id -> the tests whose evidence executed it, for every changed
            unit of ``fd`` (a unit missing here was executed by none).
    """
    if fd.failure:
        return []
    return [u for u in fd.units
            if _FUNCTION_KINDS & set(u.kinds) and not _NOT_UNSEEN & set(u.kinds)
            and not executed.get(u.unit)]


def unseen_code_rules(hits: Hits, groups: Mapping[tuple[RelPath, str], list[TestId]],
                      diffs: Mapping[tuple[RelPath, str], FileDiff | None],
                      executed: Mapping[UnitId, set[TestId]], store: EvidenceReader,
                      versions: Versions) -> None:
    """Add an :attr:`DecisionKind.UNSEEN_CODE` reason to the tests that reach a module
    where a changed function no recording executed (see the module docstring).

    Args:
        hits: the reasons found so far (added to).
        groups: (path, recorded version) -> the tests whose evidence touches ``path``
            in that version, which differs from the head's.
        diffs: the semantic diff of each group's version to the head (None: unknown).
        executed: unit id -> tests that executed it, for the changed units of ``diffs``.
        store: the evidence store's read side.
        versions: the head side.
    """
    found: dict[tuple[RelPath, str], list[UnitChange]] = {}
    functions: dict[RelPath, set[UnitId]] = {}
    for key, fd in diffs.items():
        unseen = unseen_changes(fd, executed) if fd is not None else []
        if not unseen or fd is None:
            continue
        path = key[0]
        if path not in functions:
            functions[path] = _function_ids(path, fd.current, versions)
        found[key] = unseen
    if not found:
        return
    callers = _callers(store, functions)
    for (path, version), unseen in sorted(found.items()):
        reach = callers.get(path, set())
        how = ("the tests whose evidence runs a function of it" if reach else
               "the tests whose evidence imports it (no recorded test ran any of its "
               "functions)")
        for test in groups.get((path, version), ()):
            if reach and test not in reach:
                continue
            known = {r.unit for r in hits.get(test, ())}
            for u in unseen:
                if u.unit in known:
                    continue  # another rule selected it for this unit (import-time code)
                add_hit(hits, test, Reason(
                    DecisionKind.UNSEEN_CODE,
                    f"changed code no test was seen executing; the recorder may not see it "
                    f"({BLIND_SPOTS}): {u.unit} ({kinds_of(u)}), so {how} run at full "
                    "workload", unit=u.unit, change=kinds_of(u), path=path,
                    via=f"safety rule: a changed function that no recording executed selects "
                        f"{how}"))


def _function_ids(path: RelPath, current: FileUnits | None, versions: Versions) -> set[UnitId]:
    """The ids of the functions and methods of ``path`` at the head: from the diff's index
    when it has one, else from the syntax tree alone (no checksums: the fast diff keeps no
    index, and hashing every unit of a large file costs more than the rest of the net)."""
    if current is not None:
        return {u.id for u in current.units if u.kind is UnitKind.FUNCTION}
    source = versions.now(path)
    try:
        tree = ast.parse(source or b"")
    except (SyntaxError, ValueError):
        return set()  # the diff's failure is another rule's business
    return {unit_id(path, scoped_qualname(scope, a.name)) for a, scope in scoped_defs(tree)
            if not isinstance(a, ast.ClassDef)}


def _callers(store: EvidenceReader, functions: Mapping[RelPath, set[UnitId]]
             ) -> dict[RelPath, set[TestId]]:
    """Path -> tests whose evidence executed a function or method of it (one lookup of
    the posting lists of those functions, for every path at once)."""
    by_unit = {uid: path for path, uids in functions.items() for uid in uids}
    out: dict[RelPath, set[TestId]] = {}
    for uid, tests in store.tests_for_units(sorted(by_unit)).items():
        if tests:
            out.setdefault(by_unit[uid], set()).update(tests)
    return out
