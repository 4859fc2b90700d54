"""FastCI's own code that runs inside a test process counts as core: its change runs every test.

The launcher of every gpu_test (``fastci.run.launch``: GPU pool, schedule, workload
flags), the recorder and what it imports (children, contexts, files, traces) and the
pytest plugin run *inside* the test process, before, around or instead of what a
recording can see: the recorder starts after the launcher ran and never traces
itself. So no evidence ever names them, and a change to them selected nothing
(issue 34 item 7). They are core instead, like a kernel: a changed file that is one of
:data:`IN_TEST_MODULES` (matched by its path suffix ``fastci/run/launch.py``, wherever
the repository keeps FastCI's sources) or :data:`IN_TEST_FILES` runs every test.

A repository that installs FastCI instead of keeping its sources has none of these
files: there the ``fastci`` distribution is core (a changed pin of it, or another
version in the test environment, reaches every test:
:data:`fastci.select.manifest_rules.CORE_NAMES`).

The list is the import closure of the in-test entry points
(:data:`IN_TEST_ENTRY_POINTS`); ``tests/test_own_code.py`` imports them in a fresh
interpreter and fails when a module they load is missing here.
"""

from __future__ import annotations

from fastci.types import RelPath

#: What a test process imports of FastCI: the gpu_test launcher, the recorder (and the
#: start-up hook of recorded children), the pytest plugin with its plan, collection
#: and untraced-rewrite parts, and the workload checks the plugin applies overrides with.
IN_TEST_ENTRY_POINTS: tuple[str, ...] = (
    "fastci.run.launch", "fastci.evidence.record.recorder", "fastci.evidence.record.child_start",
    "fastci.pytest_plugin", "fastci.pytest.plugin", "fastci.pytest.plan",
    "fastci.pytest.untraced", "fastci.evidence.record.collection", "fastci.plan.workload",
)

#: The import closure of :data:`IN_TEST_ENTRY_POINTS` (package ``__init__`` files included:
#: they run at import).
IN_TEST_MODULES: tuple[str, ...] = (
    "fastci", "fastci.config", "fastci.errors", "fastci.gcpause", "fastci.types",
    "fastci.pytest_plugin",
    "fastci.evidence", "fastci.evidence.record", "fastci.evidence.record.active",
    "fastci.evidence.record.autograd",
    "fastci.evidence.record.child_start", "fastci.evidence.record.children",
    "fastci.evidence.record.collection", "fastci.evidence.record.contexts",
    "fastci.evidence.record.covplugin", "fastci.evidence.record.distributions",
    "fastci.evidence.record.environment", "fastci.evidence.record.files",
    "fastci.evidence.record.inputs", "fastci.evidence.record.monitor",
    "fastci.evidence.record.recorder",
    "fastci.evidence.record.scope", "fastci.evidence.record.trace",
    "fastci.evidence.record.trace_files",
    "fastci.evidence.record.trace_pb2",
    "fastci.evidence.record.traced",
    "fastci.integrations", "fastci.integrations.bazel", "fastci.integrations.bazel.mains",
    "fastci.integrations.git", "fastci.integrations.git.tree",
    "fastci.plan", "fastci.plan.model", "fastci.plan.workload",
    "fastci.pytest", "fastci.pytest.ids", "fastci.pytest.plan", "fastci.pytest.plugin",
    "fastci.pytest.untraced",
    "fastci.run", "fastci.run.gpus", "fastci.run.launch", "fastci.run.scale",
    "fastci.run.schedule",
    "fastci.units", "fastci.units.lines",
)

#: In-test files that are not Python modules of the package: the py_test main of every
#: gpu_test, and the recorder's audit hook in C (loaded when a recording starts).
IN_TEST_FILES: tuple[RelPath, ...] = ("rules/private/gpu_test_main.py",
                                      "fastci/evidence/record/native_audit.c")


def _suffixes() -> tuple[str, ...]:
    out = []
    for name in IN_TEST_MODULES:
        parts = name.split(".")
        out.append("/".join(parts) + ".py")
        out.append("/".join(parts) + "/__init__.py")  # a package
    return tuple(out) + IN_TEST_FILES


_SUFFIXES = _suffixes()


def in_test_code(path: RelPath) -> str | None:
    """The in-test module or file ``path`` is (``fastci/run/launch.py``), or None."""
    for suffix in _SUFFIXES:
        if path == suffix or path.endswith("/" + suffix):
            return suffix
    return None
