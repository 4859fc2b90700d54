"""A small adapter over the ``git`` command line: changed files and file contents.

Change analysis needs three things from git: which files differ between two
revisions (or between a revision and the working tree), what a file looked like
at a revision, and whether a revision exists. Every failure becomes a
:class:`~fastci.errors.GitError` so the caller can widen the plan and say why.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from fastci.errors import GitError
from fastci.types import RelPath, is_tool_artifact

LOG = logging.getLogger(__name__)

#: The revision name meaning "the working tree, including untracked files".
WORKTREE = ":worktree"


@dataclass(frozen=True)
class FileChange:
    """One changed path: ``status`` is ``A`` added, ``D`` deleted, ``M`` modified, ``R`` renamed."""

    status: str
    path: RelPath
    old_path: RelPath | None = None  # the path at the base revision for renames

    @property
    def base_path(self) -> RelPath:
        """The path under which the file existed at the base revision."""
        return self.old_path or self.path


def _text(raw: bytes) -> str:
    """Decode git's output as the file system does: bytes that are not UTF-8 survive.

    Git prints paths as stored, whatever their encoding; ``surrogateescape`` maps
    each undecodable byte to a lone surrogate, so the name still opens the file
    (``os`` encodes it back the same way) and no path is dropped or crashes.
    """
    return raw.decode("utf-8", errors="surrogateescape")


def _names(raw: bytes) -> list[RelPath]:
    """The paths of a ``-z`` (NUL-separated) listing, in git's order."""
    return [p for p in _text(raw).split("\0") if p]


def shown(path: str) -> str:
    """``path`` printable: a byte that is not UTF-8 is shown escaped (``caf\\xe9.bin``)."""
    return path.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="backslashreplace")


#: A full commit id, SHA-1 or SHA-256 (nothing git would read as an option or a range;
#: ``git log --format=%H`` answers with full ids, so an abbreviated one would never match).
_HEX = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")


class Git:
    """Run git in one repository; every method raises :class:`GitError` on failure."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._resolved: dict[str, str] = {}

    def _run(self, args: Sequence[str], *, check: bool = True,
             input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        cmd = ["git", "-C", str(self.root), *args]
        try:
            proc = subprocess.run(cmd, input=input, capture_output=True, check=False)
        except OSError as exc:
            raise GitError(f"cannot run git: {exc.strerror}") from exc
        if check and proc.returncode != 0:
            msg = proc.stderr.decode(errors="replace").strip().splitlines()
            raise GitError(f"git {' '.join(args[:3])}: {msg[0] if msg else 'failed'}")
        return proc

    def toplevel(self) -> Path:
        """Return the repository's top-level directory."""
        return Path(_text(self._run(["rev-parse", "--show-toplevel"]).stdout).strip())

    def resolve(self, rev: str) -> str:
        """Return the full commit id of ``rev``; :class:`GitError` if it does not exist."""
        if rev in self._resolved:
            return self._resolved[rev]
        proc = self._run(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], check=False)
        if proc.returncode != 0:
            raise GitError(f"revision {rev!r} does not exist in {self.root}")
        commit = proc.stdout.decode().strip()
        if rev == commit:  # only immutable names are cached (branches move)
            self._resolved[rev] = commit
        return commit

    def has_revision(self, rev: str) -> bool:
        """Whether ``rev`` names a commit."""
        try:
            self.resolve(rev)
        except GitError:
            return False
        return True

    def changed_files(self, base: str, head: str = WORKTREE) -> list[FileChange]:
        """Files that differ between ``base`` and ``head`` (a revision or :data:`WORKTREE`).

        Renames are detected (``-M``); in worktree mode untracked files that are not
        ignored count as added.
        """
        base_id = self.resolve(base)
        args = ["diff", "--name-status", "-z", "-M", "--no-ext-diff", base_id]
        if head != WORKTREE:
            args.append(self.resolve(head))
        changes = parse_name_status(self._run([*args, "--"]).stdout)
        if head == WORKTREE:
            seen = {c.path for c in changes}
            out = self._run(["ls-files", "-z", "--others", "--exclude-standard"]).stdout
            for p in _names(out):
                # A repo that does not ignore __pycache__ or .pytest_cache: what a run
                # wrote there is no change to the code.
                if p and p not in seen and not is_tool_artifact(p):
                    changes.append(FileChange("A", p))
        return sorted(changes, key=lambda c: c.path)

    def files_of_commits(self, commits: Iterable[str]) -> dict[str, frozenset[RelPath]]:
        """The paths each commit changed against its first parent, in one ``git log``
        (a commit the repository does not hold, e.g. in a shallow clone, is left out)."""
        wanted = sorted({c for c in commits if c and _HEX.fullmatch(c)})
        if not wanted:
            return {}
        out = self._run(["-c", "core.quotepath=off", "log", "--no-walk=unsorted",
                         "--ignore-missing", "-m", "--first-parent", "--name-only",
                         "--format=%x00%H", *wanted]).stdout
        got: dict[str, set[RelPath]] = {}
        for block in _text(out).split("\0")[1:]:
            sha, *paths = block.strip("\n").split("\n")
            got.setdefault(sha, set()).update(p for p in paths if p)
        return {c: frozenset(paths) for c, paths in got.items()}

    def parents_of_history(self, tips: Iterable[str], limit: int) -> dict[str, tuple[str, ...]]:
        """Commit -> its parents, for up to ``limit`` commits reachable from ``tips`` (the
        newest first), in one ``git rev-list``; a tip the repository does not hold is left
        out. A commit outside the answer is unknown (a shallow clone, past ``limit``)."""
        wanted = sorted({c for c in tips if c and _HEX.fullmatch(c)})
        if not wanted:
            return {}
        held = self._run(["cat-file", "--batch-check=%(objectname) %(objecttype)"],
                         input="".join(f"{c}\n" for c in wanted).encode()).stdout
        present = [line.split()[0] for line in _text(held).splitlines()
                   if line.endswith(" commit")]
        if not present:
            return {}
        out = self._run(["rev-list", "--parents", f"--max-count={int(limit)}", *present,
                         "--"]).stdout
        graph: dict[str, tuple[str, ...]] = {}
        for line in _text(out).splitlines():
            sha, *parents = line.split()
            graph[sha] = tuple(parents)
        return graph

    def read(self, rev: str, path: RelPath) -> bytes | None:
        """The bytes of ``path`` at ``rev`` (``WORKTREE`` reads the disk); None if absent."""
        if rev == WORKTREE:
            try:
                return (self.root / path).read_bytes()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return None
            except OSError as exc:
                raise GitError(f"cannot read {path}: {exc.strerror}") from exc
        proc = self._run(["cat-file", "blob", f"{self.resolve(rev)}:{path}"], check=False)
        if proc.returncode != 0:
            return None
        return proc.stdout

    def read_many(self, rev: str, paths: Iterable[RelPath]) -> dict[RelPath, bytes | None]:
        """:meth:`read` of several paths at the commit ``rev``, in one ``git cat-file
        --batch`` (a plan reads every changed file's old version: one git process
        instead of one each). A path that is not a file there (absent, a folder, a
        submodule) reads None, as :meth:`read` gives; a name ``--batch`` cannot carry
        (a newline in it) is read alone."""
        wanted = sorted(set(paths))
        if not wanted:
            return {}
        commit = self.resolve(rev)
        batch = [p for p in wanted if "\n" not in p and "\r" not in p]
        out = {p: self.read(commit, p) for p in wanted if p not in batch}
        if not batch:
            return out
        request = "".join(f"{commit}:{p}\n" for p in batch).encode("utf-8", "surrogateescape")
        data, at = self._run(["cat-file", "--batch"], input=request).stdout, 0
        for path in batch:
            end = data.find(b"\n", at)
            if end < 0:
                raise GitError(f"git cat-file --batch: its answer ends before {path}")
            header = data[at:end].split()
            at = end + 1
            if len(header) == 3 and header[2].isdigit():  # <object> <type> <size>, then the bytes
                size = int(header[2])
                out[path] = data[at:at + size] if header[1] == b"blob" else None
                at += size + 1
            else:  # "<name> missing" (or ambiguous): nothing at that path
                out[path] = None
        return out

    def list_files(self, rev: str, under: str = "") -> list[RelPath]:
        """Files at ``rev`` (``WORKTREE``: tracked and untracked-not-ignored, on disk) under a folder."""
        spec = [f":(literal){under.rstrip('/')}"] if under.strip("/") else []
        if rev == WORKTREE:
            out = self._run(["ls-files", "-z", "--cached", "--others", "--exclude-standard",
                             "--", *spec]).stdout
            names = sorted(set(_names(out)))
            return [p for p in names if (self.root / p).is_file()]
        out = self._run(["ls-tree", "-r", "-z", "--name-only", self.resolve(rev), "--",
                         *spec]).stdout
        return sorted(_names(out))

    def tracked_files(self, rev: str) -> set[RelPath]:
        """Paths git tracks at ``rev`` (``WORKTREE``: the index), untracked and ignored not."""
        if rev == WORKTREE:
            out = self._run(["ls-files", "-z", "--cached"]).stdout
        else:
            out = self._run(["ls-tree", "-r", "-z", "--name-only", self.resolve(rev)]).stdout
        return set(_names(out))

    def grep_files(self, rev: str, words: Sequence[str], glob: str = "*.py") -> list[RelPath]:
        """Files at ``rev`` matching ``glob`` whose text contains any of ``words`` (fixed strings).

        ``WORKTREE`` searches the working tree, untracked (not ignored) files included.
        """
        if not words:
            return []
        return self._grep_result(rev, self._run(self._grep_args(rev, words, glob), check=False))

    def grep_files_each(self, rev: str, searches: Sequence[Sequence[str]],
                        glob: str = "*.py") -> list[list[RelPath]]:
        """:meth:`grep_files` for each of ``searches``, the git processes run side by side
        (each one reads every file: on a large tree their time adds up otherwise)."""
        if len(searches) < 2:
            return [self.grep_files(rev, words, glob) for words in searches]
        from concurrent.futures import ThreadPoolExecutor

        commands = [self._grep_args(rev, words, glob) if words else None for words in searches]
        with ThreadPoolExecutor(max_workers=min(len(searches), 4)) as pool:
            procs = list(pool.map(lambda args: self._run(args, check=False) if args else None,
                                  commands))
        return [self._grep_result(rev, proc) if proc is not None else [] for proc in procs]

    def _grep_args(self, rev: str, words: Sequence[str], glob: str) -> list[str]:
        args = ["grep", "-l", "-z", "-F", "-I"]
        for w in words:
            args += ["-e", w]
        if rev == WORKTREE:
            return [*args, "--untracked", "--", glob]
        return [*args, self.resolve(rev), "--", glob]

    def _grep_result(self, rev: str, proc: subprocess.CompletedProcess[bytes]) -> list[RelPath]:
        if proc.returncode not in (0, 1):  # 1: nothing matched
            msg = proc.stderr.decode(errors="replace").strip().splitlines()
            raise GitError(f"git grep: {msg[0] if msg else 'failed'}")
        prefix = "" if rev == WORKTREE else f"{self.resolve(rev)}:"
        return sorted(p[len(prefix):] if prefix and p.startswith(prefix) else p
                      for p in _names(proc.stdout))

    def head(self) -> str | None:
        """The commit id of HEAD, or None in a repository without commits."""
        try:
            return self.resolve("HEAD")
        except GitError:
            return None


def cache_dir(root: Path) -> Path:
    """Where FastCI keeps per-machine caches for the repository at ``root``.

    Inside git's own directory (``.git/fastci``) when there is one: nothing a
    change commits can be placed there, so a cache never comes from the change
    under analysis. Outside git, ``root/.fastci``.
    """
    try:
        proc = subprocess.run(["git", "-C", str(root), "rev-parse", "--absolute-git-dir"],
                              capture_output=True, check=False)
    except OSError:
        proc = None
    if proc is not None and proc.returncode == 0 and proc.stdout.strip():
        return Path(os.fsdecode(proc.stdout.strip())) / "fastci"
    return Path(root) / ".fastci"


def repo_root(start: Path) -> Path:
    """The git top level containing ``start`` (resolved), else ``start`` itself, resolved."""
    try:
        return Git(start).toplevel().resolve()
    except GitError:
        return Path(start).resolve()


def parse_name_status(raw: bytes) -> list[FileChange]:
    """Parse ``git diff --name-status -z`` output into :class:`FileChange` values."""
    fields = _text(raw).split("\0")
    out: list[FileChange] = []
    i = 0
    while i < len(fields) and fields[i]:
        status = fields[i]
        code = status[0]
        if code in "RC":
            old, new = fields[i + 1], fields[i + 2]
            out.append(FileChange("R", new, old) if code == "R" else FileChange("A", new))
            i += 3
            continue
        path = fields[i + 1]
        # T (type change), U (unmerged), X: treat as a modification; never drop a path.
        out.append(FileChange(code if code in "ADM" else "M", path))
        i += 2
    return out
