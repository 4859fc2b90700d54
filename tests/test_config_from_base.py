"""A change cannot rewrite its own rules: decisions use the base revision's fastci.yaml.

Each test builds a temporary git repository whose base commit holds a
``fastci.yaml``, records three tests at that base in a real store, then changes
things and plans with the configuration loaded the way ``fastci plan`` loads it
(:func:`fastci.config.load` on the working tree).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest

from fastci import config
from fastci.plan.planner import analyze
from fastci.plan.analysis import Analysis
from fastci.plan.inputs import Declarations, Given, KnownFingerprint, Query
from fastci.config import Config
from fastci.evidence.store.db import EvidenceStore
from fastci.select import DeclaredTest, DecisionKind
from selection_support import DATA, MODEL, OTHER, Repo, env_now, ingest, units_of

TESTS = ("//t:a", "//t:b", "//t:c")
BASE_CONFIG = """\
run_all: [BUILD.bazel, fastci.yaml]
ignore: ["*.md"]
path_tests:
  "data/weights/**": ["//t:c"]
"""
#: The probe from the issue: drop BUILD.bazel from run_all, ignore everything.
REWRITE = 'run_all: []\nignore: ["**"]\n'
CHANGED = "fastci.yaml changed: decisions use the base's rules, and a change to the rules runs"


class Suite:
    """A repo whose base has ``config_text`` as fastci.yaml (None: no file), three tests."""

    def __init__(self, root: Path, config_text: str | None, path: str = "fastci.yaml") -> None:
        self.root = root
        self.repo = Repo(root)
        files = {"pkg/model.py": MODEL, "pkg/data.py": DATA, "pkg/other.py": OTHER,
                 "data/cfg.json": "{}\n", "data/weights/w.bin": "w1\n", "BUILD.bazel": "# b\n",
                 "README.md": "r\n", ".gitignore": "/.fastci/\n"}
        if config_text is not None:
            files[path] = config_text
        self.base = self.repo.commit(files)
        units = units_of(root, ["pkg/model.py", "pkg/data.py", "pkg/other.py"])
        self.store = EvidenceStore.open(root / ".fastci/evidence.db", create=True)
        for test, mod in zip(TESTS, ("model", "data", "other")):
            ingest(self.store, test, {u: c for u, c in units.items() if u.startswith(f"pkg/{mod}")},
                   commit=self.base, files={"data/cfg.json": "d1"} if mod == "data" else None)
        self.declared = {t: DeclaredTest(t, 1, {}, ()) for t in TESTS}

    def plan(self, cfg: Config, *, head: str | None = None,
             declared: Declarations | None = None) -> Analysis:
        kw = {"head": head} if head else {}
        return analyze(self.root, cfg, base=self.base, declared=declared or Given(self.declared),
                       environment=KnownFingerprint(env_now()), store=self.store, **kw)

    def load(self, env: Mapping[str, str] | None = None) -> Config:
        """The configuration as ``fastci plan`` loads it: from the working tree."""
        return config.load(self.root, env=env or {})


@pytest.fixture
def suite(tmp_path: Path) -> Iterator[Suite]:
    s = Suite(tmp_path / "repo", BASE_CONFIG)
    yield s
    s.store.close()


def selected(a: Analysis) -> set[str]:
    return {d.test for d in a.selection.selected}


def test_nothing_changed_plans_nothing_with_the_base_rules(suite: Suite) -> None:
    a = suite.plan(suite.load())
    assert a.plan.mode == "selective" and selected(a) == set(), a.plan.reason


def test_probe_a_change_that_rewrites_its_rules_still_runs_everything(suite: Suite) -> None:
    suite.repo.write({"fastci.yaml": REWRITE, "BUILD.bazel": "# b, changed\n"})
    cfg = suite.load()
    assert cfg.ignore == ("**",)  # the head's rules would ignore the BUILD change: 0 of 3
    a = suite.plan(cfg)
    assert a.plan.mode == "all" and selected(a) == set(TESTS)
    assert a.plan.reason.startswith(CHANGED), a.plan.reason
    # Base's rules also judge the BUILD change itself.
    assert any(r.kind is DecisionKind.RUN_ALL_PATH and r.path == "BUILD.bazel"
               for r in a.selection.widen), a.selection.widen


def test_a_config_change_alone_widens_whatever_run_all_says(tmp_path: Path) -> None:
    s = Suite(tmp_path / "repo", "run_all: [BUILD.bazel]\n")  # fastci.yaml not in run_all
    try:
        s.repo.write({"fastci.yaml": "run_all: [BUILD.bazel]\nignore: [fastci.yaml]\n"})
        a = s.plan(s.load())
        assert a.plan.mode == "all" and selected(a) == set(TESTS), a.plan.reason
        reason = a.selection.widen[0]
        assert reason.path == "fastci.yaml" and reason.sentence.startswith(CHANGED)
        # Every test carries the reason; the plan's "why" says it.
        assert all(reason in d.reasons for d in a.selection.decisions)
        assert all(CHANGED in t.why for t in a.plan.tests)
    finally:
        s.store.close()


def test_a_comment_edit_is_a_change_too(suite: Suite) -> None:
    suite.repo.write({"fastci.yaml": BASE_CONFIG + "# just a comment\n"})
    assert suite.plan(suite.load()).plan.mode == "all"


def test_a_change_elsewhere_is_decided_with_the_base_rules(suite: Suite) -> None:
    # base -> head changes a mapped data file; the working tree's fastci.yaml (what
    # config.load reads) is edited to ignore everything, but base and head agree.
    head = suite.repo.commit({"data/weights/w.bin": "w2\n"})
    suite.repo.write({"fastci.yaml": REWRITE})
    cfg = suite.load()
    a = suite.plan(cfg, head=head)
    assert a.plan.mode == "selective", a.plan.reason
    assert selected(a) == {"//t:c"}
    assert [r.kind for r in a.selection.by_test["//t:c"].reasons] == [DecisionKind.PATH_RULE]


def test_the_same_rules_decide_in_worktree_mode_when_the_file_is_unchanged(suite: Suite) -> None:
    suite.repo.write({"data/weights/w.bin": "w2\n", "docs.md": "x\n"})
    a = suite.plan(suite.load())
    assert a.plan.mode == "selective" and selected(a) == {"//t:c"}, a.plan.reason


def test_a_base_without_the_file_decides_with_the_defaults(tmp_path: Path) -> None:
    s = Suite(tmp_path / "repo", None)
    try:
        head = s.repo.commit({"BUILD.bazel": "# b, changed\n"})
        s.repo.write({"fastci.yaml": REWRITE})  # untracked in the working tree only
        a = s.plan(s.load(), head=head)
        assert a.plan.mode == "all", a.plan.reason
        assert [r.path for r in a.selection.widen] == ["BUILD.bazel"]  # default run_all
        assert "matches run_all 'BUILD.bazel'" in a.plan.reason
    finally:
        s.store.close()


@pytest.mark.parametrize("base_text,head_text,word", [
    (None, REWRITE, "added"),
    (BASE_CONFIG, None, "deleted"),
    (BASE_CONFIG, "run_all: [\n", "changed"),  # no longer parses
])
def test_added_deleted_or_unparsable_config_widens(tmp_path: Path, base_text: str | None,
                                                   head_text: str | None, word: str) -> None:
    s = Suite(tmp_path / "repo", base_text)
    try:
        head = s.repo.commit({"fastci.yaml": head_text})
        # The working tree (what config.load reads) goes back to the base's file.
        s.repo.write({"fastci.yaml": base_text}) if base_text else None
        a = s.plan(s.load(), head=head)
        assert a.plan.mode == "all" and selected(a) == set(TESTS), a.plan.reason
        assert a.plan.reason.startswith(f"fastci.yaml {word}: decisions use the base's rules")
    finally:
        s.store.close()


def test_an_invalid_base_config_widens_with_the_error(tmp_path: Path) -> None:
    s = Suite(tmp_path / "repo", "run_al: []\n")
    try:
        s.repo.write({"fastci.yaml": BASE_CONFIG})  # a fix of the typo, in the working tree
        a = s.plan(s.load())
        assert a.plan.mode == "all" and selected(a) == set(TESTS)
        assert "change analysis failed" in a.plan.reason and "unknown key 'run_al'" in a.plan.reason
    finally:
        s.store.close()


def test_fastci_config_inside_the_repo_is_read_at_base(tmp_path: Path) -> None:
    s = Suite(tmp_path / "repo", BASE_CONFIG, path="ci/fastci.yaml")
    try:
        env = {"FASTCI_CONFIG": str(s.root / "ci" / "fastci.yaml")}
        s.repo.write({"data/weights/w.bin": "w2\n"})
        assert selected(s.plan(s.load(env))) == {"//t:c"}
        s.repo.write({"ci/fastci.yaml": REWRITE})
        a = s.plan(s.load(env))
        assert a.plan.mode == "all" and a.plan.reason.startswith("ci/fastci.yaml changed: ")
    finally:
        s.store.close()


def test_targets_come_from_base_unless_the_environment_sets_them(suite: Suite) -> None:
    seen: list[str] = []

    def declared(root: Path, cfg: Config) -> dict[str, DeclaredTest]:
        seen.append(cfg.targets)
        return suite.declared

    suite.repo.write({"fastci.yaml": BASE_CONFIG + "targets: //narrow/...\n"})
    suite.plan(suite.load(), declared=Query(declared))
    suite.plan(suite.load({"FASTCI_TARGETS": "//from/env/..."}), declared=Query(declared))
    assert seen == ["//...", "//from/env/..."]


def test_the_bazel_program_comes_from_base_a_change_cannot_choose_it(suite: Suite) -> None:
    """Reported: a change's fastci.yaml could set ``bazel:`` to a script of its own, which
    the planner then ran (``bazel query``). The planner runs the base's program."""
    seen: list[str] = []

    def declared(root: Path, cfg: Config) -> dict[str, DeclaredTest]:
        seen.append(cfg.bazel)
        return suite.declared

    suite.repo.write({"fastci.yaml": BASE_CONFIG + "bazel: ./evil.sh\n"})
    a = suite.plan(suite.load(), declared=Query(declared))
    suite.plan(suite.load({"FASTCI_BAZEL": "/ci/bazel"}), declared=Query(declared))
    assert seen == ["bazel", "/ci/bazel"]
    assert a.selection.widen  # the rules changed: everything runs, with the base's bazel


def test_rung_timeout_is_a_positive_number_of_seconds(tmp_path: Path) -> None:
    (tmp_path / "fastci.yaml").write_text("rung_timeout_s: 600\n")
    assert config.load(tmp_path, env={}).rung_timeout_s == 600.0
    assert config.load(tmp_path, env={"FASTCI_RUNG_TIMEOUT_S": "90"}).rung_timeout_s == 90.0
    for bad in ("0", "-3", "soon"):
        with pytest.raises(config.ConfigError, match="rung_timeout_s"):
            config.load(tmp_path, env={"FASTCI_RUNG_TIMEOUT_S": bad})


def test_a_python_path_in_run_all_runs_everything(tmp_path: Path) -> None:
    """run_all held Python paths (setup.py, conftest.py, build scripts) that were never
    checked: only non-Python paths were, so editing setup.py ran nothing."""
    for path in ("setup.py", "tools/gen.py"):
        suite = Suite(tmp_path / path.replace("/", "_"),
                      "run_all: [BUILD.bazel, fastci.yaml, setup.py, 'tools/**']\n")
        suite.repo.write({path: "def main():\n    return 2\n"})
        a = suite.plan(suite.load())
        assert [r.sentence for r in a.selection.widen] == [
            f"{path} changed and matches run_all {path if path == 'setup.py' else 'tools/**'!r}: "
            "everything runs"], a.selection.widen
        suite.store.close()
