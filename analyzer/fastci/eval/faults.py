"""Generated faults: seeded single-site mutants of the units a change touches.

Hand-written changes are bugs someone thought of; generated faults are bugs nobody
picked. :func:`changed_units_of` asks FastCI's own change analysis
(:func:`fastci.changes.semantic_diff.diff_sources`) which units a change touches
(:func:`changed_units` does it for patch files applied to a checkout); :func:`generate`
then makes single-site edits of those units with libcst (operators in
:mod:`fastci.eval.fault_ops`):

- ``slice``: move a bound (``x[:n]`` <-> ``x[n:]``, ``x[:-k]`` <-> ``x[k:]``), drop one of two
  bounds, or shift a bound by one;
- ``compare``: flip a comparison (``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``,
  ``is`` <-> ``is not``, ``in`` <-> ``not in``);
- ``constant``: an integer literal ``n`` -> ``n + 1`` or ``n - 1`` (never below 0);
- ``drop``: remove one simple statement line (an emptied block becomes ``pass``);
- ``swap``: swap two adjacent positional arguments of a call;
- ``boolean``: ``and`` <-> ``or`` (parenthesized where an operand of ``and`` becomes an
  ``or``), drop a ``not`` (``not x`` -> ``x``), ``True`` <-> ``False``;
- ``reduction``: the wrong reduction. A called method or module function named ``sum`` <->
  ``mean``, ``max`` <-> ``min``, ``amax`` <-> ``amin``, ``all`` <-> ``any``, ``nansum`` <->
  ``nanmean``, ``argmax`` <-> ``argmin`` (``loss.mean()`` -> ``loss.sum()``,
  ``torch.amax(x)`` -> ``torch.amin(x)``; a bare builtin only within ``max``/``min`` and
  ``all``/``any``); a ``reduction=``/``reduce=``/``reduce_op=`` keyword's string ``"mean"``
  <-> ``"sum"`` (also ``"max"``/``"min"``, ``"amax"``/``"amin"``); an attribute of
  ``ReduceOp`` ``SUM`` <-> ``AVG``, ``MAX`` <-> ``MIN`` (``dist.ReduceOp.SUM`` ->
  ``dist.ReduceOp.AVG``);
- ``dtype``: the wrong dtype. An attribute ``float32`` <-> ``float16``, ``bfloat16`` ->
  ``float16``, ``float64`` -> ``float32``, ``int64`` <-> ``int32`` on anything
  (``torch.bfloat16`` -> ``torch.float16``, ``np.int64`` -> ``np.int32``), ``torch.long`` ->
  ``torch.int``; the same names as the string value of a keyword whose name holds
  ``dtype``, and their short forms ``"fp32"`` <-> ``"fp16"``, ``"bf16"`` -> ``"fp16"``
  (``param_dtype="bf16"`` -> ``param_dtype="fp16"``).

Edits stay inside the unit's own code (a function's body, a class's or module's own
statements; nested defs are other units and are never touched; nor are annotations and
imports), every mutant compiles, and its ``ast.dump`` differs from the original's. The
choice is reproducible per seed: candidates are enumerated in source order and drawn with
``random.Random(seed)``, operators round-robin so that each is represented once ``count``
reaches their number.
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
from typing import Iterable, Mapping, Sequence

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from fastci.changes.semantic_diff import ChangeKind, diff_sources
from fastci.config import first_match
from fastci.errors import FastCIError
from fastci.eval.fault_ops import OPERATORS, Replacement, ReplaceOne, SiteFinder, describe
from fastci.types import RelPath, UnitId
from fastci.units.index import MODULE_QUALNAME, split_unit_id, unit_id

__all__ = ["OPERATORS", "Mutant", "candidates", "changed_units", "changed_units_of", "generate",
           "materialize", "own_code", "patch_paths", "patched_sources", "read_sources",
           "sample_units"]


@dataclass(frozen=True)
class Mutant:
    """One single-site edit of one unit.

    Attributes:
        name: ``mut-<operator>-<file stem>.<qualname>-<site number>``, unique per unit and
            operator.
        operator: one of :data:`OPERATORS`.
        unit: the edited unit.
        path: its file, relative to the root.
        line: the edited line of the original file (1-based).
        description: ``label: `old` -> `new```.
        original: the file's source before the edit.
        mutated: the file's source after it.
    """

    name: str
    operator: str
    unit: UnitId
    path: RelPath
    line: int
    description: str
    original: str
    mutated: str

    def diff(self) -> str:
        """The edit as a unified diff (``git apply`` format, paths relative to the root)."""
        return "".join(difflib.unified_diff(
            self.original.splitlines(keepends=True), self.mutated.splitlines(keepends=True),
            f"a/{self.path}", f"b/{self.path}"))

    def apply(self, root: Path) -> None:
        """Write the mutated file under ``root``.

        Raises:
            FastCIError: the file under ``root`` is not the source the mutant was made from.
        """
        target = root / self.path
        if target.read_text() != self.original:
            raise FastCIError(f"{self.name}: {self.path} differs from the source it was made from")
        target.write_text(self.mutated)

    def to_dict(self) -> dict[str, str | int]:
        """What a results file records of the mutant (the sources are left out)."""
        return {"name": self.name, "operator": self.operator, "unit": self.unit,
                "path": self.path, "line": self.line, "description": self.description}


@dataclass(frozen=True)
class _Candidate:
    operator: str
    path: RelPath
    qualname: str
    index: int  # 1-based number among this unit's sites of this operator
    line: int
    description: str
    target: cst.CSTNode  # a node of ``tree`` (edits match nodes by identity)
    replacement: Replacement
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

    Raises:
        FastCIError: the patch does not apply.
    """
    paths = patch_paths(patch.read_text())
    with tempfile.TemporaryDirectory(prefix="fastci-faults-") as tmp:
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


def changed_units_of(sources: Mapping[RelPath, tuple[bytes | None, bytes | None]], *,
                     ignore: tuple[str, ...] = ()) -> list[UnitId]:
    """The units that changed between before and after sources, by FastCI's change analysis.

    Only units that exist on both sides count (nothing of an added unit to mutate before
    the change, nothing of a deleted one after it).

    Args:
        sources: path -> (before, after); None for a side where the file does not exist.
            Files that are not ``.py``, added files and files that do not parse are skipped.
        ignore: globs of files to skip (the config's never-affects-a-test globs).

    Returns:
        The changed units' ids, sorted, no duplicates.
    """
    out: set[UnitId] = set()
    for rel, (old, new) in sources.items():
        if not rel.endswith(".py") or old is None or first_match(rel, ignore):
            continue
        diff = diff_sources(rel, old, new, quick=False)
        if diff.failure:
            continue
        out.update(unit_id(rel, c.qualname) for c in diff.units
                   if ChangeKind.DELETED not in c.kinds and ChangeKind.ADDED not in c.kinds)
    return sorted(out)


def changed_units(root: Path, patches: Iterable[Path], *, ignore: tuple[str, ...] = (),
                  problems: list[str] | None = None) -> list[UnitId]:
    """Units of ``root``'s Python files that ``patches`` change (:func:`changed_units_of`).

    Args:
        root: the checkout the patches apply to (only read).
        patches: unified diffs, each applied to ``root`` on its own.
        ignore: globs of files to skip.
        problems: where a patch that does not apply is named (it is skipped either way).

    Returns:
        The changed units of all patches, sorted, no duplicates.
    """
    out: set[UnitId] = set()
    for patch in patches:
        try:
            sources = patched_sources(root, patch)
        except FastCIError as exc:
            if problems is not None:
                problems.append(str(exc))
            continue
        out.update(changed_units_of(sources, ignore=ignore))
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
    """The nodes holding a unit's own code.

    A function's or class's body block (nested defs inside it are skipped by
    :class:`~fastci.eval.fault_ops.SiteFinder`), or a module's top-level statements.

    Args:
        module: the parsed file.
        qualname: the unit's ``co_qualname`` (:data:`MODULE_QUALNAME` for the module).

    Returns:
        The nodes, or None when there is no such unit or its qualname is ambiguous.
    """
    if qualname == MODULE_QUALNAME:
        return list(module.body)
    found: dict[str, list[cst.FunctionDef | cst.ClassDef]] = {}
    _defs(list(module.body), "", found)
    nodes = found.get(qualname, [])
    return [nodes[0].body] if len(nodes) == 1 else None


def _is_docstring(stmt: cst.CSTNode) -> bool:
    """Whether ``stmt`` is a statement holding only a string literal."""
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


# --------------------------------------------------------------------------- mutants


def candidates(path: RelPath, source: str, qualname: str) -> list[_Candidate]:
    """Every single-site edit of unit ``path::qualname`` in ``source``, in source order.

    Not every candidate is a mutant: :func:`materialize` drops those that do not compile
    or leave the AST as it was.
    """
    module = cst.parse_module(source)
    roots = own_code(module, qualname)
    if roots is None:
        return []
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions: Mapping[cst.CSTNode, CodeRange] = wrapper.resolve(PositionProvider)
    first = roots[0].body[0] if isinstance(roots[0], cst.IndentedBlock) and roots[0].body \
        else roots[0] if qualname == MODULE_QUALNAME else None
    finder = SiteFinder(first if first is not None and _is_docstring(first) else None)
    for root in roots:
        root.visit(finder)
    out: list[_Candidate] = []
    counts: dict[str, int] = {}
    for operator, node, variants in finder.sites:
        for label, new in variants:
            counts[operator] = counts.get(operator, 0) + 1
            text = f"{label}: {describe(module, node, new)}"
            out.append(_Candidate(operator, path, qualname, counts[operator],
                                  positions[node].start.line, text, node, new, module))
    return out


def _short(path: RelPath, qualname: str) -> str:
    stem = Path(path).stem
    return stem if qualname == MODULE_QUALNAME else f"{stem}.{qualname.replace('.<locals>.', '.')}"


def materialize(candidate: _Candidate) -> Mutant | None:
    """The mutant of one candidate, or None when it does not compile or changes no AST."""
    source = candidate.tree.code
    mutated = candidate.tree.visit(ReplaceOne(candidate.target, candidate.replacement)).code
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
    """Draw ``count`` distinct mutants of ``units``, seeded.

    Operators take turns in a seeded order, so any ``count >= len(OPERATORS)`` has each
    operator at least once (where the units offer a site for it); within an operator the
    least-used unit goes first, so mutants spread over the units.

    Args:
        sources: path -> text of every file holding one of ``units`` (others are skipped).
        units: the units to mutate.
        count: how many mutants at most (fewer when the units offer fewer).
        seed: the seed; the same arguments give the same mutants.

    Returns:
        The mutants, in the order drawn.
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
