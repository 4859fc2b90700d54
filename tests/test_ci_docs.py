"""The CI integration docs stay true: docs/CI.md, docs/ci/github-actions.yml, docs/ci/fastci-ci.sh.

- The workflow parses (PyYAML) and has the structure docs/CI.md describes: its triggers,
  the jobs main/pr/nightly on GPU runners with timeouts and concurrency groups, full-history
  checkouts, downloads outside the checkout, no `${{ }}` inside `run:` (script injection).
- Every `fastci ...` command line in the workflow's `run:` blocks, in the shell script and in
  the bash/sh blocks of docs/CI.md parses with FastCI's real argument parser
  (``build_parser(_load_commands()).parse_args``). Shell substitutions become a placeholder
  (``${VAR:-default}`` its default), continuation lines are joined, heredoc bodies skipped.
- The YAML excerpts of docs/CI.md's GitHub Actions section are verbatim parts of the workflow.
- The script passes ``bash -n`` and, run with a stand-in ``fastci`` that logs its arguments in
  a scratch repository, calls the commands each mode promises (and those parse too), writes
  its outputs, keeps going after a failure and exits with it, and refuses an artifact
  directory that would become part of the change.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from argparse import Namespace
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from fastci.cli.app import _load_commands, build_parser

ROOT = Path(__file__).resolve().parents[1]
CI_MD = ROOT / "docs" / "CI.md"
WORKFLOW = ROOT / "docs" / "ci" / "github-actions.yml"
SCRIPT = ROOT / "docs" / "ci" / "fastci-ci.sh"

#: What an unresolvable shell substitution becomes: a word that is also a valid number.
PLACEHOLDER = "1"


# --- extracting `fastci ...` commands from shell text -----------------------------------------

_HEREDOC = re.compile(r"(?<!<)<<(?!<)-?\s*(['\"]?)([A-Za-z_]\w*)\1")
_PREFILTER = re.compile(r"(^|[\s;|&(!{])(\S*/)?fastci(\s|$)")
_CONTROL = {";", "&&", "||", "|", "&", "(", ")", ";;", "|&"}
_KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "time", "!", "{", "}", "exec"}


def shell_lines(text: str, first_line: int = 1) -> Iterator[tuple[int, str]]:
    """(line number, logical line): ``\\`` continuations joined, heredoc bodies left out."""
    buf, start, heredoc = "", 0, None
    for n, line in enumerate(text.splitlines(), first_line):
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        if not buf:
            start = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        full = buf + line
        buf = ""
        yield start, full
        m = _HEREDOC.search(full)
        if m:
            heredoc = m.group(2)
    if buf:
        yield start, buf


def substitute(line: str) -> str:
    """Shell substitutions replaced: ``${VAR:-default}`` by its default, the rest by PLACEHOLDER."""
    line = re.sub(r"\$\{\{.*?\}\}", PLACEHOLDER, line)  # GitHub expressions
    previous = None
    while previous != line:  # $(...), innermost first
        previous = line
        line = re.sub(r"\$\([^()]*\)", PLACEHOLDER, line)
    line = re.sub(r"\$\{\w+:-([^{}$\"']*)\}", lambda m: m.group(1), line)
    line = re.sub(r"\$\{[^{}]*\}", PLACEHOLDER, line)
    line = re.sub(r"\$(\w+|[@*#?$!-])", PLACEHOLDER, line)
    line = re.sub(r"`[^`]*`", PLACEHOLDER, line)
    return line


def commands_in_line(line: str) -> list[list[str]]:
    """The argv (after ``fastci``) of every simple command in ``line`` that runs fastci."""
    if not _PREFILTER.search(line):
        return []
    text = re.sub(r"(?<=\s)\d+(?=[<>])", "", substitute(line))  # `2>&1` -> ` >&1`
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    tokens = list(lexer)  # ValueError (an open quote) reaches the caller
    for i, token in enumerate(tokens):
        if token.startswith("#"):
            tokens = tokens[:i]
            break
    found: list[list[str]] = []
    current: list[str] = []
    skip = False
    for token in [*tokens, ";"]:
        if skip:
            skip = False
            continue
        if token in _CONTROL:
            found.append(current)
            current = []
        elif set(token) <= set("<>&|;()") and ("<" in token or ">" in token):
            skip = True  # a redirection and its target
        else:
            current.append(token)
    out: list[list[str]] = []
    for words in found:
        while words and (words[0] in _KEYWORDS or re.fullmatch(r"\w+=.*", words[0])):
            words = words[1:]
        if words and (words[0] == "fastci" or words[0].endswith("/fastci")):
            out.append(words[1:])
        elif len(words) >= 3 and Path(words[0]).name.startswith("python") and \
                words[1:3] == ["-m", "fastci"]:
            out.append(words[3:])
    return out


def extract(text: str, where: str, first_line: int = 1) -> list[tuple[str, list[str]]]:
    """(``where:line``, argv) of every fastci command in shell ``text``."""
    out: list[tuple[str, list[str]]] = []
    for n, line in shell_lines(text, first_line):
        try:
            cmds = commands_in_line(line)
        except ValueError as exc:
            pytest.fail(f"{where}:{n}: cannot split the shell line ({exc}): {line.strip()}")
        out.extend((f"{where}:{n}", argv) for argv in cmds)
    return out


@functools.lru_cache(maxsize=1)
def _commands() -> list[Any]:
    return _load_commands()


def parse(argv: list[str]) -> Namespace:
    """FastCI's own parser on ``argv``; raises AssertionError with the reason when it exits."""
    parser = build_parser(_commands(), argv)
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0 and ("-h" in argv or "--help" in argv):
            return Namespace(command="help")
        raise AssertionError(f"exit {exc.code}") from None


def check_all(found: list[tuple[str, list[str]]], capsys: pytest.CaptureFixture[str]) \
        -> list[tuple[str, list[str], Namespace]]:
    """Parse every command; fail with every line that does not parse."""
    bad, parsed = [], []
    for where, argv in found:
        try:
            parsed.append((where, argv, parse(argv)))
        except AssertionError as exc:
            err = capsys.readouterr().err.strip().splitlines()
            bad.append(f"{where}: fastci {shlex.join(argv)}: {exc}: {err[-1] if err else ''}")
    assert not bad, "commands the real parser rejects:\n" + "\n".join(bad)
    return parsed


def subcommand(ns: Namespace) -> str:
    action = getattr(ns, "action", None)
    return f"{ns.command} {action}" if ns.command == "evidence" and action else ns.command


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Parse from a scratch folder: a failed `plan` parse withdraws `./.fastci/plan.json`."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_extractor_understands_the_shell_it_meets() -> None:
    cases = {
        'fastci explain --base origin/main "$test_id" 2>&1 || true':
            [["explain", "--base", "origin/main", PLACEHOLDER]],
        'if [ ${#files[@]} -gt 0 ]; then fastci evidence import "${files[@]}"; fi':
            [["evidence", "import", PLACEHOLDER]],
        'fastci plan --shadow --base "${SINCE:-HEAD}" | tee "$RUNNER_TEMP/plan.txt"':
            [["plan", "--shadow", "--base", "HEAD"]],
        'FASTCI_PRUNE=safe .venv/bin/fastci run --fail-fast > out.txt':
            [["run", "--fail-fast"]],
        'python -m fastci eval "$(git rev-parse HEAD~1)..HEAD" --out /tmp/x':
            [["eval", "1..HEAD", "--out", "/tmp/x"]],
        'echo "fastci plan is a command in a string" >> "$GITHUB_STEP_SUMMARY"': [],
        'FASTCI_ARTIFACTS=/tmp/a docs/ci/fastci-ci.sh pr   # fastci plan in a comment': [],
    }
    for line, expected in cases.items():
        assert commands_in_line(line) == expected, line
    text = ("fastci record \\\n  --bazel-flag=--config=x\n"
            "cat <<'EOF'\nfastci bogus\nEOF\nfastci run\n")
    assert extract(text, "t") == [("t:1", ["record", "--bazel-flag=--config=x"]),
                                  ("t:6", ["run"])]


def test_a_command_that_does_not_parse_is_reported(in_tmp: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(AssertionError, match="--bazel-flag"):
        check_all([("x:1", ["record", "--bazel-flag", "--config=remote_cache"])], capsys)
    with pytest.raises(AssertionError, match="x:2"):
        check_all([("x:2", ["plan", "--no-such-flag"])], capsys)
    assert not (in_tmp / ".fastci").exists()


# --- the workflow --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def workflow() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def steps(job: str) -> list[dict[str, Any]]:
    return list(workflow()["jobs"][job]["steps"])


def run_blocks(job: str) -> Iterator[tuple[str, str, int]]:
    """(step name, run text, line of the step's `run:` in the file) of each run step."""
    lines = WORKFLOW.read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if line == f"  {job}:")
    for step in steps(job):
        if "run" not in step:
            continue
        name = step.get("name", "?")
        at = next((i for i in range(at, len(lines))
                   if re.fullmatch(rf"\s*- name: {re.escape(name)}", lines[i])), at)
        run_at = next((i for i in range(at, len(lines)) if re.match(r"\s*run:", lines[i])), at)
        at = run_at
        # The line of the command when `run:` holds it, else the first line of the block.
        yield name, step["run"], run_at + (1 if lines[run_at].rstrip().endswith("|") else 0) + 1


def workflow_commands(job: str | None = None) -> list[tuple[str, list[str]]]:
    jobs = [job] if job else list(workflow()["jobs"])
    found = []
    for j in jobs:
        for name, text, line in run_blocks(j):
            found.extend(extract(text, f"{WORKFLOW.name}:{j}:{name!r}", line))
    return found


def test_workflow_triggers_and_defaults() -> None:
    wf = workflow()
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as true
    assert isinstance(on, dict)
    assert {"push", "pull_request", "schedule"} <= set(on), sorted(on)
    assert "main" in on["push"]["branches"]
    assert on["schedule"] and all("cron" in s for s in on["schedule"])
    assert wf["defaults"]["run"]["shell"] == "bash"  # -eo pipefail: `fastci run | tee` fails
    assert wf["permissions"]["actions"] == "read"  # artifacts of other runs


def test_workflow_jobs_run_on_gpu_runners_with_limits() -> None:
    jobs = workflow()["jobs"]
    assert {"main", "pr", "nightly"} <= set(jobs)
    groups = set()
    for name, job in jobs.items():
        assert {"self-hosted", "gpu"} <= set(job["runs-on"]), name
        assert isinstance(job["timeout-minutes"], int) and job["timeout-minutes"] > 0, name
        assert job["concurrency"]["group"], name
        groups.add(job["concurrency"]["group"])
        assert "if" in job, f"{name}: every job names the events it runs on"
    assert len(groups) == len(jobs)
    assert jobs["main"]["concurrency"]["cancel-in-progress"] is False  # never a half recording
    assert jobs["pr"]["concurrency"]["cancel-in-progress"] is True
    assert "push" in jobs["main"]["if"] and "pull_request" in jobs["pr"]["if"]
    assert jobs["nightly"]["needs"] == "main" and "schedule" in jobs["nightly"]["if"]


def test_workflow_steps_are_well_formed() -> None:
    for job in workflow()["jobs"]:
        for step in steps(job):
            assert ("uses" in step) != ("run" in step), f"{job}: {step}"
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), step["uses"]
                for key, value in (step.get("with") or {}).items():
                    if key == "path":  # downloads and uploads never land in the checkout
                        for p in filter(None, map(str.strip, str(value).splitlines())):
                            assert p.startswith("${{ runner.temp }}/"), f"{job}: {p}"
                if step["uses"].startswith("actions/checkout@"):
                    assert step["with"]["fetch-depth"] == 0, job
            else:
                assert step.get("name"), f"{job}: a run step without a name: {step['run'][:60]}"
                assert "${{" not in step["run"], \
                    f"{job}: {step['name']}: pass expressions through env:, not inside run:"
        first = steps(job)[0]
        assert first["uses"].startswith("actions/checkout@"), job


def _uses(job: str, action: str) -> list[dict[str, Any]]:
    return [s for s in steps(job) if s.get("uses", "").startswith(action + "@")]


def test_workflow_moves_the_store_through_artifacts() -> None:
    uploaded = {s["with"]["name"] for j in workflow()["jobs"]
                for s in _uses(j, "actions/upload-artifact")}
    assert {"fastci-store", "fastci-nightly-evidence", "fastci-nightly-report"} <= uploaded
    for job in workflow()["jobs"]:
        for s in _uses(job, "actions/download-artifact"):
            assert s["with"]["name"] in uploaded, (job, s["with"]["name"])
            assert "run-id" in s["with"] and "github-token" in s["with"], job
    for job in ("main", "pr", "nightly", "explain"):
        assert any(s["with"]["name"] == "fastci-store"
                   for s in _uses(job, "actions/download-artifact")), job
    store = [s for s in _uses("main", "actions/upload-artifact")
             if s["with"]["name"] == "fastci-store"]
    assert len(store) == 1 and "steps.import.outcome == 'success'" in store[0]["if"]


def test_workflow_reports_back() -> None:
    pr_text = "\n".join(text for _, text, _ in run_blocks("pr"))
    assert "GITHUB_STEP_SUMMARY" in pr_text
    assert _uses("pr", "actions/github-script")  # the PR comment
    explain_text = "\n".join(text for _, text, _ in run_blocks("explain"))
    assert "gh pr comment" in explain_text and "--body-file" in explain_text
    tell = [s for s in steps("nightly") if "failure()" in str(s.get("if", ""))]
    assert tell and "gh issue create" in tell[-1]["run"]
    assert "miss-report-*.json" in "\n".join(text for _, text, _ in run_blocks("nightly"))


def test_every_fastci_command_in_the_workflow_parses(
        in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parsed = check_all(workflow_commands(), capsys)
    assert len(parsed) >= 14, [w for w, _, _ in parsed]
    by_job: dict[str, list[Namespace]] = {}
    for where, _, ns in parsed:
        by_job.setdefault(where.split(":")[1], []).append(ns)
    kinds = {j: {subcommand(ns) for ns in found} for j, found in by_job.items()}
    assert {"evidence import", "record", "calibrate", "evidence export"} <= kinds["main"]
    assert {"evidence import", "plan", "run"} <= kinds["pr"]
    assert {"evidence import", "explain"} <= kinds["explain"]
    assert {"evidence import", "plan", "run", "eval", "evidence export"} <= kinds["nightly"]
    pr_plan = next(ns for ns in by_job["pr"] if ns.command == "plan")
    assert pr_plan.base == "origin/main" and not pr_plan.shadow
    nightly_plan = next(ns for ns in by_job["nightly"] if ns.command == "plan")
    assert nightly_plan.shadow
    ev = next(ns for ns in by_job["nightly"] if ns.command == "eval")
    assert ev.faults >= 1 and ev.changes and ".." in ev.changes[0] and ev.out


# --- docs/CI.md ----------------------------------------------------------------------------------


def code_blocks(text: str) -> Iterator[tuple[str, str, int, str]]:
    """(language, body, first body line, section heading) of each fenced block."""
    section, lang, start = "", None, 0
    body: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if lang is None:
            if line.startswith("## "):
                section = line[3:].strip()
            m = re.match(r"```(\w*)\s*$", line)
            if m:
                lang, body, start = m.group(1), [], n + 1
        elif line.startswith("```"):
            yield lang, "\n".join(body), start, section
            lang = None
        else:
            body.append(line)


def test_ci_md_shell_commands_parse(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = []
    for lang, body, start, _ in code_blocks(CI_MD.read_text(encoding="utf-8")):
        if lang in ("bash", "sh", "shell"):
            found.extend(extract(body, CI_MD.name, start))
    parsed = check_all(found, capsys)
    assert len(parsed) >= 8, found
    assert {"evidence import", "plan", "explain", "run", "record", "eval"} <= \
        {subcommand(ns) for _, _, ns in parsed}


def test_ci_md_workflow_excerpts_are_verbatim() -> None:
    lines = WORKFLOW.read_text(encoding="utf-8").splitlines()
    checked = 0
    for lang, body, start, section in code_blocks(CI_MD.read_text(encoding="utf-8")):
        if lang not in ("yaml", "yml"):
            continue
        assert yaml.safe_load(textwrap.dedent(body)) is not None, f"CI.md:{start}"
        if section != "GitHub Actions":
            continue
        want = textwrap.dedent(body).splitlines()
        n = len(want)
        assert any(textwrap.dedent("\n".join(lines[i:i + n])).splitlines() == want
                   for i in range(len(lines) - n + 1)), \
            f"CI.md:{start}: this excerpt is not in {WORKFLOW.name} as written"
        checked += 1
    assert checked >= 6


def test_ci_md_links_resolve() -> None:
    text = CI_MD.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        if "://" not in link:
            assert (CI_MD.parent / link).exists(), link
    assert "docs/ci/github-actions.yml" in text and "docs/ci/fastci-ci.sh" in text


# --- docs/ci/fastci-ci.sh ------------------------------------------------------------------------


def test_script_syntax() -> None:
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert SCRIPT.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in SCRIPT.read_text(encoding="utf-8")
    assert os.access(SCRIPT, os.X_OK)


def test_script_commands_parse(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parsed = check_all(extract(SCRIPT.read_text(encoding="utf-8"), SCRIPT.name), capsys)
    assert len(parsed) >= 8, parsed
    assert {"evidence import", "evidence export", "record", "calibrate", "plan", "run",
            "eval"} <= {subcommand(ns) for _, _, ns in parsed}


FAKE_FASTCI = r'''
import json, os, pathlib, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\n")
cmd = argv[0] if argv else ""
failing = cmd in os.environ.get("FAKE_FAIL", "").split(",")
def opt(name):
    return argv[argv.index(name) + 1] if name in argv else None
own = pathlib.Path(".fastci")
if cmd in ("record", "evidence") and argv[1:2] != ["export"]:
    own.mkdir(exist_ok=True)
    (own / "evidence.db").write_text("store")
if cmd == "evidence" and argv[1] == "export":
    pathlib.Path(opt("--out")).write_text("export")
elif cmd == "calibrate":
    (own / "calibration.db").write_text("calibration")
elif cmd == "plan":
    own.mkdir(exist_ok=True)
    mode = "shadow" if "--shadow" in argv else "selective"
    (own / "plan.json").write_text(json.dumps({
        "version": 1, "mode": mode, "reason": "r", "tests": [{"id": "//a:t"}],
        "skipped": [{"id": "//b:skipped_test", "why": "not affected: no changed unit"}]}))
    print(f"fastci plan: {mode}: 1 of 2 tests selected, 1 skipped")
elif cmd == "run":
    if json.loads((own / "plan.json").read_text()).get("mode") == "shadow":
        (own / "runs").mkdir(exist_ok=True)
        (own / "runs" / "miss-report-1.json").write_text("[]")
    print("0 passed, 1 failed" if failing else "1 passed, 0 failed")
elif cmd == "eval":
    out = pathlib.Path(opt("--out"))
    out.mkdir(parents=True, exist_ok=True)
    for name in ("results.jsonl", "summary.md", "report.html"):
        (out / name).write_text(name)
sys.exit(1 if failing else 0)
'''


@pytest.fixture
def sandbox(tmp_path: Path) -> dict[str, Any]:
    """A git repository with three commits, a fake `fastci` on PATH, an artifact dir outside."""
    repo, bin_dir, art = tmp_path / "repo", tmp_path / "bin", tmp_path / "artifacts"
    repo.mkdir()
    bin_dir.mkdir()
    fake = bin_dir / "fastci"
    fake.write_text(f"#!{sys.executable}\n{FAKE_FASTCI}")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "FAKE_LOG": str(tmp_path / "calls.jsonl"), "FASTCI_ARTIFACTS": str(art),
           "FASTCI_PYTHON": sys.executable, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1"}
    for key in ("FASTCI_STORE", "FASTCI_CALIBRATION", "FASTCI_PLAN", "FASTCI_BASE",
                "FASTCI_SINCE", "FASTCI_REMOTE_CACHE", "FASTCI_RECORD", "FASTCI_CALIBRATE",
                "GITHUB_STEP_SUMMARY"):
        env.pop(key, None)

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, env=env, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    (repo / ".gitignore").write_text("/user.bazelrc\n")
    for i in range(3):
        (repo / f"f{i}.py").write_text(f"x = {i}\n")
        git("add", "-A")
        git("-c", "commit.gpgsign=false", "commit", "-q", "-m", f"c{i}")
    return {"repo": repo, "env": env, "art": art, "log": tmp_path / "calls.jsonl", "git": git}


def run_script(box: dict[str, Any], mode: str, **extra: str) -> subprocess.CompletedProcess[str]:
    box["log"].unlink(missing_ok=True)
    return subprocess.run(["bash", str(SCRIPT), mode], cwd=box["repo"],
                          env={**box["env"], **extra}, capture_output=True, text=True,
                          timeout=120, check=False)


def calls(box: dict[str, Any]) -> list[list[str]]:
    if not box["log"].exists():
        return []
    return [json.loads(line) for line in box["log"].read_text().splitlines()]


def test_script_main_mode(sandbox: dict[str, Any], in_tmp: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    (sandbox["art"] / "in").mkdir(parents=True)
    (sandbox["art"] / "in" / "evidence-main.jsonl.gz").write_text("old")
    (sandbox["art"] / "in" / "evidence-nightly.jsonl.gz").write_text("night")
    res = run_script(sandbox, "main", FASTCI_CALIBRATE="1")
    assert res.returncode == 0, res.stderr
    got = calls(sandbox)
    check_all([("main", argv) for argv in got], capsys)
    assert [argv[:2] for argv in got] == [["evidence", "import"], ["record"], ["calibrate"],
                                         ["evidence", "export"]]
    assert sorted(Path(p).name for p in got[0][2:]) == ["evidence-main.jsonl.gz",
                                                        "evidence-nightly.jsonl.gz"]
    out = sandbox["art"] / "out"
    assert (out / "evidence-main.jsonl.gz").read_text() == "export"
    assert (out / "calibration.db").read_text() == "calibration"
    # A calibration-only night, and a recording that fails: still exported, exit 1.
    res = run_script(sandbox, "main", FASTCI_RECORD="0", FASTCI_CALIBRATE="1")
    assert res.returncode == 0 and ["record"] not in calls(sandbox)
    res = run_script(sandbox, "main", FAKE_FAIL="record")
    assert res.returncode == 1, res.stderr
    assert [argv[:2] for argv in calls(sandbox)][-1] == ["evidence", "export"]
    # An import that fails: nothing recorded, nothing published.
    res = run_script(sandbox, "main", FAKE_FAIL="evidence")
    assert res.returncode == 2 and "not publishing" in res.stderr
    assert len(calls(sandbox)) == 1


def test_script_pr_mode(sandbox: dict[str, Any], in_tmp: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    res = run_script(sandbox, "pr")  # no evidence in: the store starts empty
    assert res.returncode == 0, res.stderr
    got = calls(sandbox)
    check_all([("pr", argv) for argv in got], capsys)
    assert got == [["plan", "--base", "origin/main"], ["run"]]
    out = sandbox["art"] / "out"
    summary = (out / "summary.md").read_text()
    assert "1 of 2 tests selected" in summary and "**Result:** 1 passed, 0 failed" in summary
    assert "`//b:skipped_test`: not affected" in summary
    assert json.loads((out / "plan.json").read_text())["mode"] == "selective"
    # A failing run: the summary is still written, and the script exits with the failure.
    res = run_script(sandbox, "pr", FAKE_FAIL="run", FASTCI_BASE="HEAD~1")
    assert res.returncode == 1
    assert calls(sandbox)[0] == ["plan", "--base", "HEAD~1"]
    assert "0 passed, 1 failed" in (out / "summary.md").read_text()
    assert "fastci explain --base HEAD~1 <test id>" in (out / "summary.md").read_text()
    # A failed plan: warned, and the run goes on (it runs everything).
    res = run_script(sandbox, "pr", FAKE_FAIL="plan")
    assert res.returncode == 0 and "fastci plan failed" in res.stderr
    assert [argv[0] for argv in calls(sandbox)] == ["plan", "run"]


def test_script_nightly_mode(sandbox: dict[str, Any], in_tmp: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    (sandbox["art"] / "in").mkdir(parents=True)
    (sandbox["art"] / "in" / "evidence-main.jsonl.gz").write_text("store")
    since, head = sandbox["git"]("rev-parse", "HEAD~2"), sandbox["git"]("rev-parse", "HEAD")
    res = run_script(sandbox, "nightly", FASTCI_SINCE="HEAD~2", FAKE_FAIL="eval")
    assert res.returncode == 1, res.stderr  # eval found a miss: the job goes red
    got = calls(sandbox)
    parsed = check_all([("nightly", argv) for argv in got], capsys)
    assert [subcommand(ns) for _, _, ns in parsed] == [
        "evidence import", "plan", "run", "eval", "evidence export"]
    assert got[1] == ["plan", "--shadow", "--base", since]
    ev = parsed[3][2]
    assert ev.changes == [f"{since}..{head}"] and ev.faults == 1
    out = sandbox["art"] / "out"
    assert (out / "eval" / "report.html").exists()
    assert (out / "misses" / "miss-report-1.json").exists()
    assert (out / "evidence-nightly.jsonl.gz").exists()
    # Commits all younger than a day: no merges "since 24 hours ago" to evaluate.
    res = run_script(sandbox, "nightly")
    assert res.returncode == 0, res.stderr
    assert "nothing to evaluate" in res.stderr
    assert [argv[0] for argv in calls(sandbox)] == ["evidence", "plan", "run", "evidence"]
    assert calls(sandbox)[1] == ["plan", "--shadow", "--base", "HEAD"]


def test_script_refuses_what_would_change_the_tree(sandbox: dict[str, Any]) -> None:
    inside = sandbox["repo"] / "fastci-artifacts"
    res = run_script(sandbox, "pr", FASTCI_ARTIFACTS=str(inside))
    assert res.returncode == 2 and "git does not ignore it" in res.stderr
    assert calls(sandbox) == []
    with open(sandbox["repo"] / ".git" / "info" / "exclude", "a") as f:
        f.write("/fastci-artifacts/\n")
    res = run_script(sandbox, "pr", FASTCI_ARTIFACTS=str(inside))
    assert res.returncode == 0, res.stderr
    # The remote cache goes to user.bazelrc only when git ignores it.
    res = run_script(sandbox, "pr", FASTCI_REMOTE_CACHE="grpc://cache:8980")
    assert res.returncode == 0, res.stderr
    assert "--remote_cache=grpc://cache:8980" in (sandbox["repo"] / "user.bazelrc").read_text()
    (sandbox["repo"] / ".gitignore").write_text("")
    res = run_script(sandbox, "pr", FASTCI_REMOTE_CACHE="grpc://cache:8980")
    assert res.returncode == 2 and "user.bazelrc is not git-ignored" in res.stderr


def test_script_usage(sandbox: dict[str, Any]) -> None:
    res = run_script(sandbox, "--help")
    assert res.returncode == 0 and "FASTCI_ARTIFACTS" in res.stdout
    res = run_script(sandbox, "deploy")
    assert res.returncode == 2 and "main|pr|nightly" in res.stderr
    env = {k: v for k, v in sandbox["env"].items() if k != "FASTCI_ARTIFACTS"}
    res = subprocess.run(["bash", str(SCRIPT), "pr"], cwd=sandbox["repo"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "set FASTCI_ARTIFACTS" in res.stderr
