"""A plan is obeyed only on the tree it was made for (issue 9 item 6).

The pytest plugin (a real pytest subprocess on a temporary git repository),
``rules/bazelw``'s shell digest (with a stand-in for the real bazel), and the
digest itself against git's racy-clean trap. The Bazel rules are tested in
tests/test_bazel_stale_plan.py, ``fastci run`` in tests/test_run.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastci.plan.model import Plan, PlannedTest, SkippedTest, dump_plan
from fastci.integrations.git.tree import head_tree, worktree_tree
from fastci.types import is_tool_artifact
from selection_support import Repo

REPO = Path(__file__).resolve().parents[1]

SUITE = '''
def test_a():
    print("RAN a")


def test_b():
    print("RAN b")


def test_c():
    print("RAN c")
'''
# The plan is not committed (`git add -A` in Repo.commit would); ignoring it is not what
# keeps it out of the tree digest: .fastci/ never is part of it.
IGNORE = "/.fastci/plan.json\n__pycache__/\n"


def _repo(root: Path) -> Repo:
    repo = Repo(root)
    repo.commit({".gitignore": IGNORE, "test_suite.py": SUITE, "README.md": "suite\n"})
    return repo


def _plan(tree: str | None) -> Plan:
    return Plan(mode="selective", reason="b only", tree=tree,
                tests=(PlannedTest("test_suite.py::test_b"),),
                skipped=(SkippedTest("test_suite.py::test_a", "not affected"),
                         SkippedTest("test_suite.py::test_c", "not affected")))


def _pytest(root: Path) -> tuple[list[str], str]:
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-v",
                          "--fastci-plan", ".fastci/plan.json", "test_suite.py"],
                         cwd=root, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return re.findall(r"RAN (\w)", res.stdout), res.stdout + res.stderr


def test_pytest_plugin_obeys_a_plan_only_on_its_tree(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    clean = worktree_tree(tmp_path)
    dump_plan(_plan(clean), tmp_path / ".fastci/plan.json")
    ran, out = _pytest(tmp_path)
    assert ran == ["b"] and "2 deselected" in out and "this tree is" not in out

    # A tracked file edited after planning: the plan describes another tree.
    repo.write({"README.md": "suite, edited after the plan was made\n"})
    edited = worktree_tree(tmp_path)
    ran, out = _pytest(tmp_path)
    assert ran == ["a", "b", "c"] and "deselected" not in out
    assert f"plan made for tree {clean}, this tree is {edited}: running every test at full workload" in out

    # Committing changes no content: a plan for the edited tree is obeyed after the commit.
    dump_plan(_plan(edited), tmp_path / ".fastci/plan.json")
    repo.commit(msg="commit the edit")
    assert head_tree(tmp_path) == edited
    ran, out = _pytest(tmp_path)
    assert ran == ["b"] and "this tree is" not in out

    # Back to the first content (and an empty commit on top): the first plan applies again.
    repo.commit({"README.md": "suite\n"}, msg="revert")
    repo.commit(msg="nothing")
    dump_plan(_plan(clean), tmp_path / ".fastci/plan.json")
    ran, _ = _pytest(tmp_path)
    assert ran == ["b"]


def test_pytest_plugin_does_not_obey_a_plan_tied_to_no_tree(tmp_path: Path) -> None:
    # Issue 34 item 6: a plan without `tree` (hand-written, left in place) says nothing
    # about this content: every test runs, with one line why.
    repo = _repo(tmp_path)
    dump_plan(_plan(None), tmp_path / ".fastci/plan.json")
    repo.write({"README.md": "anything\n"})
    ran, out = _pytest(tmp_path)
    assert ran == ["a", "b", "c"]
    assert "the plan names no `tree`, so it is tied to no tree" in out
    assert "running every test at full workload" in out


def test_pytest_plugin_does_not_obey_a_committed_plan_even_for_its_tree(tmp_path: Path) -> None:
    # Issue 34 item 6: a plan file git tracks was committed (by the change under test):
    # a change never chooses its own plan. Even one naming a tree is not obeyed.
    repo = _repo(tmp_path)
    (tmp_path / ".gitignore").write_text("__pycache__/\n")
    dump_plan(_plan(None), tmp_path / ".fastci/plan.json")
    repo.commit(msg="the change commits its own plan")
    dump_plan(_plan(worktree_tree(tmp_path)), tmp_path / ".fastci/plan.json")  # untracked edits stay out
    ran, out = _pytest(tmp_path)
    assert ran == ["a", "b", "c"]
    assert "is tracked by git: a committed plan is never obeyed" in out
    res = subprocess.run([sys.executable, "-m", "fastci", "validate-plan", "--workspace", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "NOT OBEYED: the plan file plan.json" in res.stdout, res.stdout


def test_pytest_plugin_outside_git_does_not_obey_a_plan_for_a_tree(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    dump_plan(_plan("0" * 40), tmp_path / ".fastci/plan.json")
    ran, out = _pytest(tmp_path)
    assert ran == ["a", "b", "c"]
    assert f"plan made for tree {'0' * 40}, this tree is unknown" in out


# --- rules/bazelw computes the same digest in shell ----------------------------------------------

FAKE_BAZEL = "#!/bin/sh\nprintf '%s\\n' \"$@\"\n"


def _bazelw(ws: Path, tmp: Path, *args: str) -> list[str]:
    fake = tmp / "fake-bazel"
    fake.write_text(FAKE_BAZEL)
    fake.chmod(0o755)
    res = subprocess.run([str(REPO / "rules/bazelw"), *args], cwd=ws, capture_output=True, text=True,
                         env=dict(os.environ, BAZEL_REAL=str(fake)), timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def _tree_flag(lines: list[str]) -> str:
    flags = [line for line in lines if line.startswith("--repo_env=FASTCI_TREE_DIGEST=")]
    assert len(flags) == 1, lines
    return flags[0].split("=", 2)[2]


def test_bazelw_passes_the_same_tree_digest_as_fastci(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    repo = _repo(ws)
    repo.commit({"WORKSPACE": "", ".fastci/BUILD.bazel": "# the plan's package\n"})
    (ws / "pkg").mkdir()
    assert _tree_flag(_bazelw(ws / "pkg", tmp_path, "test", "//...")) == worktree_tree(ws)
    # FastCI's own outputs are no content; the .fastci BUILD file is.
    repo.write({".fastci/plan.json": "{}", ".fastci/runs/bep.json": "{}"})
    assert _tree_flag(_bazelw(ws, tmp_path, "test", "//...")) == worktree_tree(ws) == head_tree(ws)
    repo.write({"README.md": "edited\n", "pkg/new.py": "x = 1\n", ".fastci/BUILD.bazel": "# edited\n"})
    before = subprocess.run(["git", "-C", str(ws), "status", "--porcelain"], capture_output=True,
                            text=True, check=True).stdout
    lines = _bazelw(ws, tmp_path, "--output_base=/x", "build", "//...")
    assert lines[:2] == ["--output_base=/x", "build"] and lines[-1] == "//..."
    assert _tree_flag(lines) == worktree_tree(ws) != head_tree(ws)
    # The user's index is untouched (pkg/new.py is still untracked, README.md unstaged).
    assert subprocess.run(["git", "-C", str(ws), "status", "--porcelain"], capture_output=True,
                          text=True, check=True).stdout == before
    # Deleted files, odd names, and a .fastci/ folder that is itself git-ignored.
    repo.write({"test_suite.py": None, "pkg/a b ü.py": "y = 2\n", ".gitignore": IGNORE + "/.fastci/\n"})
    assert _tree_flag(_bazelw(ws, tmp_path, "test", "//...")) == worktree_tree(ws) != head_tree(ws)
    # Commands that load no repository get no digest (it is not computed at all).
    assert not any("FASTCI_TREE_DIGEST" in line for line in _bazelw(ws, tmp_path, "info"))


def test_bazelw_leaves_the_caches_of_a_test_run_out_of_the_tree_as_fastci_does(tmp_path: Path) -> None:
    # Issue 36: in a repository that ignores none of them, what a run writes (bytecode,
    # pytest's last-failed list, coverage data) must not change the digest on either side.
    ws = tmp_path / "ws"
    repo = _repo(ws)
    repo.commit({"WORKSPACE": "", "pkg/a.py": "A = 1\n", ".gitignore": ""})
    clean = head_tree(ws)
    repo.write({"pkg/__pycache__/a.cpython-311.pyc": "b", ".pytest_cache/v/cache/lastfailed": "{}",
                ".coverage": "d", ".coverage.h.1": "d", "x.egg-info/PKG-INFO": "n", "m.pyo": "b"})
    assert _tree_flag(_bazelw(ws, tmp_path, "test", "//...")) == worktree_tree(ws) == clean


def test_bazelws_artifact_pattern_is_is_tool_artifact() -> None:
    line = next(ln for ln in (REPO / "rules/bazelw").read_text().splitlines()
                if ln.startswith("ARTIFACTS="))
    pattern = line.split("=", 1)[1].strip("'")
    paths = ["a.py", "pkg/__pycache__/a.pyc", "__pycache__", "pkg/__pycache__x/a.txt",
             ".pytest_cache/v/cache/lastfailed", "sub/.pytest_cache/README.md", ".mypy_cache/x",
             ".hypothesis/examples/a", ".ruff_cache/x", ".tox/py/bin/python", ".nox/x", ".eggs/x",
             ".benchmarks/x.json", "pip-wheel-metadata/x", "htmlcov/index.html",
             "fastci.egg-info/PKG-INFO", "torch-2.4.dist-info/RECORD", "x.egg-infox/a",
             "m.pyc", "m.pyo", "m.pyx", "a.pyc.txt", ".coverage", ".coverage.host.1", ".coveragerc",
             "d/.coverage", "coverage.xml", "docs/htmlcov.md", "tox.ini", "data/.hypothesis2/x"]
    res = subprocess.run(["grep", "-E", pattern], input="\n".join(paths) + "\n",
                         capture_output=True, text=True)
    assert set(res.stdout.split()) == {p for p in paths if is_tool_artifact(p)}
    assert {p for p in paths if is_tool_artifact(p)} > {"m.pyc", ".coverage"}


def test_bazelw_never_fails_over_the_digest(tmp_path: Path) -> None:
    ws = tmp_path / "nogit"
    ws.mkdir()
    (ws / "WORKSPACE").write_text("")
    assert _tree_flag(_bazelw(ws, tmp_path, "test", "//...")) == "unknown"
    repo = _repo(tmp_path / "broken")
    (repo.root / "WORKSPACE").write_text("")
    (repo.root / ".git" / "HEAD").write_text("garbage\n")  # git no longer sees a repository
    assert _tree_flag(_bazelw(repo.root, tmp_path, "query", "//...")) == "unknown"


# --- The digest sees a same-size edit made in the second the index was written -----------------


def _true_tree(root: Path, tmp: Path) -> str:
    """The tree of the working tree's content from a fresh index (no stat cache at all)."""
    env = dict(os.environ, GIT_INDEX_FILE=str(tmp / "fresh-index"))
    subprocess.run(["git", "-C", str(root), "add", "-A", "."], env=env, check=True)
    return subprocess.run(["git", "-C", str(root), "write-tree"], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def _racy_edit(root: Path) -> Repo:
    """Commit a file and rewrite it with the same size within one second, then let a second pass.

    git stores stat times in whole seconds here: the edited file's stat matches
    its index entry, and only git's racy-clean check (entry as new as the index
    file) makes git read the content again.
    """
    for _ in range(5):
        while time.time() % 1 > 0.3:  # start early in a second: the steps take well under 0.7 s
            time.sleep(0.05)
        second = int(time.time())
        repo = Repo(root)
        repo.commit({"m.py": "y = x * 2\n"})
        (root / "m.py").write_text("y = x * 3\n")
        st = (root / "m.py").stat()
        if int(st.st_mtime) == int(st.st_ctime) == int((root / ".git/index").stat().st_mtime) == second:
            time.sleep(1.2)
            return repo
        subprocess.run(["rm", "-rf", str(root)], check=True)
    pytest.fail("could not make a same-second edit")


def test_bazelw_digest_sees_a_same_second_same_size_edit(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _racy_edit(ws)
    (ws / "WORKSPACE").write_text("")
    truth = _true_tree(ws, tmp_path)
    assert truth != head_tree(ws)
    assert _tree_flag(_bazelw(ws, tmp_path, "test", "//...")) == truth


def test_worktree_tree_sees_a_same_second_same_size_edit(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _racy_edit(ws)
    truth = _true_tree(ws, tmp_path)
    assert truth != head_tree(ws)
    assert worktree_tree(ws) == truth


def test_a_change_never_chooses_its_own_plan_file(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 34 item 6: the `plan:` key comes from the base revision's config. A change
    # that points it at a plan of its own (tied to its tree, naming the base) does not
    # get it obeyed by `fastci run`, and `fastci plan` writes where the base says.
    import dataclasses

    from fastci import cli, config as config_mod
    from fastci.plan.planner import plan_file_at

    repo = _repo(tmp_path)
    base = repo.git("rev-parse", "HEAD")
    repo.commit({"fastci.yaml": "plan: .fastci/mine.json\n"}, msg="the change moves the plan")
    cfg = config_mod.load(tmp_path)
    path, note = plan_file_at(tmp_path, cfg, base)
    assert path == tmp_path / ".fastci/plan.json"
    assert note is not None and "a change never chooses its own plan file" in note
    assert plan_file_at(tmp_path, cfg, "HEAD") == (tmp_path / ".fastci/mine.json", None)
    # The CI's own choice (--plan, $FASTCI_PLAN) wins.
    chosen = config_mod.load(tmp_path, overrides={"plan": ".fastci/mine.json"})
    assert plan_file_at(tmp_path, chosen, base) == (tmp_path / ".fastci/mine.json", None)

    mine = dataclasses.replace(_plan(worktree_tree(tmp_path)), base=base)
    dump_plan(mine, tmp_path / ".fastci/mine.json")
    capsys.readouterr()
    assert cli.main(["run", "--root", str(tmp_path), "--no-record"]) == 0
    out = capsys.readouterr().out
    assert all(f"PASSED     test_suite.py::test_{t}" in out for t in "abc"), out
    assert "fastci run: WARNING: fastci.yaml names the plan file '.fastci/mine.json', the base" in out
    assert "a change never chooses its own plan file" in out


READER = '''
from pathlib import Path


def test_reads():
    print("RAN reads")
    assert Path("data/golden.txt").read_text() != ""


def test_other():
    print("RAN other")
'''


def test_a_plan_is_stale_once_a_git_ignored_input_it_relied_on_changed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 34 item 7: the tree does not cover git-ignored files (downloaded data,
    # goldens). The plan records the digests of those its recorded tests read, and
    # runners re-check them: changed -> every test runs, loudly.
    from fastci import cli
    from fastci.plan.model import load_plan

    repo = Repo(tmp_path)
    repo.commit({".gitignore": "/.fastci/\n/data/\n/traces/\n__pycache__/\n",
                 "test_suite.py": READER})
    repo.write({"data/golden.txt": "42\n"})
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "fastci.pytest.plugin", "--fastci-record",
                          "--fastci-trace-dir=traces", "test_suite.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "2 passed" in res.stdout, res.stdout + res.stderr
    assert cli.main(["ingest", str(tmp_path / "traces"), "--source-root", str(tmp_path),
                     "--store", str(tmp_path / ".fastci/evidence.db")]) == 0
    assert cli.main(["plan", "--root", str(tmp_path), "--no-bazel"]) == 0
    plan = load_plan(tmp_path / ".fastci/plan.json")
    assert plan.mode == "selective" and plan.tests == () and len(plan.skipped) == 2, plan.reason
    assert dict(plan.inputs) == {"data/golden.txt": hashlib.sha256(b"42\n").hexdigest()}

    capsys.readouterr()
    assert cli.main(["run", "--root", str(tmp_path), "--no-record"]) == 0
    out = capsys.readouterr().out
    assert "PASSED" not in out and "WARNING" not in out, out  # the plan holds: nothing runs

    repo.write({"data/golden.txt": "43\n"})  # the tree is the same: only the input changed
    assert cli.main(["validate-plan", "--workspace", str(tmp_path)]) == 0
    assert "inputs: STALE: the git-ignored input data/golden.txt changed" in capsys.readouterr().out
    assert cli.main(["run", "--root", str(tmp_path), "--no-record"]) == 0
    out = capsys.readouterr().out
    assert ("fastci run: WARNING: the git-ignored input data/golden.txt changed since the "
            "plan was made") in out, out
    assert "PASSED     test_suite.py::test_reads" in out and "PASSED     test_suite.py::test_other" in out


def test_bazelw_and_the_runner_name_the_same_plan_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 34 item 6: the plan file the rules read is chosen in one place. rules/bazelw
    # passes $FASTCI_PLAN (the config's env var) as FASTCI_PLAN_FILE with that file's
    # digest; fastci.integrations.bazel.runner passes the plan `fastci run` hands it.
    import hashlib as _hashlib

    from fastci.integrations.bazel.runner import Bazel

    ws = tmp_path / "ws"
    repo = _repo(ws)
    repo.commit({"WORKSPACE": "", ".fastci/BUILD.bazel": "# the plan's package\n"})
    dump_plan(_plan(None), ws / ".fastci/other.json")
    digest = _hashlib.sha256((ws / ".fastci/other.json").read_bytes()).hexdigest()[:16]
    monkeypatch.setenv("FASTCI_PLAN", ".fastci/other.json")
    lines = _bazelw(ws, tmp_path, "test", "//...")
    assert f"--repo_env=FASTCI_PLAN_FILE={ws}/.fastci/other.json" in lines
    assert f"--repo_env=FASTCI_PLAN_DIGEST={digest}" in lines
    flags = Bazel(ws, python=sys.executable).fastci_flags("query", ws / ".fastci/other.json")
    assert f"--repo_env=FASTCI_PLAN_FILE={ws}/.fastci/other.json" in flags
    assert f"--repo_env=FASTCI_PLAN_DIGEST={digest}" in flags
    monkeypatch.delenv("FASTCI_PLAN")
    lines = _bazelw(ws, tmp_path, "test", "//...")
    assert not any(line.startswith("--repo_env=FASTCI_PLAN_FILE") for line in lines)
    assert "--repo_env=FASTCI_PLAN_DIGEST=absent" in lines  # no .fastci/plan.json
