"""What ``fastci eval`` evaluates: commits, ranges and patch files, and faults on top.

A CHANGE on the command line is

- a patch file (a path that exists): applied to ``--base`` (default ``HEAD``);
- a range ``A..B``: every commit of ``git rev-list --first-parent A..B``, oldest
  first, each against its first parent (evidence is refreshed between them, as a
  main branch that records on every merge would have it);
- anything else: a commit (``git rev-parse``), against its first parent.

Generated faults (``--faults N``) are made later, once a change's tree is in place
(:mod:`fastci.eval.faults` needs its sources): N seeded mutants per changed unit,
each a change of its own planned against the same base as the change it sits on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from fastci.eval.workspace import WorkspaceError, git

#: The kinds of change, in the order reports list them.
KINDS = ("commit", "patch", "fault")


@dataclass(frozen=True)
class Change:
    """One change to evaluate.

    Attributes:
        id: ``commit:<sha12>``, ``patch:<file name>`` or ``fault:<parent id>:<mutant>``.
        kind: one of :data:`KINDS`.
        title: a commit's subject, a patch's ``Subject:`` line or name, a fault's edit.
        base: the full sha the change is planned against.
        commit: the commit whose tree the change starts from (a commit change's own,
            or the commit a fault's parent is), None: ``base``.
        patches: unified diffs applied in order on that tree (a patch file; a fault's
            parent patch, if any, then the fault's own edit).
        parent: the change a fault sits on ("" otherwise).
        fault: a fault's description (name, operator, unit, path, line, edit).
    """

    id: str
    kind: str
    title: str
    base: str
    commit: str | None = None
    patches: tuple[str, ...] = ()
    parent: str = ""
    fault: Mapping[str, Any] = field(default_factory=dict)

    @property
    def refreshes_evidence(self) -> bool:
        """Whether its run-all recording becomes evidence for later changes: a commit's
        does (the next commit of a range builds on it); a patch or fault sits on a base
        that later changes do not share."""
        return self.kind == "commit"


def _commit_title(repo: Path, sha: str) -> str:
    return git(repo, "log", "-1", "--format=%s", sha).strip()


def _first_parent(repo: Path, sha: str, spec: str) -> str:
    out = git(repo, "rev-list", "--parents", "-n", "1", sha).split()
    if len(out) < 2:
        raise WorkspaceError(f"{spec}: a root commit has no parent to compare with")
    return out[1]


def _verify(repo: Path, rev: str) -> str:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except WorkspaceError:
        raise WorkspaceError(f"{rev}: no such commit in {repo}") from None


def patch_title(text: str, name: str) -> str:
    """A patch's ``Subject:`` line (``[PATCH]`` prefixes dropped), else its file name."""
    for line in text.splitlines():
        if line.startswith("Subject:"):
            subject = line[len("Subject:"):].strip()
            while subject.startswith("["):
                subject = subject.partition("]")[2].strip()
            return subject or name
        if line.startswith(("diff --git", "--- ")):
            break
    return name


def resolve(repo: Path, specs: Sequence[str], *, base: str = "HEAD") -> list[Change]:
    """The changes ``specs`` name (see the module docstring); none named: ``HEAD``.

    Raises:
        WorkspaceError: a revision does not exist, a range is empty, a patch cannot
            be read, or a commit is the root commit.
    """
    out: list[Change] = []
    base_sha = _verify(repo, base)
    for spec in specs or ["HEAD"]:
        path = Path(spec)
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise WorkspaceError(f"{spec}: cannot read the patch ({exc})") from exc
            out.append(Change(f"patch:{path.name}", "patch", patch_title(text, path.stem),
                              base_sha, patches=(text,)))
        elif ".." in spec:
            lo, _, hi = spec.partition("..")
            lo_sha, hi_sha = _verify(repo, lo or "HEAD"), _verify(repo, hi or "HEAD")
            shas = git(repo, "rev-list", "--reverse", "--first-parent",
                       f"{lo_sha}..{hi_sha}").split()
            if not shas:
                raise WorkspaceError(f"{spec}: the range holds no commit")
            out.extend(_commit(repo, sha, spec) for sha in shas)
        else:
            out.append(_commit(repo, _verify(repo, spec), spec))
    seen: set[str] = set()
    unique = []
    for change in out:
        if change.id not in seen:
            seen.add(change.id)
            unique.append(change)
    return unique


def _commit(repo: Path, sha: str, spec: str) -> Change:
    return Change(f"commit:{sha[:12]}", "commit", _commit_title(repo, sha),
                  _first_parent(repo, sha, spec), commit=sha)


def fault_seed(seed: int, change_id: str) -> int:
    """The mutant seed of one change: the user's seed and the change, so that adding a
    change to an evaluation does not alter the faults drawn for the others."""
    digest = hashlib.sha256(f"{seed}:{change_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")
