"""FastCI's own in-test code and the ``fastci`` distribution are core (issue 34 item 7).

The launcher, GPU pool, schedule, recorder, children, contexts and pytest plugin run
inside every test process, where no evidence can name them (the recorder starts after
the launcher and never traces itself): a change to them, or bumping the `fastci`
version, selected nothing. Now either runs every test, in any repository: FastCI's
sources matched by path wherever a repository keeps them, the distribution by name.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fastci.select import DecisionKind
from fastci.select.own_code import IN_TEST_ENTRY_POINTS, IN_TEST_FILES, IN_TEST_MODULES, in_test_code
from selection_support import MODEL, World, ingest, units_of, world  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]


def test_the_list_is_the_import_closure_of_the_in_test_entry_points() -> None:
    # A fresh interpreter: what the entry points load is exactly what runs in a test.
    code = ("import importlib, sys\n"
            f"for m in {list(IN_TEST_ENTRY_POINTS)!r}: importlib.import_module(m)\n"
            "print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] == 'fastci')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    loaded = set(res.stdout.split())
    assert loaded - set(IN_TEST_MODULES) == set(), "add these to IN_TEST_MODULES"
    for name in IN_TEST_MODULES:  # every entry names a real file of this checkout
        rel = "analyzer/" + name.replace(".", "/")
        assert (REPO / f"{rel}.py").is_file() or (REPO / rel / "__init__.py").is_file(), name
    for rel in IN_TEST_FILES:  # the rules' main at the root, the C hook in the package
        assert (REPO / rel).is_file() or (REPO / "analyzer" / rel).is_file(), rel


def test_in_test_code_is_matched_wherever_the_sources_live() -> None:
    assert in_test_code("analyzer/fastci/run/schedule.py") == "fastci/run/schedule.py"
    assert in_test_code("third_party/fastci/evidence/record/contexts.py") == "fastci/evidence/record/contexts.py"
    assert in_test_code("fastci/run/launch.py") == "fastci/run/launch.py"
    assert in_test_code("analyzer/fastci/evidence/__init__.py") == "fastci/evidence/__init__.py"
    assert in_test_code("rules/private/gpu_test_main.py") == "rules/private/gpu_test_main.py"
    assert in_test_code("analyzer/fastci/evidence/record/native_audit.c") == \
        "fastci/evidence/record/native_audit.c"
    # Code that runs only in the planner is not core.
    assert in_test_code("analyzer/fastci/select/prune.py") is None
    assert in_test_code("analyzer/fastci/plan/planner.py") is None
    assert in_test_code("mypkg/run/launch.py") is None


def test_a_change_to_fastcis_in_test_code_runs_every_test(world: World) -> None:
    # The schedule the launcher obeys, kept in the repository (as in FastCI's own): no
    # test's evidence names it, and before, its change selected nothing.
    world.repo.commit({"analyzer/fastci/run/schedule.py": "def decide():\n    return 1\n"})
    world.repo.write({"analyzer/fastci/run/schedule.py": "def decide():\n    return 2\n"})
    sel = world.plan()
    assert sel.mode == "all", sel.summary
    assert sel.widen[0].kind is DecisionKind.RUN_ALL_PATH
    assert "FastCI's own code that runs inside every test process" in sel.widen[0].sentence


def test_bumping_the_fastci_pin_runs_every_test(world: World) -> None:
    # A repository that installs FastCI: its pin is core, like torch's.
    world.base = world.repo.commit({"requirements.txt": "fastci==0.1.0\nrequests==2.0\n"})
    units = units_of(world.root, ["pkg/model.py", "pkg/data.py", "pkg/other.py"])
    for test, path in (("//t:a", "pkg/model.py"), ("//t:b", "pkg/data.py"), ("//t:c", "pkg/other.py")):
        ingest(world.store, test, {u: c for u, c in units.items() if u.startswith(path)},
               commit=world.base)
    world.repo.write({"requirements.txt": "fastci==0.2.0\nrequests==2.0\n"})
    sel = world.plan()
    assert sel.mode == "all", sel.summary
    assert any("fastci" in r.sentence for r in sel.widen), [r.sentence for r in sel.widen]
