"""The launcher every ``gpu_test`` runs as its ``py_test`` main.

It reads what the macro put into the environment (``FASTCI_WORKLOAD``,
``FASTCI_MODE``, ``FASTCI_TEST_ID``, ``FASTCI_GPUS``, ``FASTCI_TEST_MAIN``,
``FASTCI_PLAN_STATUS``, ``FASTCI_CPU_WORKLOAD``), takes GPUs from the lock-file pool
(:mod:`fastci.run.gpus`) — in a ``fastci run`` that published a schedule, only
when it is this test's turn in priority order (:mod:`fastci.run.schedule`) —, writes ``$TEST_UNDECLARED_OUTPUTS_DIR/fastci_workload.json``,
lowers the workload to the test's declared CPU scale when the host has no GPU at all
(:mod:`fastci.run.scale`), optionally wraps the run in the evidence recorder (``FASTCI_RECORD=1``), and
runs the test's own main in this process with the workload flags in
``sys.argv``. See docs/CONTRACTS.md, "A running gpu_test".

The workload flags are built here, from ``FASTCI_WORKLOAD``, and appended
after the arguments Bazel passed (the gpu_test's own ``args``, then any
``--test_arg``): ``--<dim>=<value>`` per dimension, sorted, one argv element
each with the value verbatim (bools as ``true``/``false``). They never go
through Bazel's ``args``, which are tokenized and ``$(...)``-expanded.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, MutableMapping, Sequence

from fastci.run import gpus as gpu_pool
from fastci.run import schedule
from fastci.run.scale import CPU_WORKLOAD_ENV, DECLARED, ScaleError, cpu_scaled, parse_cpu_workload
from fastci.errors import FastCIError
from fastci.types import normalize_test_id

WORKLOAD_FILE = "fastci_workload.json"
TRACES_DIR = "fastci_traces"


class LaunchError(FastCIError):
    """The launcher's environment is incomplete or inconsistent."""


@dataclass(frozen=True)
class LaunchConfig:
    """What one gpu_test run was declared with (from its environment)."""

    test_id: str
    mode: str
    workload: Mapping[str, Any]  # what this run uses: the declared workload with the plan's overrides
    gpus: int
    main: str
    plan_status: str
    record: bool
    declared: Mapping[str, Any] | None = None  # the full workload as declared (None: not told)
    cpu_workload: Mapping[str, Any] = field(default_factory=dict)  # the CPU scale (empty: none)
    scale: str = DECLARED  # "cpu" once the CPU scale lowered the workload (fastci.run.scale)
    cpu_applied: Mapping[str, Any] = field(default_factory=dict)  # what the CPU scale lowered

    @property
    def overrides(self) -> dict[str, Any] | None:
        """The dimensions this run changed from the declared workload (None: unknown)."""
        if self.declared is None:
            return None
        return {k: v for k, v in self.workload.items() if self.declared.get(k) != v}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> LaunchConfig:
        """Read the configuration the gpu_test macro put into the environment.

        Raises:
            LaunchError: a variable is missing or malformed.
        """
        try:
            workload = json.loads(environ.get("FASTCI_WORKLOAD", "{}"))
        except json.JSONDecodeError as exc:
            raise LaunchError(f"FASTCI_WORKLOAD is not JSON: {exc}") from exc
        if not isinstance(workload, dict):
            raise LaunchError(f"FASTCI_WORKLOAD: expected a JSON object, got {type(workload).__name__}")
        declared = None
        if environ.get("FASTCI_DECLARED_WORKLOAD"):
            try:
                declared = json.loads(environ["FASTCI_DECLARED_WORKLOAD"])
            except json.JSONDecodeError as exc:
                raise LaunchError(f"FASTCI_DECLARED_WORKLOAD is not JSON: {exc}") from exc
            if not isinstance(declared, dict):
                raise LaunchError("FASTCI_DECLARED_WORKLOAD: expected a JSON object, "
                                  f"got {type(declared).__name__}")
        try:
            gpus = int(environ.get("FASTCI_GPUS", "0"))
        except ValueError as exc:
            raise LaunchError(f"FASTCI_GPUS: expected an int, got {environ.get('FASTCI_GPUS')!r}") from exc
        main = environ.get("FASTCI_TEST_MAIN", "")
        if not main:
            raise LaunchError("FASTCI_TEST_MAIN is not set: run gpu_tests through bazel")
        try:
            cpu_workload = parse_cpu_workload(environ.get(CPU_WORKLOAD_ENV, ""), declared)
        except ScaleError as exc:
            raise LaunchError(str(exc)) from exc
        return cls(
            test_id=normalize_test_id(environ.get("FASTCI_TEST_ID") or environ.get("TEST_TARGET", "?")),
            mode=environ.get("FASTCI_MODE", "full"),
            workload=workload,
            gpus=gpus,
            main=main,
            plan_status=environ.get("FASTCI_PLAN_STATUS", ""),
            record=environ.get("FASTCI_RECORD", "") == "1",
            declared=declared,
            cpu_workload=cpu_workload,
        )


def resolve_main(main: str, environ: Mapping[str, str], cwd: Path) -> Path:
    """Find the test's own main file (a ``$(rootpath)`` relative to the runfiles workspace)."""
    candidates = [cwd / main]
    runfiles = environ.get("RUNFILES_DIR")
    if runfiles and main.startswith("external/"):
        candidates.append(Path(runfiles) / main[len("external/") :])
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise LaunchError(f"test main {main!r} not found (looked in {', '.join(map(str, candidates))})")


def render_value(value: object) -> str:
    """A workload value as a flag value: bools as true/false, others as ``str``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def workload_flags(workload: Mapping[str, Any]) -> list[str]:
    """``--<dim>=<value>`` per dimension, sorted by dimension, one element each.

    Raises:
        LaunchError: a dimension name is not an identifier or a value is not
            an int, float, string or bool.
    """
    flags = []
    for dim in sorted(workload):
        value = workload[dim]
        if not dim.isidentifier() or not dim.isascii():
            raise LaunchError(f"FASTCI_WORKLOAD: {dim!r} is not a dimension name")
        if not isinstance(value, (bool, int, float, str)):
            raise LaunchError(f"FASTCI_WORKLOAD: {dim}: expected int, float, string or bool, got {type(value).__name__}")
        flags.append(f"--{dim}={render_value(value)}")
    return flags


def workload_record(cfg: LaunchConfig, devices: Sequence[str]) -> dict[str, Any]:
    """The content of ``fastci_workload.json``: what this run actually used."""
    return {
        "test": cfg.test_id,
        "mode": cfg.mode,
        "workload": dict(cfg.workload),
        "declared": dict(cfg.declared) if cfg.declared is not None else None,
        "overrides": cfg.overrides,
        "gpus": cfg.gpus,
        "devices": list(devices),
        "plan_status": cfg.plan_status,
        # Which scale ran: "declared", or "cpu" with the dimensions the CPU scale lowered.
        "scale": cfg.scale,
        "cpu_scale": dict(cfg.cpu_applied),
    }


def run_main(main: Path, argv: Sequence[str]) -> int:
    """Run ``main`` as ``__main__`` in this process; return its exit code."""
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else ""
    sys.argv = [str(main), *argv]
    if sys.path:
        sys.path[0] = str(main.parent)
    try:
        runpy.run_path(str(main), run_name="__main__")
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # the test's own failure: report it like python would
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved_argv
        if sys.path:
            sys.path[0] = saved_path0


def _recorder(cfg: LaunchConfig, out_dir: Path, repo_root: Path) -> Any:
    try:
        from fastci.evidence.record.recorder import Recorder
    except ImportError as exc:
        raise LaunchError(
            f"FASTCI_RECORD=1 but fastci.evidence.record.recorder cannot be imported ({exc}); "
            "run without --config=fastci_record or install the recorder"
        ) from exc
    if cfg.declared is None:  # an older macro: the workload used is all we know
        return Recorder(cfg.test_id, out_dir, repo_root=repo_root, workload=cfg.workload,
                        gpus=cfg.gpus)
    return Recorder(cfg.test_id, out_dir, repo_root=repo_root, workload=cfg.declared,
                    overrides=cfg.overrides, gpus=cfg.gpus)


def launch(argv: Sequence[str], environ: MutableMapping[str, str]) -> int:
    """Run one gpu_test: pick GPUs, write the workload record, run (and record) its main."""
    cfg = LaunchConfig.from_env(environ)
    cwd = Path.cwd()
    main = resolve_main(cfg.main, environ, cwd)
    outputs = environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    # Found from where the main lives, never from the environment: no cache key changes.
    ticket = schedule.ticket_for(cfg.test_id, cfg.gpus, main, cfg.main, say=_say)
    try:
        with gpu_pool.gpus_for(cfg.gpus, environ,
                               turn=ticket.turn if ticket is not None else None) as devices:
            if ticket is not None:
                ticket.close()
            cfg = _at_scale(cfg, devices, environ)
            rc = _run(cfg, main, [*argv, *workload_flags(cfg.workload)], environ, devices, outputs, cwd)
            if rc != 0 and ticket is not None:
                ticket.failed()  # before the devices go back: nothing starts after a failure
            return rc
    finally:
        if ticket is not None:
            ticket.close()


def _at_scale(cfg: LaunchConfig, devices: Sequence[str], environ: Mapping[str, str]) -> LaunchConfig:
    """``cfg`` at the CPU scale when the host has no GPU at all, else unchanged.

    Devices given to the test prove a GPU host; without any (a CPU-only host, or a test that
    asks for none) the host is probed, and only when the test declares a CPU scale: a
    ``gpus = 0`` test on a GPU host keeps its declared workload.
    """
    if not cfg.cpu_workload:
        return cfg
    host_has_gpu = bool(devices) or bool(gpu_pool.discover_devices(environ).devices)
    scaled = cpu_scaled(cfg.workload, cfg.cpu_workload, host_has_gpu)
    if scaled.scale == DECLARED:
        return cfg
    return replace(cfg, workload=scaled.workload, scale=scaled.scale, cpu_applied=scaled.applied)


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def _run(cfg: LaunchConfig, main: Path, argv: Sequence[str], environ: MutableMapping[str, str],
         devices: tuple[str, ...], outputs: str | None, cwd: Path) -> int:
    """Run the test's main on ``devices`` (held by the caller)."""
    environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    record = workload_record(cfg, devices)
    if cfg.gpus and not devices:
        print(
            f"fastci: WARNING: {cfg.test_id} needs {cfg.gpus} GPU(s) and runs on CPU "
            f"({gpu_pool.ALLOW_CPU_ENV}=1): a pass here says nothing about the GPU path",
            file=sys.stderr,
        )
    if cfg.cpu_applied:
        print(f"fastci: {cfg.test_id}: no GPU on this host: running its declared CPU scale "
              f"{json.dumps(dict(cfg.cpu_applied), sort_keys=True)} (recorded as overrides, scale=cpu)",
              file=sys.stderr)
    print(
        f"fastci: {cfg.test_id} mode={cfg.mode} gpus={cfg.gpus} devices=[{','.join(devices)}] "
        f"workload={json.dumps(record['workload'], sort_keys=True)}"
        + (f" plan={cfg.plan_status}" if cfg.plan_status else ""),
        file=sys.stderr,
    )
    if outputs:
        out = Path(outputs)
        out.mkdir(parents=True, exist_ok=True)
        (out / WORKLOAD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    if not cfg.record:
        return run_main(main, argv)
    if not outputs:
        raise LaunchError("FASTCI_RECORD=1 needs TEST_UNDECLARED_OUTPUTS_DIR (run under bazel test)")
    repo_root = Path(environ.get("FASTCI_REPO_ROOT") or cwd)
    recorder = _recorder(cfg, Path(outputs) / TRACES_DIR, repo_root)
    recorder.start()
    rc = 1
    try:
        rc = run_main(main, argv)
    finally:
        recorder.stop("passed" if rc == 0 else "failed")
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rules/private/gpu_test_main.py``; returns the test's exit code."""
    args = list(sys.argv if argv is None else argv)[1:]
    try:
        return launch(args, os.environ)
    except FastCIError as exc:
        print(f"fastci: {exc}", file=sys.stderr)
        return exc.exit_code
