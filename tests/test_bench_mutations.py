"""The selection benchmark's mutation round: the generator and the miss logic (no Bazel)."""

from __future__ import annotations

import ast
import difflib
import subprocess
import sys
import types
from pathlib import Path

import libcst as cst
import pytest

from bench import __main__ as bench_main
from bench.mutations import (OPERATORS, Mutant, candidates, changed_units, generate, materialize,
                             own_code, patch_paths, read_sources, sample_units)
from bench.selection import MutantOutcome, Outcome, exit_code, miss_lines, mutation_report
from fastci.units.index import FileUnits, index_source

REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "examples" / "microllm" / "microllm"

FIXTURE = '''"""A module with a site for every operator, nested defs and a class."""
LIMIT = 3


def window(xs, n):
    """Take the first n items."""
    if n < LIMIT:
        n = max(n, 1)
    return xs[:n]


def outer(a, b):
    def inner(c):
        return c[1:] == a
    total = pow(a, b)
    return inner(total)


class Box:
    size = 2

    def grow(self, k):
        if k is None:
            return self.size
        return self.size + k
'''
PATH = "pkg/mod.py"
UNITS = [f"{PATH}::{q}" for q in ("<module>", "window", "outer", "outer.<locals>.inner", "Box",
                                   "Box.grow")]


def _all_mutants(path: str, source: str, qualname: str) -> list[Mutant]:
    out = []
    for c in candidates(path, source, qualname):
        m = materialize(c)
        if m is not None:
            out.append(m)
    return out


def _changed_old_lines(old: str, new: str) -> set[int]:
    """1-based lines of ``old`` that the edit replaced or removed (or next to an insertion)."""
    lines: set[int] = set()
    matcher = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False)
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag in ("replace", "delete"):
            lines.update(range(i1 + 1, i2 + 1))
        elif tag == "insert":
            lines.add(max(i1, 1))
    return lines


def test_generate_is_deterministic_per_seed() -> None:
    sources = {PATH: FIXTURE}
    first = generate(sources, UNITS, count=8, seed=3)
    again = generate(sources, UNITS, count=8, seed=3)
    assert [(m.name, m.mutated) for m in first] == [(m.name, m.mutated) for m in again]
    assert len(first) == 8
    others = [generate(sources, UNITS, count=8, seed=s) for s in (4, 5)]
    assert any([m.name for m in o] != [m.name for m in first] for o in others)


def test_each_operator_is_represented_and_names_are_unique() -> None:
    mutants = generate({PATH: FIXTURE}, UNITS, count=len(OPERATORS), seed=0)
    assert sorted(m.operator for m in mutants) == sorted(OPERATORS)
    many = generate({PATH: FIXTURE}, UNITS, count=40, seed=0)
    assert len({m.name for m in many}) == len(many)
    assert len({m.mutated for m in many}) == len(many)
    assert all(m.name.startswith(f"mut-{m.operator}-mod.") or m.name.startswith(f"mut-{m.operator}-mod-")
               for m in many)


@pytest.mark.parametrize("qualname", [u.split("::")[1] for u in UNITS])
def test_every_mutant_is_valid_differs_and_stays_in_its_unit(qualname: str) -> None:
    mutants = _all_mutants(PATH, FIXTURE, qualname)
    assert mutants, qualname
    before = index_source(PATH, FIXTURE)
    assert isinstance(before, FileUnits)
    original = ast.dump(ast.parse(FIXTURE))
    for m in mutants:
        tree = ast.parse(m.mutated)  # valid Python
        compile(tree, PATH, "exec")
        assert ast.dump(tree) != original, m.name
        # Only the intended unit's lines changed ...
        owners = {before.unit_for_line(line).qualname
                  for line in _changed_old_lines(FIXTURE, m.mutated)}
        assert owners == {qualname}, (m.name, owners, m.diff())
        # ... and every other unit keeps its checksum.
        after = index_source(PATH, m.mutated)
        assert isinstance(after, FileUnits)
        old_sums = {u.qualname: u.checksum for u in before.units if u.qualname != qualname}
        new_sums = {u.qualname: u.checksum for u in after.units if u.qualname != qualname}
        assert old_sums == new_sums, m.name


def test_each_operator_has_its_kind_of_edit() -> None:
    by_op: dict[str, list[Mutant]] = {}
    for uid in UNITS:
        for m in _all_mutants(PATH, FIXTURE, uid.split("::")[1]):
            by_op.setdefault(m.operator, []).append(m)
    assert set(by_op) == set(OPERATORS)
    window = {m.mutated for m in by_op["slice"] if m.unit == f"{PATH}::window"}
    assert FIXTURE.replace("return xs[:n]", "return xs[n:]") in window
    assert FIXTURE.replace("return xs[:n]", "return xs[:n + 1]") in window
    assert FIXTURE.replace("if n < LIMIT", "if n <= LIMIT") in {m.mutated for m in by_op["compare"]}
    assert FIXTURE.replace("if k is None", "if k is not None") in {m.mutated for m in by_op["compare"]}
    assert FIXTURE.replace("LIMIT = 3", "LIMIT = 4") in {m.mutated for m in by_op["constant"]}
    assert FIXTURE.replace("    size = 2", "    size = 1") in {m.mutated for m in by_op["constant"]}
    assert FIXTURE.replace("pow(a, b)", "pow(b, a)") in {m.mutated for m in by_op["swap"]}
    # Dropping the only statement of a block leaves `pass`.
    emptied = FIXTURE.replace("        n = max(n, 1)\n", "        pass\n")
    assert emptied in {m.mutated for m in by_op["drop"]}
    # The docstring is never the dropped statement.
    assert all('"""Take the first n items."""' in m.mutated for m in by_op["drop"]
               if m.unit == f"{PATH}::window")


def test_slice_variants_on_negative_bounds() -> None:
    src = "def f(x):\n    return x[:-1]\n"
    mutated = {m.mutated for m in _all_mutants("m.py", src, "f")}
    assert "def f(x):\n    return x[1:]\n" in mutated  # x[:-1] <-> x[1:]
    assert "def f(x):\n    return x[-1:]\n" in mutated
    assert "def f(x):\n    return x[:-2]\n" in mutated


def test_own_code_finds_every_unit_of_the_example() -> None:
    for path in sorted(LIBRARY.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        source = path.read_text()
        idx = index_source(rel, source)
        assert isinstance(idx, FileUnits)
        module = cst.parse_module(source)
        quals = [u.qualname for u in idx.units]
        for q in quals:
            if quals.count(q) == 1:
                assert own_code(module, q) is not None, f"{rel}::{q}"


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_changed_units_come_from_fastcis_change_analysis(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text(FIXTURE)
    (root / "README.md").write_text("hello\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "base")
    (root / "pkg" / "mod.py").write_text(FIXTURE.replace("n = max(n, 1)", "n = max(n, 2)")
                                         .replace('"""Take the first n items."""', '"""Take n."""')
                                         .replace("size = 2", "size = 5"))
    (root / "README.md").write_text("bye\n")
    patch = tmp_path / "change.patch"
    patch.write_text(subprocess.run(["git", "-C", str(root), "diff"], capture_output=True,
                                    text=True, check=True).stdout)
    _git(root, "checkout", "-q", "--", ".")
    assert sorted(patch_paths(patch.read_text())) == ["README.md", "pkg/mod.py"]
    problems: list[str] = []
    units = changed_units(root, [patch], ignore=("*.md",), problems=problems)
    assert units == ["pkg/mod.py::Box", "pkg/mod.py::window"]
    assert problems == []
    assert (root / "pkg" / "mod.py").read_text() == FIXTURE  # the root is only read
    # A docstring-only patch changes no unit; a patch that does not apply is reported.
    docs = tmp_path / "docs.patch"
    docs.write_text(patch.read_text().replace("max(n, 2)", "max(n, 1)").replace("size = 5", "size = 2"))
    assert changed_units(root, [docs], ignore=("*.md",)) == []
    broken = tmp_path / "broken.patch"
    broken.write_text(patch.read_text().replace("size = 2", "size = 9"))
    assert changed_units(root, [broken], problems=problems) == []
    assert len(problems) == 1 and "broken.patch" in problems[0]


def test_mutant_applies_as_a_file_and_as_a_diff(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    target = tmp_path / "pkg" / "mod.py"
    target.write_text(FIXTURE)
    mutant = generate({PATH: FIXTURE}, UNITS, count=1, seed=1)[0]
    assert read_sources(tmp_path, [mutant.unit]) == {PATH: FIXTURE}
    (tmp_path / "m.diff").write_text(mutant.diff())
    subprocess.run(["git", "apply", "m.diff"], cwd=tmp_path, check=True, capture_output=True)
    assert target.read_text() == mutant.mutated
    with pytest.raises(Exception, match="differs from the source"):
        mutant.apply(tmp_path)  # already mutated: refuses to write over other content
    target.write_text(FIXTURE)
    mutant.apply(tmp_path)
    assert target.read_text() == mutant.mutated


def test_sample_units_stays_in_the_package_and_is_seeded() -> None:
    executed = ["lib/pkg/a.py::f", "lib/pkg/a.py::g", "lib/pkg/sub/b.py::h", "tests/t.py::test",
                "lib/other.py::x", "lib/pkg/c.py::k"]
    near = ["lib/pkg/a.py::f", "lib/pkg/c.py::k"]
    picked = sample_units(executed, near, count=2, seed=0)
    assert picked == sample_units(executed, near, count=2, seed=0)
    assert set(picked) <= {"lib/pkg/a.py::g", "lib/pkg/sub/b.py::h"} and len(picked) == 2
    assert sample_units(executed, near, count=0, seed=0) == []


def _row(name: str, failing: tuple[str, ...], planned: set[str], kind: str = "bug") -> Outcome:
    missed = tuple(t for t in failing if t not in planned)
    return Outcome(name, kind, len(planned), 4, 1.0, 2.0, failing, missed, 0.1)


def _mutant_row(name: str, failing: tuple[str, ...], planned: set[str]) -> MutantOutcome:
    m = generate({PATH: FIXTURE}, UNITS, count=1, seed=0)[0]
    return MutantOutcome(m, _row(name, failing, planned, m.operator))


def test_exit_code_is_nonzero_on_any_miss() -> None:
    clean = [_row("01_bug", ("//t:a",), {"//t:a", "//t:b"}), _row("02_benign", (), set())]
    mutants = [_mutant_row("mut-a", ("//t:a",), {"//t:a"}), _mutant_row("mut-b", (), set())]
    assert exit_code(clean, mutants) == 0 and miss_lines(clean, mutants) == []
    bad_patch = clean + [_row("03_bug", ("//t:a", "//t:c"), {"//t:a"})]
    assert exit_code(bad_patch, mutants) == 1
    assert miss_lines(bad_patch, mutants) == ["MISSED 03_bug: //t:c"]
    bad_mutant = mutants + [_mutant_row("mut-c", ("//t:d",), {"//t:a"})]
    assert exit_code(clean, bad_mutant) == 1
    assert miss_lines(clean, bad_mutant) == ["MISSED mut-c: //t:d"]


def test_mutation_report_counts_detected_caught_and_missed() -> None:
    rows = [_mutant_row("mut-caught", ("//t:a",), {"//t:a"}),
            _mutant_row("mut-undetected", (), {"//t:a"}),
            _mutant_row("mut-missed", ("//t:a", "//t:b"), {"//t:a"})]
    assert [r.detected for r in rows] == [True, False, True]
    assert [r.caught for r in rows] == [True, False, False]
    lines = mutation_report(rows, seed=0, full=False, baseline=[])
    assert lines[-1].strip().startswith("total: 3 mutants, 2 detected by run-all, 1 caught by the "
                                        "plan, 1 misses (1 failing tests not planned)")
    assert "    MISSED: //t:b" in lines
    assert any("not detected by run-all" in line for line in lines)


def test_a_test_failing_without_the_mutant_detects_nothing() -> None:
    m = generate({PATH: FIXTURE}, UNITS, count=1, seed=0)[0]
    flaky = frozenset({"//t:flaky"})
    only_base = MutantOutcome(m, _row("mut-a", ("//t:flaky",), {"//t:flaky"}), flaky)
    more = MutantOutcome(m, _row("mut-b", ("//t:flaky", "//t:a"), {"//t:flaky", "//t:a"}), flaky)
    assert not only_base.detected and not only_base.caught
    assert more.detected and more.caught and more.detecting == ("//t:a",)
    lines = mutation_report([only_base, more], seed=0, full=False, baseline=sorted(flaky))
    assert "failing //t:flaky" in lines[1]
    assert lines[-1].strip().startswith("total: 2 mutants, 1 detected by run-all, 1 caught")
    # A failing test left out of the plan is still a miss, baseline or not.
    left_out = MutantOutcome(m, _row("mut-c", ("//t:flaky",), set()), flaky)
    assert exit_code([], [left_out]) == 1


def test_bench_main_forwards_options_and_propagates_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 1 if "--miss" in argv else 0

    module = types.ModuleType("bench.fake_bench")
    module.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.fake_bench", module)
    monkeypatch.setattr(bench_main, "MODULES", ["bench.fake_bench"])
    assert bench_main.main(["fake_bench", "--", "--mutants", "3"]) == 0
    assert bench_main.main(["--", "--miss"]) == 1
    assert seen == [["--mutants", "3"], ["--miss"]]
