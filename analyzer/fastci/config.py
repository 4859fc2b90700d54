"""FastCI's configuration: one loader, numbered precedence, unknown keys rejected.

Precedence, lowest first (a later source replaces a key of an earlier one):

1. the defaults in :data:`DEFAULTS`;
2. ``fastci.yaml`` at the repository root (or ``$FASTCI_CONFIG``);
3. environment variables (:data:`ENV_VARS`);
4. command-line options (passed in by the CLI as ``overrides``).

Every key and every environment variable is documented in ``docs/CONFIG.md``.

The *decision keys* (:data:`DECISION_KEYS`: what decides which tests run) and the
*tool keys* (:data:`TOOL_KEYS`: programs the planner runs) are
not taken from the change being planned: :mod:`fastci.plan.planner` rebuilds them
from the base revision's ``fastci.yaml`` with :func:`with_rules_from`, keeping
whatever the environment or command line set, so a change cannot rewrite the
rules that judge it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping


from fastci.errors import ConfigError

LOG = logging.getLogger(__name__)

CONFIG_FILE = "fastci.yaml"

#: Paths whose change can affect any test in ways evidence cannot see: run everything.
DEFAULT_RUN_ALL: tuple[str, ...] = (
    "csrc/**",  # kernels: compiled code that coverage of Python cannot see
    "BUILD", "BUILD.bazel", "*.bzl", "WORKSPACE", "WORKSPACE.bazel", "MODULE.bazel",
    ".bazelrc", ".bazelversion",  # build files: targets, deps, toolchains, flags
    # setup.py is code; requirements*.txt, pyproject.toml, setup.cfg and lock files are read
    # for meaning (fastci.changes.manifests): a pin selects the tests that imported it.
    "setup.py", "third_party/**",
    ".ci/**",  # the CI configuration itself
    "fastci.yaml",  # FastCI's own rules changed
    "conftest.py",  # pytest fixtures and hooks run at collection, which is not recorded
    "rules/**", "tools/**",  # the gpu_test rules, the launcher and the setup scripts
)
#: Repository metadata that no test process opens: a change is noted, nothing runs for it,
#: unless a test recorded reading the file or path_tests maps it (docs/CONFIG.md lists each
#: with its residual risk). CI workflows (.github/workflows/**) are not here: they set the
#: flags and variables tests run with.
DEFAULT_METADATA_IGNORE: tuple[str, ...] = (
    ".pre-commit-config.yaml", ".pre-commit-hooks.yaml", ".editorconfig", "CODEOWNERS",
    ".mailmap", ".git-blame-ignore-revs", ".github/ISSUE_TEMPLATE/**",
    ".github/PULL_REQUEST_TEMPLATE*", ".github/pull_request_template*", ".github/dependabot.yml",
    ".github/FUNDING.yml", ".github/labeler.yml", ".github/release-drafter.yml",
    ".readthedocs.yaml", ".readthedocs.yml", ".flake8", ".pylintrc", ".isort.cfg",
    ".ruff.toml", "ruff.toml", ".yamllint", ".yamllint.yaml", ".yamllint.yml",
    ".markdownlint*", ".prettierrc*", ".clang-format", "AUTHORS", "CONTRIBUTORS", "NOTICE",
    "CITATION.cff",
)
#: Dotted names (fnmatch globs) of decorators and calls that act at import time only on
#: the object they build: a new def decorated only with these is a new unit (not an
#: import-time change), and a module-level binding whose value calls only these changes
#: only that name. ``torch.set_grad_enabled`` is left out on purpose: calling it flips the
#: grad mode at once; so is ``pytest.fixture`` (a new fixture can shadow a conftest one).
DEFAULT_PURE_CALLABLES: tuple[str, ...] = (
    "pytest.mark.*", "pytest.param",
    "torch.no_grad", "torch.inference_mode", "torch.enable_grad", "torch.autocast",
    "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cuda.is_available",
    "torch.cuda.device_count",
    "functools.wraps", "functools.lru_cache", "functools.cache", "functools.cached_property",
    "functools.partial", "functools.total_ordering",
    "staticmethod", "classmethod", "property",
    "abc.abstractmethod", "typing.overload", "typing.final", "typing.no_type_check",
    "typing_extensions.overload", "typing_extensions.final", "typing.TypeVar", "typing.NewType",
    "typing.cast", "collections.namedtuple", "dataclasses.dataclass", "dataclasses.field",
    "contextlib.contextmanager", "contextlib.asynccontextmanager",
    "unittest.mock.patch", "unittest.mock.patch.*", "mock.patch", "mock.patch.*",
    "unittest.skip", "unittest.skipIf", "unittest.skipUnless", "unittest.expectedFailure",
    "os.environ.get", "os.getenv", "os.path.join", "os.path.dirname", "os.path.abspath",
    "pathlib.Path", "re.compile", "logging.getLogger",
)
#: Paths that never affect a test's outcome.
DEFAULT_IGNORE: tuple[str, ...] = (
    "*.md", "*.rst", "docs/**", "LICENSE", ".gitignore", "bench/**",
)


@dataclass(frozen=True)
class Config:
    """The effective configuration (see ``docs/CONFIG.md``)."""

    store: str = ".fastci/evidence.db"
    calibration: str = ".fastci/calibration.db"  # fastci calibrate's rungs (never evidence)
    plan: str = ".fastci/plan.json"
    base: str = "HEAD"
    targets: str = "//..."
    bazel: str = "bazel"
    bazel_config: str = "fastci"
    run_all: tuple[str, ...] = DEFAULT_RUN_ALL
    ignore: tuple[str, ...] = DEFAULT_IGNORE
    metadata_ignore: tuple[str, ...] = DEFAULT_METADATA_IGNORE  # repository metadata
    path_tests: tuple[tuple[str, tuple[str, ...]], ...] = ()  # glob -> test id globs
    # Files native code reads (tokenizers, safetensors, arrow, dataset snapshots): test id
    # glob -> path globs (repository-relative or absolute), hashed at record and plan time.
    inputs: tuple[tuple[str, tuple[str, ...]], ...] = ()
    runner_python: str = "auto"  # the test runner's interpreter, for its environment fingerprint
    runner: str = "auto"  # auto | bazel | pytest: who declares and runs the tests (RUNNERS)
    prune: str = "off"  # off | safe | aggressive: equivalent-context pruning (PRUNE_MODES)
    granularity: str = "unit"  # unit | line: line evidence narrows body changes (GRANULARITIES)
    priority: str = "rare_inputs"  # reasons | risk | risk_per_cost | rare_inputs | rare_named: run order (PRIORITY_STRATEGIES)
    pure_callables: tuple[str, ...] = DEFAULT_PURE_CALLABLES  # side-effect-free at import
    rung_timeout_s: float = 7200.0  # the most a calibration rung may run (its cap)
    full_sample: float = 0.1  # `fastci run --full-sample`: share of reduced tests re-run at full workload
    # Provenance, not keys (never compared), set by :func:`load`: the config file it
    # consulted (absolute; it may not exist; None for a Config built in code) and the
    # keys the environment or command line set (levels 3 and 4).
    origin: str | None = field(default=None, compare=False, repr=False)
    overridden: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def path(self, root: Path, key: str) -> Path:
        """Resolve a path-valued key against the repository root."""
        value = Path(str(getattr(self, key)))
        return value if value.is_absolute() else root / value


DEFAULTS = Config()

#: Environment variable -> key (scalars only; lists are set in ``fastci.yaml``).
ENV_VARS: dict[str, str] = {
    "FASTCI_STORE": "store",
    "FASTCI_CALIBRATION": "calibration",
    "FASTCI_PLAN": "plan",
    "FASTCI_BASE": "base",
    "FASTCI_TARGETS": "targets",
    "FASTCI_BAZEL": "bazel",
    "FASTCI_BAZEL_CONFIG": "bazel_config",
    "FASTCI_RUNNER_PYTHON": "runner_python",
    "FASTCI_RUNNER": "runner",
    "FASTCI_PRUNE": "prune",
    "FASTCI_GRANULARITY": "granularity",
    "FASTCI_PRIORITY": "priority",
    "FASTCI_RUNG_TIMEOUT_S": "rung_timeout_s",
    "FASTCI_FULL_SAMPLE": "full_sample",
}
#: Names the config file location (not a key).
ENV_CONFIG_FILE = "FASTCI_CONFIG"

#: Keys that decide which tests run. They come from the *base* revision's config file
#: (plus environment and command line), never from the change under analysis; every
#: other key says where FastCI reads and writes or how it runs things.
DECISION_KEYS: tuple[str, ...] = ("run_all", "ignore", "path_tests", "targets", "runner_python",
                                  "runner", "pure_callables", "metadata_ignore", "prune",
                                  "granularity", "inputs")
#: Keys naming programs the planner runs (``bazel query``). Like the decision keys they
#: come from the base revision's config: a change must not make the planner run a
#: script of its own choosing.
TOOL_KEYS: tuple[str, ...] = ("bazel",)
#: Values of ``runner`` (``auto``: Bazel in a Bazel workspace with ``bazel`` found, else
#: pytest; :func:`fastci.plan.inputs.choose_runner`).
RUNNERS: tuple[str, ...] = ("auto", "bazel", "pytest")
#: Values of ``prune`` (:mod:`fastci.select.prune`).
PRUNE_MODES: tuple[str, ...] = ("off", "safe", "aggressive")
#: Values of ``granularity`` (:mod:`fastci.select.lines`).
GRANULARITIES: tuple[str, ...] = ("unit", "line")
#: Values of ``priority`` (:data:`fastci.select.priority.STRATEGIES`).
PRIORITY_STRATEGIES: tuple[str, ...] = ("reasons", "risk", "risk_per_cost", "rare_inputs",
                                         "rare_named")

_LIST_KEYS = {"run_all", "ignore", "metadata_ignore"}
_SECONDS_KEYS = {"rung_timeout_s"}
_INTERNAL = frozenset({"origin", "overridden"})
_KEYS = {f.name for f in fields(Config)} - _INTERNAL


def _check_str(key: str, value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key}: expected a non-empty string, got {value!r}")
    return value


def _rate(value: Any, where: str) -> float:
    """A ``full_sample`` value (a number, or its text from the environment) in [0, 1]."""
    try:
        rate = float(value) if isinstance(value, (int, float, str)) \
            and not isinstance(value, bool) else float("nan")
    except ValueError:
        rate = float("nan")
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"{where}: full_sample: expected a share of tests between 0 and 1, "
                          f"got {value!r}")
    return rate


def _coerce(key: str, value: Any, where: str) -> Any:
    if key in _LIST_KEYS:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{where}: {key}: expected a list of path globs")
        return tuple(value)
    if key == "pure_callables":
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{where}: pure_callables: expected a list of dotted names (globs)")
        return tuple(value)
    if key == "path_tests":
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: path_tests: expected a mapping glob -> list of tests")
        out = []
        for glob, tests in value.items():
            if isinstance(tests, str):
                tests = [tests]
            if not isinstance(glob, str) or not isinstance(tests, list) \
                    or not all(isinstance(t, str) and t for t in tests):
                raise ConfigError(f"{where}: path_tests: {glob!r}: expected a list of test ids")
            out.append((glob, tuple(tests)))
        return tuple(out)
    if key == "inputs":
        return _inputs(value, where)
    if key in _SECONDS_KEYS:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = -1.0
        if isinstance(value, bool) or not seconds > 0:
            raise ConfigError(f"{where}: {key}: expected a number of seconds above 0, "
                              f"got {value!r}")
        return seconds
    if key == "priority" and value not in PRIORITY_STRATEGIES:
        raise ConfigError(f"{where}: priority: expected one of {', '.join(PRIORITY_STRATEGIES)}, "
                          f"got {value!r}")
    if key == "granularity" and value not in GRANULARITIES:
        raise ConfigError(f"{where}: granularity: expected one of {', '.join(GRANULARITIES)}, "
                          f"got {value!r}")
    if key == "prune" and value not in PRUNE_MODES:
        raise ConfigError(f"{where}: prune: expected one of {', '.join(PRUNE_MODES)}, got {value!r}")
    if key == "full_sample":
        return _rate(value, where)
    if key == "runner" and value not in RUNNERS:
        raise ConfigError(f"{where}: runner: expected one of {', '.join(RUNNERS)}, got {value!r}")
    return _check_str(key, value, where)


def _inputs(value: Any, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``inputs``: a list of path globs (every test), or a mapping test id glob -> globs."""
    def globs(item: Any, what: str) -> tuple[str, ...]:
        if isinstance(item, str):
            item = [item]
        if not isinstance(item, list) or not all(isinstance(g, str) and g for g in item):
            raise ConfigError(f"{where}: inputs: {what}: expected a list of path globs "
                              "(repository-relative or absolute)")
        return tuple(item)

    if isinstance(value, list):
        return (("*", globs(value, "the list")),)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: inputs: expected a list of path globs, or a mapping "
                          "test id glob -> list of path globs")
    out = []
    for test_glob, items in value.items():
        if not isinstance(test_glob, str) or not test_glob:
            raise ConfigError(f"{where}: inputs: {test_glob!r}: expected a test id glob")
        out.append((test_glob, globs(items, repr(test_glob))))
    return tuple(out)


def _apply(values: dict[str, Any], source: Mapping[str, Any], where: str) -> None:
    for key, value in source.items():
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(_KEYS))})")
        values[key] = _coerce(key, value, where)


def parse_text(text: str | bytes, where: str) -> dict[str, Any]:
    """Parse the text of a ``fastci.yaml`` (``where`` names it in errors); empty is ``{}``."""
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{where}: not UTF-8 text (byte {exc.start})") from exc
    # Imported here: every recorded test process imports this module (declared inputs),
    # and PyYAML costs ~10 ms to import; most never read a config file.
    import yaml  # type: ignore[import-untyped]

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    return data


def read_file(path: Path) -> dict[str, Any]:
    """Read a ``fastci.yaml``; a missing file is empty, a malformed one a :class:`ConfigError`."""
    try:
        data = path.read_bytes()  # decoded by parse_text: bytes that are not UTF-8 are one line
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    return parse_text(data, str(path))


def config_path(root: Path, env: Mapping[str, str] | None = None) -> Path:
    """The config file of the repository at ``root``: ``$FASTCI_CONFIG``, else ``fastci.yaml``
    at the root (``env``: the environment, ``os.environ`` when None)."""
    env = os.environ if env is None else env
    named = env.get(ENV_CONFIG_FILE)
    return Path(named) if named else root / CONFIG_FILE


def load(root: Path, *, env: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Config:
    """Load the effective configuration for the repository at ``root``.

    Args:
        root: the repository root; ``fastci.yaml`` is looked up there.
        env: the environment (``os.environ`` when None).
        overrides: CLI values; None values are ignored (the option was not given).
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    cfg_path = config_path(root, env)
    _apply(values, read_file(cfg_path), str(cfg_path))
    from_env = {k: env[v] for v, k in ENV_VARS.items() if env.get(v)}
    _apply(values, from_env, "environment")
    cli = {k: v for k, v in (overrides or {}).items() if v is not None}
    _apply(values, cli, "command line")
    overridden = frozenset(from_env) | frozenset(cli)
    return Config(**values, origin=os.path.abspath(cfg_path), overridden=overridden)


def with_rules_from(config: Config, text: str | bytes | None, where: str) -> Config:
    """``config`` with its :data:`DECISION_KEYS` and :data:`TOOL_KEYS` taken from another
    version of its file.

    Levels 1 and 2 are rebuilt from ``text`` (None: no file, the built-in defaults);
    keys the environment or command line set (``config.overridden``) keep their
    values, as they would in :func:`load`. Every key of ``text`` is validated.

    Raises:
        ConfigError: ``text`` is not a valid config file.
    """
    values: dict[str, Any] = {}
    if text is not None:
        _apply(values, parse_text(text, where), where)
    rules = {k: values.get(k, getattr(DEFAULTS, k)) for k in (*DECISION_KEYS, *TOOL_KEYS)
             if k not in config.overridden}
    return replace(config, **rules)


def repo_config_path(root: Path, config: Config) -> str | None:
    """The config file's path relative to the repository ``root`` (POSIX), or None.

    None when the file lies outside the repository (``$FASTCI_CONFIG`` elsewhere): it
    is then the CI's own setting, not part of any change. A config built in code
    (no ``origin``) is taken to belong to ``<root>/fastci.yaml``.
    """
    if config.origin is None:
        return CONFIG_FILE
    origin = Path(os.path.abspath(config.origin))
    for base, path in ((Path(os.path.abspath(root)), origin),
                       (Path(root).resolve(), origin.resolve())):
        try:
            return path.relative_to(base).as_posix()
        except ValueError:
            continue
    return None


# --------------------------------------------------------------------------- globs


@functools.lru_cache(maxsize=1024)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Translate a path glob: ``**`` spans directories, ``*`` and ``?`` stay in one segment.

    A pattern without ``/`` matches the file name in any directory (like .gitignore).
    """
    if "/" not in pattern:
        pattern = "**/" + pattern
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


def glob_match(path: str, pattern: str) -> bool:
    """Whether the repo-relative ``path`` matches the glob ``pattern``."""
    return _glob_regex(pattern).match(path) is not None


def first_match(path: str, patterns: tuple[str, ...]) -> str | None:
    """The first of ``patterns`` that ``path`` matches, or None."""
    for p in patterns:
        if glob_match(path, p):
            return p
    return None
