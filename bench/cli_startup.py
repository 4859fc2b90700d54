"""CLI start-up benchmark: how long ``fastci --help`` and a small ``fastci plan`` take.

The CLI imports a command's stage only when that command runs (:mod:`fastci.cli.command`),
so printing help pays for argparse and the command declarations alone. Each command line
runs ``--runs`` times (default 10) in a fresh interpreter; the minimum and median wall
times are printed, with the median CPU time (user + system) of the process, and
``python -X importtime`` gives the seconds spent importing (the sum of the top-level
imports' cumulative times, the least of 3 runs). ``python -c pass`` is the floor.

``fastci plan`` runs on a scratch git repository with two pytest tests and no evidence
(every test is selected): what a tiny project pays per plan, imports against analysis.

Target: ``fastci --help`` at most 0.3 s, judged on its median CPU time: the process is
single-threaded and waits for nothing, so on an idle host its wall time is its CPU time,
while on a shared one (this 2-core machine runs several jobs) the wall time mostly
measures the others. Exit 1 when over.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

TARGET_HELP_S = 0.3
_IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)")


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wall_times(argv: Sequence[str], runs: int, cwd: Path) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each of ``runs`` fresh runs of ``argv`` (one warm-up first)."""
    subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, check=False)
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), _children_cpu()
        res = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, check=False)
        wall.append(time.perf_counter() - t0)
        cpu.append(_children_cpu() - c0)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr[-500:]}")
    return wall, cpu


def import_seconds(stderr: str) -> tuple[float, int]:
    """Seconds of imports in ``-X importtime`` output (top-level cumulative times summed),
    and how many ``fastci`` modules were imported."""
    total_us, fastci = 0, 0
    for line in stderr.splitlines():
        m = _IMPORT_LINE.match(line)
        if m is None:
            continue
        if not m.group(3):  # a top-level import: its cumulative time holds its children's
            total_us += int(m.group(2))
        if m.group(4) == "fastci" or m.group(4).startswith("fastci."):
            fastci += 1
    return total_us / 1e6, fastci


def import_profile(argv: Sequence[str], cwd: Path, runs: int = 3) -> tuple[float, int]:
    """:func:`import_seconds` of ``argv``, the least of ``runs`` runs (a busy host adds noise)."""
    found = []
    for _ in range(runs):
        res = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=cwd, env=_env(),
                             capture_output=True, text=True, check=False)
        found.append(import_seconds(res.stderr))
    return min(found)


def scratch_repo(root: Path) -> None:
    """A git repository with a module and two pytest tests of it, committed."""
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("def double(x):\n    return x * 2\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_model.py").write_text(
        "from pkg.model import double\n\n\ndef test_double():\n    assert double(2) == 4\n\n\n"
        "def test_zero():\n    assert double(0) == 0\n")
    (root / ".gitignore").write_text(".fastci/\n")
    for cmd in (["init", "-q"], ["add", "-A"],
                ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "base"]):
        subprocess.run(["git", *cmd], cwd=root, check=True, capture_output=True)
    (root / "pkg" / "model.py").write_text("def double(x):\n    return x + x\n")


def line(what: str, times: tuple[list[float], list[float]],
         imports: tuple[float, int] | None = None) -> str:
    wall, cpu = times
    text = (f"{what:<24} wall min {min(wall):.3f} s, median {statistics.median(wall):.3f} s; "
            f"CPU median {statistics.median(cpu):.3f} s")
    if imports is not None:
        text += f"; imports {imports[0]:.3f} s ({imports[1]} fastci modules)"
    return text


def main(argv: list[str]) -> int:
    """``python -m bench cli_startup [-- --runs N]``; exit 1 when ``fastci --help`` is slow."""
    parser = argparse.ArgumentParser(prog="python -m bench.cli_startup")
    parser.add_argument("--runs", type=int, default=10)
    args, _unknown = parser.parse_known_args(argv)  # `python -m bench -- ...` passes all options
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="fastci-cli-bench-") as tmp:
        root = Path(tmp)
        scratch_repo(root)
        floor = wall_times([py, "-c", "pass"], args.runs, root)
        print(line("python -c pass", floor), flush=True)
        helps = {}
        for what, cmd in (("fastci --help", ["--help"]), ("fastci plan --help", ["plan", "--help"])):
            full = [py, "-m", "fastci", *cmd]
            helps[what] = wall_times(full, args.runs, root)
            print(line(what, helps[what], import_profile(full, root)), flush=True)
        plan = [py, "-m", "fastci", "plan", "--no-bazel", "--root", str(root)]
        times = wall_times(plan, max(args.runs // 2, 3), root)
        print(line("fastci plan (2 tests)", times, import_profile(plan, root)), flush=True)
    median = statistics.median(helps["fastci --help"][1])
    if median > TARGET_HELP_S:
        print(f"cli start-up benchmark FAILED: fastci --help median CPU {median:.3f} s > "
              f"{TARGET_HELP_S} s", file=sys.stderr)
        return 1
    print(f"fastci --help median CPU {median:.3f} s <= {TARGET_HELP_S} s: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
