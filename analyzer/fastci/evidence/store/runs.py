"""The store's records of runs: what ingest takes (:class:`RunEvidence`) and reads give.

:class:`RunRecord` is one run as the store holds it (a tuple of its row, JSON parsed
when read), :class:`HistoryRun` one entry of a failure history. ``db`` re-exports
them: ``from fastci.evidence.store.db import RunRecord`` is the usual spelling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Mapping

from fastci.errors import StoreError
from fastci.types import Checksum, ContextSig, RelPath, TestId, UnitId

#: The key of a run's environment JSON that says why its evidence is incomplete although
#: every process stopped cleanly (trace field ``incomplete_reasons``; absent otherwise).
#: Kept there rather than in a column of its own so that stores need no new schema.
INCOMPLETE_KEY = "incomplete_reason"


@dataclass(frozen=True)
class HistoryRun:
    """One run in a test's failure history (:meth:`EvidenceStore.failure_history`)."""

    outcome: str
    commit: str | None
    full: bool  # known to be at full workload
    recorded_at: float


class RunRecord(tuple[Any, ...]):
    """One run of a test as the store knows it.

    ``workload`` is the declared (full) workload the run knew; ``overrides`` what
    the run changed of it: ``{}`` when it ran at full workload, ``None`` when the
    writer did not say (such a run never counts as a full-workload run).
    :meth:`EvidenceStore.latest_runs` also fills ``last_full``: the test's newest
    run known to be at full workload (this record itself when it is one).

    Immutable. Held as a tuple of the store's row (:data:`_ROW`'s layout, see
    :meth:`of_row`), its JSON columns parsed when read: a plan reads the newest run
    of every test, 100,000 at scale, and a tuple made from the row costs a fifth of
    an object with a ``__dict__`` (measured: 0.04 against 0.2 s). Equality compares
    the fields, as a dataclass's would, never the layout.
    """

    __slots__ = ()

    def __new__(cls, test: TestId, commit: str | None, env_fingerprint: str,
                workload: Mapping[str, Any], duration_s: float, gpus: int, outcome: str,
                complete: bool, recorded_at: float, overrides: Mapping[str, Any] | None = None,
                last_full: RunRecord | None = None, environment_json: str = "{}",
                packages_list: str = "") -> RunRecord:
        return tuple.__new__(cls, (test, commit, env_fingerprint, workload, overrides, duration_s,
                                   gpus, outcome, complete, recorded_at, environment_json, None,
                                   last_full, packages_list))

    @classmethod
    def of_row(cls, row: tuple[Any, ...]) -> RunRecord:
        """A record of a row in :data:`_ROW`'s layout: the 11 record columns, the run's
        id, then optionally the newest full-workload run (None; the run's own id: this
        run; or a RunRecord) and the package listing of its environment."""
        return tuple.__new__(cls, row)

    if TYPE_CHECKING:
        test: TestId
        commit: str | None
        env_fingerprint: str
        duration_s: float
        gpus: int
        outcome: str
        recorded_at: float
        environment_json: str
    else:
        test = property(itemgetter(0))
        commit = property(itemgetter(1))
        env_fingerprint = property(itemgetter(2))
        duration_s = property(itemgetter(5))
        gpus = property(itemgetter(6))
        outcome = property(itemgetter(7))
        recorded_at = property(itemgetter(9))
        environment_json = property(itemgetter(10))

    @property
    def workload(self) -> Mapping[str, Any]:
        got: Mapping[str, Any] | str = self[3]
        return _loads(got) if isinstance(got, str) else got

    @property
    def overrides(self) -> Mapping[str, Any] | None:
        got: Mapping[str, Any] | str | None = self[4]
        return _loads(got) if isinstance(got, str) else got

    @property
    def complete(self) -> bool:
        return bool(self[8])

    @property
    def last_full(self) -> RunRecord | None:
        got = self[12] if len(self) > 12 else None
        if got is None or isinstance(got, RunRecord):
            return got
        if got == self[11]:
            return self  # the run's own id: it is its own newest full-workload run
        raise StoreError(f"the run record of {self.test} names a full-workload run it does not hold")

    @property
    def packages_list(self) -> str:
        return (self[13] if len(self) > 13 else None) or ""

    def _fields(self) -> tuple[Any, ...]:
        """What equality compares: the fields (:data:`_COMPARED`), mappings as dicts, and
        the record's own ``last_full`` as a marker (no recursion into itself)."""
        full = self.last_full
        return (*(_plain(getattr(self, name)) for name in _COMPARED),
                _ITSELF if full is self else full)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunRecord):
            return NotImplemented
        return self._fields() == other._fields()

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, RunRecord):
            return NotImplemented
        return self._fields() != other._fields()

    __hash__ = None  # type: ignore[assignment]  # holds dicts, as the dataclass it replaced

    def __repr__(self) -> str:
        full = self.last_full
        shown = ", ".join(f"{name}={_plain(getattr(self, name))!r}" for name in _COMPARED)
        return f"RunRecord({shown}, last_full={'<itself>' if full is self else repr(full)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return RunRecord.of_row, (tuple(self),)

    def as_dict(self) -> dict[str, Any]:
        """The fields by name (``last_full`` as its own dict, ``"itself"`` when the record
        is its own newest full-workload run): what ``fastci evidence show --json`` prints."""
        full = self.last_full
        return {**{name: _plain(getattr(self, name)) for name in _COMPARED},
                "last_full": "itself" if full is self else None if full is None
                else full.as_dict(),
                "environment_json": self.environment_json, "packages_list": self.packages_list}

    @property
    def environment(self) -> dict[str, Any]:
        """The run's environment parts (``python``, ``base_fingerprint`` ...) and, when the
        store holds it, ``packages_list``: what environment rules compare package by package."""
        try:
            env = json.loads(self.environment_json)
        except ValueError:
            env = {}
        env = env if isinstance(env, dict) else {}
        if self.packages_list:
            env["packages_list"] = self.packages_list
        return env

    @property
    def incomplete_reason(self) -> str:
        """Why the run's evidence is incomplete, when its recording said (``""``: not said)."""
        got = self.environment.get(INCOMPLETE_KEY)
        return got if isinstance(got, str) else ""

    @property
    def full(self) -> bool:
        """Whether the run is known to have run at the full declared workload."""
        return self.overrides is not None and not self.overrides


@dataclass(frozen=True)
class RunEvidence:
    """A merged recording of one test run (all its processes), ready to ingest.

    ``workload`` is the declared (full) workload, ``overrides`` what the run
    changed of it (see :class:`RunRecord`).
    """

    test: TestId
    run_key: str
    outcome: str
    complete: bool
    duration_s: float
    gpus: int
    workload: Mapping[str, Any]
    recorded_at: float
    env_fingerprint: str = ""
    # What the run changed of ``workload`` (the declared one): {} = full
    # workload, None = the recording did not say (never counts as full).
    overrides: Mapping[str, Any] | None = None
    environment: Mapping[str, Any] = field(default_factory=dict)
    commit: str | None = None
    source: str = "bazel"
    units: Mapping[UnitId, tuple[Checksum, frozenset[ContextSig]]] = field(default_factory=dict)
    files: Mapping[RelPath, str] = field(default_factory=dict)
    # Python path -> sha256 of its bytes when recorded (the test's baseline of the file).
    sources: Mapping[RelPath, str] = field(default_factory=dict)
    # Third-party distributions the run imported: name -> version.
    distributions: Mapping[str, str] = field(default_factory=dict)
    # A run imported from an export without its evidence (history; :meth:`add_run`).
    has_evidence: bool = True


def real_overrides(workload: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides that change something: entries equal to the declared value are dropped.

    So "ran at full workload" is one thing (``{}``), however a writer spelled it.
    """
    return {k: v for k, v in overrides.items() if k not in workload or workload[k] != v}


#: What a record's equality puts where its ``last_full`` is the record itself.
_ITSELF = object()
#: The fields a record's equality compares (and its repr shows) besides ``last_full``;
#: the environment's text and package listing are not compared.
_COMPARED = ("test", "commit", "env_fingerprint", "workload", "duration_s", "gpus", "outcome",
             "complete", "recorded_at", "overrides")


def _plain(value: Any) -> Any:
    """A field's value with a mapping as a plain dict (what equality and JSON see)."""
    return dict(value) if isinstance(value, Mapping) else value


def _loads(text: str) -> Any:
    """``json.loads``, without its cost for the empty object most runs hold."""
    return {} if text == "{}" else json.loads(text)
