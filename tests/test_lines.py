"""Line granularity (issue 14 item 1): reach lines of a body change, and the selection rule.

:func:`fastci.select.lines.reach_lines` says which old lines every run that reaches a
function's changed code executes. The differential test checks the claim the rule rests
on, by running real functions before and after generated edits: whenever a run executed
none of the reach lines, the edited function behaves exactly as the old one (same result,
same executed lines, and no edited or inserted code ran).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
import sys
import textwrap
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastci.select.lines import reach_lines
from fastci.plan.inputs import Given, KnownFingerprint

# --------------------------------------------------------------------------- reach_lines

F = '''def f(x, steps):
    y = x + 1
    if steps > 4:
        y = y * 2
    total = (y +
             steps)
    for i in range(steps):
        if i == 3:
            break
    else:
        total += 1
    try:
        z = 1 / x
    except ZeroDivisionError:
        z = 0
    return total + z
'''


def _edit(src: str, line: int, text: str | None, *, insert: bool = False) -> str:
    lines = src.splitlines(keepends=True)
    if insert:
        lines.insert(line, text + "\n")  # after old line ``line``
    elif text is None:
        del lines[line - 1]
    else:
        lines[line - 1] = text + "\n"
    return "".join(lines)


def _reach(new: str, old: str = F) -> frozenset[int] | str:
    return reach_lines(old.encode(), new.encode(), "m.py", "f")


def test_a_replaced_statement_is_reached_by_its_own_lines() -> None:
    assert _reach(_edit(F, 4, "        y = y * 3")) == {4}


def test_a_continuation_line_counts_for_the_whole_statement() -> None:
    assert _reach(_edit(F, 6, "             steps * 2)")) == {5, 6}


def test_a_compound_header_counts_for_the_whole_statement() -> None:
    assert _reach(_edit(F, 3, "    if steps > 5:")) == {3, 4}
    # An ``except`` line: every line of the try statement.
    assert _reach(_edit(F, 14, "    except (ZeroDivisionError, ValueError):")) == set(range(12, 16))


def test_an_insertion_is_reached_by_what_runs_before_it() -> None:
    # After the ``if`` header, inside its block: every run that evaluates the condition.
    assert _reach(_edit(F, 3, "        y = 0", insert=True)) == {3, 4}
    # At top level after a statement: whoever finished that statement.
    assert _reach(_edit(F, 4, "    y = 0", insert=True)) == {3, 4}
    # Inside the loop body after the inner ``if``: every line of the loop.
    assert _reach(_edit(F, 9, "        total -= 1", insert=True)) == set(range(7, 12))


def test_what_cannot_be_placed_stays_unit_wide() -> None:
    # Before the first statement every run reaches it.
    assert isinstance(_reach(_edit(F, 1, "    print('hi')", insert=True)), str)
    # The def line (a signature change) is not a body change.
    assert isinstance(_reach(_edit(F, 1, "def f(x, steps, k=1):")), str)
    # The file is gone, or the old side does not parse.
    assert isinstance(reach_lines(F.encode(), None, "m.py", "f"), str)
    assert isinstance(reach_lines(b"def f(:\n", F.encode(), "m.py", "f"), str)
    # Two definitions of one name are one merged unit: no line map.
    twice = F + "\n\nif True:\n    " + "\n    ".join(F.splitlines()) + "\n"
    assert isinstance(reach_lines(twice.encode(), twice.replace("y * 2", "y * 3").encode(),
                                  "m.py", "f"), str)


def test_a_statement_without_code_is_reached_like_an_insertion() -> None:
    old = _edit(F, 4, "        'a note'", insert=True)
    new = old.replace("        'a note'", "        y = -y")
    assert _reach(new, old) == {3, 4, 5}


def test_an_edit_that_changes_the_function_s_scope_is_unit_wide() -> None:
    """Compiling decides some things for every line: a new binding makes a global name
    local (UnboundLocalError where the branch is not taken), ``global`` the reverse, and
    a ``yield`` makes every call return a generator."""
    old = "LIMIT = 3\n\n\ndef f(x):\n    if x > 100:\n        pass\n    return x + LIMIT\n"
    for body in ("        LIMIT = 1", "        import os as LIMIT", "        del LIMIT",
                 "        yield x"):
        new = old.replace("        pass", body)
        got = reach_lines(old.encode(), new.encode(), "m.py", "f")
        assert isinstance(got, str), (body, got)
    local = "def f(x):\n    if x > 100:\n        pass\n    y = 1\n    return x + y\n"
    made_global = local.replace("        pass", "        global y")
    assert isinstance(reach_lines(local.encode(), made_global.encode(), "m.py", "f"), str)
    # A local that shares its name with an attribute (``x = self.x``) is no scope change.
    attr = ("def f(self, a):\n    qkv = self.qkv(a)\n    if a:\n        pass\n"
            "    return qkv\n")
    got = reach_lines(attr.encode(), attr.replace("        pass", "        qkv = qkv * 2").encode(),
                      "m.py", "f")
    assert got == {4}, got
    # A new local under another name stays at line granularity.
    new = old.replace("        pass", "        tmp = 1")
    assert reach_lines(old.encode(), new.encode(), "m.py", "f") == {6}


def test_a_nested_function_s_statement_is_one_statement() -> None:
    old = "def f(x):\n    def g(a):\n        return a + 1\n    return g(x)\n"
    new = old.replace("    return g(x)", "    return g(x) * 2")
    assert reach_lines(old.encode(), new.encode(), "m.py", "f") == {4}


# --------------------------------------------------------------------------- differential

CORPUS = '''def lr_at(step, warmup, total, base):
    if step < warmup:
        scale = (step + 1) / warmup
    elif step >= total:
        scale = 0.0
    else:
        progress = (step - warmup) / max(1, total - warmup)
        scale = 0.5 * (1.0 + (1.0 - 2.0 * progress))
    return base * scale


def pad_batch(seqs, pad, multiple):
    longest = max((len(s) for s in seqs), default=0)
    if multiple > 1:
        longest = ((longest + multiple - 1) // multiple) * multiple
    out = []
    for s in seqs:
        if len(s) > longest:
            raise ValueError("too long")
        out.append(list(s) + [pad] * (longest - len(s)))
    return out


def shard(items, rank, world):
    if world <= 0:
        raise ValueError("world")
    n = len(items)
    per = n // world
    extra = n % world
    start = rank * per + min(rank, extra)
    stop = start + per + (1 if rank < extra else 0)
    return items[start:stop]


def clip(grads, max_norm):
    total = 0.0
    for g in grads:
        total += g * g
    norm = total ** 0.5
    if norm <= max_norm or norm == 0:
        return list(grads)
    try:
        factor = max_norm / norm
    except ZeroDivisionError:
        factor = 1.0
    return [g * factor for g in grads]


def find_stop(tokens, stop):
    i = 0
    while i < len(tokens):
        if tokens[i] == stop:
            break
        i += 1
    else:
        return -1
    return i
'''

INPUTS: dict[str, list[tuple[Any, ...]]] = {
    "lr_at": [(0, 10, 100, 1.0), (50, 10, 100, 0.1), (200, 10, 100, 1.0), (9, 10, 100, 2.0)],
    "pad_batch": [([[1, 2], [3]], 0, 1), ([[1, 2, 3], []], 0, 4), ([], 0, 2)],
    "shard": [(list(range(10)), 0, 3), (list(range(10)), 2, 3), ([], 0, 1), ([1], 0, 0)],
    "clip": [([3.0, 4.0], 10.0), ([3.0, 4.0], 1.0), ([], 1.0)],
    "find_stop": [([1, 2, 3], 2), ([1, 2, 3], 9), ([], 1)],
}
FUNCS = sorted(INPUTS)
HIT = "HITS.append({k})"


def _functions() -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.parse(CORPUS).body if isinstance(n, ast.FunctionDef)}


def _run(src: str, name: str, args: tuple[Any, ...]) -> tuple[Any, frozenset[int], list[int]]:
    """Call ``name`` from ``src``; its result (or exception), executed lines, and HITS."""
    hits: list[int] = []
    ns: dict[str, Any] = {"HITS": hits}
    exec(compile(src, "<mut>", "exec"), ns)
    lines: set[int] = set()

    def tracer(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if frame.f_code.co_filename != "<mut>":
            return None
        if event == "line":
            lines.add(frame.f_lineno)
        return tracer

    import copy

    args = copy.deepcopy(args)
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        result: Any = ("ok", ns[name](*args))
    except Exception as exc:  # noqa: BLE001 - the result of the call under test
        result = ("raised", type(exc).__name__, str(exc))
    finally:
        sys.settrace(old)
    return result, frozenset(lines), hits


_HEADER = re.compile(r"^(\s*)(if|elif|while) (.*):\s*$")


def _mutations(name: str) -> list[tuple[str, int, str | None]]:
    """Edits of function ``name`` as (kind, old line, text): replace, insert after, delete."""
    fn = _functions()[name]
    lines = CORPUS.splitlines()
    simple = {s.lineno for s in ast.walk(fn) if isinstance(s, ast.stmt)
              and not isinstance(s, (ast.FunctionDef, ast.If, ast.For, ast.While, ast.Try))
              and s.lineno == s.end_lineno and s.lineno > fn.lineno}
    out: list[tuple[str, int, str | None]] = []
    end = fn.end_lineno or fn.lineno
    for ln in range(fn.lineno + 1, end + 1):
        text = lines[ln - 1]
        indent = text[:len(text) - len(text.lstrip())]
        k = ln
        if ln in simple:
            out.append(("replace", ln, f"{indent}{HIT.format(k=k)}; {text.strip()}"))
            out.append(("delete", ln, None))
        m = _HEADER.match(text)
        if m:
            out.append(("replace", ln, f"{m.group(1)}{m.group(2)} ({HIT.format(k=k)} or ({m.group(3)})):"))
        for width in range(4, len(indent) + 9, 4):  # any block level the line may end
            out.append(("insert", ln, f"{' ' * width}{HIT.format(k=1000 + k)}"))
            # Shadow a global the function reads: it becomes local on every line.
            for name in ("len", "max", "min", "range", "list", "ValueError"):
                if f"{name}(" in (ast.get_source_segment(CORPUS, fn) or ""):
                    out.append(("insert", ln, f"{' ' * width}{name} = None; {HIT.format(k=k)}"))
    return out


def _apply(kind: str, line: int, text: str | None) -> str | None:
    lines = CORPUS.splitlines(keepends=True)
    if kind == "replace":
        lines[line - 1] = f"{text}\n"
    elif kind == "delete":
        lines[line - 1] = ""
    else:
        lines.insert(line, f"{text}\n")
    new = "".join(lines)
    try:
        compile(new, "<mut>", "exec")
    except SyntaxError:
        return None
    return new


def _new_to_old(old: str, new: str) -> dict[int, int]:
    a, b = old.splitlines(), new.splitlines()
    out: dict[int, int] = {}
    for tag, i1, i2, j1, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            for k in range(i2 - i1):
                out[j1 + k + 1] = i1 + k + 1
    return out


ALL_MUTATIONS = [(name, m) for name in FUNCS for m in _mutations(name)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL_MUTATIONS))
def test_a_run_that_misses_the_reach_lines_is_unaffected(case: tuple[str, tuple[str, int, str | None]]) -> None:
    name, (kind, line, text) = case
    new = _apply(kind, line, text)
    if new is None:
        return  # the edit does not compile at that indentation
    reach = reach_lines(CORPUS.encode(), new.encode(), "m.py", name)
    if isinstance(reach, str):
        return  # unit-wide: every run of the function is affected
    mapping = _new_to_old(CORPUS, new)
    for args in INPUTS[name]:
        before, lines_before, _ = _run(CORPUS, name, args)
        if lines_before & reach:
            continue  # affected: nothing to check
        after, lines_after, hits = _run(new, name, args)
        assert not hits, (kind, line, text, args, sorted(reach))
        assert after == before, (kind, line, text, args)
        assert {mapping.get(ln, -ln) for ln in lines_after} == set(lines_before), (kind, line, args)


def test_the_differential_corpus_exercises_both_outcomes() -> None:
    """The property above is not vacuous: some runs are unaffected, some affected."""
    unaffected = affected = 0
    for name, (kind, line, text) in ALL_MUTATIONS:
        new = _apply(kind, line, text)
        if new is None:
            continue
        reach = reach_lines(CORPUS.encode(), new.encode(), "m.py", name)
        if isinstance(reach, str):
            continue
        for args in INPUTS[name]:
            _, lines_before, _ = _run(CORPUS, name, args)
            if lines_before & reach:
                affected += 1
            else:
                unaffected += 1
    assert unaffected >= 50 and affected >= 50, (unaffected, affected)


# --------------------------------------------------------------------------- the plan

M = textwrap.dedent('''\
    def f(x, steps):
        y = x + 1
        if steps > 4:
            y = y * 2
        return y
''')


def test_the_plan_skips_a_test_that_ran_no_changed_line(tmp_path: Path) -> None:
    """Wired into ``analyze`` with ``granularity: line``: //t:small (steps=2 at full
    workload, never runs line 4) is skipped for an edit of line 4, with the lines in its
    reason; //t:big runs. Unit granularity, a stale calibration, a checksum that differs
    from the test's evidence, or an edit it runs keep it."""
    from fastci.config import Config
    from fastci.evidence.store.calibrations import CalibrationStore, Rung, declaration_digest
    from fastci.evidence.store.db import EvidenceStore
    from fastci.plan.planner import analyze
    from fastci.select import DeclaredTest
    from fastci.evidence.store.db import RunEvidence
    from selection_support import Repo, env_now, units_of

    repo = Repo(tmp_path / "repo")
    repo.write({".gitignore": ".fastci/\n", "pkg/m.py": M})
    base = repo.commit()
    uid = "pkg/m.py::f"
    checksum = units_of(repo.root, ["pkg/m.py"])[uid]
    decls = {t: DeclaredTest(t, 1, {"steps": s}, floors={"steps": 1})
             for t, s in (("//t:small", 2), ("//t:big", 8))}
    (repo.root / ".fastci").mkdir()
    cal = CalibrationStore.open(repo.root / ".fastci/calibration.db", create=True)
    digest = hashlib.sha256(M.encode()).hexdigest()
    for t, lines in (("//t:small", {2, 3, 5}), ("//t:big", {2, 3, 4, 5})):
        cal.put(Rung(test=t, rung="full", declaration=declaration_digest(decls[t]),
                     overrides={}, commit=base, duration_s=5.0, gpus=1, outcome="passed",
                     complete=True, recorded_at=1.0, lines={"pkg/m.py": frozenset(lines)},
                     units={uid: (checksum, frozenset({"ctx"}))},
                     digests={"pkg/m.py": digest}))
    cal.close()
    store = EvidenceStore.open(repo.root / ".fastci/evidence.db", create=True)

    def record(test: str, unit_checksum: str, sources: dict[str, str],
               contexts: frozenset[str] = frozenset({"ctx"})) -> None:
        store.ingest(RunEvidence(
            test=test, run_key=f"{test}:{time.time_ns()}", outcome="passed", complete=True,
            duration_s=5.0, gpus=1, workload=dict(decls[test].workload), recorded_at=time.time(),
            env_fingerprint=env_now(), commit=base,
            units={uid: (unit_checksum, contexts)}, sources=sources))

    for t in decls:
        record(t, checksum, {"pkg/m.py": digest})

    def plan(edit_line: int, text: str, granularity: str = "line",
             declared: dict[str, Any] | None = None) -> dict[str, Any]:
        repo.write({"pkg/m.py": _edit(M, edit_line, text)})
        a = analyze(repo.root, Config(), base=base, declared=Given(declared or decls),
                    environment=KnownFingerprint(env_now()), store=store, reduce=False,
                    granularity=granularity)
        out = {t.id: "run" for t in a.plan.tests}
        out.update({s.id: s.why for s in a.plan.skipped})
        return out

    got = plan(4, "        y = y * 3")
    assert got["//t:big"] == "run"
    # `fastci explain` shows it: skipped, the line rule first, then why it was affected.
    from fastci.select.explain import explain

    a = analyze(repo.root, Config(), base=base, declared=Given(decls), environment=KnownFingerprint(env_now()),
                store=store, reduce=False, granularity="line")
    shown = explain(a.selection, "//t:small", store)
    assert shown[0] == "//t:small: SKIPPED"
    assert shown[1].startswith("  1. enters the changed functions but runs none of their "
                               "changed lines: not affected at line granularity")
    assert any(line.startswith("  2. executes a changed unit") for line in shown), shown
    assert got["//t:small"].startswith("not affected at line granularity")
    assert "pkg/m.py::f lines 4" in got["//t:small"], got
    assert plan(4, "        y = y * 3", granularity="unit")["//t:small"] == "run"
    assert plan(2, "    y = x + 2")["//t:small"] == "run"  # it runs line 2
    # A declaration changed since calibration: the line evidence is of another test.
    stale = {**decls, "//t:small": DeclaredTest("//t:small", 1, {"steps": 3}, floors={"steps": 1})}
    assert plan(4, "        y = y * 3", declared=stale)["//t:small"] == "run"
    # A file its run executed names a compiler: its frames may produce no line events.
    repo.write({"pkg/train.py": "import torch\nstep = torch.compile(lambda x: x)\n"})
    record("//t:small", checksum, {"pkg/m.py": digest, "pkg/train.py": "x"})
    assert plan(4, "        y = y * 3")["//t:small"] == "run"
    record("//t:small", checksum, {"pkg/m.py": digest})
    assert plan(4, "        y = y * 3")["//t:small"] != "run"
    # Its evidence holds a unit dynamo traced (compiled by a library, say): no line events.
    record("//t:small", checksum, {"pkg/m.py": digest}, frozenset({"ctx", "traced(dynamo)"}))
    assert plan(4, "        y = y * 3")["//t:small"] == "run"
    # The test's own evidence holds another checksum: the lines describe other code.
    record("//t:small", "0" * 16, {"pkg/m.py": digest})
    assert plan(4, "        y = y * 3")["//t:small"] == "run"
    store.close()


def test_line_evidence_older_than_a_changed_caller_is_not_used(tmp_path: Path) -> None:
    """Issue 34 item 1, the reported case: the full rung ran none of f's changed lines at
    the calibration's commit, but main changed the caller since (it now takes the branch),
    so the old lines say nothing about this tree: the test stays selected."""
    from fastci.config import Config
    from fastci.evidence.store.calibrations import CalibrationStore, Rung, declaration_digest
    from fastci.evidence.store.db import EvidenceStore, RunEvidence
    from fastci.plan.planner import analyze
    from fastci.select import DeclaredTest
    from selection_support import Repo, env_now, units_of

    caller = "from pkg.m import f\n\n\ndef run():\n    return f(1, 2)\n"
    repo = Repo(tmp_path / "repo")
    calibrated = repo.commit({".gitignore": ".fastci/\n", "pkg/m.py": M, "pkg/run.py": caller})
    decl = DeclaredTest("//t:small", 1, {"steps": 2}, floors={"steps": 1})
    units = units_of(repo.root, ["pkg/m.py", "pkg/run.py"])
    (repo.root / ".fastci").mkdir()
    with CalibrationStore.open(repo.root / ".fastci/calibration.db", create=True) as cal:
        cal.put(Rung(test="//t:small", rung="full", declaration=declaration_digest(decl),
                     overrides={}, commit=calibrated, duration_s=5.0, gpus=1, outcome="passed",
                     complete=True, recorded_at=1.0,
                     lines={"pkg/m.py": frozenset({2, 3, 5}), "pkg/run.py": frozenset({1, 4, 5})},
                     units={u: (units[u], frozenset({"ctx"}))
                            for u in ("pkg/m.py::f", "pkg/run.py::run")},
                     digests={p: hashlib.sha256((repo.root / p).read_bytes()).hexdigest()
                              for p in ("pkg/m.py", "pkg/run.py")}))
    store = EvidenceStore.open(repo.root / ".fastci/evidence.db", create=True)

    def plan(base: str) -> str:
        now = units_of(repo.root, ["pkg/m.py", "pkg/run.py"])
        store.ingest(RunEvidence(
            test="//t:small", run_key=f"r{time.time_ns()}", outcome="passed", complete=True,
            duration_s=5.0, gpus=1, workload={"steps": 2}, recorded_at=time.time(),
            env_fingerprint=env_now(), commit=base,
            units={u: (now[u], frozenset({"ctx"})) for u in ("pkg/m.py::f", "pkg/run.py::run")},
            sources={p: hashlib.sha256((repo.root / p).read_bytes()).hexdigest()
                     for p in ("pkg/m.py", "pkg/run.py")}))
        repo.write({"pkg/m.py": _edit(M, 4, "        y = y * 3")})
        a = analyze(repo.root, Config(), base=base, declared=Given({"//t:small": decl}),
                    environment=KnownFingerprint(env_now()), store=store, reduce=False, granularity="line")
        repo.write({"pkg/m.py": M})
        return "run" if [t.id for t in a.plan.tests] == ["//t:small"] else a.plan.skipped[0].why

    assert plan(calibrated).startswith("not affected at line granularity")  # same tree
    later = repo.commit({"pkg/run.py": caller.replace("f(1, 2)", "f(1, 8)")})
    assert plan(later) == "run"
    store.close()
