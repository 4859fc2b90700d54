"""The plan: which tests run, with which workload overrides, and why (schema v1).

A plan is the output of the analysis and the input of every runner: the Bazel
rules (``@fastci_plan``, whose Starlark twin is ``rules/private/plan_model.bzl``
— both are held to the shared corpus rules/tests/plan_cases.json), the pytest
plugin and ``fastci run``. A test id that starts like a Bazel label (``//``,
``@``) must be a well-formed one (:func:`fastci.types.parse_label`). Format:
docs/PLAN_FORMAT.md. Bad input raises :class:`~fastci.errors.PlanError` with a
one-line message naming the exact place, e.g.
``plan.json: tests[2].overrides.train_iters: expected int, float, str or bool, got list``.

What a plan may hold is capped (:data:`MAX_PLAN_BYTES`, :data:`MAX_ENTRIES`,
:data:`MAX_STRING_CHARS`): a file over the byte cap is refused before it is
read, and so is JSON nested too deeply to decode or an object that repeats a
key (JSON would keep the last value silently). Every refusal is one line, and
the runners then run every test at full workload. :meth:`Plan.to_dict` keeps
``reason`` and ``why`` under the string cap, so what ``fastci plan`` writes is
never refused for its length. ``skipped[].why`` is required and non-empty: a
skip always says why.

A plan made by ``fastci plan`` carries ``tree``: the git tree id of the content it
analysed (:mod:`fastci.integrations.git.tree`). A runner that finds another tree must not obey it:
:func:`tree_problem` says why, and :func:`for_tree` turns it into the plan to run
(every test at full workload). A plan without ``tree`` is tied to no tree (a
hand-written plan, or one a change committed): it is not obeyed either. A plan
written by hand names the tree it is for (``python -m fastci.integrations.git.tree``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import json.encoder
import math
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from fastci.errors import PlanError
from fastci.gcpause import gc_paused
from fastci.integrations.git.tree import UNKNOWN_TREE
# normalize_test_id is re-exported: callers have always imported it from here.
from fastci.types import LabelError, TestId, WorkloadValue, is_label, parse_label
from fastci.types import normalize_test_id as normalize_test_id

PLAN_VERSION = 1
MODES = ("selective", "all", "shadow")
DEFAULT_PATH = Path(".fastci/plan.json")

_DIM_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOP_KEYS = ("version", "base", "head", "tree", "inputs", "mode", "reason", "tests", "skipped")
#: The digest an input has in ``inputs`` when it did not exist at planning time.
ABSENT_INPUT = "absent"
#: The tree id runners use when the current tree cannot be computed (never equals a plan's).
_TEST_KEYS = ("id", "overrides", "priority", "why", "est_gpu_s")
_SKIPPED_KEYS = ("id", "why", "stand_ins")

#: The largest plan file, in bytes, checked before it is read (a 250k-test plan
#: with one-line reasons is about 30 MB; parsing one that size takes ~2 s).
MAX_PLAN_BYTES = 32 * 1024 * 1024
#: The most entries ``tests`` and ``skipped`` may hold together (a suite's size).
MAX_ENTRIES = 250_000
#: The longest string a plan may hold (ids, ``why``, ``reason``, ``base``/``head``/
#: ``tree``, dimension names, string override values), in characters counted as
#: UTF-16 code units (one outside the Basic Multilingual Plane counts 2): Bazel's
#: strings count so, and the Starlark twin must decide alike.
MAX_STRING_CHARS = 4096
#: The longest problem text, in characters (a problem quoting a huge value stays one short line).
MAX_PROBLEM_CHARS = 1000


@dataclass(frozen=True)
class PlannedTest:
    """A test the plan runs, with its workload overrides (empty = full workload)."""

    id: TestId
    overrides: Mapping[str, WorkloadValue] = field(default_factory=dict)
    priority: float | None = None
    why: str = ""
    est_gpu_s: float | None = None


@dataclass(frozen=True)
class SkippedTest:
    """A test the plan does not run, and why (e.g. ``pruned: same contexts as //x:y``).

    ``stand_ins``: set for a pruned test (:mod:`fastci.select.prune`), the planned tests
    that stand in for it. A prune holds only while the plan's tests pass: ``fastci run``
    runs the pruned tests after any planned test fails (docs/RUNNING.md).
    """

    id: TestId
    why: str = ""
    stand_ins: tuple[TestId, ...] = ()


@dataclass(frozen=True)
class Plan:
    """A version-1 plan. ``mode``: ``selective`` | ``all`` | ``shadow``.

    ``tree`` is the git tree id of the content the plan was made for (None: a
    hand-written plan, tied to no tree).
    """

    mode: str
    reason: str = ""
    tests: tuple[PlannedTest, ...] = ()
    skipped: tuple[SkippedTest, ...] = ()
    base: str | None = None
    head: str | None = None
    tree: str | None = None
    #: The git-ignored files the analysis relied on (recorded reads of files git does not
    #: track: downloaded data, generated goldens) and their sha256 then (:data:`ABSENT_INPUT`:
    #: the file did not exist). The tree does not cover them; runners re-check them
    #: (:func:`inputs_problem`).
    inputs: tuple[tuple[str, str], ...] = ()

    @classmethod
    def run_all(cls, reason: str) -> Plan:
        """A plan that runs every test at full workload (the safe side)."""
        return cls(mode="all", reason=reason)

    @classmethod
    def from_json(cls, text: str, *, source: str = "plan.json") -> Plan:
        """Parse and validate plan JSON text.

        Raises:
            PlanError: the text is not JSON or does not follow schema version 1.
        """
        size = len(text) if len(text) > MAX_PLAN_BYTES else _utf8_len(text)
        if size > MAX_PLAN_BYTES:
            raise PlanError(_too_big(source, size))
        try:
            data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            raise PlanError(_short(f"{source}: duplicate key {exc.key!r} in one JSON object "
                                   "(JSON would keep only the last value)")) from exc
        except RecursionError as exc:
            raise PlanError(f"{source}: not valid JSON: nested too deeply") from exc
        except ValueError as exc:  # json.JSONDecodeError, a non-standard constant
            raise PlanError(_short(f"{source}: not valid JSON: {exc}")) from exc
        return cls.from_dict(data, source=source)

    @classmethod
    def from_dict(cls, data: object, *, source: str = "plan.json") -> Plan:
        """Validate decoded JSON and build the plan (see :meth:`from_json`)."""
        try:
            return _parse(data, source)
        except PlanError as exc:
            short = _short(str(exc))
            if short == str(exc):
                raise
            raise PlanError(short) from exc

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this plan (optional fields left out when unset)."""
        out = self._dict_before_skipped()
        out["skipped"] = [_skipped_dict(s) for s in self.skipped]
        return out

    def _dict_before_skipped(self) -> dict[str, Any]:
        """:meth:`to_dict` up to its last key, ``skipped``."""
        out: dict[str, Any] = {"version": PLAN_VERSION}
        if self.base is not None:
            out["base"] = self.base
        if self.head is not None:
            out["head"] = self.head
        if self.tree is not None:
            out["tree"] = self.tree
        if self.inputs:
            out["inputs"] = dict(self.inputs)
        out["mode"] = self.mode
        out["reason"] = _fit(self.reason)
        out["tests"] = [_test_dict(t) for t in self.tests]
        return out

    @gc_paused
    def to_json(self) -> str:
        """Serialize as pretty, stable JSON text (ends with a newline): ``json.dumps(...,
        indent=2)``'s text, made faster (:func:`_pretty`). The cyclic collector is paused
        meanwhile (:mod:`fastci.gcpause`): the dicts made for 100,000 tests would start
        collections that walk every object the analysis made (0.4 s at that scale)."""
        if not self.skipped:
            return _pretty(self.to_dict(), "\n") + "\n"
        # The skipped entries (100,000 at scale) are written straight from the plan, as
        # _pretty writes each {"id": ..., "why": ...} at that depth: the same text.
        out = self._dict_before_skipped()
        out["skipped"] = [None]
        head, tail = _pretty(out, "\n").rsplit("null", 1)
        esc = _escape
        body = "},\n    {\n      ".join(
            f'"id": {esc(s.id)},\n      "why": {esc(_fit(s.why))}'
            + (',\n      "stand_ins": [\n        ' + ",\n        ".join(map(esc, s.stand_ins))
               + "\n      ]" if s.stand_ins else "") + "\n    " for s in self.skipped)
        return f"{head}{{\n      {body}}}{tail}\n"

    def planned(self, test: TestId) -> PlannedTest | None:
        """Return the entry of ``test`` in ``tests``, if any."""
        return next((t for t in self.tests if t.id == test), None)


def _pretty(obj: Any, newline: str) -> str:
    """``json.dumps(obj, indent=2)`` at the indentation ``newline`` (a newline and the
    spaces of the current level), the same text: the stdlib's indenting encoder is pure
    Python and a plan at 100,000 tests holds 100,000 skipped entries. Strings are escaped
    by the stdlib's own C escaper; any value other than a dict with string keys, a list, a
    string or ``None`` is written by ``json.dumps`` itself (numbers, booleans, the rest).
    """
    if type(obj) is str:
        return _escape(obj)
    if type(obj) is dict and all(type(k) is str for k in obj):
        if not obj:
            return "{}"
        inner = newline + "  "
        # A string value is escaped here, not in a call of its own (a plan's skipped
        # entries are 100,000 dicts of two strings at scale).
        return "{" + inner + ("," + inner).join(
            f"{_escape(k)}: {_escape(v) if type(v) is str else _pretty(v, inner)}"
            for k, v in obj.items()) + newline + "}"
    if type(obj) is list:
        if not obj:
            return "[]"
        inner = newline + "  "
        return "[" + inner + ("," + inner).join(
            _escape(v) if type(v) is str else _pretty(v, inner) for v in obj) + newline + "]"
    if obj is None:
        return "null"
    return json.dumps(obj, indent=2).replace("\n", newline)


_escape = json.encoder.encode_basestring_ascii


def _skipped_dict(s: SkippedTest) -> dict[str, Any]:
    out: dict[str, Any] = {"id": s.id, "why": _fit(s.why)}
    if s.stand_ins:
        out["stand_ins"] = list(s.stand_ins)
    return out


def _test_dict(t: PlannedTest) -> dict[str, Any]:
    out: dict[str, Any] = {"id": t.id, "overrides": dict(t.overrides)}
    if t.priority is not None:
        out["priority"] = t.priority
    if t.why:
        out["why"] = _fit(t.why)
    if t.est_gpu_s is not None:
        out["est_gpu_s"] = t.est_gpu_s
    return out


def tree_problem(plan: Plan, tree: str | None) -> str | None:
    """Why ``plan`` must not be obeyed on the tree ``tree``, or None when it may be (pure).

    ``tree`` is the current tree id (:func:`fastci.integrations.git.tree.worktree_tree`); None or
    :data:`UNKNOWN_TREE` when it could not be computed, which never matches. A plan
    in mode ``all`` runs everything anyway: no problem. A plan without ``tree`` is
    tied to no tree: nothing says it was made for this content (a hand-written plan
    left in place, or one a change committed), so it is not obeyed (invariant 6).
    The Starlark twin is ``check_tree`` in ``rules/private/plan.bzl``.
    """
    if plan.mode == "all":
        return None
    if plan.tree is None:
        return UNTIED_PROBLEM
    if tree is not None and tree != UNKNOWN_TREE and plan.tree == tree:
        return None
    return f"plan made for tree {plan.tree}, this tree is {tree or UNKNOWN_TREE}"


#: Why a plan without ``tree`` is not obeyed (the same words in ``rules/private/plan.bzl``).
UNTIED_PROBLEM = ("the plan names no `tree`, so it is tied to no tree (a hand-written plan "
                  "must name the tree it is for: python -m fastci.integrations.git.tree)")


def for_tree(plan: Plan, tree: str | None) -> tuple[Plan, str | None]:
    """The plan a runner on the tree ``tree`` obeys, and the warning to print loudly (or None).

    A plan made for another tree (or an unknown one), or for no tree, becomes
    "every test at full workload", the reason naming the problem.
    """
    problem = tree_problem(plan, tree)
    if problem is not None:
        what = "stale plan" if plan.tree is not None else "plan not obeyed"
        return Plan.run_all(f"{what}: {problem}"), f"{problem}: running every test at full workload"
    return plan, None


def inputs_problem(plan: Plan, root: Path) -> str | None:
    """Why ``plan`` no longer holds for the git-ignored files it relied on, or None.

    Each of ``plan.inputs`` (paths relative to the repository ``root``) is hashed again;
    the first whose digest differs (or that appeared or vanished) is the problem. A
    plan in mode ``all`` relies on nothing.
    """
    if plan.mode == "all" or not plan.inputs:
        return None
    for path, digest in plan.inputs:
        local = root / path
        try:
            with local.open("rb") as f:
                now = hashlib.file_digest(f, "sha256").hexdigest()
        except FileNotFoundError:
            now = ABSENT_INPUT
        except OSError as exc:
            now = f"unreadable ({exc.strerror})"
        if now != digest:
            return (f"the git-ignored input {path} changed since the plan was made "
                    f"({digest[:12]} -> {now[:12]})")
    return None


def for_runner(plan: Plan, tree: str | None, source: Path | None = None,
               root: Path | None = None) -> tuple[Plan, str | None]:
    """:func:`for_tree`, and first: a plan read from a file git tracks is not obeyed
    (:func:`fastci.integrations.git.tree.committed_plan_problem`; ``source``: the file
    the plan was read from, None when it was not read from a file); and then, with the
    repository ``root``, a plan whose git-ignored inputs changed (:func:`inputs_problem`)."""
    if source is not None and plan.mode != "all":
        from fastci.integrations.git.tree import committed_plan_problem

        problem = committed_plan_problem(source)
        if problem is not None:
            return (Plan.run_all(f"plan not obeyed: {problem}"),
                    f"{problem}: running every test at full workload")
    obeyed, warning = for_tree(plan, tree)
    if warning is None and root is not None:
        problem = inputs_problem(plan, root)
        if problem is not None:
            return (Plan.run_all(f"stale plan: {problem}"),
                    f"{problem}: running every test at full workload")
    return obeyed, warning


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-standard JSON constant {name}")


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a JSON object that names a key twice is refused."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key[:MAX_STRING_CHARS])
            seen.add(key)
    return out


def _utf8_len(text: str) -> int:
    # surrogatepass: JSON may spell a lone surrogate (\ud800); it still has a length.
    return len(text.encode("utf-8", "surrogatepass"))


def _too_big(source: str, size: int) -> str:
    return f"{source}: {size} bytes, more than a plan may hold ({MAX_PLAN_BYTES} bytes)"


def _chars(text: str) -> int:
    """The length of ``text`` in UTF-16 code units (what Bazel's ``len`` says)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _too_long(where: str, text: str) -> str | None:
    """The problem when ``text`` is over :data:`MAX_STRING_CHARS`, else None (twin: ``_too_long``)."""
    if 2 * len(text) <= MAX_STRING_CHARS:  # a character is at most 2 UTF-16 code units
        return None
    size = len(text) if len(text) > MAX_STRING_CHARS else _chars(text)
    if size <= MAX_STRING_CHARS:
        return None
    return f"{where}: {size} characters, more than a plan string may hold ({MAX_STRING_CHARS})"


def _short(problem: str) -> str:
    """``problem`` cut to :data:`MAX_PROBLEM_CHARS` (it may quote a huge value; twin: ``_short``)."""
    if len(problem) <= MAX_PROBLEM_CHARS:
        return problem
    return problem[:MAX_PROBLEM_CHARS] + f"... ({len(problem) - MAX_PROBLEM_CHARS} more characters)"


@functools.lru_cache(maxsize=1024)
def _fit(text: str) -> str:
    """``text`` cut to fit :data:`MAX_STRING_CHARS`, saying so (what a writer must not exceed).

    Cached: the skipped tests of one plan mostly share one ``why`` (100,000 at scale).
    """
    if _too_long("", text) is None:
        return text
    return text[: MAX_STRING_CHARS // 2] + f"... (cut: {len(text)} characters in all)"


def _tname(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_keys(where: str, obj: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in obj:
        if key not in allowed:
            raise PlanError(f"{where}: unknown key {key!r} (allowed: {', '.join(allowed)})")


def _parse_overrides(where: str, raw: object) -> dict[str, WorkloadValue]:
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: expected an object, got {_tname(raw)}")
    out: dict[str, WorkloadValue] = {}
    for dim, value in raw.items():
        problem = _too_long(f"{where}: a dimension name", dim)
        if problem:
            raise PlanError(problem)
        if not _DIM_RE.fullmatch(dim):
            raise PlanError(f"{where}: {dim!r} is not a dimension name")
        if not isinstance(value, (int, float, str, bool)):
            raise PlanError(f"{where}.{dim}: expected int, float, str or bool, got {_tname(value)}")
        problem = _too_long(f"{where}.{dim}", value) if isinstance(value, str) else None
        if problem:
            raise PlanError(problem)
        out[dim] = value
    return out


def _parse_entry(where: str, raw: object, allowed: tuple[str, ...], *, skipped: bool) -> dict[str, Any]:
    # The same checks in the same order as plan_model.bzl's `_check_entry` (same first problem).
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: expected an object, got {_tname(raw)}")
    _check_keys(where, raw, allowed)
    if not isinstance(raw.get("id"), str) or not raw["id"]:
        raise PlanError(f"{where}.id: expected a non-empty string (a label or pytest node id), got {raw.get('id')!r}")
    problem = _too_long(f"{where}.id", raw["id"])
    if problem:
        raise PlanError(problem)
    if is_label(raw["id"]):
        try:
            parse_label(raw["id"])
        except LabelError as exc:
            # A malformed label names no test: the plan is refused (the runners then run everything).
            raise PlanError(f"{where}.id: {exc}") from exc
    if not isinstance(raw.get("why", ""), str):
        raise PlanError(f"{where}.why: expected a string, got {_tname(raw['why'])}")
    problem = _too_long(f"{where}.why", raw.get("why", ""))
    if problem:
        raise PlanError(problem)
    if skipped and not raw.get("why"):
        # A skip always says why: a test that does not run must be traceable to a reason.
        raise PlanError(f"{where}.why: a skipped test needs a reason (a non-empty string)")
    for key in ("priority", "est_gpu_s"):
        if key in raw and not _is_number(raw[key]):
            raise PlanError(f"{where}.{key}: expected a number, got {_tname(raw[key])}")
    if "stand_ins" in raw:
        _check_stand_ins(f"{where}.stand_ins", raw["stand_ins"])
    return raw


def _check_stand_ins(where: str, raw: object) -> None:
    # The same checks in the same order as plan_model.bzl's `_stand_ins_problem`.
    if not isinstance(raw, list):
        raise PlanError(f"{where}: expected a list of test ids, got {_tname(raw)}")
    for j, test in enumerate(raw):
        if not isinstance(test, str) or not test:
            raise PlanError(f"{where}[{j}]: expected a non-empty string (a label or pytest "
                            f"node id), got {test!r}")
        problem = _too_long(f"{where}[{j}]", test)
        if problem:
            raise PlanError(problem)
        if is_label(test):
            try:
                parse_label(test)
            except LabelError as exc:
                raise PlanError(f"{where}[{j}]: {exc}") from exc


def _parse(data: object, source: str) -> Plan:
    if not isinstance(data, dict):
        raise PlanError(f"{source}: expected a JSON object at the top level, got {_tname(data)}")
    _check_top(source, data)
    inputs = _parse_inputs(source, data.get("inputs", {}))
    tests, skipped = _parse_listed(source, data)
    return Plan(
        mode=data["mode"],
        reason=data.get("reason", ""),
        tests=tuple(tests),
        skipped=tuple(skipped),
        base=data.get("base"),
        head=data.get("head"),
        tree=data.get("tree"),
        inputs=inputs,
    )


def _check_top(source: str, data: dict[str, Any]) -> None:
    """The plan's version, keys, mode and string fields (before its entries)."""
    if "version" not in data:
        raise PlanError(f"{source}: missing key 'version'")
    version = data["version"]
    if type(version) is not int or version != PLAN_VERSION:
        raise PlanError(f"{source}: unknown version {version!r} (this FastCI reads version {PLAN_VERSION})")
    _check_keys(source, data, _TOP_KEYS)
    if data.get("mode") not in MODES:
        raise PlanError(f"{source}: mode: expected one of {', '.join(MODES)}, got {data.get('mode')!r}")
    for key in ("reason", "base", "head", "tree"):
        if key in data and not isinstance(data[key], str):
            raise PlanError(f"{source}: {key}: expected a string, got {_tname(data[key])}")
        problem = _too_long(f"{source}: {key}", data[key]) if key in data else None
        if problem:
            raise PlanError(problem)


def _parse_listed(source: str, data: dict[str, Any]
                  ) -> tuple[list[PlannedTest], list[SkippedTest]]:
    """The ``tests`` and ``skipped`` entries: at most :data:`MAX_ENTRIES` together, each id
    listed once."""
    seen: dict[str, str] = {}
    tests: list[PlannedTest] = []
    skipped: list[SkippedTest] = []
    listed = 0
    for key, allowed in (("tests", _TEST_KEYS), ("skipped", _SKIPPED_KEYS)):
        entries = data.get(key, [])
        if not isinstance(entries, list):
            raise PlanError(f"{source}: {key}: expected a list, got {_tname(entries)}")
        listed += len(entries)
        if listed > MAX_ENTRIES:
            raise PlanError(f"{source}: {key}: {listed} entries in tests and skipped together, "
                            f"more than a plan may hold ({MAX_ENTRIES})")
        for i, raw in enumerate(entries):
            where = f"{source}: {key}[{i}]"
            entry = _parse_entry(where, raw, allowed, skipped=key == "skipped")
            test_id = entry["id"]
            label = normalize_test_id(test_id)
            if label in seen:
                raise PlanError(f"{where}.id: {label} is listed twice (also in {seen[label]})")
            seen[label] = f"{key}[{i}]"
            if key == "tests":
                tests.append(PlannedTest(
                    id=test_id,
                    overrides=_parse_overrides(f"{where}.overrides", entry.get("overrides", {})),
                    priority=entry.get("priority"),
                    why=entry.get("why", ""),
                    est_gpu_s=entry.get("est_gpu_s"),
                ))
            else:
                skipped.append(SkippedTest(id=test_id, why=entry.get("why", ""),
                                           stand_ins=tuple(entry.get("stand_ins", ()))))
    return tests, skipped


def _parse_inputs(source: str, raw: object) -> tuple[tuple[str, str], ...]:
    """``inputs``: an object of repository-relative path -> digest string (twin: ``_inputs_problem``)."""
    if not isinstance(raw, dict):
        raise PlanError(f"{source}: inputs: expected an object, got {_tname(raw)}")
    if len(raw) > MAX_ENTRIES:
        raise PlanError(f"{source}: inputs: {len(raw)} entries, more than a plan may hold "
                        f"({MAX_ENTRIES})")
    for path, digest in raw.items():
        if not path:
            raise PlanError(f"{source}: inputs: an empty path")
        if not isinstance(digest, str):
            raise PlanError(f"{source}: inputs: a digest must be a string, got {_tname(digest)}")
        problem = _too_long(f"{source}: inputs", path) or _too_long(f"{source}: inputs", digest)
        if problem:
            raise PlanError(problem)
    return tuple(sorted(raw.items()))


def load_plan(path: Path | str) -> Plan:
    """Read and validate a plan file.

    Raises:
        PlanError: the file is missing, unreadable, or invalid.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise PlanError(f"{path}: cannot read: not a regular file")
            # The size is checked before reading: a huge file is refused without loading it.
            if info.st_size > MAX_PLAN_BYTES:
                raise PlanError(_too_big(path.name, info.st_size))
            data = f.read(MAX_PLAN_BYTES + 1)  # a file growing meanwhile is still capped
        text = data.decode("utf-8")
    except FileNotFoundError as exc:
        raise PlanError(f"{path}: no such plan file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(_short(f"{path}: cannot read: {exc}")) from exc
    if len(data) > MAX_PLAN_BYTES:
        raise PlanError(_too_big(path.name, len(data)))
    return Plan.from_json(text, source=path.name)


def dump_plan(plan: Plan, path: Path | str) -> None:
    """Write ``plan`` to ``path`` atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(plan.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def by_priority(tests: Sequence[PlannedTest]) -> list[PlannedTest]:
    """``tests`` in run order: highest ``priority`` first (1.0 first); tests without a
    priority after those, in plan order. ``fastci run`` and the pytest plugin both run
    a plan in this order."""
    def key(item: tuple[int, PlannedTest]) -> tuple[int, float, int]:
        index, test = item
        p = test.priority
        if p is None or not math.isfinite(p):
            return (1, 0.0, index)
        return (0, -p, index)

    return [t for _, t in sorted(enumerate(tests), key=key)]
