"""Precision rules narrowed to evidence (issue 38 items 1, 2, 3 and 5).

Each scenario is a temporary git repository whose pytest suite is recorded by the real
recorder (``--fastci-record``), ingested, and planned by the real planner against the
commit it was recorded at. Each first reproduces the issue's over-selection, then checks
that a change the rule exists for still reaches its tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

import pytest

from fastci.config import Config
from fastci.evidence.record.environment import current_fingerprint
from fastci.evidence.store.ingest import find_traces, ingest
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.planner import analyze
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.select import DecisionKind, Selection
from selection_support import Repo

ANALYZER = Path(__file__).resolve().parents[1] / "analyzer"


class Suite:
    """A repository with a pytest suite, a store, and the commit it was last recorded at."""

    def __init__(self, root: Path, files: Mapping[str, str]) -> None:
        self.repo = Repo(root)
        self.root = root
        self.base = self.repo.commit({".gitignore": ".fastci/\n__pycache__/\n", **files})
        self.store = EvidenceStore.open(root / ".fastci/evidence.db", create=True)
        self.runs = 0

    def record(self, *tests: str) -> None:
        """Run ``tests`` (default: all) recorded at HEAD and ingest them."""
        self.runs += 1
        traces = self.root.parent / f"{self.root.name}-traces-{self.runs}"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=os.pathsep.join([str(self.root), str(ANALYZER)]))
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-p", "fastci.pytest.plugin", "--fastci-record",
                              f"--fastci-trace-dir={traces}", *(tests or ["."])],
                             cwd=self.root, env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        ingest(self.store, find_traces([traces]), source="pytest",
               commit=self.repo.git("rev-parse", "HEAD"), root=self.root)

    def plan(self, base: str | None = None) -> Selection:
        return analyze(self.root, Config(), base=base or self.base, declared=Given(None),
                       environment=KnownFingerprint(current_fingerprint()), store=self.store).selection

    def chosen(self, base: str | None = None) -> dict[str, set[DecisionKind]]:
        return {d.test.rpartition("::")[2]: {r.kind for r in d.reasons}
                for d in self.plan(base).selected}

    def why(self, test: str) -> str:
        (d,) = [d for d in self.plan().decisions if d.test.endswith(f"::{test}")]
        return " | ".join(r.sentence for r in d.reasons)


# ------------------------------------------------------------ item 1: re-exports

PKG = {
    "pkg/__init__.py": '"""A package."""\nfrom pkg.utils import clip\n\n__all__ = ["clip"]\n',
    "pkg/utils.py": "def clip(x):\n    return min(x, 1)\n\n\ndef scale(x):\n    return 2 * x\n\n\n"
                    "def double_clip(x):\n    return min(x, 2)\n",
    "pkg/model.py": "from pkg import clip\n\n\ndef forward(x):\n    return clip(x)\n",
    "test_model.py": "from pkg.model import forward\n\n\ndef test_forward():\n"
                     "    assert forward(3) <= 2\n",
    "test_utils.py": "from pkg.utils import scale\n\n\ndef test_scale():\n"
                     "    assert scale(2) == 4\n",
    "test_names.py": "import pkg\n\n\ndef test_names():\n    assert 'clip' in pkg.__all__\n",
}
INIT = PKG["pkg/__init__.py"]


def test_a_re_export_reaches_only_the_users_of_the_names_it_binds(tmp_path: Path) -> None:
    s = Suite(tmp_path / "repo", PKG)
    s.record()
    # The case: one more name re-exported, a longer __all__. Every test imports
    # the package; only the one reading __all__ uses a changed name.
    s.repo.write({"pkg/__init__.py": INIT.replace(
        "from pkg.utils import clip\n", "from pkg.utils import clip\nfrom pkg.utils import scale\n"
    ).replace('["clip"]', '["clip", "scale"]')})
    assert s.chosen() == {"test_names": {DecisionKind.USES_CHANGED_NAME}}
    assert "__all__" in s.why("test_names")
    # A re-export that changes what an existing name binds reaches its users.
    s.repo.write({"pkg/__init__.py": INIT.replace("import clip", "import double_clip as clip")})
    assert set(s.chosen()) == {"test_forward"}
    assert "clip" in s.why("test_forward")
    s.store.close()


def test_a_re_export_stays_module_wide_where_a_star_import_or_odd_all_reads_it(
        tmp_path: Path) -> None:
    s = Suite(tmp_path / "repo", {**PKG, "pkg/star.py": "from pkg import *\n\n\ndef f():\n"
                                                         "    return clip(1)\n",
                                  "test_star.py": "from pkg.star import f\n\n\ndef test_f():\n"
                                                  "    assert f() == 1\n"})
    s.record()
    s.repo.write({"pkg/__init__.py": INIT.replace(
        "from pkg.utils import clip\n", "from pkg.utils import clip, scale\n"
    ).replace('["clip"]', '["clip", "scale"]')})
    assert set(s.chosen()) == {"test_forward", "test_scale", "test_names", "test_f"}
    # __all__ computed (not a list of strings) is module machinery too.
    s2 = Suite(tmp_path / "repo2", PKG)
    s2.record()
    s2.repo.write({"pkg/__init__.py": INIT.replace('__all__ = ["clip"]',
                                                   '__all__ = [n for n in ("clip",)]')})
    assert set(s2.chosen()) == {"test_forward", "test_scale", "test_names"}
    s.store.close()
    s2.store.close()


# ------------------------------------------------------------ item 2: discovery by pattern

DISCOVERY = {
    "pkg/__init__.py": "",
    "pkg/ckpt.py": "import os\nfrom pathlib import Path\n\n\ndef latest(d):\n"
                   "    found = sorted(Path(d).glob('ckpt_*.pt'))\n"
                   "    found += [f for f in os.listdir(d) if f.endswith(('.bin', '.pt'))]\n"
                   "    return found[-1] if found else None\n",
    "pkg/plugins/__init__.py": "import importlib\n\n\ndef load(name):\n"
                               "    return importlib.import_module(f'pkg.plugins.{name}')\n",
    "pkg/plugins/base.py": "X = 1\n",
    "test_ckpt.py": "from pkg.ckpt import latest\n\n\ndef test_latest(tmp_path):\n"
                    "    assert latest(tmp_path) is None\n",
    "test_plugins.py": "from pkg.plugins import load\n\n\ndef test_load():\n"
                       "    assert load('base').X == 1\n",
}


def test_a_new_file_reaches_discovery_only_where_the_pattern_can_match_it(
        tmp_path: Path) -> None:
    s = Suite(tmp_path / "repo", DISCOVERY)
    s.record()
    # The case: a new script next to code that globs for checkpoint files.
    s.repo.write({"pkg/convert.py": "def main():\n    return 0\n"})
    assert s.chosen() == {}
    # A new plugin module is found by the computed import of its package.
    s.repo.write({"pkg/plugins/gpt.py": "X = 2\n"})
    assert s.chosen() == {"test_load": {DecisionKind.STATIC_REACH}}
    assert "pkg.plugins.*" in s.why("test_load")
    s.repo.write({"pkg/plugins/gpt.py": None, "pkg/convert.py": None})
    # A pattern that is not a literal, or an unfiltered listing, finds any file.
    s.repo.write({"pkg/ckpt.py": "PATTERN = 'ckpt_*.pt'\n" + DISCOVERY["pkg/ckpt.py"].replace(
        "'ckpt_*.pt'", "PATTERN")})
    s.base = s.repo.commit()
    s.record()
    s.repo.write({"pkg/convert.py": "def main():\n    return 0\n"})
    assert s.chosen() == {"test_latest": {DecisionKind.STATIC_REACH}}
    assert "not a literal" in s.why("test_latest")
    s.store.close()


# ------------------------------------------------------------ item 3: pins in text only

PINNED = {
    "pyproject.toml": '[project]\nname = "demo"\nversion = "0.1"\n'
                      'dependencies = ["tqdm>=4", "protobuf>=3"]\n',
    "pkg/__init__.py": "",
    # Imported when called (collection imports are every test's): only test_load imports it.
    "pkg/conf.py": "def load(items):\n    import tqdm\n\n"
                   "    return list(tqdm.tqdm(items, disable=True))\n",
    "test_conf.py": "from pkg.conf import load\n\n\ndef test_load():\n"
                    "    assert load([1]) == [1]\n",
    "test_plain.py": "def test_plain():\n    assert True\n",
}


def test_a_pin_bump_the_recorded_version_satisfies_selects_nobody(tmp_path: Path) -> None:
    from importlib.metadata import version

    installed = version("tqdm")
    s = Suite(tmp_path / "repo", PINNED)
    # Apart: a distribution loaded by an earlier test of the session is in every later
    # test's list (what the process had imported).
    s.record("test_plain.py")
    s.record("test_conf.py")
    assert s.store.distributions_of_tests()[
        next(t for t in s.store.distributions_of_tests() if t.endswith("test_load"))
    ]["tqdm"] == installed
    # The case: the pin raised to what was installed (and recorded) all along.
    s.repo.write({"pyproject.toml": PINNED["pyproject.toml"].replace(
        "tqdm>=4", f"tqdm>={installed}")})
    sel = s.plan()
    assert sel.mode == "selective" and not sel.selected
    assert any(f"still admits the version recorded (tqdm {installed})" in n
               for n in sel.notes), sel.notes
    # A pin the recorded version does not satisfy reaches the importers, and only them.
    s.repo.write({"pyproject.toml": PINNED["pyproject.toml"].replace("tqdm>=4",
                                                                     "tqdm>=999")})
    assert s.chosen() == {"test_load": {DecisionKind.CHANGED_DISTRIBUTION}}
    assert f"tqdm {installed}, which the new requirement does not admit" in s.why("test_load")
    # A marker or a removal cannot be read as a range: the importers run.
    for text in ('"tqdm>=4; python_version >= \'3.8\'", "protobuf>=3"', '"protobuf>=3"'):
        s.repo.write({"pyproject.toml": PINNED["pyproject.toml"].replace(
            '"tqdm>=4", "protobuf>=3"', text)})
        assert set(s.chosen()) == {"test_load"}, text
    s.store.close()


# ------------------------------------------------------------ item 5: new relative to each test

OPTIONAL = {
    "pkg/__init__.py": "",
    "pkg/app.py": "try:\n    from pkg import fast\nexcept ImportError:\n    fast = None\n\n\n"
                  "def run(x):\n    return fast.double(x) if fast else 2 * x\n",
    "test_a.py": "from pkg.app import run\n\n\ndef test_a():\n    assert run(2) == 4\n",
    "test_b.py": "from pkg.app import run\n\n\ndef test_b():\n    assert run(3) == 6\n",
}
FAST = "def double(x):\n    return 2 * x\n\n\ndef unused(x):\n    return x\n"


def test_a_file_is_new_only_for_tests_recorded_before_it_existed(tmp_path: Path) -> None:
    s = Suite(tmp_path / "repo", OPTIONAL)
    s.record()  # both tests at the first commit: pkg/fast.py does not exist
    s.repo.commit({"pkg/fast.py": FAST})
    s.record("test_b.py")  # only test_b re-recorded since: it ran pkg/fast.py
    # A later edit of pkg/fast.py in code test_b never ran.
    s.repo.write({"pkg/fast.py": FAST.replace("return x\n", "return -x\n")})
    got = s.chosen()
    # test_a's evidence predates the file: new for it. test_b saw it: for test_b it is
    # a body change of a function it did not run, which no recording ever ran: only the
    # structural safety net selects it (never "new file").
    assert got == {"test_a": {DecisionKind.STATIC_REACH},
                   "test_b": {DecisionKind.UNSEEN_CODE}}, got
    assert "new file pkg/fast.py" in s.why("test_a")
    s.store.close()


def test_a_re_export_from_a_module_not_imported_before(tmp_path: Path) -> None:
    """The package now loads a module it did not: narrowed when that module only defines
    (imports of the standard library or of what the package loaded already, defs, plain
    classes, constants); module-wide when its import may act (a registry call)."""
    extra = "import math\nfrom pkg.utils import clip\n\nLIMIT = 2\n\n\ndef helper(x):\n" \
            "    return math.floor(clip(x))\n\n\nclass Box:\n    size = LIMIT\n"
    s = Suite(tmp_path / "repo", {**PKG, "pkg/extra.py": extra})
    s.record()
    reexport = INIT.replace("from pkg.utils import clip\n",
                            "from pkg.utils import clip\nfrom pkg.extra import helper\n"
                            ).replace('["clip"]', '["clip", "helper"]')
    s.repo.write({"pkg/__init__.py": reexport})
    assert s.chosen() == {"test_names": {DecisionKind.USES_CHANGED_NAME}}
    s.repo.write({"pkg/extra.py": extra + "\nprint('registered')\n"})
    assert set(s.chosen()) == {"test_forward", "test_scale", "test_names"}
    s.repo.write({"pkg/extra.py": "import numpy\n" + extra})  # an installed package
    assert set(s.chosen()) == {"test_forward", "test_scale", "test_names"}
    s.store.close()


@pytest.mark.parametrize("code, finds, misses", [
    ("sorted(Path(d).glob('ckpt_*.pt'))", ["a/ckpt_1.pt"], ["a/convert.py"]),
    ("glob.glob(os.path.join(d, '*.py'))", ["a/x.py"], ["a/x.pt"]),
    ("glob.glob(f'{d}/*.safetensors')", ["m.safetensors"], ["m.py"]),
    ("list(Path(d).rglob('model_' + 'x'))", ["a/b.py"], []),  # not a literal: any file
    ("Path(d) / 'w' and Path(d).glob(PATTERN)", ["a/b.py"], []),
    ("[f for f in os.listdir(d) if f.endswith(('.pt', '.bin'))]", ["x.bin"], ["x.py"]),
    ("[p for p in sorted(d.iterdir()) if p.suffix == '.json']", ["c.json"], ["c.py"]),
    ("[f for f in os.listdir(d) if fnmatch.fnmatch(f, 'ckpt_*')]", ["ckpt_1"], ["run.py"]),
    ("[f for f in os.listdir(d) if not f.endswith('.pt')]", ["x.py"], []),  # unknown test
    ("os.listdir(d)", ["x.py"], []),
    ("pkgutil.iter_modules(__path__)", ["p/x.py"], []),
    ("importlib.import_module(f'pkg.models.{name}')", ["src/pkg/models/gpt.py"],
     ["pkg/data/gpt.py", "pkg/models.py"]),
    ("importlib.import_module('pkg.models.' + name)", ["pkg/models/gpt.py"], ["pkg/x.py"]),
    ("importlib.import_module(name)", ["any/x.py"], []),
])
def test_what_a_discovery_call_can_find(code: str, finds: list[str], misses: list[str]) -> None:
    from fastci.changes.static_facts import file_discoveries, parse

    tree = parse(f"def f(d, name):\n    return {code}\n")
    assert tree is not None
    (found,) = file_discoveries(tree)
    assert all(found.can_find(p) for p in finds), found
    assert not any(found.can_find(p) for p in misses), found


# A folder glob whose entries are then run (found in review): the pattern names a folder
# below the listed one, not the file the change adds.
PLUGINS = {
    "pkg/__init__.py": "",
    "pkg/loader.py": ("import glob, os, runpy\nHERE = os.path.dirname(__file__)\n\n\n"
                      "def load():\n    out = []\n"
                      "    for d in sorted(glob.glob(os.path.join(HERE, 'plugin_*'))):\n"
                      "        out.append(runpy.run_path(os.path.join(d, 'main.py'))['VALUE'])\n"
                      "    return out\n"),
    "pkg/plugin_a/__init__.py": "",
    "pkg/plugin_a/main.py": "VALUE = 1\n",
    "test_load.py": "from pkg.loader import load\n\n\ndef test_load():\n"
                    "    assert all(v == 1 for v in load())\n",
    "test_other.py": "def test_other():\n    assert True\n",
}


def test_a_folder_pattern_reaches_the_files_below_the_folders_it_finds(tmp_path: Path) -> None:
    s = Suite(tmp_path / "repo", PLUGINS)
    s.record()
    s.repo.commit({"pkg/plugin_b/__init__.py": "", "pkg/plugin_b/main.py": "VALUE = 2\n"})
    assert "test_load" in s.chosen()
    assert "test_other" not in s.chosen()
    s.store.close()


# Found in review: a re-export from another module drops the attribute the old import
# set on the package (``pkg.utils``), which a test read.
SUBMODULE_ATTR = {
    "pkg/__init__.py": '"""A package."""\nfrom pkg.utils import clip\n',
    "pkg/utils.py": "def clip(x):\n    return min(x, 1)\n\n\ndef scale(x):\n    return 2 * x\n",
    "pkg/helpers.py": "def clip(x):\n    return min(x, 1)\n",
    "test_clip.py": "from pkg import clip\n\n\ndef test_clip():\n    assert clip(3) == 1\n",
    "test_attr.py": "import pkg\n\n\ndef test_attr():\n    assert pkg.utils.scale(2) == 4\n",
}


def test_a_reexport_that_stops_importing_a_submodule_reaches_its_attribute_users(
        tmp_path: Path) -> None:
    s = Suite(tmp_path / "repo", SUBMODULE_ATTR)
    s.record()
    s.repo.commit({"pkg/__init__.py": '"""A package."""\nfrom pkg.helpers import clip\n'})
    assert {"test_clip", "test_attr"} <= set(s.chosen())
    s.store.close()
