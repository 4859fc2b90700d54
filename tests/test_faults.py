"""Generated faults (fastci.eval.faults): the operators, the generator, changed units.

Also the selection benchmark's mutation round built on them: its miss logic (no Bazel).
"""

from __future__ import annotations

import ast
import difflib
import itertools
import subprocess
import sys
import types
from pathlib import Path

import libcst as cst
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import __main__ as bench_main
from bench.selection import MutantOutcome, Outcome, exit_code, miss_lines, mutation_report
from fastci.eval.faults import (OPERATORS, Mutant, candidates, changed_units, changed_units_of,
                                generate, materialize, own_code, patch_paths, read_sources,
                                sample_units)
from fastci.eval.fault_ops import ReplaceOne
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


def reduce_loss(err, mask, dist):
    if mask is not None and not mask.all():
        err = err * mask
    dist.all_reduce(err, op=dist.ReduceOp.SUM)
    return err.to(torch.bfloat16).mean()
'''
PATH = "pkg/mod.py"
UNITS = [f"{PATH}::{q}" for q in ("<module>", "window", "outer", "outer.<locals>.inner", "Box",
                                   "Box.grow", "reduce_loss")]


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
    assert FIXTURE.replace("mask is not None and not", "mask is not None or not") \
        in {m.mutated for m in by_op["boolean"]}
    reductions = {m.mutated for m in by_op["reduction"]}
    assert FIXTURE.replace("ReduceOp.SUM", "ReduceOp.AVG") in reductions
    assert FIXTURE.replace(").mean()", ").sum()") in reductions
    assert FIXTURE.replace("torch.bfloat16", "torch.float16") in {m.mutated for m in by_op["dtype"]}


def test_slice_variants_on_negative_bounds() -> None:
    src = "def f(x):\n    return x[:-1]\n"
    mutated = {m.mutated for m in _all_mutants("m.py", src, "f")}
    assert "def f(x):\n    return x[1:]\n" in mutated  # x[:-1] <-> x[1:]
    assert "def f(x):\n    return x[-1:]\n" in mutated
    assert "def f(x):\n    return x[:-2]\n" in mutated


# ------------------------------------------------------------------ boolean, reduction, dtype


def _mutated(source: str, qualname: str, operator: str) -> list[str]:
    """Every mutant of one operator in one unit, checked valid, in source order."""
    original = ast.dump(ast.parse(source))
    out: list[str] = []
    for c in candidates("m.py", source, qualname):
        if c.operator != operator:
            continue
        m = materialize(c)
        assert m is not None, c.description  # every site of these operators makes a mutant
        tree = ast.parse(m.mutated)
        compile(tree, "m.py", "exec")
        assert ast.dump(tree) != original, m.name
        out.append(m.mutated)
    return out


LOSS = """\
def mse(pred, target, weight=None):
    err = (pred - target) ** 2
    if weight is not None:
        err = err * weight
    return err.mean()


def nll(logits, target):
    return F.cross_entropy(logits.float(), target, reduction="mean")
"""


def test_reduction_swaps_a_loss_mean_for_a_sum() -> None:
    assert _mutated(LOSS, "mse", "reduction") == [LOSS.replace("err.mean()", "err.sum()")]
    assert _mutated(LOSS, "nll", "reduction") == [
        LOSS.replace('reduction="mean"', 'reduction="sum"')]


def test_reduction_swaps_the_all_reduce_op() -> None:
    src = """\
def sync_grads(params, world):
    for p in params:
        dist.all_reduce(p.grad, op=ReduceOp.SUM)
        dist.all_reduce(p.norm, op=dist.ReduceOp.MAX, group=None)
        p.grad /= world
"""
    assert _mutated(src, "sync_grads", "reduction") == [
        src.replace("ReduceOp.SUM", "ReduceOp.AVG"),
        src.replace("dist.ReduceOp.MAX", "dist.ReduceOp.MIN"),
    ]


def test_reduction_calls_methods_functions_and_builtins() -> None:
    src = """\
def stats(x, xs, a, b):
    top = torch.amax(x, dim=-1).argmax()
    s = np.nansum(x) + sum(xs) + max(a, b)
    return x.float().all(), scatter(x, reduce="amax")
"""
    assert _mutated(src, "stats", "reduction") == [
        src.replace("torch.amax(x, dim=-1).argmax()", "torch.amax(x, dim=-1).argmin()"),
        src.replace("torch.amax(", "torch.amin("),
        src.replace("np.nansum", "np.nanmean"),
        src.replace("max(a, b)", "min(a, b)"),  # a bare builtin: only max/min, all/any
        src.replace(".all()", ".any()"),
        src.replace('reduce="amax"', 'reduce="amin"'),
    ]


def test_dtype_swaps_attributes_and_dtype_keywords() -> None:
    src = """\
def cast(x, n, model):
    h = x.to(torch.bfloat16)
    idx = torch.arange(n, dtype=torch.long)
    mp = MixedPrecision(param_dtype="bf16", reduce_dtype='float32', name="fp16")
    return h.float(), model.long, np.zeros(n, dtype=np.int64), cfg(dtype="fp16")
"""
    assert _mutated(src, "cast", "dtype") == [
        src.replace("torch.bfloat16", "torch.float16"),
        src.replace("torch.long", "torch.int"),
        src.replace('param_dtype="bf16"', 'param_dtype="fp16"'),
        src.replace("reduce_dtype='float32'", "reduce_dtype='float16'"),
        src.replace("np.int64", "np.int32"),
        src.replace('cfg(dtype="fp16")', 'cfg(dtype="fp32")'),
    ]
    # `model.long` is not torch's, `name=` holds no dtype, `.float()` is a method: no sites.
    # Nor bytes, f-strings or dtype names that are not a keyword's value.
    other = 'f(dtype=b"bf16", param_dtype=f"bf16", x="fp32")\n'
    assert not [c for c in candidates("m.py", other, "<module>") if c.operator == "dtype"]


def test_boolean_flips_and_or_drops_not_and_flips_literals() -> None:
    src = """\
def step(a, b, c):
    if a and not b:
        return True
    return a and b and c
"""
    assert _mutated(src, "step", "boolean") == [
        src.replace("if a and not b:", "if a or not b:"),
        src.replace("if a and not b:", "if a and b:"),
        src.replace("return True", "return False"),
        src.replace("return a and b and c", "return a and b or c"),
        # An operand of `and` turned `or` is parenthesized: (a or b) and c, not a or (b and c).
        src.replace("return a and b and c", "return (a or b) and c"),
    ]
    assert _mutated("x = not (a or b)\n", "<module>", "boolean") == [
        "x = (a or b)\n", "x = not (a and b)\n"]  # source order: the outer site first


def test_new_operators_leave_nested_defs_and_annotations_alone() -> None:
    src = """\
def outer(x: torch.float32, flag=True) -> torch.bfloat16:
    def inner(y):
        return y.sum() and not y.to(torch.bfloat16).all()
    class Cfg:
        dtype = "bf16"
        ok = True
    from torch import float32
    return inner(x).mean()
"""
    operators = ("boolean", "reduction", "dtype")
    assert _mutated(src, "outer", "reduction") == [src.replace(").mean()", ").sum()")]
    assert _mutated(src, "outer", "boolean") == _mutated(src, "outer", "dtype") == []
    mutated = {m.mutated for m in generate({"m.py": src}, ["m.py::outer"], count=20, seed=0)}
    for text in mutated:
        assert "        return y.sum() and not y.to(torch.bfloat16).all()" in text
        assert '        dtype = "bf16"\n        ok = True\n' in text
    # The nested units have sites of their own.
    inner = [c.operator for c in candidates("m.py", src, "outer.<locals>.inner")]
    assert set(operators) <= set(inner)


def test_every_operator_is_drawn_seeded_and_reproducibly() -> None:
    src = """\
def train_step(model, batch, world, n):
    if model.training and not batch.empty and n > 1:
        logits = model(batch.x[:n]).to(torch.bfloat16)
        loss = F.cross_entropy(logits, batch.y, reduction="mean")
        dist.all_reduce(loss, op=ReduceOp.SUM)
        return pow(loss, 2) / world
    return None
"""
    units = ["m.py::train_step"]
    draws = []
    for seed in range(4):
        first = generate({"m.py": src}, units, count=len(OPERATORS), seed=seed)
        assert [(m.name, m.mutated) for m in first] == [
            (m.name, m.mutated) for m in generate({"m.py": src}, units, count=len(OPERATORS),
                                                  seed=seed)]
        assert sorted(m.operator for m in first) == sorted(OPERATORS)  # one per operator
        draws.append([m.name for m in first])
    assert len({tuple(d) for d in draws}) > 1


def test_descriptions_show_the_edit_even_in_long_lines() -> None:
    src = "ok = manifest.get('iteration') != iteration or not shards or len(shards) != world\n"
    descriptions = [c.description for c in candidates("m.py", src, "<module>")
                    if c.operator == "boolean"]
    assert descriptions[0].startswith("or -> and: `")
    # The two ends of the changed part: the new parenthesis and the flipped operator.
    old, new = descriptions[0].split("` -> `")
    assert old.endswith("not shards or...") and new.startswith("(manifest") \
        and new.endswith("not shards) and...`"), descriptions[0]
    assert all(len(d) < 120 for d in descriptions)


def test_to_dict_is_what_a_results_file_records() -> None:
    m = generate({"m.py": LOSS}, ["m.py::mse"], count=1, seed=0)[0]
    d = m.to_dict()
    assert d == {"name": m.name, "operator": m.operator, "unit": "m.py::mse", "path": "m.py",
                 "line": m.line, "description": m.description}
    assert set(d) == {"name", "operator", "unit", "path", "line", "description"}


# --------------------------------------------------------------------------- property

_SIMPLE = [
    "err = (pred - target) ** 2",
    "loss = err.mean()",
    "total = torch.sum(x, dim=-1)",
    "dist.all_reduce(t, op=dist.ReduceOp.SUM)",
    "h = x.to(torch.bfloat16)",
    "y = torch.zeros(n, dtype=torch.long)",
    'cfg = dict(param_dtype="bf16", reduction="mean", strict=True)',
    "head = xs[:n]",
    "tail = xs[-k:]",
    "z = pow(a, b)",
    "ok = a and not b or c",
    "flag = max(a, b) >= min(c, 0)",
    "out.append(x[1:n - 1])",
    "assert k in out, (a, b)",
    "n -= 1",
]
_HEADERS = ["if a and not b:", "for i in range(n):", "while x is not None and k < 3:",
            "def inner(v):", "with ctx(a, b):"]


@st.composite
def _functions(draw: st.DrawFn) -> str:
    lines = ["def f(pred, target, x, xs, n, k, a, b, c, t, out, ctx):"]
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            lines.append("    " + draw(st.sampled_from(_HEADERS)))
            body = draw(st.lists(st.sampled_from(_SIMPLE), min_size=1, max_size=3))
            lines += ["        " + s for s in body]
        else:
            lines.append("    " + draw(st.sampled_from(_SIMPLE)))
    if draw(st.booleans()):
        lines.append("    return out and x.float().amax()")
    return "\n".join(lines) + "\n"


@settings(max_examples=40, deadline=None, database=None)
@given(_functions(), st.integers(0, 3))
def test_every_candidate_of_generated_functions_is_a_valid_distinct_mutant(src: str,
                                                                          seed: int) -> None:
    original = ast.dump(ast.parse(src))
    before = index_source("m.py", src)
    assert isinstance(before, FileUnits)
    nested = {u.qualname: u.checksum for u in before.units if u.qualname != "f"}
    for c in candidates("m.py", src, "f"):
        m = materialize(c)
        assert m is not None, (c.description, src)
        tree = ast.parse(m.mutated)
        compile(tree, "m.py", "exec")
        assert ast.dump(tree) != original, m.name
        after = index_source("m.py", m.mutated)
        assert isinstance(after, FileUnits)
        assert {u.qualname: u.checksum for u in after.units if u.qualname != "f"} == nested
    again = [m.mutated for m in generate({"m.py": src}, ["m.py::f"], count=6, seed=seed)]
    assert again == [m.mutated for m in generate({"m.py": src}, ["m.py::f"], count=6, seed=seed)]


def _truth(node: cst.BaseExpression, env: dict[str, bool]) -> bool:
    """What a libcst tree of and/or/not over names means (its structure, not its text)."""
    if isinstance(node, cst.Name):
        return {"True": True, "False": False}.get(node.value, env.get(node.value, False))
    if isinstance(node, cst.UnaryOperation):
        return not _truth(node.expression, env)
    assert isinstance(node, cst.BooleanOperation)
    left, right = _truth(node.left, env), _truth(node.right, env)
    return (left and right) if isinstance(node.operator, cst.And) else (left or right)


_LEAVES = st.sampled_from([ast.Name("a"), ast.Name("b"), ast.Name("c"), ast.Constant(True)])
_BOOL_EXPRS = st.recursive(_LEAVES, lambda inner: st.one_of(
    inner.map(lambda e: ast.UnaryOp(ast.Not(), e)),
    st.tuples(st.sampled_from([ast.And, ast.Or]), st.lists(inner, min_size=2, max_size=3))
    .map(lambda t: ast.BoolOp(t[0](), t[1]))), max_leaves=7)


@settings(max_examples=150, deadline=None, database=None)
@given(_BOOL_EXPRS)
def test_boolean_mutants_mean_what_their_tree_says(expr: ast.expr) -> None:
    """The printed mutant parses back to the edited tree: parentheses are never lost."""
    src = f"x = {ast.unparse(expr)}\n"
    envs = [dict(zip("abc", bits)) for bits in itertools.product([False, True], repeat=3)]
    for c in candidates("m.py", src, "<module>"):
        if c.operator != "boolean":
            continue
        m = materialize(c)
        assert m is not None, (src, c.description)
        tree = c.tree.visit(ReplaceOne(c.target, c.replacement))
        stmt = tree.body[0]
        assert isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)
        for env in envs:
            scope: dict[str, object] = dict(env)
            exec(m.mutated, {}, scope)
            assert scope["x"] == _truth(stmt.body[0].value, env), (src, m.mutated, env)


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


def test_changed_units_of_sources() -> None:
    new = FIXTURE.replace("n = max(n, 1)", "n = max(n, 2)").replace("return c[1:] == a",
                                                                    "return c[2:] == a")
    added = "def g():\n    return 1\n"
    sources: dict[str, tuple[bytes | None, bytes | None]] = {
        PATH: (FIXTURE.encode(), (new + "\n\n" + added).encode()),  # g is added: skipped
        "pkg/new.py": (None, added.encode()),  # an added file: skipped
        "pkg/gone.py": (added.encode(), None),  # a deleted file: its units are deleted
        "pkg/vendored/x.py": (added.encode(), added.replace("1", "2").encode()),
        "README.md": (b"a", b"b"),
        "pkg/broken.py": (added.encode(), b"def g(:\n"),  # does not parse: skipped
    }
    assert changed_units_of(sources, ignore=("pkg/vendored/**",)) == [
        "pkg/mod.py::outer.<locals>.inner", "pkg/mod.py::window"]
    assert changed_units_of(sources) == [
        "pkg/mod.py::outer.<locals>.inner", "pkg/mod.py::window", "pkg/vendored/x.py::g"]


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
