"""Dependency manifests read for meaning: which distributions and settings a change touches.

Pure functions over the old and new text of one file (no I/O). A changed
manifest becomes a :class:`ManifestChange`:

* ``distributions``: canonical names (PEP 503) whose requirement or lock entry
  was added, removed or edited — selection runs the tests that imported them;
* ``settings``: changed parts that can change any test (``[build-system]``,
  pytest options, the interpreter requirement, entry points, index options ...)
  — selection runs everything;
* ``inert``: changed parts no test process reads (``[tool.black]``, the
  description, classifiers, URLs) — reported, nothing runs for them.

``None`` means the change could not be read (bad TOML, an unknown line): the
caller runs everything. Formats: ``pyproject.toml`` (PEP 621 and Poetry),
``requirements*.txt``/``.in`` and ``constraints*.txt`` (pip's format),
``setup.cfg``, ``Pipfile``, and the lock files ``poetry.lock``, ``uv.lock``,
``pdm.lock`` (TOML ``[[package]]``) and ``Pipfile.lock`` (JSON). ``setup.py`` is
code, never read here.
"""

from __future__ import annotations

import configparser
import json
import posixpath
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from fastci.evidence.record.distributions import canonical
from fastci.types import RelPath

#: ``[tool.<name>]`` tables of tools that only lint, format or release: no test reads them.
INERT_TOOLS = frozenset({
    "autopep8", "bandit", "black", "bumpversion", "bumpver", "check-manifest", "codespell",
    "commitizen", "docformatter", "flake8", "flynt", "interrogate", "isort", "mypy", "pycln",
    "pydocstyle", "pylint", "pyright", "refurb", "ruff", "semantic_release", "towncrier",
    "typos", "vulture", "yapf",
})
#: ``[project]`` keys that only describe the project (PyPI's page), never its behaviour.
INERT_PROJECT_KEYS = frozenset({
    "description", "readme", "license", "license-files", "authors", "maintainers", "keywords",
    "classifiers", "urls",
})
#: ``setup.cfg`` sections and ``[metadata]`` keys of the same kinds.
INERT_CFG_SECTIONS = frozenset({
    "flake8", "isort", "mypy", "pycodestyle", "pydocstyle", "pylint", "yapf", "bdist_wheel",
    "sdist", "codespell", "bumpversion",
})
INERT_CFG_METADATA = frozenset({
    "description", "long_description", "long_description_content_type", "author",
    "author_email", "maintainer", "maintainer_email", "url", "project_urls", "license",
    "license_files", "license_file", "classifiers", "keywords", "platforms",
})
# A PEP 508 name, then nothing or what may follow one (extras, versions, marker, URL).
_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)((?:[\s\[(<>=!~;@].*)?)\Z",
                   re.DOTALL)
_REQ_FILE = re.compile(r"(requirements|constraints)[^/]*\.(txt|in)\Z|[^/]*requirements\.(txt|in)\Z")
_LOCKS = frozenset({"poetry.lock", "uv.lock", "pdm.lock"})


@dataclass(frozen=True)
class ManifestChange:
    """What a change to one manifest means; see the module docstring."""

    path: RelPath
    distributions: tuple[str, ...] = ()
    added: tuple[str, ...] = ()  # of ``distributions``: new in the manifest
    settings: tuple[str, ...] = ()
    inert: tuple[str, ...] = ()
    #: Of ``distributions``: each one's entries in the new manifest (none: removed).
    requirements: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Of ``distributions``: those whose entries changed in more than their versions
    #: (extras, a lock's source or commit, the files of the same version...): no
    #: recorded version can tell that such a change is text only.
    beyond_version: tuple[str, ...] = ()

    def admits(self, name: str, version: str | None) -> bool:
        """Whether the new manifest still admits ``version`` of changed distribution
        ``name`` (issue 38: a pin bump the installed version already satisfied changes
        nothing a test ran). False whenever it cannot be sure: no recorded version, a
        removed requirement, a marker, a URL, a non-PEP 440 specifier (Poetry's ``^``)."""
        entries = dict(self.requirements).get(name)
        if name in self.beyond_version:
            return False
        return bool(version and entries) and all(_entry_admits(e, version or "")
                                                 for e in entries or ())


def is_manifest(path: RelPath) -> bool:
    """Whether :func:`read_change` understands ``path`` (by its name, in any folder)."""
    name = posixpath.basename(path)
    parent = posixpath.basename(posixpath.dirname(path))
    return (name in ("pyproject.toml", "setup.cfg", "Pipfile", "Pipfile.lock") or name in _LOCKS
            or _REQ_FILE.match(name) is not None
            or (parent == "requirements" and name.endswith((".txt", ".in"))))


def read_change(path: RelPath, old: bytes | None, new: bytes | None) -> ManifestChange | None:
    """What changed in manifest ``path`` between ``old`` and ``new`` (None: absent).

    Returns:
        The change, or None when it cannot be read (the caller runs everything).
    """
    if not is_manifest(path):
        return None
    try:
        old_text = (old or b"").decode("utf-8")
        new_text = (new or b"").decode("utf-8")
        name = posixpath.basename(path)
        if name == "pyproject.toml":
            parts = (_pyproject(old_text), _pyproject(new_text))
        elif name == "setup.cfg":
            parts = (_setup_cfg(old_text), _setup_cfg(new_text))
        elif name == "Pipfile":
            parts = (_pipfile(old_text), _pipfile(new_text))
        elif name == "Pipfile.lock":
            parts = (_pipfile_lock(old_text), _pipfile_lock(new_text))
        elif name in _LOCKS:
            parts = (_toml_lock(old_text), _toml_lock(new_text))
        else:
            parts = (_requirements(old_text), _requirements(new_text))
    except (UnicodeDecodeError, ValueError, TypeError, AttributeError, KeyError,
            configparser.Error):
        return None  # tomllib.TOMLDecodeError and json's errors are ValueErrors
    if parts[0] is None or parts[1] is None:
        return None
    return _compare(path, parts[0], parts[1])


# A manifest as read: canonical name -> its entries (sorted strings), and part -> (meaningful?, value).
_Deps = dict[str, list[str]]
_Parts = dict[str, tuple[bool, str]]


def _compare(path: RelPath, old: tuple[_Deps, _Parts], new: tuple[_Deps, _Parts]) -> ManifestChange:
    (old_deps, old_parts), (new_deps, new_parts) = old, new
    changed = sorted(n for n in set(old_deps) | set(new_deps)
                     if sorted(old_deps.get(n, [])) != sorted(new_deps.get(n, [])))
    added = [n for n in changed if n not in old_deps]
    settings: list[str] = []
    inert: list[str] = []
    for part in sorted(set(old_parts) | set(new_parts)):
        a, b = old_parts.get(part), new_parts.get(part)
        if (a[1] if a else None) == (b[1] if b else None):
            continue
        meaningful = (a[0] if a else False) or (b[0] if b else False)
        (settings if meaningful else inert).append(part)
    beyond = tuple(n for n in changed if n in old_deps and n in new_deps
                   and _beyond_version(old_deps[n], new_deps[n]))
    return ManifestChange(path, tuple(changed), tuple(added), tuple(settings), tuple(inert),
                          tuple((n, tuple(sorted(new_deps.get(n, [])))) for n in changed),
                          beyond)


#: What a version bump of a locked package changes besides its version.
_LOCK_VERSIONED = frozenset({"version", "files", "hashes", "hash", "wheels", "sdist"})


def _shape(entry: str) -> tuple[str, str]:
    """An entry without its version (:func:`_beyond_version`): a requirement's group,
    extras, marker and URL; a lock entry's fields but those a version bump changes."""
    group, sep, spec = entry.partition(_SEP)
    if not sep:
        try:
            locked = json.loads(entry)
        except ValueError:
            return ("lock", entry)
        if not isinstance(locked, dict):
            return ("lock", entry)
        return ("lock", _dump({k: v for k, v in locked.items() if k not in _LOCK_VERSIONED}))
    extras = re.match(r"\[[^\]]*\]", spec)
    rest = re.sub(r"^\[[^\]]*\]", "", spec)
    tail = rest[min((i for i in (rest.find(";"), rest.find("@")) if i >= 0), default=len(rest)):]
    return (group, f"{extras.group(0) if extras else ''}{tail}")


def _beyond_version(old: list[str], new: list[str]) -> bool:
    """Whether a distribution's entries changed in more than their versions: their shapes
    differ, or a lock entry changed while its version stayed (a rebuilt wheel, a git
    dependency moved to another commit)."""
    if sorted(map(_shape, old)) != sorted(map(_shape, new)):
        return True
    def versions(entries: list[str]) -> list[str]:
        out = []
        for e in entries:
            if _SEP not in e:
                try:
                    out.append(str(json.loads(e).get("version")))
                except (ValueError, AttributeError):
                    return ["?"]
        return sorted(out)
    locked_old, locked_new = versions(old), versions(new)
    return bool(locked_old) and locked_old == locked_new


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _add_requirement(deps: _Deps, line: str, group: str) -> bool:
    """Add a PEP 508 requirement string under its name; False if it has none."""
    m = _NAME.match(line)
    if m is None:
        return False
    rest = re.sub(r"\s+", "", m.group(2))
    deps.setdefault(canonical(m.group(1)), []).append(f"{group}{_SEP}{rest}")
    return True


#: Between an entry's group and its requirement (whitespace never occurs in either).
_SEP = "\t"


def _entry_admits(entry: str, version: str) -> bool:
    """Whether one manifest entry (:data:`_Deps`) admits ``version``."""
    group, sep, spec = entry.partition(_SEP)
    try:
        if not sep:  # a lock entry: its pinned version
            locked = json.loads(entry)
            if not isinstance(locked, dict) or not isinstance(locked.get("version"), str):
                return False
            pinned = locked["version"]
            spec = pinned if pinned[:1] in "=<>!~" else f"=={pinned}"
        elif spec.startswith('"'):  # Poetry's, Pipfile's table: a JSON string (a dict is not read)
            spec = json.loads(spec)
        if spec == "*":
            return True  # any version
        spec = re.sub(r"^\[[^\]]*\]", "", spec)  # extras do not change the version
        if ";" in spec or "@" in spec:
            return False  # a marker or a URL: not a version range we can read
        installed = Version(version)
        if installed.local is not None and f"+{installed.local}" not in spec:
            # PEP 440 ignores a local label (``+cpu``, ``+cu121``) in ``==``, but the build
            # it names is what the test ran: a pin without it may install another.
            return False
        return SpecifierSet(spec).contains(installed, prereleases=True)
    except (ValueError, TypeError, InvalidSpecifier, InvalidVersion):
        return False


def _pyproject(text: str) -> tuple[_Deps, _Parts] | None:
    data = tomllib.loads(text)
    deps: _Deps = {}
    parts: _Parts = {}
    project = data.get("project", {})
    for key, value in project.items():
        if key == "dependencies":
            for req in value:
                if not _add_requirement(deps, req, ""):
                    return None
        elif key == "optional-dependencies":
            for extra, reqs in value.items():
                for req in reqs:
                    if not _add_requirement(deps, req, f"[{extra}]"):
                        return None
        else:  # name, version, requires-python, scripts, entry-points, dynamic ...
            parts[f"[project].{key}"] = (key not in INERT_PROJECT_KEYS, _dump(value))
    groups = data.get("dependency-groups", {})  # PEP 735
    for group, reqs in groups.items():
        for req in reqs:
            if isinstance(req, str):
                if not _add_requirement(deps, req, f"group:{group}"):
                    return None
            else:  # {include-group = ...}
                parts[f"[dependency-groups].{group}"] = (True, _dump(req))
    for key, value in data.items():
        if key in ("project", "dependency-groups"):
            continue
        if key != "tool":
            parts[f"[{key}]"] = (True, _dump(value))  # build-system and anything unknown
            continue
        for tool, table in value.items():
            if tool == "poetry" and isinstance(table, dict):
                _poetry(table, deps, parts)
            else:
                parts[f"[tool.{tool}]"] = (tool not in INERT_TOOLS, _dump(table))
    return deps, parts


def _poetry(table: Mapping[str, Any], deps: _Deps, parts: _Parts) -> None:
    def spec_table(where: str, specs: Mapping[str, Any]) -> None:
        for name, spec in specs.items():
            if canonical(name) == "python":  # the interpreter, not a distribution
                parts[f"{where}.python"] = (True, _dump(spec))
            else:
                deps.setdefault(canonical(name), []).append(f"{where}{_SEP}{_dump(spec)}")

    for key, value in table.items():
        if key in ("dependencies", "dev-dependencies"):
            spec_table(f"[tool.poetry.{key}]", value)
        elif key == "group":
            for group, body in value.items():
                spec_table(f"[tool.poetry.group.{group}]", body.get("dependencies", {}))
                rest = {k: v for k, v in body.items() if k != "dependencies"}
                if rest:
                    parts[f"[tool.poetry.group.{group}]"] = (False, _dump(rest))
        else:
            parts[f"[tool.poetry].{key}"] = (key not in INERT_PROJECT_KEYS | {"homepage",
                                             "repository", "documentation"}, _dump(value))


def _requirements(text: str) -> tuple[_Deps, _Parts] | None:
    deps: _Deps = {}
    options: list[str] = []
    for raw in re.sub(r"\\\r?\n", " ", text).splitlines():
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        if not line:
            continue
        if line.startswith("-"):  # -r/-c includes, -e, index and build options
            options.append(re.sub(r"\s+", " ", line))
        elif not _add_requirement(deps, line, ""):
            return None  # a URL or path without a name: cannot say whose
    return deps, {"options (-r, -c, -e, --index-url ...)": (True, _dump(sorted(options)))}


def _setup_cfg(text: str) -> tuple[_Deps, _Parts] | None:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(text)
    deps: _Deps = {}
    parts: _Parts = {}
    for section in cfg.sections():
        items = dict(cfg.items(section, raw=True))
        if section == "options":
            for key in ("install_requires", "tests_require", "setup_requires"):
                for req in _cfg_list(items.pop(key, "")):
                    if not _add_requirement(deps, req, key):
                        return None
            for key, value in items.items():
                parts[f"[options].{key}"] = (True, value)
        elif section == "options.extras_require":
            for extra, value in items.items():
                for req in _cfg_list(value):
                    if not _add_requirement(deps, req, f"[{extra}]"):
                        return None
        elif section == "metadata":
            for key, value in items.items():
                parts[f"[metadata].{key}"] = (key not in INERT_CFG_METADATA, value)
        else:  # tool:pytest, options.entry_points, coverage:run ... count unless known inert
            parts[f"[{section}]"] = (section not in INERT_CFG_SECTIONS, _dump(items))
    return deps, parts


def _cfg_list(value: str) -> list[str]:
    """A ``setup.cfg`` list: one entry per line (``;`` starts a PEP 508 marker, not an entry)."""
    return [v.strip() for v in value.splitlines() if v.strip() and not v.strip().startswith("#")]


def _pipfile(text: str) -> tuple[_Deps, _Parts] | None:
    data = tomllib.loads(text)
    deps: _Deps = {}
    parts: _Parts = {}
    for key, value in data.items():
        if key in ("packages", "dev-packages"):
            for name, spec in value.items():
                deps.setdefault(canonical(name), []).append(f"{key}{_SEP}{_dump(spec)}")
        else:  # requires (python_version), source (indexes), scripts ...
            parts[f"[{key}]"] = (True, _dump(value))
    return deps, parts


def _toml_lock(text: str) -> tuple[_Deps, _Parts] | None:
    data = tomllib.loads(text)
    return _lock_entries(data.get("package", []), {k: v for k, v in data.items() if k != "package"})


def _pipfile_lock(text: str) -> tuple[_Deps, _Parts] | None:
    data = json.loads(text) if text.strip() else {}
    packages = [{"name": name, **(spec if isinstance(spec, dict) else {"spec": spec}), "group": group}
                for group in ("default", "develop") for name, spec in data.get(group, {}).items()]
    return _lock_entries(packages, {k: v for k, v in data.items()
                                    if k not in ("default", "develop")})


def _lock_entries(packages: Iterable[Any], rest: Mapping[str, Any]) -> tuple[_Deps, _Parts] | None:
    deps: _Deps = {}
    for pkg in packages:
        if not isinstance(pkg, dict) or not isinstance(pkg.get("name"), str):
            return None
        deps.setdefault(canonical(pkg["name"]), []).append(_dump(pkg))
    parts: _Parts = {}
    for key, value in rest.items():
        if isinstance(value, dict):
            # The lock's hash of its inputs changes with every input edit, which is read itself.
            value = {k: v for k, v in value.items() if k not in ("content-hash", "hash")}
        parts[f"[{key}]"] = (True, _dump(value))
    return deps, parts
