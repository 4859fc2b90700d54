"""Recording cost on Python 3.11 and 3.12, side by side (issue 35).

``python -m bench record_py312`` (part of ``make bench``) times whole pytest runs, plain
and recorded (``--fastci-record``), best of ``--rounds`` (3) with the modes alternating
inside each round, wall seconds:

* the pure-Python suite ``bench/pysuite_fixture`` (scalar autodiff and an MLP, a BPE
  tokenizer, list linear algebra: call-heavy code, deterministic);
* CPU-light tests of the project itself that import no torch (:data:`PROJECT_TESTS`);

each under Python 3.11 (``.venv``, coverage.py's C tracer) and Python 3.12 (``.venv312``,
made by ``make test-py312``): recorded by the ``sys.monitoring`` engine (the default there)
and by coverage.py's (``FASTCI_RECORDER=coverage``). Target: the 3.12 pure-Python suite
recorded <= :data:`TARGET` x plain. ``--example`` adds the example suite at its floors on
3.11 (torch; the issue's 3.11 reference: 1.38x plain).

FastCI's own modules are byte-compiled first, by each interpreter (``compileall``), as
``pip install`` does for a regular install: an editable install under
``PYTHONDONTWRITEBYTECODE=1`` (this host's setting, and the bench's) would compile them
from source in every recorded session (``--no-compile`` measures that case). The suite
under test is never compiled ahead, recorded or not.

``--instructions`` also counts the instructions of one plain and one recorded run of
the pure-Python suite on 3.12 with ``valgrind --tool=callgrind``: repeatable where wall
times vary with the host's load (it takes a few minutes; needs valgrind).

A missing ``.venv312`` is said in a line marked ``NOT MEASURED`` and the exit code is 1.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY311 = ROOT / ".venv" / "bin" / "python"
PY312 = ROOT / ".venv312" / "bin" / "python"
SUITE = "bench/pysuite_fixture"
PROJECT_TESTS = ("tests/test_units.py", "tests/test_changes.py")
EXAMPLE = ("examples/microllm/tests", "--at-floors")
#: The 3.12 pure-Python suite recorded, at most this times its plain run.
TARGET = 1.10
OVER_TARGET = "OVER TARGET"


def _env(engine: str | None) -> dict[str, str]:
    """One thread, no bytecode written, the default recording mode (or ``engine``)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("FASTCI_RECORD_LINES", None)
    env.pop("FASTCI_RECORDER", None)
    if engine is not None:
        env["FASTCI_RECORDER"] = engine
    return env


def _run(python: Path, args: tuple[str, ...], record: Path | None,
         engine: str | None) -> float:
    env = _env(engine)
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    if record is not None:
        cmd += ["--fastci-record", f"--fastci-trace-dir={record}"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        tail = " | ".join((res.stdout + res.stderr).strip().splitlines()[-3:])
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {tail}")
    return wall


def _compile(python: Path) -> None:
    """Byte-compile FastCI's package for ``python`` (what ``pip install`` does)."""
    subprocess.run([str(python), "-m", "compileall", "-q", str(ROOT / "analyzer" / "fastci")],
                   cwd=ROOT, check=True, capture_output=True)


def instructions(python: Path, args: tuple[str, ...], record: Path | None) -> int:
    """Instructions one whole pytest run executes (valgrind callgrind), all processes."""
    env = _env(None)
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    if record is not None:
        cmd += ["--fastci-record", f"--fastci-trace-dir={record}"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    found = re.findall(r"Collected : (\d+)", res.stderr)
    if res.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr[-300:]}")
    return sum(int(n) for n in found)


def compare(name: str, python: Path, args: tuple[str, ...], engines: list[str | None],
            rounds: int, work: Path) -> dict[str, float]:
    """Best wall seconds of ``plain`` and of each recorded engine, alternating per round."""
    best: dict[str, float] = {}
    for r in range(rounds):
        for engine in [None, *engines]:
            label = "plain" if engine is None else f"recorded[{engine or 'default'}]"
            out = None if engine is None else work / f"{name}-{engine}-{r}"
            wall = _run(python, args, out, None if engine in (None, "default") else engine)
            best[label] = min(best.get(label, float("inf")), wall)
    return best


def _line(title: str, best: dict[str, float]) -> str:
    plain = best["plain"]
    parts = [f"plain {plain:.2f} s"] + [f"{k} {v:.2f} s = {v / plain:.2f}x"
                                        for k, v in best.items() if k != "plain"]
    return f"  {title}: " + ", ".join(parts)


def main(argv: list[str]) -> int:
    """Print the comparison; 1 when the 3.12 target is missed or 3.12 was not measured."""
    parser = argparse.ArgumentParser(prog="python -m bench.record_py312")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--example", action="store_true",
                        help="also the example suite at its floors on 3.11 (torch)")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave FastCI's modules uncompiled (an editable install without "
                             "bytecode: each session compiles them)")
    parser.add_argument("--instructions", action="store_true",
                        help="also count instructions of the 3.12 pure-Python suite, plain "
                             "and recorded (valgrind callgrind)")
    args, _ = parser.parse_known_args(argv)
    for python in (PY311, PY312):
        if python.exists() and not args.no_compile:
            _compile(python)
    lines = [f"recording cost by Python version (whole pytest runs, wall, best of "
             f"{args.rounds}, modes alternating; 3.11: coverage.py's C tracer, 3.12: "
             "sys.monitoring unless [coverage]; FastCI "
             f"{'not compiled' if args.no_compile else 'byte-compiled'}):"]
    print(lines[0], flush=True)
    code = 0
    with tempfile.TemporaryDirectory(prefix="fastci-bench-py312-") as tmp:
        work = Path(tmp)
        py311 = PY311 if PY311.exists() else Path(sys.executable)
        for title, targs in (("pure-Python suite", (SUITE,)), ("project tests", PROJECT_TESTS)):
            best = compare(f"311-{title[:4]}", py311, targs, ["default"], args.rounds, work)
            lines.append(_line(f"3.11 {title}", best))
            print(lines[-1], flush=True)
            if not PY312.exists():
                lines.append(f"  3.12 {title}: NOT MEASURED: {PY312} is missing "
                             "(make test-py312 makes it)")
                print(lines[-1], flush=True)
                code = 1
                continue
            best = compare(f"312-{title[:4]}", PY312, targs, ["monitoring", "coverage"],
                           args.rounds, work)
            line = _line(f"3.12 {title}", best)
            if title.startswith("pure"):
                ratio = best["recorded[monitoring]"] / best["plain"]
                ok = ratio <= TARGET
                line += f" (target recorded <= {TARGET}x plain: {'OK' if ok else OVER_TARGET})"
                code = code or (0 if ok else 1)
            lines.append(line)
            print(lines[-1], flush=True)
        if args.instructions and PY312.exists():
            if shutil.which("valgrind") is None:
                lines.append("  3.12 pure-Python suite, instructions: NOT MEASURED: no valgrind")
                code = 1
            else:
                plain = instructions(PY312, (SUITE,), None)
                rec = instructions(PY312, (SUITE,), work / "callgrind")
                lines.append(f"  3.12 pure-Python suite, instructions (callgrind, one run "
                             f"each): plain {plain / 1e9:.3f} G, recorded {rec / 1e9:.3f} G "
                             f"= {rec / plain:.3f}x")
            print(lines[-1], flush=True)
        if args.example:
            best = compare("311-example", py311, EXAMPLE, ["default"], args.rounds, work)
            lines.append(_line("3.11 example suite at floors", best))
            print(lines[-1], flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
