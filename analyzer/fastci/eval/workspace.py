"""The scratch worktree ``fastci eval`` checks changes out in.

An evaluation checks out many trees (each commit of a range, a patch on its base,
a fault on top of a change) and runs tests in them. Doing that in the user's
checkout would lose their work, so it happens in a detached ``git worktree`` of
the repository under the evaluation's work directory (outside the repository, so
Bazel never sees it as part of the user's workspace). The worktree shares the
repository's objects (every commit is there) and keeps its own Bazel output base
between evaluations, so a second evaluation starts warm.

Every operation that puts a tree in place first resets the worktree (``checkout
-f``, ``clean -fd``: ignored files such as Bazel's ``bazel-*`` links stay), so no
change leaks into the next one. Because that reset destroys work, a worktree is
reset only if FastCI made it: :meth:`Worktree.open` marks the worktrees it makes
(a file beside them in the work directory) and refuses any other, and
:func:`check_workdir` refuses a work directory inside the checkout or one whose
files would be the user's own store, calibration or plan.
"""

from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from fastci.errors import FastCIError
from fastci.types import RelPath

LOG = logging.getLogger(__name__)


class WorkspaceError(FastCIError):
    """The scratch worktree cannot be made, or a change cannot be put in it."""


def git(root: Path, *args: str, check: bool = True, stdin: str | None = None) -> str:
    """Run ``git -C root ARGS``; its stdout. A failure is a :class:`WorkspaceError`
    carrying git's first line of complaint."""
    proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          input=stdin, errors="replace", check=False)
    if check and proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[0]
        raise WorkspaceError(f"git {' '.join(args[:2])}: {why}")
    return proc.stdout


#: The file beside a scratch worktree that says FastCI made it (its content: the
#: worktree's resolved path). A worktree without it is never reset or checked out.
MARK = ".fastci-eval-worktree"


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_workdir(repo: Path, workdir: Path, keep: Iterable[Path]) -> Path:
    """``workdir`` resolved, once it is known to be safe for an evaluation to write.

    An evaluation resets the worktree ``workdir/tree`` and overwrites
    ``workdir/{evidence,calibration}.db`` and ``workdir/plan.json``. So the folder must
    lie outside the checkout (and so outside its ``.fastci``), and none of those files
    may be one of ``keep`` (the user's store, calibration and plan, wherever the
    configuration puts them). Nothing is written before this check.

    Raises:
        WorkspaceError: the folder is unsafe; the message says why and what to do.
    """
    work = workdir.expanduser().resolve()
    top = repo.resolve()
    if _inside(work, top):
        raise WorkspaceError(f"--workdir {workdir} is inside the checkout {top}: an evaluation "
                             "resets and overwrites its work directory; choose a folder "
                             "outside the repository")
    mine = {work / name for name in ("evidence.db", "calibration.db", "plan.json")}
    mine |= {Path(f"{p}{s}") for p in list(mine) for s in ("-wal", "-shm")}
    for user in keep:
        user = user.expanduser().resolve()
        if user in mine or _inside(user, work / "tree"):
            raise WorkspaceError(f"--workdir {workdir} would overwrite {user}, which the "
                                 "evaluation must only read: choose another folder")
    return work


@dataclass(frozen=True)
class Worktree:
    """A detached worktree of ``repo`` at ``path``."""

    repo: Path
    path: Path

    @classmethod
    def open(cls, repo: Path, path: Path, *, adopt: bool = False) -> Worktree:
        """The worktree at ``path``: made (and marked as FastCI's) when absent, reused
        when FastCI made it for ``repo``.

        ``adopt`` marks an unmarked worktree of ``repo`` as FastCI's: only for a folder
        that no one but FastCI writes (the default work directory under
        ``~/.cache/fastci``, whose worktrees earlier versions made without a mark).

        Raises:
            WorkspaceError: ``path`` exists and is something else, a worktree FastCI did
                not make, or git refuses.
        """
        path = path.resolve()
        mark = path.parent / MARK
        if path.exists():
            if not (path / ".git").is_file():
                raise WorkspaceError(f"{path} exists and is not a worktree of {repo}: "
                                     "remove it or choose another --workdir")
            common = Path(git(path, "rev-parse", "--git-common-dir").strip())
            mine = Path(git(repo, "rev-parse", "--git-common-dir").strip())
            if (path / common).resolve() != (repo / mine).resolve():
                raise WorkspaceError(f"{path} is a worktree of another repository: remove it "
                                     "or choose another --workdir")
            if not _marks(mark, path):
                if not adopt:
                    raise WorkspaceError(
                        f"{path} is a worktree FastCI did not make (it may hold your work): "
                        "fastci eval resets its worktree, so it refuses; choose another "
                        "--workdir")
                mark.write_text(f"{path}\n")
            return cls(repo, path)
        path.parent.mkdir(parents=True, exist_ok=True)
        git(repo, "worktree", "prune")
        git(repo, "worktree", "add", "--detach", "--force", str(path), "HEAD")
        mark.write_text(f"{path}\n")
        LOG.info("made the scratch worktree %s", path)
        return cls(repo, path)

    def checkout(self, commit: str) -> None:
        """Put ``commit``'s tree in place (detached), dropping whatever was there."""
        self.reset()
        git(self.path, "checkout", "-q", "--detach", "-f", commit)

    def reset(self) -> None:
        """Drop every change to tracked files and every untracked, unignored file."""
        git(self.path, "reset", "-q")
        git(self.path, "checkout", "-q", "-f", "--", ".", check=False)
        git(self.path, "clean", "-q", "-fd")

    def apply(self, patch: str, name: str) -> None:
        """Apply a unified diff to the tree in place.

        Raises:
            WorkspaceError: the patch does not apply (nothing of it is applied).
        """
        proc = subprocess.run(["git", "-C", str(self.path), "apply", "--recount", "-"],
                              input=patch, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["?"])[0]
            raise WorkspaceError(f"{name} does not apply: {why}")

    def snapshot(self, base: str) -> Snapshot:
        """The content in place compared with ``base``: its tree id, changed paths and
        changed Python lines, from one staging of the worktree (untracked files
        included; the index is reset afterwards)."""
        git(self.path, "add", "-A")
        try:
            tree = git(self.path, "write-tree").strip()
            names = git(self.path, "diff", "--cached", "--name-only", "--no-renames", base)
            diff = git(self.path, "diff", "--cached", "-U0", "--no-color", "--no-renames", base,
                       "--", "*.py")
        finally:
            git(self.path, "reset", "-q")
        return Snapshot(tree, sorted(line for line in names.splitlines() if line),
                        parse_changed_lines(diff))

    def read(self, rel: RelPath, rev: str | None = None) -> bytes | None:
        """A file's bytes in place (``rev`` None) or at ``rev``; None when it is absent."""
        if rev is None:
            p = self.path / rel
            return p.read_bytes() if p.is_file() else None
        proc = subprocess.run(["git", "-C", str(self.path), "show", f"{rev}:{rel}"],
                              capture_output=True, check=False)
        return proc.stdout if proc.returncode == 0 else None


def _marks(mark: Path, path: Path) -> bool:
    """Whether ``mark`` says FastCI made the worktree at ``path``."""
    try:
        return mark.read_text().strip() == str(path)
    except (OSError, UnicodeDecodeError):
        return False


@dataclass(frozen=True)
class Snapshot:
    """What :meth:`Worktree.snapshot` saw: the git tree id of the content in place, the
    files that differ from the base (sorted), and the changed lines per Python file (the
    new side of each hunk; a hunk that only deletes counts the line after the deletion,
    where the removed code ran before)."""

    tree: str
    paths: list[RelPath]
    lines: dict[RelPath, set[int]]


_HUNK = re.compile(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


def parse_changed_lines(diff: str) -> dict[RelPath, set[int]]:
    """New-side lines of a ``git diff -U0`` (see :class:`Snapshot`)."""
    lines: dict[RelPath, set[int]] = {}
    path = ""
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else ""
            continue
        m = _HUNK.match(line)
        if m and path:
            start, count = int(m.group(1)), int(m.group(2) or "1")
            lines.setdefault(path, set()).update(range(start, start + count) if count
                                                 else {start + 1})
    return lines
