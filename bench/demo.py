"""``make demo``: FastCI's main job, end to end, on the example framework.

1. copy the repository (tracked and untracked, not ignored files) into a scratch
   git repository — the user's checkout is only read, never touched;
2. record evidence for the example's gpu_tests at that commit (``fastci record``;
   the first demo is cold, later ones reuse the cached store for the same sources);
3. apply a small sample change to the example framework;
4. ``fastci plan`` it, explain the decisions, ``fastci run`` only what the plan says;
5. print what ran, what was skipped and why; undo the change and stop Bazel.

The scratch directory (``$FASTCI_DEMO_DIR``, default ``~/.cache/fastci/demo``)
is kept between runs so Bazel's cache stays warm (its output base is keyed by the
workspace path); ``python -m bench.demo --clean`` removes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from fastci.plan.planner import analyze
from fastci.plan.inputs import bazel_declared
from fastci.plan.summary import summarize
from fastci.plan.inputs import Query
from fastci.integrations.bazel.runner import Bazel
from fastci.config import DEFAULTS, Config, first_match, load as load_config
from fastci.errors import FastCIError
from fastci.evidence.store.db import EvidenceStore
from fastci.select.explain import explain
from fastci.plan.model import dump_plan
from fastci.run.runner import execute
from fastci.select.test_rules import own_output
from fastci.integrations.git.tree import plan_tree
from fastci.units.index import FileUnits, index_source

REPO = Path(__file__).resolve().parents[1]
TARGETS = "//examples/microllm/..."
#: The sample change: a small, behaviour-preserving edit of the KV cache.
SAMPLE = ("examples/microllm/microllm/model/attention.py",
          "        self.history.append(k.shape[-2])\n",
          "        self.history.append(int(k.shape[-2]))  # sample change by `make demo`\n")
_GIT_ENV = {"GIT_AUTHOR_NAME": "fastci demo", "GIT_AUTHOR_EMAIL": "demo@fastci.invalid",
            "GIT_COMMITTER_NAME": "fastci demo", "GIT_COMMITTER_EMAIL": "demo@fastci.invalid",
            # Fixed dates: the same sources give the same commit id, so cached evidence matches.
            "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}


def scratch_dir() -> Path:
    """Where the demo keeps its workspace and caches."""
    env = os.environ.get("FASTCI_DEMO_DIR")
    return Path(env) if env else Path.home() / ".cache" / "fastci" / "demo"


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    res = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise FastCIError(f"git {' '.join(args[:2])} in {root}: {res.stderr.strip()[:300]}")
    return res.stdout


def source_files(repo: Path) -> list[str]:
    """Tracked and untracked, not ignored files of ``repo`` (read-only git calls)."""
    out = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return sorted(p for p in set(out.split("\0")) if p and (repo / p).is_file()
                  and not own_output(p, DEFAULTS))


#: What recorded evidence depends on: the example, the rules and launcher, the unit indexer
#: and the recorder. The evidence cache is keyed by these files only.
# All of FastCI is an input: the recorder, the line index, the checksums at ingest and the
# launcher all shape what the evidence says (a stale cache would measure old code).
EVIDENCE_INPUTS = ("examples/**", "rules/**", "analyzer/**", "WORKSPACE", "BUILD.bazel",
                   ".bazelrc", ".fastci/BUILD*", "third_party/**")


def make_workspace(repo: Path, ws: Path) -> tuple[str, str]:
    """Mirror ``repo``'s sources into ``ws`` as a one-commit git repo.

    Returns the commit and a digest of the :data:`EVIDENCE_INPUTS` files.
    """
    files = source_files(repo)
    if ws.exists():
        for p in ws.iterdir():
            if p.name.startswith("bazel-"):
                p.unlink()
            elif p.name == ".git" or p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
    ws.mkdir(parents=True, exist_ok=True)
    for rel in files:
        data = (repo / rel).read_bytes()
        dst = ws / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
        shutil.copymode(repo / rel, dst)
    # The venv stays outside the copy; Bazel's interpreter rule is pointed at it.
    (ws / "user.bazelrc").write_text(f"build --repo_env=FASTCI_PYTHON={sys.executable}\n")
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-q", "--no-gpg-sign", "-m", "fastci demo base")
    return _git(ws, "rev-parse", "HEAD").strip(), evidence_digest(ws, files)


def evidence_digest(root: Path, files: Sequence[str]) -> str:
    """Digest of the :data:`EVIDENCE_INPUTS` among ``files`` (the evidence cache key)."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        if first_match(rel, EVIDENCE_INPUTS):
            data = (root / rel).read_bytes()
            digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()[:16]


def apply_sample_change(ws: Path) -> str:
    """Apply :data:`SAMPLE` (or, if the example moved on, edit a function of the same file)."""
    path, old, new = SAMPLE
    target = ws / path
    text = target.read_text()
    if old in text:
        target.write_text(text.replace(old, new, 1))
        return f"{path}: KVCache.append: `k.shape[-2]` -> `int(k.shape[-2])`"
    idx = index_source(path, text)
    funcs = [u for u in idx.units if u.kind == "function"] if isinstance(idx, FileUnits) else []
    if not funcs:
        raise FastCIError(f"{path}: no function to change for the demo")
    unit = funcs[-1]
    lines = text.splitlines(keepends=True)
    body = lines[unit.body_start - 1]
    indent = body[: len(body) - len(body.lstrip())]
    lines.insert(unit.body_start - 1, f"{indent}_demo_marker = None  # sample change by `make demo`\n")
    target.write_text("".join(lines))
    return f"{path}: {unit.qualname}: added a no-op statement"


@dataclass(frozen=True)
class Scratch:
    """The demo's scratch workspace: a one-commit copy of the repo with recorded evidence."""

    ws: Path
    commit: str
    config: Config
    bazel: Bazel
    store_path: Path


def prepare(echo: Callable[[str], None] = print, *, targets: str = TARGETS,
            reuse: bool = False) -> Scratch:
    """Copy the repository into the scratch workspace and make sure evidence is recorded.

    With ``reuse``, an existing clean scratch workspace with a store is used as it is, but
    only while its sources are the checkout's (:func:`snapshot_is_current`): a benchmark
    must never measure old code. Otherwise the checkout is copied again (the evidence
    cache still spares the recording when the evidence inputs did not change).
    """
    base_dir = scratch_dir()
    ws, cache = base_dir / "workspace", base_dir / "evidence-cache"
    cache.mkdir(parents=True, exist_ok=True)
    cfg = load_config(ws, overrides={"targets": targets})
    if reuse and (ws / ".git").exists() and _readable_store(cfg.path(ws, "store"), echo) \
            and not _git(ws, "status", "--porcelain", "--untracked-files=no").strip() \
            and snapshot_is_current(REPO, ws, echo):
        commit = _git(ws, "rev-parse", "HEAD").strip()
        echo(f"== reusing the scratch snapshot {commit[:12]} in {ws} and its evidence")
        return Scratch(ws, commit, cfg, Bazel(ws, cfg.bazel, python=sys.executable),
                       cfg.path(ws, "store"))
    echo(f"== scratch copy of {REPO} in {ws} (your checkout is not touched)")
    commit, digest = make_workspace(REPO, ws)
    cfg = load_config(ws, overrides={"targets": targets})
    store_path = cfg.path(ws, "store")
    store_path.parent.mkdir(parents=True, exist_ok=True)
    bazel = Bazel(ws, cfg.bazel, python=sys.executable)
    from fastci.evidence.record.environment import current_fingerprint

    from fastci.evidence.store.schema import SCHEMA_VERSION

    cached = cache / f"{digest}-{current_fingerprint()}-v{SCHEMA_VERSION}.db"
    if cached.exists() and _readable_store(cached, echo):
        shutil.copyfile(cached, store_path)
        echo(f"== evidence: reusing the recording cached for these example sources ({cached.name})")
        _restamp(store_path, commit, echo)
    else:
        echo(f"== recording evidence: bazel test {targets} --config=fastci_record "
             "(cold; cached for the next run)")
        from fastci.evidence.fill import record

        started = time.perf_counter()
        out = record(ws, [targets], store_path, bazel=bazel)
        echo("   " + out.replace("\n", "\n   "))
        echo(f"   recorded in {time.perf_counter() - started:.0f} s")
        shutil.copyfile(store_path, cached)
    return Scratch(ws, commit, cfg, bazel, store_path)


def source_digest(root: Path) -> str:
    """Digest of every source file of ``root`` (:func:`source_files`: paths and contents).

    ``user.bazelrc`` is left out: :func:`make_workspace` writes its own into the snapshot.
    """
    digest = hashlib.sha256()
    for rel in source_files(root):
        if rel == "user.bazelrc":
            continue
        digest.update(rel.encode() + b"\0" + hashlib.sha256((root / rel).read_bytes()).digest())
    return digest.hexdigest()[:16]


def snapshot_is_current(repo: Path, ws: Path, echo: Callable[[str], None] = print) -> bool:
    """Whether the scratch snapshot ``ws`` holds exactly ``repo``'s current sources."""
    try:
        mine, theirs = source_digest(repo), source_digest(ws)
    except (FastCIError, OSError) as exc:  # unreadable: copy again (the safe side)
        echo(f"== not reusing the scratch snapshot: {exc}")
        return False
    if mine != theirs:
        echo(f"== not reusing the scratch snapshot: its sources ({theirs}) are not the "
             f"checkout's ({mine})")
    return mine == theirs


def _readable_store(path: Path, echo: Callable[[str], None]) -> bool:
    """Whether ``path`` is an evidence store this FastCI reads (another schema is re-recorded)."""
    if not path.exists():
        return False
    try:
        EvidenceStore.open(path).close()
    except FastCIError as exc:
        echo(f"== not reusing {path}: {exc}")
        return False
    return True


def _restamp(store_path: Path, commit: str, echo: Callable[[str], None]) -> None:
    """Point cached evidence at this snapshot's commit.

    The cache key covers every file the evidence depends on, so evidence recorded on
    an earlier snapshot with the same key is evidence of this one; only files outside
    the key (docs, FastCI's analyzer) differ.
    """
    with EvidenceStore.open(store_path) as store:
        old = {c for c in store.conn.execute("SELECT DISTINCT commit_sha FROM run")}
        if old != {(commit,)}:
            store.conn.execute("UPDATE run SET commit_sha = ?", (commit,))
            echo(f"   (recorded on an earlier snapshot with identical example sources; "
                 f"re-stamped to {commit[:12]})")


def run_demo(echo: Callable[[str], None] = print, *, keep_change: bool = False) -> int:
    """Run the demo; returns the exit code (0 when every planned test passed)."""
    t0 = time.perf_counter()
    echo("== 1-2. scratch workspace and evidence")
    sc = prepare(echo)
    ws, cfg, bazel = sc.ws, sc.config, sc.bazel
    try:
        echo("== 3. sample change: " + apply_sample_change(ws))
        echo(_git(ws, "diff", "--stat").rstrip())
        echo("== 4. fastci plan")
        with EvidenceStore.open(sc.store_path) as store:
            analysis = analyze(ws, cfg, base=sc.commit,
                               declared=Query(lambda root, c: bazel_declared(root, c, bazel=bazel)),
                               store=store)
            # Tie the plan to the tree it describes, as `fastci plan` does.
            analysis = dataclasses.replace(
                analysis, plan=dataclasses.replace(analysis.plan, tree=plan_tree(ws)))
            dump_plan(analysis.plan, cfg.path(ws, "plan"))
            for line in summarize(analysis):
                echo(line)
            echo("== 5. why (fastci explain)")
            for d in analysis.selection.selected:
                for line in explain(analysis.selection, d.test, store)[:8]:
                    echo("   " + line)
            for d in analysis.selection.skipped[:3]:
                echo(f"   {d.test}: SKIPPED: {d.why}")
            if len(analysis.selection.skipped) > 3:
                echo(f"   ... and {len(analysis.selection.skipped) - 3} more skipped, same reason")
            echo("== 6. fastci run: only what the plan says")
            report = execute(ws, analysis.plan, cfg, store=store, bazel=bazel, echo=echo)
        sel = analysis.selection
        echo(f"== done in {time.perf_counter() - t0:.0f} s: ran {len(sel.selected)} of "
             f"{len(sel.decisions)} gpu_tests, skipped {len(sel.skipped)}; {report.summary_line()}")
        return 0 if report.failed == 0 else 1
    finally:
        if not keep_change:
            _git(ws, "checkout", "-q", "--", ".")
        bazel.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m bench.demo``."""
    parser = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--clean", action="store_true", help="remove the scratch directory and exit")
    parser.add_argument("--keep-change", action="store_true", help="leave the sample change applied")
    args = parser.parse_args(argv)
    if args.clean:
        ws = scratch_dir() / "workspace"
        if ws.exists():
            subprocess.run(["bazel", "clean", "--expunge"], cwd=ws, capture_output=True, check=False)
        shutil.rmtree(scratch_dir(), ignore_errors=True)
        print(f"removed {scratch_dir()}")
        return 0
    try:
        return run_demo(keep_change=args.keep_change)
    except FastCIError as exc:
        print(f"fastci demo: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
