"""Filling the evidence store: the routines behind ``fastci record`` and ``fastci ingest``.

:func:`record` runs tests under the recorder with Bazel (``--config=fastci_record``)
and ingests their traces; :func:`ingest_paths` ingests trace files already on disk
(``bazel-testlogs``, pytest trace directories). Both stamp the evidence with
:func:`fastci.integrations.git.tree.evidence_commit` of the tree the traces come
from, taken before anything runs: ``HEAD`` for a clean tree, ``dirty:<tree id>``
for a modified one, which never passes for a commit, so plans compare every
recorded file with what they analyse instead of trusting it as ``HEAD``'s.

(:mod:`fastci.evidence.record.recorder` is the other end: the recorder inside a test process.)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from fastci.errors import BazelError, FastCIError
from fastci.evidence.record import trace, trace_pb2
from fastci.evidence.store.ingest import (IngestReport, TraceBlob, find_traces, ingest,
                                          results_from_bep)
from fastci.evidence.store.db import EvidenceStore
from fastci.integrations.bazel.runner import EXIT_NO_TESTS, Bazel
from fastci.integrations.bazel.bep_follow import follow_bep_progress
from fastci.integrations.git.tree import DIRTY_PREFIX, evidence_commit

if TYPE_CHECKING:
    from fastci.progress import Progress


def summary(report: IngestReport) -> str:
    """One line saying what an ingest did."""
    line = (f"ingested {report.traces} trace(s): {report.runs_added} run(s) added, "
            f"{report.runs_skipped} already known, {len(report.tests)} test(s)")
    if report.incomplete_tests:
        line += f", {len(report.incomplete_tests)} with incomplete evidence"
    if report.corrupt:
        line += f", {len(report.corrupt)} corrupt trace(s) skipped"
    return line


def dirty_note(commit: str | None) -> list[str]:
    """The line saying evidence was stamped as a modified tree's (none for a commit)."""
    if commit is None or not commit.startswith(DIRTY_PREFIX):
        return []
    return [f"recorded from a modified tree: evidence stamped {commit[:len(DIRTY_PREFIX) + 12]}…; "
            "plans compare every recorded file"]


# TraceModules: a Trace's module counts alone (typed Any: see fastci.evidence.record.trace).
_TRACE_MODULES: Any = getattr(trace_pb2, "TraceModules")
# The frame before a trace's payload: magic, u32 length, u32 crc32 (fastci.evidence.record.trace).
_FRAME = len(trace.MAGIC) + 8


@dataclass
class ModuleTally:
    """Module counts of the traces an ingest read (``Trace.modules``), for its warning.

    Attributes:
        traces: traces that name their modules (recorders before it leave them unset).
        flagged: those in which modules from outside the repository outnumber the
            repository's own: most of what that process executed is not evidence.
        outside: the most outside modules one flagged trace imported.
        examples: where flagged traces' outside modules came from, and how often.
    """

    traces: int = 0
    flagged: int = 0
    outside: int = 0
    examples: Counter[str] = field(default_factory=Counter)

    def add(self, data: bytes) -> None:
        """Count one framed trace; a bad one is ingest's to report, so it is skipped here."""
        if not data.startswith(trace.MAGIC):
            return
        view = _TRACE_MODULES()
        try:  # parses field 21 only: the files and contexts are skipped, not decoded
            view.ParseFromString(data[_FRAME:])
        except Exception:  # protobuf raises its own DecodeError
            return
        if not view.HasField("modules"):
            return
        mods = view.modules
        self.traces += 1
        if mods.outside_modules > mods.repo_modules:
            self.flagged += 1
            self.outside = max(self.outside, mods.outside_modules)
            self.examples[mods.outside_example] += 1

    def counting(self, blobs: Iterable[TraceBlob]) -> Iterator[TraceBlob]:
        """Yield ``blobs`` unchanged, counting each on the way to ingest."""
        for blob in blobs:
            self.add(blob.data)
            yield blob

    def note(self) -> list[str]:
        """The warning line when a recorded process executed mostly code outside the repo."""
        if not self.flagged:
            return []
        where = self.examples.most_common(1)[0][0] or "another directory"
        more = f" and {len(self.examples) - 1} other folder(s)" if len(self.examples) > 1 else ""
        return [f"{self.outside} module(s) executed from {where}{more} outside the repository "
                f"are not evidence ({self.flagged} of {self.traces} trace(s)): record from that "
                "checkout, or install it inside this repository — see docs/EVIDENCE.md"]


def guess_source(paths: Sequence[Path]) -> str:
    """``bazel`` when a path is under a ``bazel-testlogs`` tree, else ``pytest``."""
    return "bazel" if any("testlogs" in str(p) for p in paths) else "pytest"


def ingest_paths(store_path: Path, paths: Sequence[Path], *, source: str | None = None,
                 bep: Path | None = None, commit: str | None = None,
                 source_root: Path, notes: list[str] | None = None,
                 jobs: int | None = None) -> tuple[IngestReport, str | None]:
    """Merge the trace files under ``paths`` into the store at ``store_path`` (created if absent).

    Args:
        store_path: the evidence store.
        paths: trace files or directories; every one must exist.
        source: ``bazel`` or ``pytest`` (None: :func:`guess_source`).
        bep: a build event JSON file: its outcomes and durations win over the traces',
            and only its tests' traces are read.
        commit: the commit the traces were recorded at (None: the
            :func:`~fastci.integrations.git.tree.evidence_commit` of ``source_root``).
        source_root: the tree the traces were recorded from (unit checksums are taken from it).
        notes: warnings for the user are appended here (code outside the repository,
            :class:`ModuleTally`); print them after :func:`summary`, before :func:`dirty_note`.
        jobs: worker processes that merge traces (:func:`fastci.evidence.store.ingest.worker_count`).

    Returns:
        The ingest report and the commit the evidence was stamped with (None outside
        a git repository: evidence of an unknown revision).

    Raises:
        FastCIError: a path does not exist (nothing is ingested).
    """
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise FastCIError(f"{missing[0]}: no such file or directory")
    results = results_from_bep(bep) if bep else None
    # The tree the unit checksums are computed from, taken before the store is created.
    commit = commit or evidence_commit(source_root)
    store = EvidenceStore.open(store_path, create=True)
    tally = ModuleTally()
    try:
        report = ingest(store, tally.counting(find_traces(paths)),
                        source=source or guess_source(paths),
                        commit=commit, results=results, root=source_root,
                        only=set(results) if results is not None else None, jobs=jobs)
    finally:
        store.close()
    if notes is not None:
        notes.extend(tally.note())
    return report, commit


@dataclass(frozen=True)
class Recording:
    """What ``fastci record`` did.

    Attributes:
        summary: the lines the command prints.
        passed: tests that passed.
        failed: labels of tests that did not pass (failed, timed out, not built); their
            evidence is ingested with that outcome, so plans select them again.
        bazel_exit: ``bazel test``'s exit code.
    """

    summary: str
    passed: int
    failed: tuple[str, ...]
    bazel_exit: int

    @property
    def ok(self) -> bool:
        """Whether every test passed and Bazel agrees (exit 0, or 4: nothing to test)."""
        return not self.failed and self.bazel_exit in (0, EXIT_NO_TESTS)

    def failure_line(self) -> str | None:
        """The one line for stderr when the recording is not :attr:`ok` (None when it is)."""
        if self.ok:
            return None
        if not self.failed:
            return (f"bazel test exited {self.bazel_exit} although no test failed "
                    "(a target did not build?): evidence of the passing tests was ingested")
        shown = ", ".join(self.failed[:5]) + (f" and {len(self.failed) - 5} more"
                                              if len(self.failed) > 5 else "")
        return (f"{len(self.failed)} test(s) failed while recording: {shown} (evidence of the "
                "passing tests was ingested; the failing ones are marked failed)")


def record(workspace: Path, targets: list[str], store_path: Path, *,
           flags: Sequence[str] = (), bazel: Bazel | None = None) -> str:
    """Run ``bazel test --config=fastci_record`` and ingest; return the summary text.

    :func:`record_tests` does the same and also says whether every test passed.
    """
    return record_tests(workspace, targets, store_path, flags=flags, bazel=bazel).summary


def record_tests(workspace: Path, targets: list[str], store_path: Path, *,
                 flags: Sequence[str] = (), bazel: Bazel | None = None,
                 progress: Progress | None = None) -> Recording:
    """Run ``bazel test --config=fastci_record`` and ingest the traces.

    Args:
        workspace: the Bazel workspace (its tree stamps the evidence).
        targets: target patterns to test.
        store_path: the evidence store (created if absent).
        flags: extra flags for ``bazel test``.
        bazel: the Bazel adapter to use (default: one for ``workspace``).
        progress: advanced as each test finishes, from the build event file while Bazel
            writes it (:func:`~fastci.integrations.bazel.bep_follow.follow_bep_progress`;
            its total is the test targets Bazel configured), and closed when ``bazel test``
            returns, before the ingest.

    Raises:
        BazelError: Bazel reported no test results although tests were built.
    """
    bz = bazel or Bazel(workspace)
    # The tree the tests run on: taken before the run writes anything into the workspace.
    commit = evidence_commit(workspace)
    bep = workspace / ".fastci" / "runs" / "record-bep.json"
    bep.parent.mkdir(parents=True, exist_ok=True)
    bep.unlink(missing_ok=True)  # the last recording's: neither its progress nor its results
    if progress is None:
        res = bz.test(targets, flags=["--config=fastci_record", *flags], bep_path=bep)
    else:
        with progress, follow_bep_progress(bep, progress):
            res = bz.test(targets, flags=["--config=fastci_record", *flags], bep_path=bep)
    testlogs = Path(bz.info("bazel-testlogs"))
    results = results_from_bep(bep)
    if not results and not res.no_tests:
        raise BazelError(f"bazel test reported no test results in {bep}")
    store = EvidenceStore.open(store_path, create=True)
    tally = ModuleTally()
    try:
        report = ingest(store, tally.counting(find_traces([testlogs]) if testlogs.exists()
                                              else iter(())),
                        source="bazel", commit=commit, results=results,
                        root=workspace, only=set(results))
        stats = store.stats()
    finally:
        store.close()
    failed = tuple(sorted(label for label, r in results.items() if r.outcome != "passed"))
    passed = len(results) - len(failed)
    lines = [f"{passed} passed, {len(failed)} failed",
             summary(report),
             f"store {store_path}: {stats['test']} tests, {stats['unit']} units, "
             f"{stats['context']} contexts, {stats['file_read']} file reads, "
             f"{stats['evidence']} evidence rows, {stats['bytes'] / 1e6:.2f} MB"]
    lines += [f"fastci: {m}" for m in report.corrupt]
    lines += tally.note()
    lines += dirty_note(commit)
    return Recording("\n".join(lines), passed, failed, res.returncode)
