"""Seeded mutants of the units the benchmark's changes touch (the selection benchmark's mutation round).

The patches in ``bench/changes/`` are bugs someone thought of; mutants are bugs nobody
picked. :func:`changed_units` applies each patch to copies of its files and asks FastCI's
own change analysis (:func:`fastci.changes.semantic_diff.diff_sources`) which units it changes;
:func:`generate` then makes single-site edits of those units with libcst:

- ``slice``: move a bound (``x[:n]`` <-> ``x[n:]``, ``x[:-k]`` <-> ``x[k:]``), drop one of two
  bounds, or shift a bound by one;
- ``compare``: flip a comparison (``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``,
  ``is`` <-> ``is not``, ``in`` <-> ``not in``);
- ``constant``: an integer literal ``n`` -> ``n + 1`` or ``n - 1`` (never below 0);
- ``drop``: remove one simple statement line (an emptied block becomes ``pass``);
- ``swap``: swap two adjacent positional arguments of a call.

Edits stay inside the unit's own code (a function's body, a class's or module's own
statements; nested defs are other units and are never touched), every mutant compiles,
and its ``ast.dump`` differs from the original's. The choice is reproducible per seed:
candidates are enumerated in source order and drawn with ``random.Random(seed)``,
operators round-robin so that each is represented once ``count`` reaches their number.
"""

from __future__ import annotations

import ast
import difflib
import random
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Mapping, Sequence, Union

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from fastci.changes.semantic_diff import ChangeKind, diff_sources
from fastci.config import first_match
from fastci.errors import FastCIError
from fastci.types import RelPath, UnitId
from fastci.units.index import MODULE_QUALNAME, split_unit_id, unit_id

#: The operators, in the order a report lists them.
OPERATORS = ("slice", "compare", "constant", "drop", "swap")

_Replacement = Union[cst.CSTNode, cst.RemovalSentinel]


@dataclass(frozen=True)
class Mutant:
    """One single-site edit of one unit."""

    name: str  # mut-<operator>-<file stem>.<qualname>-<site number>
    operator: str
    unit: UnitId
    path: RelPath
    line: int
    description: str  # `old` -> `new`
    original: str  # the file's source before and after the edit
    mutated: str

    def diff(self) -> str:
        """The edit as a unified diff (``git apply`` format, paths relative to the root)."""
        return "".join(difflib.unified_diff(
            self.original.splitlines(keepends=True), self.mutated.splitlines(keepends=True),
            f"a/{self.path}", f"b/{self.path}"))

    def apply(self, root: Path) -> None:
        """Write the mutated file under ``root``; refuse if the file is not the original."""
        target = root / self.path
        if target.read_text() != self.original:
            raise FastCIError(f"{self.name}: {self.path} differs from the source it was made from")
        target.write_text(self.mutated)


@dataclass(frozen=True)
class _Candidate:
    operator: str
    path: RelPath
    qualname: str
    index: int  # 1-based number among this unit's sites of this operator
    line: int
    description: str
    target: cst.CSTNode  # a node of ``tree`` (edits match nodes by identity)
    replacement: _Replacement
    tree: cst.Module


# --------------------------------------------------------------------------- changed units


def patch_paths(patch_text: str) -> list[RelPath]:
    """The repo-relative paths a unified diff touches (old and new sides, ``/dev/null`` aside)."""
    out: list[RelPath] = []
    for line in patch_text.splitlines():
        if line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t", 1)[0].strip()
            if name != "/dev/null":
                rel = name[2:] if name.startswith(("a/", "b/")) else name
                if rel not in out:
                    out.append(rel)
    return out


def patched_sources(root: Path, patch: Path) -> dict[RelPath, tuple[bytes | None, bytes | None]]:
    """Apply ``patch`` to copies of its files from ``root``: path -> (before, after).

    ``root`` is only read; the patch is applied with ``git apply`` in a scratch directory.
    """
    paths = patch_paths(patch.read_text())
    with tempfile.TemporaryDirectory(prefix="fastci-mutations-") as tmp:
        scratch = Path(tmp)
        # A repository of its own, so git never resolves paths against an enclosing one.
        subprocess.run(["git", "init", "-q", str(scratch)], check=True, capture_output=True)
        before: dict[RelPath, bytes | None] = {}
        for rel in paths:
            src = root / rel
            before[rel] = src.read_bytes() if src.is_file() else None
            if src.is_file():
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, scratch / rel)
        res = subprocess.run(["git", "apply", "--recount", str(patch.resolve())], cwd=scratch,
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise FastCIError(f"{patch.name} does not apply to {root}: "
                              + (res.stderr.strip().splitlines() or ["?"])[0])
        return {rel: (before[rel], (scratch / rel).read_bytes() if (scratch / rel).is_file()
                      else None) for rel in paths}


def changed_units(root: Path, patches: Iterable[Path], *, ignore: tuple[str, ...] = (),
                  problems: list[str] | None = None) -> list[UnitId]:
    """Units of ``root``'s Python files that ``patches`` change, by FastCI's change analysis.

    Files matching ``ignore`` (the config's never-affects-a-test globs) are skipped, and so
    are units the patch adds or deletes (nothing of them to mutate in ``root``). A patch that
    does not apply is skipped and named in ``problems``. Sorted, no duplicates.
    """
    out: set[UnitId] = set()
    for patch in patches:
        try:
            sources = patched_sources(root, patch)
        except FastCIError as exc:
            if problems is not None:
                problems.append(str(exc))
            continue
        for rel, (old, new) in sources.items():
            if not rel.endswith(".py") or old is None or first_match(rel, ignore):
                continue
            diff = diff_sources(rel, old, new, quick=False)
            if diff.failure:
                continue
            out.update(unit_id(rel, c.qualname) for c in diff.units
                       if ChangeKind.DELETED not in c.kinds and ChangeKind.ADDED not in c.kinds)
    return sorted(out)


# --------------------------------------------------------------------------- finding a unit's code


def _defs(stmts: Sequence[cst.CSTNode], prefix: str,
          out: dict[str, list[cst.FunctionDef | cst.ClassDef]]) -> None:
    """def/class nodes by ``co_qualname`` (``C.m``, ``f.<locals>.g``)."""
    for stmt in stmts:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            qual = prefix + stmt.name.value
            out.setdefault(qual, []).append(stmt)
            inner = ".<locals>." if isinstance(stmt, cst.FunctionDef) else "."
            _defs(list(stmt.body.body), qual + inner, out)
        elif isinstance(stmt, (cst.BaseCompoundStatement, cst.ExceptHandler, cst.ExceptStarHandler,
                               cst.Else, cst.Finally, cst.MatchCase)):
            for child in stmt.children:
                if isinstance(child, cst.BaseSuite):
                    _defs(list(child.body), prefix, out)
                elif isinstance(child, (cst.BaseCompoundStatement, cst.ExceptHandler,
                                        cst.ExceptStarHandler, cst.Else, cst.Finally,
                                        cst.MatchCase)):
                    _defs([child], prefix, out)


def own_code(module: cst.Module, qualname: str) -> list[cst.CSTNode] | None:
    """The nodes holding a unit's own code (None: no such unit, or its qualname is ambiguous).

    A function's or class's body block (nested defs inside it are skipped by the site
    visitor), or a module's top-level statements.
    """
    if qualname == MODULE_QUALNAME:
        return list(module.body)
    found: dict[str, list[cst.FunctionDef | cst.ClassDef]] = {}
    _defs(list(module.body), "", found)
    nodes = found.get(qualname, [])
    return [nodes[0].body] if len(nodes) == 1 else None


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


# --------------------------------------------------------------------------- the operators


def _int_node(value: int) -> cst.BaseExpression:
    if value < 0:
        return cst.UnaryOperation(cst.Minus(), cst.Integer(str(-value)))
    return cst.Integer(str(value))


def _literal_int(node: cst.BaseExpression | None) -> int | None:
    """The value of ``n`` or ``-n`` written as a literal, else None."""
    if isinstance(node, cst.Integer) and not node.lpar:
        return int(node.value.replace("_", ""), 0)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) \
            and isinstance(node.expression, cst.Integer) and not node.lpar:
        return -int(node.expression.value.replace("_", ""), 0)
    return None


def _shift(node: cst.BaseExpression, delta: int) -> cst.BaseExpression:
    """``node`` plus ``delta`` (folded into a literal; otherwise ``(node) + 1``)."""
    value = _literal_int(node)
    if value is not None:
        return _int_node(value + delta)
    atom = isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or bool(node.lpar)
    left = node if atom else node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    op: cst.BaseBinaryOp = cst.Add() if delta > 0 else cst.Subtract()
    return cst.BinaryOperation(left, op, cst.Integer(str(abs(delta))))


def _slice_variants(node: cst.Slice) -> list[tuple[str, cst.Slice]]:
    lo, hi = node.lower, node.upper
    out: list[tuple[str, cst.Slice]] = []
    if hi is not None and lo is None:
        out.append(("move the upper bound to the lower", node.with_changes(lower=hi, upper=None)))
        k = _literal_int(hi)
        if k is not None and k < 0:
            out.append(("mirror the bound", node.with_changes(lower=_int_node(-k), upper=None)))
    if lo is not None and hi is None:
        out.append(("move the lower bound to the upper", node.with_changes(lower=None, upper=lo)))
        k = _literal_int(lo)
        if k is not None and k > 0:
            out.append(("mirror the bound", node.with_changes(lower=None, upper=_int_node(-k))))
    if lo is not None and hi is not None:
        out.append(("drop the lower bound", node.with_changes(lower=None)))
        out.append(("drop the upper bound", node.with_changes(upper=None)))
    for field, bound in (("lower", lo), ("upper", hi)):
        if bound is not None:
            for delta in (1, -1):
                out.append((f"{field} bound {delta:+d}",
                            node.with_changes(**{field: _shift(bound, delta)})))
    return out


_FLIPS: dict[type[cst.BaseCompOp], Callable[[], cst.BaseCompOp]] = {
    cst.LessThan: cst.LessThanEqual, cst.LessThanEqual: cst.LessThan,
    cst.GreaterThan: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.GreaterThan,
    cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal,
    cst.Is: cst.IsNot, cst.IsNot: cst.Is, cst.In: cst.NotIn, cst.NotIn: cst.In,
}


class _Sites(cst.CSTVisitor):
    """Collect (operator, node, variants) inside one unit's own code."""

    def __init__(self, docstring: cst.CSTNode | None) -> None:
        self.docstring = docstring
        self.sites: list[tuple[str, cst.CSTNode, list[tuple[str, _Replacement]]]] = []

    # Other units (nested defs and classes) and annotations are not this unit's behaviour.
    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Annotation(self, node: cst.Annotation) -> bool:
        return False

    def visit_Slice(self, node: cst.Slice) -> None:
        self.sites.append(("slice", node, list(_slice_variants(node))))

    def visit_ComparisonTarget(self, node: cst.ComparisonTarget) -> None:
        flip = _FLIPS.get(type(node.operator))
        if flip is not None:
            new = node.with_changes(operator=flip())
            self.sites.append(("compare", node, [("flip", new)]))

    def visit_Integer(self, node: cst.Integer) -> None:
        value = int(node.value.replace("_", ""), 0)
        variants: list[tuple[str, _Replacement]] = [("+1", node.with_changes(value=str(value + 1)))]
        if value > 0:
            variants.append(("-1", node.with_changes(value=str(value - 1))))
        self.sites.append(("constant", node, variants))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        inert = all(isinstance(s, cst.Pass) or (isinstance(s, cst.Expr)
                    and isinstance(s.value, cst.Ellipsis)) for s in node.body)
        if node is not self.docstring and not inert:
            self.sites.append(("drop", node, [("drop", cst.RemovalSentinel.REMOVE)]))

    def visit_Call(self, node: cst.Call) -> None:
        args = list(node.args)
        variants: list[tuple[str, _Replacement]] = []
        for i in range(len(args) - 1):
            a, b = args[i], args[i + 1]
            if a.keyword is None and b.keyword is None and not a.star and not b.star \
                    and not a.value.deep_equals(b.value):
                swapped = list(args)
                swapped[i], swapped[i + 1] = a.with_changes(value=b.value), b.with_changes(value=a.value)
                variants.append((f"arguments {i + 1} and {i + 2}", node.with_changes(args=swapped)))
        if variants:
            self.sites.append(("swap", node, variants))


class _Replace(cst.CSTTransformer):
    """Replace (or remove) exactly one node; an emptied block gets ``pass``."""

    def __init__(self, target: cst.CSTNode, replacement: _Replacement) -> None:
        super().__init__()
        self.target, self.replacement = target, replacement

    def on_leave(self, original_node: cst.CSTNode,  # type: ignore[override]
                 updated_node: cst.CSTNode) -> _Replacement:
        if original_node is self.target:
            return self.replacement
        if isinstance(updated_node, cst.IndentedBlock) and not updated_node.body:
            return updated_node.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated_node


def _snippet(module: cst.Module, node: _Replacement) -> str:
    if isinstance(node, cst.RemovalSentinel):
        return "(removed)"
    text = " ".join(module.code_for_node(node).split())
    return text if len(text) <= 48 else text[:45] + "..."


def candidates(path: RelPath, source: str, qualname: str) -> list[_Candidate]:
    """Every single-site edit of unit ``path::qualname`` in ``source``, in source order."""
    module = cst.parse_module(source)
    roots = own_code(module, qualname)
    if roots is None:
        return []
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions: Mapping[cst.CSTNode, CodeRange] = wrapper.resolve(PositionProvider)
    first = roots[0].body[0] if isinstance(roots[0], cst.IndentedBlock) and roots[0].body \
        else roots[0] if qualname == MODULE_QUALNAME else None
    visitor = _Sites(first if first is not None and _is_docstring(first) else None)
    for root in roots:
        root.visit(visitor)
    out: list[_Candidate] = []
    counts: dict[str, int] = {}
    for operator, node, variants in visitor.sites:
        for label, new in variants:
            counts[operator] = counts.get(operator, 0) + 1
            text = f"{label}: `{_snippet(module, node)}` -> `{_snippet(module, new)}`"
            out.append(_Candidate(operator, path, qualname, counts[operator],
                                  positions[node].start.line, text, node, new, module))
    return out


def _short(path: RelPath, qualname: str) -> str:
    stem = Path(path).stem
    return stem if qualname == MODULE_QUALNAME else f"{stem}.{qualname.replace('.<locals>.', '.')}"


def materialize(candidate: _Candidate) -> Mutant | None:
    """The mutant of one candidate, or None when it does not compile or changes no AST."""
    source = candidate.tree.code
    mutated = candidate.tree.visit(_Replace(candidate.target, candidate.replacement)).code
    try:
        new_ast = ast.parse(mutated)
        compile(new_ast, candidate.path, "exec")
    except (SyntaxError, ValueError):
        return None
    if ast.dump(new_ast) == ast.dump(ast.parse(source)):
        return None
    return Mutant(f"mut-{candidate.operator}-{_short(candidate.path, candidate.qualname)}-"
                  f"{candidate.index}", candidate.operator,
                  unit_id(candidate.path, candidate.qualname), candidate.path, candidate.line,
                  candidate.description, source, mutated)


def generate(sources: Mapping[RelPath, str], units: Iterable[UnitId], *, count: int,
             seed: int) -> list[Mutant]:
    """Draw ``count`` distinct mutants of ``units`` (``sources``: path -> text), seeded.

    Operators take turns in a seeded order, so any ``count >= len(OPERATORS)`` has each
    operator at least once (where the units offer a site for it); within an operator the
    least-used unit goes first, so mutants spread over the units.
    """
    pools: dict[str, list[_Candidate]] = {op: [] for op in OPERATORS}
    for uid in sorted(set(units)):
        path, qual = split_unit_id(uid)
        if path in sources:
            for c in candidates(path, sources[path], qual):
                pools[c.operator].append(c)
    rng = random.Random(seed)
    for op in OPERATORS:
        rng.shuffle(pools[op])
    order = list(OPERATORS)
    rng.shuffle(order)
    used: dict[UnitId, int] = {}
    seen: set[tuple[RelPath, str]] = set()
    out: list[Mutant] = []
    while len(out) < count and any(pools.values()):
        for op in order:
            pool = pools[op]
            while pool and len(out) < count:
                pick = min(range(len(pool)),
                           key=lambda j: used.get(unit_id(pool[j].path, pool[j].qualname), 0))
                mutant = materialize(pool.pop(pick))
                if mutant is not None and (mutant.path, mutant.mutated) not in seen:
                    seen.add((mutant.path, mutant.mutated))
                    used[mutant.unit] = used.get(mutant.unit, 0) + 1
                    out.append(mutant)
                    break
    return out


def read_sources(root: Path, units: Iterable[UnitId]) -> dict[RelPath, str]:
    """The text of each file that holds one of ``units``, read from ``root``."""
    paths = sorted({split_unit_id(u)[0] for u in units})
    return {p: (root / p).read_text() for p in paths if (root / p).is_file()}


def sample_units(executed: Iterable[UnitId], near: Iterable[UnitId], *, count: int,
                 seed: int) -> list[UnitId]:
    """A seeded sample of ``count`` executed units in the package of ``near``, not in it.

    "The package" is the deepest directory holding every file of ``near`` (for changes of
    one framework, its source tree); units elsewhere (tests, FastCI itself) are left out.
    """
    near = sorted(set(near))
    if count <= 0 or not near:
        return []
    dirs = [PurePosixPath(split_unit_id(u)[0]).parent.parts for u in near]
    common: list[str] = []
    for parts in zip(*dirs):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    prefix = "/".join(common) + "/" if common else ""
    pool = sorted(u for u in set(executed) - set(near)
                  if split_unit_id(u)[0].startswith(prefix) and split_unit_id(u)[0].endswith(".py"))
    return sorted(random.Random(seed).sample(pool, min(count, len(pool))))
