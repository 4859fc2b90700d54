"""Declared inputs (``inputs:`` in ``fastci.yaml``): files native code reads.

A C, C++ or Rust reader (sentencepiece, HF tokenizers, safetensors, arrow) opens
its files without an audit event, so the recorder never sees them read; and a
git-ignored file (a downloaded tokenizer, a generated golden) or a file outside
the repository (a dataset snapshot, a model cache) never shows in a diff. The
config names them instead: path globs, repository-relative or absolute, for every
test or per test id glob. At record time each test's matching files are hashed
into its evidence as files it read (the same rows, digests and comparison as the
reads the recorder sees: :mod:`fastci.evidence.record.files`); at plan time the globs
are expanded again (:mod:`fastci.select.inputs`).

A repository-relative file is keyed by its POSIX path under the root, an absolute
one by its absolute path (the store never confuses the two: a repository path
never starts with ``/``).

Cost is bounded: one glob walks at most :data:`MAX_VISITED` directory entries and
matches at most :data:`MAX_FILES` files; past either it is *not expanded* (no file
of it hashed) and planning selects its declaring tests, saying why.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from fastci import config as config_mod
from fastci.errors import ConfigError
from fastci.evidence.record.files import is_tagged_cache, sha256_file
from fastci.types import is_tool_artifact

LOG = logging.getLogger(__name__)

#: Files one glob may match before it is not expanded (and its tests always run).
MAX_FILES = 10_000
#: Directory entries one glob's walk may visit before the same.
MAX_VISITED = 200_000
#: Directories never walked: git's own data and FastCI's.
_SKIP_DIRS = frozenset({".git", ".fastci"})
_WILD = re.compile(r"[*?\[]")

Inputs = tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class Expansion:
    """The files one glob matches now.

    Attributes:
        glob: the glob as configured.
        files: the matching files' keys (repository-relative POSIX, or absolute), sorted.
        overflow: why the glob was not expanded (over a cap); ``files`` is then empty.
    """

    glob: str
    files: tuple[str, ...] = ()
    overflow: str | None = None


def globs_for(test: str, inputs: Inputs) -> tuple[str, ...]:
    """The path globs ``inputs`` declares for ``test`` (test id globs, fnmatch), in order."""
    out: list[str] = []
    for test_glob, globs in inputs:
        if fnmatch.fnmatchcase(test, test_glob):
            out += [g for g in globs if g not in out]
    return tuple(out)


def local_path(key: str, root: Path) -> Path:
    """Where the file of ``key`` is: absolute as it is, else under ``root``."""
    return Path(key) if key.startswith("/") else root / key


def expand(glob: str, root: Path, *, max_files: int | None = None,
           max_visited: int | None = None) -> Expansion:
    """The files ``glob`` matches now, walking only below its fixed leading folders.

    The glob syntax is the config's (:func:`fastci.config.glob_match`): ``**`` spans
    folders, ``*`` and ``?`` stay in one; a glob without ``/`` matches the file name in
    any folder of the repository. A glob with wildcards never matches the caches and
    install metadata a test run writes (:func:`fastci.types.is_tool_artifact`, below
    its fixed folders, or a folder tagged as a cache with ``CACHEDIR.TAG``): they change
    with every run, never with the code.
    """
    max_files = MAX_FILES if max_files is None else max_files
    max_visited = MAX_VISITED if max_visited is None else max_visited
    absolute = glob.startswith("/")
    pattern = glob if "/" in glob else "**/" + glob
    fixed: list[str] = []
    for part in pattern.split("/")[:-1]:
        if _WILD.search(part):
            break
        fixed.append(part)
    start = Path("/".join(fixed) or "/") if absolute else root.joinpath(*fixed)
    if not _WILD.search(pattern):  # one file named in full
        key = glob
        return Expansion(glob, (key,) if local_path(key, root).is_file() else ())
    found: list[str] = []
    visited = 0
    for dirpath, dirnames, filenames in os.walk(start):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not is_tool_artifact(d)
                             and not is_tagged_cache(os.path.join(dirpath, d)))
        visited += len(dirnames) + len(filenames)
        if visited > max_visited:
            return Expansion(glob, overflow=f"walking it visits more than {max_visited:,} "
                                            "files and folders")
        for name in filenames:
            if is_tool_artifact(name):
                continue
            full = os.path.join(dirpath, name)
            key = full if absolute else Path(full).relative_to(root).as_posix()
            if config_mod.glob_match(key, pattern) and os.path.isfile(full):
                found.append(key)
                if len(found) > max_files:
                    return Expansion(glob, overflow=f"it matches more than {max_files:,} files")
    return Expansion(glob, tuple(sorted(found)))


class Hasher:
    """Digests of files, each hashed once while its size, mtime and inode stay the same
    (a test process records many tests that declare the same files)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[int, int, int], str]] = {}

    def digest(self, path: Path) -> str:
        """The file's sha256 (``""`` when it cannot be read)."""
        try:
            st = path.stat()
        except OSError:
            return ""
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        hit = self._seen.get(str(path))
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = sha256_file(path)
        self._seen[str(path)] = (stamp, value)
        return value


_HASHER = Hasher()


def config_file_name() -> str:
    """The config file's name (or path, ``$FASTCI_CONFIG``) the recorder looks for."""
    return os.environ.get(config_mod.ENV_CONFIG_FILE) or config_mod.CONFIG_FILE


def _cannot_declare(path: Path) -> bool:
    """Whether the config file at ``path`` certainly declares no inputs: it reads, and
    its bytes neither spell the key ``inputs`` nor hold a backslash (a double-quoted
    escape could spell it). Every recorded test process asks once; for such a config
    (most repositories declare none) the YAML parser is not even imported (PyYAML's
    import: ~100 M instructions, 1.2% of a small recorded suite's whole run)."""
    try:
        text = path.read_bytes()
    except OSError:  # missing or unreadable: config.load says which
        return False
    return b"inputs" not in text and b"\\" not in text


@functools.lru_cache(maxsize=8)
def _configured(root: str) -> Inputs:
    """The ``inputs`` of the config at ``root`` (once per process)."""
    if _cannot_declare(config_mod.config_path(Path(root))):
        return ()
    try:
        return config_mod.load(Path(root)).inputs
    except ConfigError as exc:
        # Nothing hashed: planning then sees every declared file as new and runs the test.
        LOG.warning("declared inputs not recorded: %s", exc)
        return ()


def declared_digests(test: str, root: Path, inputs: Inputs | None = None,
                     hasher: Hasher | None = None) -> dict[str, str]:
    """Key -> sha256 of every file declared for ``test`` (over-cap globs left out).

    Args:
        test: the test id.
        root: the repository root (the config is read there when ``inputs`` is None).
        inputs: the ``inputs`` config (None: from ``root``'s ``fastci.yaml``).
        hasher: where digests are cached (None: the process's).
    """
    inputs = _configured(str(root)) if inputs is None else inputs
    globs = globs_for(test, inputs)
    if not globs:
        return {}
    hasher = hasher or _HASHER
    out: dict[str, str] = {}
    for e in expand_all(globs, root).values():
        if e.overflow:
            LOG.warning("declared inputs %r of %s not hashed: %s", e.glob, test, e.overflow)
            continue
        for key in e.files:
            if key not in out:
                out[key] = hasher.digest(local_path(key, root))
    return out


def expand_all(globs: Iterable[str], root: Path) -> Mapping[str, Expansion]:
    """Glob -> its expansion, each distinct glob once."""
    return {g: expand(g, root) for g in dict.fromkeys(globs)}
