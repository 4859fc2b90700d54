"""Third-party distributions a process imported (fastci.evidence.record.distributions)."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, Iterator

import pytest

from fastci.evidence.record import distributions, trace


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    caches = (distributions._ROOTS, distributions._HEADS, distributions._RUNNING)
    for cache in caches:  # every index and answer forgotten, before and after
        cache.clear()
    yield
    for cache in caches:
        cache.clear()


def module(name: str, file: str | None, *, package: bool = False) -> types.ModuleType:
    m = types.ModuleType(name)
    if file is not None:
        m.__file__ = file
    if package:
        m.__path__ = [os.path.dirname(file)] if file else []
    return m


def site(tmp_path: Path) -> Path:
    """A fake site-packages: top_level.txt, RECORD-only, a namespace, an editable install."""
    sp = tmp_path / "lib" / "site-packages"
    dists = {
        "PyYAML-6.0.1.dist-info": {"top_level.txt": "_yaml\nyaml\n", "RECORD": "yaml/__init__.py,,\n"},
        "typing_extensions-4.9.0.dist-info": {"RECORD": "typing_extensions.py,sha256=x,1\n"},
        "attrs-23.2.0.dist-info": {"RECORD": "attr/__init__.py,,\nattrs/__init__.py,,\n"},
        "protobuf-4.25.0.dist-info": {"RECORD": "google/protobuf/__init__.py,,\n"},
        "googleapis_common_protos-1.62.0.dist-info": {"RECORD": "google/api/__init__.py,,\n"},
        "mypkg-0.1.0.dist-info": {"top_level.txt": "mypkg\n", "direct_url.json":
                                  '{"url": "file:///src", "dir_info": {"editable": true}}'},
        "legacy.egg-info": {"PKG-INFO": "Name: legacy\nVersion: 1.2\n", "top_level.txt": "legacy\n"},
    }
    for folder, files in dists.items():
        (sp / folder).mkdir(parents=True)
        for name, text in files.items():
            (sp / folder / name).write_text(text)
    return sp


def test_modules_map_to_their_distributions(tmp_path: Path) -> None:
    sp = site(tmp_path)
    stdlib = tmp_path / "lib" / "python3.11"
    stdlib.mkdir()
    mods = {
        "yaml": module("yaml", f"{sp}/yaml/__init__.py", package=True),
        "yaml.loader": module("yaml.loader", f"{sp}/yaml/loader.py"),
        "_yaml": module("_yaml", f"{sp}/_yaml/__init__.py", package=True),
        "typing_extensions": module("typing_extensions", f"{sp}/typing_extensions.py"),
        "attr": module("attr", f"{sp}/attr/__init__.py", package=True),
        "google": module("google", None, package=True),  # a namespace package
        "google.protobuf": module("google.protobuf", f"{sp}/google/protobuf/__init__.py",
                                  package=True),
        "mypkg": module("mypkg", f"{sp}/mypkg/__init__.py", package=True),  # editable: ours
        "legacy": module("legacy", f"{sp}/legacy.py"),
        "json": module("json", f"{stdlib}/json/__init__.py", package=True),
        "sys": module("sys", None),
        "mine": module("mine", f"{tmp_path}/repo/mine.py"),
        "fastci": sys.modules["fastci"],
        "__editable___mypkg_finder": module("__editable___mypkg_finder", f"{sp}/x.py"),
    }
    assert distributions.imported(mods) == {
        "attrs": "23.2.0", "legacy": "1.2", "protobuf": "4.25.0", "pyyaml": "6.0.1",
        "typing-extensions": "4.9.0"}


def test_a_later_stop_reads_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sp = site(tmp_path)
    mods = {"yaml": module("yaml", f"{sp}/yaml/__init__.py", package=True),
            "attr": module("attr", f"{sp}/attr/__init__.py", package=True)}
    first = distributions.imported(mods)

    def no_io(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"file I/O at a cached stop: {args}")

    monkeypatch.setattr(builtins, "open", no_io)
    monkeypatch.setattr(os, "listdir", no_io)
    assert distributions.imported(mods) == first == {"attrs": "23.2.0", "pyyaml": "6.0.1"}


def test_canonical_names() -> None:
    assert distributions.canonical("PyYAML") == "pyyaml"
    assert distributions.canonical("typing_extensions") == "typing-extensions"
    assert distributions.canonical("zope.Interface") == "zope-interface"


DRIVER = '''
import sys
from pathlib import Path
from fastci.evidence.record.recorder import Recorder

rec = Recorder("//t:d_test", Path(sys.argv[1]), repo_root=Path(__file__).parent,
               workload={}, gpus=0)
rec.start()
import yaml
import google.protobuf
import pkg.work
pkg.work.run()
print(rec.stop("passed"))
'''


def test_recorded_process_lists_imported_distributions(tmp_path: Path) -> None:
    import google.protobuf
    import yaml  # type: ignore[import-untyped]
    from importlib.metadata import version

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "work.py").write_text("def run():\n    return 1\n")
    (repo / "drive.py").write_text(textwrap.dedent(DRIVER))
    out = tmp_path / "traces"
    res = subprocess.run([sys.executable, str(repo / "drive.py"), str(out)], cwd=repo,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (t,) = [trace.read(p) for p in out.glob("*.trace")]
    got = {d.name: d.version for d in t.distributions}
    assert got["pyyaml"] == version("PyYAML") == yaml.__version__
    assert got["protobuf"] == version("protobuf") == google.protobuf.__version__
    assert [d.name for d in t.distributions] == sorted(got)
    # The repository's own code, FastCI and the editable installs are not third-party.
    assert not {"pkg", "fastci", "microllm"} & set(got)
    assert "torch" not in got  # never imported here


def test_running_answer_for_sys_modules_equals_a_full_pass() -> None:
    # In a fresh process: the answer kept up to date import by import equals a full pass
    # over a copy of sys.modules (which takes the non-incremental path), and a removed
    # module is forgotten.
    code = textwrap.dedent('''
        import sys
        from fastci.evidence.record import distributions as d
        seen = []
        for name in ("json", "pluggy", "iniconfig", "mpmath", "google.protobuf"):
            __import__(name)
            running = d.imported()
            full = d.imported(dict(sys.modules))
            assert running == full, (name, running, full)
            seen.append(sorted(running))
        assert "protobuf" in seen[-1] and "mpmath" in seen[-1] and "pluggy" in seen[1]
        for name in [n for n in sys.modules if n == "mpmath" or n.startswith("mpmath.")]:
            del sys.modules[name]
        assert "mpmath" not in d.imported() and d.imported() == d.imported(dict(sys.modules))
        print("ok")
        ''')
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert res.stdout.strip() == "ok", res.stdout + res.stderr
