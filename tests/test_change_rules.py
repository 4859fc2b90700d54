"""Each test is compared with its own baseline (issue 12 item 1): evidence of mixed ages."""

from __future__ import annotations

from pathlib import Path

from fastci.config import Config
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.planner import analyze
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.select import DecisionKind, Selection
from selection_support import Repo, env_now, ingest, units_of

M1 = '''def u1():
    return 1


def u2():
    return 2
'''


def _plan(root: Path, store: EvidenceStore, base: str, config: Config | None = None) -> Selection:
    return analyze(root, config or Config(), base=base, declared=Given(None), environment=KnownFingerprint(env_now()),
                   store=store).selection


def _record(root: Path, store: EvidenceStore, test: str, quals: list[str], commit: str,
            files: dict[str, str] | None = None) -> None:
    units = units_of(root, ["pkg/m.py"])
    ingest(store, test, {u: c for u, c in units.items() if u.split("::")[1] in quals},
           commit=commit, files=files)


def _chosen(sel: Selection) -> dict[str, set[DecisionKind]]:
    return {d.test: {r.kind for r in d.reasons} for d in sel.selected}


def test_partial_re_record_neither_hides_nor_repeats_a_change(tmp_path: Path) -> None:
    """The issue's miss: test_b recorded before u1 changed, only test_a re-recorded since."""
    repo = Repo(tmp_path)
    repo.write({".gitignore": ".fastci/\n"})
    r0 = repo.commit({"pkg/m.py": M1})
    store = EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True)
    for test in ("test_a", "test_b"):
        _record(tmp_path, store, test, ["<module>", "u1"], r0)
    _record(tmp_path, store, "test_c", ["<module>", "u2"], r0)
    r1 = repo.commit({"pkg/m.py": M1.replace("return 1", "return 10")})  # u1 changes
    _record(tmp_path, store, "test_a", ["<module>", "u1"], r1)  # only test_a re-recorded
    # Clean at r1: test_b still has to run for u1; test_a ran it already.
    assert _chosen(_plan(tmp_path, store, r1)) == {"test_b": {DecisionKind.CHANGED_UNIT}}
    # Then u2 is edited in the working tree: test_b keeps its u1 reason, test_c joins,
    # and test_a is not selected again for u1.
    repo.write({"pkg/m.py": M1.replace("return 1", "return 10").replace("return 2", "return 20")})
    sel = _plan(tmp_path, store, r1)
    assert _chosen(sel) == {"test_b": {DecisionKind.CHANGED_UNIT},
                            "test_c": {DecisionKind.CHANGED_UNIT}}
    (b,) = [d for d in sel.selected if d.test == "test_b"]
    assert [r.unit for r in b.reasons] == ["pkg/m.py::u1"]
    # Whatever commit is named as the base, the answer is the same.
    assert _chosen(_plan(tmp_path, store, r0)) == _chosen(sel)
    store.close()


def test_a_path_no_test_reads_widens_only_tests_recorded_before_it(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write({".gitignore": ".fastci/\n"})
    r0 = repo.commit({"pkg/m.py": M1, "tools/build.sh": "echo 1\n"})
    store = EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True)
    for test in ("test_a", "test_b"):
        _record(tmp_path, store, test, ["<module>", "u1"], r0)
    # Unknown path changed since every baseline: the whole plan widens, as before.
    repo.write({"tools/build.sh": "echo 2\n"})
    assert _plan(tmp_path, store, r0).mode == "all"
    r1 = repo.commit()
    _record(tmp_path, store, "test_a", ["<module>", "u1"], r1)
    sel = _plan(tmp_path, store, r1)
    assert sel.mode == "selective"
    assert _chosen(sel) == {"test_b": {DecisionKind.CHANGED_SINCE_RECORDED}}
    store.close()


def test_a_read_file_is_compared_with_the_digest_each_test_recorded(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write({".gitignore": ".fastci/\n"})
    r0 = repo.commit({"pkg/m.py": M1, "data/cfg.json": "{}\n"})
    store = EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True)
    import hashlib

    def digest() -> str:
        return hashlib.sha256((tmp_path / "data/cfg.json").read_bytes()).hexdigest()

    for test in ("test_a", "test_b"):
        _record(tmp_path, store, test, ["u1"], r0, files={"data/cfg.json": digest()})
    r1 = repo.commit({"data/cfg.json": '{"lr": 1}\n'})
    _record(tmp_path, store, "test_a", ["u1"], r1, files={"data/cfg.json": digest()})
    assert _chosen(_plan(tmp_path, store, r1)) == {"test_b": {DecisionKind.READ_CHANGED_FILE}}
    store.close()


def test_evidence_from_a_modified_tree_is_compared_with_its_own_checksums(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write({".gitignore": ".fastci/\n"})
    r0 = repo.commit({"pkg/m.py": M1})
    store = EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True)
    repo.write({"pkg/m.py": M1.replace("return 2", "return 22")})  # recorded dirty
    _record(tmp_path, store, "test_a", ["<module>", "u1"], "dirty:abc")
    _record(tmp_path, store, "test_c", ["<module>", "u2"], "dirty:abc")
    repo.write({"pkg/m.py": M1})  # back to the commit: u2 differs from what test_c ran
    sel = _plan(tmp_path, store, r0)
    chosen = _chosen(sel)
    assert DecisionKind.CHANGED_UNIT in chosen["test_c"]
    assert any("modified tree" in n for n in sel.notes)
    store.close()


def test_skipped_and_xfailed_runs_are_not_failures(tmp_path: Path) -> None:
    """Issue 12 item 2: a test whose last run was skipped is selected only for its evidence."""
    repo = Repo(tmp_path)
    repo.write({".gitignore": ".fastci/\n"})
    r0 = repo.commit({"pkg/m.py": M1})
    store = EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True)
    units = units_of(tmp_path, ["pkg/m.py"])
    for test, outcome in (("t_skip", "skipped"), ("t_xfail", "xfailed"), ("t_xpass", "xpassed"),
                          ("t_fail", "failed"), ("t_err", "error"), ("t_odd", "interrupted")):
        ingest(store, test, {"pkg/m.py::u2": units["pkg/m.py::u2"]}, commit=r0, outcome=outcome)
    assert _chosen(_plan(tmp_path, store, r0)) == {
        t: {DecisionKind.FAILED_LAST} for t in ("t_fail", "t_err", "t_odd")}
    store.close()


def test_a_pin_bump_reaches_importers_once(tmp_path: Path) -> None:
    """Issue 12 items 4/5 against baselines: the pin bump selects the tests that imported the
    package; once they are re-recorded, later commits select nobody for it."""
    import time

    from fastci.evidence.store.db import RunEvidence

    def record(test: str, commit: str, dists: dict[str, str]) -> None:
        units = units_of(tmp_path, ["pkg/m.py"])
        store.ingest(RunEvidence(
            test=test, run_key=f"{test}:{time.time_ns()}", outcome="passed", complete=True,
            duration_s=1.0, gpus=0, workload={}, recorded_at=time.time(), env_fingerprint=env_now(),
            commit=commit, units={"pkg/m.py::u1": (units["pkg/m.py::u1"], frozenset({"c"}))},
            distributions=dists))

    repo = Repo(tmp_path)
    repo.write({".gitignore": ".fastci/\n"})
    reqs = "pyyaml==6.0.1\nprotobuf==5.0\n"
    r0 = repo.commit({"pkg/m.py": M1, "requirements.txt": reqs,
                      ".pre-commit-config.yaml": "repos: []\n"})
    store = EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True)
    record("t_yaml", r0, {"pyyaml": "6.0.1"})
    record("t_proto", r0, {"protobuf": "5.0"})
    repo.write({"requirements.txt": reqs.replace("6.0.1", "6.0.2"),
                ".pre-commit-config.yaml": "repos: [x]\n"})
    sel = _plan(tmp_path, store, r0)
    assert sel.mode == "selective"
    assert _chosen(sel) == {"t_yaml": {DecisionKind.CHANGED_DISTRIBUTION}}
    r1 = repo.commit()
    record("t_yaml", r1, {"pyyaml": "6.0.2"})  # the CI recorded what ran
    repo.write({"pkg/m.py": M1 + "\n\ndef u3():\n    return 3\n"})  # code neither test runs
    assert _chosen(_plan(tmp_path, store, r1)) == {}
    store.close()


def test_an_environment_that_differs_in_unimported_packages_keeps_the_evidence(
        tmp_path: Path) -> None:
    """Issue 12 item 4: only the tests that imported a package that differs re-run."""
    import time

    from fastci.changes.scan import scan
    from fastci.evidence.store.db import RunEvidence
    from fastci.integrations.git.repository import Git
    from fastci.select import select_tests

    def listing(pkgs: dict[str, str]) -> str:
        return "\n".join(f"{n}=={v}" for n, v in sorted(pkgs.items()))

    old = {"pyyaml": "6.0.1", "black": "24.1", "protobuf": "5.0"}
    repo = Repo(tmp_path)
    repo.write({".gitignore": ".fastci/\n"})
    r0 = repo.commit({"pkg/m.py": M1})
    store = EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True)
    units = units_of(tmp_path, ["pkg/m.py"])
    for test, dists in (("t_yaml", {"pyyaml": "6.0.1"}), ("t_none", {})):
        store.ingest(RunEvidence(
            test=test, run_key=f"{test}:{time.time_ns()}", outcome="passed", complete=True,
            duration_s=1.0, gpus=0, workload={}, recorded_at=time.time(), env_fingerprint="fp-old",
            environment={"base_fingerprint": "b1", "packages_list": listing(old)}, commit=r0,
            units={"pkg/m.py::u1": (units["pkg/m.py::u1"], frozenset({"c"}))},
            distributions=dists))
    assert store.latest_runs()["t_yaml"].environment["packages_list"] == listing(old)

    def chosen(new: dict[str, str], base_fp: str = "b1") -> dict[str, set[DecisionKind]]:
        env = {"fingerprint": "fp-new", "base_fingerprint": base_fp, "packages_list": listing(new)}
        sel = select_tests(scan(Git(tmp_path), r0, evidence_commits=[r0]), store, Config(),
                           declared=None, env_fingerprint="fp-new", environment=env)
        return _chosen(sel)

    # black differs: nobody imported it. t_none recorded no imports: it cannot be trusted.
    assert chosen({**old, "black": "24.2"}) == {"t_none": {DecisionKind.ENVIRONMENT_CHANGED}}
    assert chosen({**old, "pyyaml": "6.0.2"}) == {
        "t_yaml": {DecisionKind.ENVIRONMENT_PACKAGES}, "t_none": {DecisionKind.ENVIRONMENT_CHANGED}}
    # Another interpreter or GPU stack (base fingerprint): everything.
    assert set(chosen(old, base_fp="b2")) == {"t_yaml", "t_none"}
    store.close()


M3 = '''from typing import List

MAX_LEN = 128


def uses():
    return MAX_LEN


def other():
    return 1
'''


def test_import_time_change_reaches_the_users_of_the_names_it_binds(tmp_path: Path) -> None:
    """Item 3: an added import reaches nobody; a changed constant reaches the tests that
    executed a unit using it; a module-level call stays module-wide."""
    repo = Repo(tmp_path)
    repo.write({".gitignore": ".fastci/\n"})
    r0 = repo.commit({"pkg/__init__.py": "", "pkg/m.py": M3})
    store = EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True)
    _record(tmp_path, store, "test_uses", ["<module>", "uses"], r0)
    _record(tmp_path, store, "test_other", ["<module>", "other"], r0)
    repo.write({"pkg/m.py": M3.replace("import List", "import List, Optional")})
    assert _chosen(_plan(tmp_path, store, r0)) == {}
    repo.write({"pkg/m.py": M3.replace("MAX_LEN = 128", "MAX_LEN = 256")})
    sel = _plan(tmp_path, store, r0)
    assert _chosen(sel) == {"test_uses": {DecisionKind.USES_CHANGED_NAME}}
    (d,) = sel.selected
    assert d.reasons[0].unit == "pkg/m.py::uses" and "MAX_LEN" in d.reasons[0].sentence
    repo.write({"pkg/m.py": M3 + "\nprint(MAX_LEN)\n"})  # not only bindings: module-wide
    assert set(_chosen(_plan(tmp_path, store, r0))) == {"test_uses", "test_other"}
    store.close()


def test_the_plan_reads_the_runners_packages(tmp_path: Path) -> None:
    """Item 4 end to end: ``analyze`` asks the runner's interpreter for its package listing,
    so evidence recorded where only an unimported package differed is kept."""
    import sys
    import time

    from fastci.evidence.record.environment import environment_of_interpreter
    from fastci.evidence.store.db import RunEvidence

    now = environment_of_interpreter(sys.executable)
    lines = now["packages_list"].splitlines()
    assert len(lines) > 2
    other = lines[0].split("==")[0]  # a package the test below never imported
    then = "\n".join([f"{other}==0.0.0.old", *lines[1:]])
    repo = Repo(tmp_path)
    repo.write({".gitignore": ".fastci/\n"})
    r0 = repo.commit({"pkg/m.py": M1})
    store = EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True)
    units = units_of(tmp_path, ["pkg/m.py"])
    for test, base_fp in (("t_same_base", now["base_fingerprint"]), ("t_other_base", "b-other")):
        store.ingest(RunEvidence(
            test=test, run_key=f"{test}:{time.time_ns()}", outcome="passed", complete=True,
            duration_s=1.0, gpus=0, workload={}, recorded_at=time.time(),
            env_fingerprint="fp-then", commit=r0,
            environment={"base_fingerprint": base_fp, "packages_list": then},
            units={"pkg/m.py::u1": (units["pkg/m.py::u1"], frozenset({"c"}))},
            distributions={"nothing-like-it": "1.0"}))
    sel = analyze(tmp_path, Config(runner_python=sys.executable), base=r0, declared=Given(None),
                  store=store).selection
    assert _chosen(sel) == {"t_other_base": {DecisionKind.ENVIRONMENT_CHANGED}}
    store.close()
