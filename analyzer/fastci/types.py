"""Domain aliases shared across the package (one place, like coverage.py's types.py),
and the one parser of test ids (Bazel labels and pytest node ids)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Mapping, Union

from fastci.errors import FastCIError

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


# --- Tool artifacts: files no test's evidence may name -----------------------

#: Folders written by installing the project or by running its tests, never inputs:
#: install metadata (``pip install -e`` writes ``<pkg>.egg-info``; another install
#: writes none, or a ``.dist-info`` elsewhere), bytecode caches, and the caches of test
#: runners and linters (they change with every run: pytest's last-failed list,
#: hypothesis's example database, mypy's and ruff's caches, tox/nox environments).
ARTIFACT_FOLDERS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".hypothesis",
                              ".ruff_cache", ".tox", ".nox", ".eggs", ".benchmarks",
                              "pip-wheel-metadata", "htmlcov"})
#: Folder name endings of the same kind (``fastci.egg-info``, ``torch-2.4.dist-info``).
ARTIFACT_FOLDER_SUFFIXES = (".egg-info", ".dist-info")
#: File names of the same kind: bytecode anywhere, coverage data files (``.coverage``,
#: ``.coverage.<host>.<pid>``; not ``.coveragerc``, a configuration).
ARTIFACT_FILE_SUFFIXES = (".pyc", ".pyo")
ARTIFACT_FILE_PREFIXES = (".coverage.",)


def is_tool_artifact(path: RelPath) -> bool:
    """Whether ``path`` (repo-relative, ``/``-separated) was written by an installer or a
    test runner: never recorded as a test's input, never a change (docs/EVIDENCE.md).

    A test that reads such a file reads what the *environment* made, not the code under
    test; recording it made every test depend on how (and whether) the clone was
    installed and on the last local run.
    """
    parts = path.split("/")
    if any(p in ARTIFACT_FOLDERS or p.endswith(ARTIFACT_FOLDER_SUFFIXES) for p in parts[:-1]):
        return True
    name = parts[-1]
    return name.endswith(ARTIFACT_FILE_SUFFIXES) or name.startswith(ARTIFACT_FILE_PREFIXES) \
        or name == ".coverage" or name in ARTIFACT_FOLDERS \
        or name.endswith(ARTIFACT_FOLDER_SUFFIXES)


# --- Test outcomes: one vocabulary ----------------------------------------------


class Outcome(str, Enum):
    """How one run of a test ended, as its runner reported it (the values are stored).

    pytest's own words: a strict xfail that passes is ``failed`` (pytest reports
    it so); a non-strict one is ``xpassed``. A test a plan deselected did not run
    and has no outcome: it is never recorded as a run.
    """

    PASSED = "passed"
    FAILED = "failed"  # the test body failed (or a strict xfail passed)
    ERROR = "error"  # setup or teardown failed, the run crashed, or its trace is missing
    SKIPPED = "skipped"  # skip / skipif / pytest.skip()
    XFAILED = "xfailed"  # failed as its xfail marker expects
    XPASSED = "xpassed"  # passed despite a non-strict xfail marker

    def __str__(self) -> str:
        return self.value


#: Every outcome value (the strings stored and written in traces and result lines).
OUTCOMES: frozenset[str] = frozenset(o.value for o in Outcome)
#: The outcomes that are failures; every other *known* outcome is not.
FAILURE_OUTCOMES: frozenset[str] = frozenset({Outcome.FAILED.value, Outcome.ERROR.value})
_NOT_FAILURES = OUTCOMES - FAILURE_OUTCOMES


def is_failure(outcome: str) -> bool:
    """Whether ``outcome`` is a failure: ``failed``, ``error`` or any string not in :class:`Outcome`.

    An unknown outcome (empty, misspelt, from a newer writer) counts as a failure:
    the safe side (the test is selected again). Skipped, xfailed and xpassed runs
    are not failures.
    """
    return outcome not in _NOT_FAILURES


# --- Test ids: Bazel labels and pytest node ids -------------------------------
#
# The one parser of test ids. Its Starlark twin is ``normalize_label`` /
# ``label_problem`` in rules/private/plan_model.bzl; both are held to the shared
# corpus rules/tests/plan_cases.json (tests/test_plan_corpus.py and
# //rules/tests:plan_corpus_test), so keep the two in step.

#: Characters that make a label malformed (the same set as the Starlark twin).
_SPACE = " \t\n\r"
#: Characters of a repository name (``@name//``).
_REPO_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class LabelError(FastCIError, ValueError):
    """A test id that starts like a Bazel label (``//`` or ``@``) but is not a well-formed one."""


@dataclass(frozen=True)
class Label:
    """A parsed absolute Bazel label; ``str()`` is its canonical form.

    ``repo`` is empty for the main repository (``//p:t`` and ``@//p:t`` are the
    same label), ``package`` empty for the root package (``//:t``).
    """

    repo: str
    package: str
    name: str

    def __str__(self) -> str:
        prefix = f"@{self.repo}" if self.repo else ""
        return f"{prefix}//{self.package}:{self.name}"

    def source_path(self) -> RelPath | None:
        """The repo-relative path of a source file label (``//p/q:sub/x.py`` -> ``p/q/sub/x.py``).

        None for a file of another repository (``@r//...``): it has no path in this one.
        """
        if self.repo:
            return None
        return f"{self.package}/{self.name}" if self.package else self.name

    def testlogs_dir(self, testlogs: Path) -> Path:
        """The test's directory under ``bazel-testlogs`` (``external/<repo>/...`` for another repository)."""
        base = testlogs / "external" / self.repo if self.repo else testlogs
        return base / self.package / self.name if self.package else base / self.name


def is_label(test_id: str) -> bool:
    """Whether ``test_id`` is meant as a Bazel label (starts with ``//`` or ``@``), not a pytest node id."""
    return test_id.startswith(("//", "@"))


def label_problem(text: str) -> str | None:
    """Why ``text`` is not a well-formed absolute Bazel label, or None when it is.

    Accepted: ``//pkg:name``, ``//pkg`` (name = last package segment), ``//:name``,
    ``@repo//...``, ``@//...`` (the main repository) and ``@repo`` (``@repo//:repo``).
    """
    if any(c in text for c in _SPACE):
        return "it contains whitespace"
    if text.startswith("@"):
        repo, sep, rest = text[1:].partition("//")
        if any(c not in _REPO_CHARS for c in repo):
            return "a repository name holds only letters, digits, '_', '.' and '-'"
        if not sep:
            return None if repo else "nothing follows '@'"
        body = rest
    elif text.startswith("//"):
        body = text[2:]
    else:
        return "it starts with neither '//' nor '@'"
    if body.count(":") > 1:
        return "it has more than one ':'"
    package, colon, name = body.partition(":")
    if not package and not colon:
        return "it names neither a package nor a target"
    if colon and not name:
        return "the target name after ':' is empty"
    for part, what in ((package, "package"), (name, "target name")):
        if part.startswith("/") or part.endswith("/") or "//" in part:
            return f"the {what} has an empty path segment"
        if any(seg in (".", "..") for seg in part.split("/")):
            return f"the {what} has a '.' or '..' segment"
    return None


def parse_label(text: str) -> Label:
    """Parse an absolute Bazel label (see :func:`label_problem` for the forms).

    Raises:
        LabelError: ``text`` is not a well-formed label.
    """
    problem = label_problem(text)
    if problem is not None:
        raise LabelError(f"{text!r} is not a valid Bazel label: {problem}")
    repo = ""
    body = text[2:]
    if text.startswith("@"):
        repo, sep, rest = text[1:].partition("//")
        body = rest if sep else f":{repo}"
    package, colon, name = body.partition(":")
    return Label(repo, package, name if colon else package.rsplit("/", 1)[-1])


def as_label(test_id: str) -> Label | None:
    """The parsed label of ``test_id``; None for a pytest node id or a malformed label."""
    if not is_label(test_id) or label_problem(test_id) is not None:
        return None
    return parse_label(test_id)


def normalize_test_id(test_id: TestId) -> TestId:
    """The canonical form of a test id, so one test has one id everywhere.

    A label becomes ``[@repo]//package:name`` (``@//p:t`` and ``//p:t`` are one
    test, ``//p`` is ``//p:p``); a pytest node id, and a malformed label (which
    the plan schema rejects), are returned unchanged: never merged with another id.
    """
    label = as_label(test_id)
    return test_id if label is None else str(label)


#: Every control character as a visible ``\xNN`` escape (newline and tab included).
_ID_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f, *range(0x80, 0xa0))}


def shown(test_id: str) -> str:
    """``test_id`` as printed on one line: its control characters escaped (``\\x1b``,
    ``\\x0a``...), so an id from a plan, a store or a test runner cannot clear the
    terminal or forge a line of FastCI's report."""
    return test_id.translate(_ID_ESCAPES)
