"""Declared inputs (``inputs:`` in fastci.yaml): files native code reads, hashed at record
time into the evidence and compared at plan time (fastci.evidence.record.inputs,
fastci.select.inputs).

End to end with the real recorder (pytest plugin) and planner: a test reads a git-ignored
tokenizer file and a dataset file outside the repository through libc (``fopen``, no audit
event: the stand-in for sentencepiece, HF tokenizers, safetensors, arrow). Without the
declaration nothing notices a change to either; with it, each change selects the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from fastci import config
from fastci.errors import ConfigError
from fastci.evidence.record import inputs
from fastci.evidence.store.ingest import find_traces, ingest
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.planner import analyze
from fastci.plan.analysis import Analysis
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.select import DecisionKind
from selection_support import Repo, env_now

TOK, PLAIN = "test_tok.py::test_tokenize", "test_tok.py::test_plain"

TEST_TOK = textwrap.dedent('''
    import ctypes
    import os

    LIBC = ctypes.CDLL(None)
    LIBC.fopen.restype = ctypes.c_void_p
    LIBC.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    LIBC.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
    LIBC.fclose.argtypes = [ctypes.c_void_p]


    def native_read(path):
        """Read a file the way a C library does: no Python audit event."""
        f = LIBC.fopen(path.encode(), b"rb")
        assert f, path
        buf = ctypes.create_string_buffer(256)
        n = LIBC.fread(buf, 1, 256, f)
        LIBC.fclose(f)
        return buf.raw[:n]


    def test_tokenize():
        here = os.path.dirname(os.path.abspath(__file__))
        assert native_read(os.path.join(here, "tok", "vocab.model"))
        assert native_read(os.path.join(os.environ["SNAPSHOT_DIR"], "a.arrow"))


    def test_plain():
        assert True
    ''')


class Project:
    """The project recorded at its base commit, with or without the declaration."""

    def __init__(self, tmp: Path, declare: bool) -> None:
        self.snap = tmp / "snapshots"  # outside the repository
        self.snap.mkdir()
        (self.snap / "a.arrow").write_text("rows v1\n")
        self.root = tmp / "repo"
        self.repo = Repo(self.root)
        files = {"test_tok.py": TEST_TOK, ".gitignore": "/.fastci/\n/tok/\n"}
        if declare:
            files["fastci.yaml"] = (f'inputs:\n  "test_tok.py::test_tok*": ["tok/*.model", '
                                    f'"{self.snap}/*.arrow"]\n')
        self.base = self.repo.commit(files)
        self.repo.write({"tok/vocab.model": "vocab v1\n"})  # git-ignored: never committed
        traces = tmp / "traces"
        env = dict(os.environ, PYTHONPATH=str(self.root), PYTHONDONTWRITEBYTECODE="1",
                   SNAPSHOT_DIR=str(self.snap))
        env.pop("FASTCI_CONFIG", None)
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-p", "fastci.pytest.plugin", "--fastci-record",
                              f"--fastci-trace-dir={traces}", "test_tok.py"],
                             cwd=self.root, env=env, capture_output=True, text=True, timeout=300)
        assert "2 passed" in res.stdout, res.stdout + res.stderr
        self.store = EvidenceStore.open(tmp / "e.db", create=True)
        ingest(self.store, find_traces([traces]), source="pytest", commit=self.base,
               root=self.root)

    def plan(self) -> Analysis:
        cfg = config.load(self.root, env={})
        return analyze(self.root, cfg, base=self.base, declared=Given(None),
                       environment=KnownFingerprint(env_now()), store=self.store)

    def chosen(self) -> dict[str, set[DecisionKind]]:
        a = self.plan()
        assert a.plan.mode == "selective", a.plan.reason
        return {d.test: {r.kind for r in d.reasons} for d in a.selection.selected}


@pytest.fixture
def declared(tmp_path: Path) -> Iterator[Project]:
    p = Project(tmp_path, declare=True)
    yield p
    p.store.close()


def test_without_a_declaration_native_reads_go_unseen(tmp_path: Path) -> None:
    # The reported case: neither file is in the evidence, and changing them selects nothing.
    p = Project(tmp_path, declare=False)
    try:
        assert p.store.file_digests() == []
        (p.root / "tok/vocab.model").write_text("vocab v2\n")
        (p.snap / "a.arrow").write_text("rows v2\n")
        assert p.chosen() == {}
    finally:
        p.store.close()


def test_declared_inputs_are_hashed_into_the_declaring_test_s_evidence(declared: Project) -> None:
    rows = {(path, test) for path, test, _ in declared.store.file_digests()}
    arrow = f"{declared.snap}/a.arrow"
    assert rows == {("tok/vocab.model", TOK), (arrow, TOK)}  # test_plain declares nothing
    assert declared.chosen() == {}  # unchanged: nothing runs


def test_a_changed_ignored_tokenizer_selects_the_declaring_test(declared: Project) -> None:
    (declared.root / "tok/vocab.model").write_text("vocab v2\n")
    assert declared.chosen() == {TOK: {DecisionKind.READ_CHANGED_FILE}}
    (declared.root / "tok/vocab.model").write_text("vocab v1\n")  # back as recorded
    assert declared.chosen() == {}


def test_a_changed_file_outside_the_repository_selects_the_declaring_test(
        declared: Project) -> None:
    (declared.snap / "a.arrow").write_text("rows v2\n")
    a = declared.plan()
    (d,) = a.selection.selected
    assert d.test == TOK and d.reasons[0].kind is DecisionKind.READ_CHANGED_FILE
    assert str(declared.snap / "a.arrow") in d.reasons[0].sentence


def test_an_added_and_a_removed_declared_file_select_the_declaring_test(
        declared: Project) -> None:
    (declared.snap / "b.arrow").write_text("more rows\n")
    got = declared.plan().selection.by_test[TOK]
    assert [r.kind for r in got.reasons] == [DecisionKind.DECLARED_INPUT]
    assert "b.arrow" in got.reasons[0].sentence and "added" in got.reasons[0].sentence
    (declared.snap / "b.arrow").unlink()
    (declared.root / "tok/vocab.model").unlink()
    assert declared.chosen() == {TOK: {DecisionKind.READ_CHANGED_FILE}}  # "is gone"


def test_a_glob_over_the_cap_is_not_hashed_and_selects_its_tests(
        declared: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inputs, "MAX_FILES", 0)
    got = declared.plan().selection.by_test[TOK]
    assert {r.kind for r in got.reasons} == {DecisionKind.DECLARED_INPUT}
    assert "not hashed (it matches more than 0 files)" in got.reasons[0].sentence
    assert declared.plan().selection.by_test[PLAIN].selected is False


def test_expand_walks_below_the_fixed_folders_and_caps(tmp_path: Path) -> None:
    for rel in ("a/x.bin", "a/b/y.bin", "a/b/z.txt", "c/w.bin", ".git/q.bin"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    assert inputs.expand("a/**/*.bin", tmp_path).files == ("a/b/y.bin", "a/x.bin")
    assert inputs.expand("*.bin", tmp_path).files == ("a/b/y.bin", "a/x.bin", "c/w.bin")
    assert inputs.expand("a/x.bin", tmp_path).files == ("a/x.bin",)
    assert inputs.expand(f"{tmp_path}/c/*.bin", tmp_path).files == (f"{tmp_path}/c/w.bin",)
    assert inputs.expand("*.bin", tmp_path, max_files=2).overflow == \
        "it matches more than 2 files"
    assert "visits more than 3" in (inputs.expand("**/*.bin", tmp_path, max_visited=3).overflow
                                    or "")


def test_config_takes_a_list_or_a_mapping_and_rejects_the_rest(tmp_path: Path) -> None:
    (tmp_path / "fastci.yaml").write_text('inputs: ["tok/*.model", "/data/*.arrow"]\n')
    assert config.load(tmp_path, env={}).inputs == (("*", ("tok/*.model", "/data/*.arrow")),)
    (tmp_path / "fastci.yaml").write_text('inputs:\n  "tests/test_tok.py::*": tok/*.model\n')
    assert config.load(tmp_path, env={}).inputs == (("tests/test_tok.py::*", ("tok/*.model",)),)
    for bad in ("inputs: 3\n", "inputs: [3]\n", 'inputs:\n  "t*": [""]\n'):
        (tmp_path / "fastci.yaml").write_text(bad)
        with pytest.raises(ConfigError, match="inputs"):
            config.load(tmp_path, env={})
    assert "inputs" in config.DECISION_KEYS  # read from the base revision


def test_globs_for_joins_every_matching_declaration_in_order() -> None:
    decl = (("*", ("a",)), ("tests/*", ("b", "a")), ("other::*", ("c",)))
    assert inputs.globs_for("tests/test_tok.py::t", decl) == ("a", "b")
    assert inputs.globs_for("other::t", decl) == ("a", "c")


def test_a_glob_never_matches_the_caches_a_test_run_writes(tmp_path: Path) -> None:
    # Issue 36: a declared glob over a folder (``tests/**``, ``**/*``) also matched what
    # the last run left there: pytest's last-failed list, bytecode, coverage data. Each run
    # changed them, so after any local failure (or a child compiling a module) every
    # declaring test was selected again.
    for rel in ("tests/data/x.json", "tests/__pycache__/t.cpython-311.pyc",
                ".pytest_cache/v/cache/lastfailed", "tests/.pytest_cache/v/cache/nodeids",
                ".hypothesis/examples/a/b", ".coverage", "tests/.coverage.host.12",
                "tests/m.pyc", "pkg.egg-info/PKG-INFO", "tests/cache/x.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    # pytest's cache_dir under another name: tagged as a cache (CACHEDIR.TAG).
    (tmp_path / "tests/cache/CACHEDIR.TAG").write_text(
        "Signature: 8a477f597d28d172789f06886806bc55\n")
    assert inputs.expand("tests/**", tmp_path).files == ("tests/data/x.json",)
    assert inputs.expand("**", tmp_path).files == ("tests/data/x.json",)
    assert inputs.expand(f"{tmp_path}/**", tmp_path).files == (f"{tmp_path}/tests/data/x.json",)
    # A file named in full is what the config asks for, cache or not.
    assert inputs.expand("tests/m.pyc", tmp_path).files == ("tests/m.pyc",)


@pytest.mark.parametrize("text, declared", [
    ('select: unit\n', False),  # cannot spell the key: not parsed at all
    ('inputs: ["data.txt"]\n', True),
    ('"\\x69nputs": ["data.txt"]\n', True),  # an escape spells it: parsed, and it counts
    ('"\\x69nputs": [3]\n', False),  # ... a malformed one is parsed (and refused)
])
def test_the_recorder_parses_only_a_config_that_can_declare_inputs(
        tmp_path: Path, text: str, declared: bool) -> None:
    (tmp_path / "fastci.yaml").write_text(text)
    (tmp_path / "data.txt").write_text("x")
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from fastci.evidence.record import inputs
        got = inputs.declared_digests("t::a", Path({str(tmp_path)!r}))
        print(sorted(got), "yaml" in sys.modules)
    """)
    env = {k: v for k, v in os.environ.items() if k != config.ENV_CONFIG_FILE}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    files, parsed = res.stdout.split("] ")
    assert (files + "]" == "['data.txt']") == declared
    assert parsed.strip() == str("inputs" in text or "\\" in text)
