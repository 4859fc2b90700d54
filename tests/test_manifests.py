"""Dependency manifests read for meaning (fastci.changes.manifests)."""

from __future__ import annotations

import json

import pytest

from fastci.changes.manifests import ManifestChange, is_manifest, read_change

PYPROJECT = b'''
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "demo"
version = "0.1.0"
description = "A demo"
classifiers = ["Programming Language :: Python"]
dependencies = ["PyYAML>=6", "protobuf>=5", "numpy>=1.26; python_version >= '3.10'"]

[project.optional-dependencies]
dev = ["pytest>=8"]

[tool.black]
line-length = 100

[tool.pytest.ini_options]
addopts = "-q"
'''


def change(path: str, old: bytes | None, new: bytes | None) -> ManifestChange:
    got = read_change(path, old, new)
    assert got is not None
    return got


def edit(old: bytes, new: bytes, text: bytes = PYPROJECT) -> bytes:
    assert old in text
    return text.replace(old, new)


def test_pyproject_pin_bump_names_the_distribution_only() -> None:
    got = change("pyproject.toml", PYPROJECT, edit(b'"PyYAML>=6"', b'"pyyaml >= 6.0.2"'))
    assert got.distributions == ("pyyaml",) and got.added == ()
    assert got.settings == () and got.inert == ()


def test_pyproject_inert_tables_and_metadata_change_nothing() -> None:
    new = edit(b"line-length = 100", b"line-length = 88")
    new = edit(b'description = "A demo"', b'description = "Another"', new)
    new = edit(b'classifiers = ["Programming Language :: Python"]', b"classifiers = []", new)
    got = change("pyproject.toml", PYPROJECT, new)
    assert got.distributions == () and got.settings == ()
    assert got.inert == ("[project].classifiers", "[project].description", "[tool.black]")


@pytest.mark.parametrize("old,new,part", [
    (b'addopts = "-q"', b'addopts = "-q -x"', "[tool.pytest]"),  # ini_options inside
    (b'"setuptools>=61"', b'"setuptools>=70"', "[build-system]"),
    (b'version = "0.1.0"', b'version = "0.2.0"', "[project].version"),
    (b'name = "demo"\n', b'name = "demo"\nrequires-python = ">=3.12"\n', "[project].requires-python"),
    (b"[tool.black]", b"[tool.fastci]\nx = 1\n[tool.black]", "[tool.fastci]"),
    (b"[tool.black]", b"[tool.unknowntool]\nx = 1\n[tool.black]", "[tool.unknowntool]"),
])
def test_pyproject_settings_that_can_change_tests(old: bytes, new: bytes, part: str) -> None:
    got = change("sub/pyproject.toml", PYPROJECT, edit(old, new))
    assert got.settings == (part,) and got.distributions == ()


def test_pyproject_added_removed_and_extras() -> None:
    new = edit(b'"protobuf>=5", ', b"")
    new = edit(b'["pytest>=8"]', b'["pytest>=8", "Flash_Attn"]', new)
    got = change("pyproject.toml", PYPROJECT, new)
    assert got.distributions == ("flash-attn", "protobuf") and got.added == ("flash-attn",)
    # A new file: everything in it is added; a deleted one: everything removed.
    assert change("pyproject.toml", None, PYPROJECT).added == ("numpy", "protobuf", "pytest",
                                                               "pyyaml")
    assert change("pyproject.toml", PYPROJECT, None).settings  # build-system etc. went away


def test_poetry_tables() -> None:
    old = b'[tool.poetry]\nname = "x"\ndescription = "d"\n[tool.poetry.dependencies]\n' \
          b'python = "^3.10"\nrequests = "^2.31"\n[tool.poetry.group.dev.dependencies]\npytest = "*"\n'
    got = change("pyproject.toml", old, old.replace(b'"^2.31"', b'"^2.32"')
                 .replace(b'"d"', b'"e"'))
    assert got.distributions == ("requests",) and got.inert == ("[tool.poetry].description",)
    got = change("pyproject.toml", old, old.replace(b'"^3.10"', b'"^3.11"'))
    assert got.settings == ("[tool.poetry.dependencies].python",) and not got.distributions


def test_unreadable_manifests_are_unknown() -> None:
    assert read_change("pyproject.toml", PYPROJECT, b"[project\n") is None
    assert read_change("pyproject.toml", PYPROJECT, b"\xff\xfe") is None
    assert read_change("requirements.txt", b"torch\n", b"https://x.org/a.whl\n") is None
    assert read_change("setup.py", b"", b"x") is None  # code: never read here
    bad = edit(b'"PyYAML>=6"', b'"./local/pkg"')
    assert read_change("pyproject.toml", PYPROJECT, bad) is None


def test_requirements_lines_options_and_includes() -> None:
    old = b"-r base.txt\n# pins\ntorch==2.3.0  # the GPU build\nPyYAML==6.0.1 \\\n    --hash=sha256:aa\n"
    got = change("requirements-dev.txt", old, old.replace(b"6.0.1", b"6.0.2")
                 .replace(b"# pins", b"# pinned versions"))
    assert got.distributions == ("pyyaml",) and not got.settings
    got = change("requirements/ci.txt", old, old.replace(b"-r base.txt", b"-r other.txt"))
    assert got.settings and not got.distributions  # an include changed: unknown reach
    got = change("constraints.txt", old, old + b"--extra-index-url https://example.org\n")
    assert got.settings
    assert change("requirements.in", old, old).distributions == ()


def test_setup_cfg() -> None:
    old = b"[metadata]\nname = x\ndescription = d\n[options]\npackages = find:\ninstall_requires =\n" \
          b"    numpy>=1.26\n    foo; python_version<'3.11'\n[options.extras_require]\ntest = pytest\n" \
          b"[tool:pytest]\naddopts = -q\n[flake8]\nmax-line-length = 100\n"
    got = change("setup.cfg", old, old.replace(b"numpy>=1.26", b"numpy>=2")
                 .replace(b"= 100", b"= 88").replace(b"= d", b"= e"))
    assert got.distributions == ("numpy",) and got.settings == ()
    assert got.inert == ("[flake8]", "[metadata].description")
    assert change("setup.cfg", old, old.replace(b"-q", b"-x")).settings == ("[tool:pytest]",)


def test_lock_files() -> None:
    old = b'version = 1\n[[package]]\nname = "PyYAML"\nversion = "6.0.1"\n' \
          b'[[package]]\nname = "torch"\nversion = "2.3.0"\n[metadata]\ncontent-hash = "abc"\n'
    new = old.replace(b"6.0.1", b"6.0.2").replace(b'"abc"', b'"def"')
    got = change("poetry.lock", old, new)
    assert got.distributions == ("pyyaml",) and got.settings == ()
    assert change("uv.lock", old, old.replace(b"version = 1\n", b"version = 2\n")).settings
    lock = {"_meta": {"hash": {"sha256": "a"}}, "default": {"requests": {"version": "==2.31"}},
            "develop": {}}
    new_lock = json.loads(json.dumps(lock))
    new_lock["_meta"]["hash"]["sha256"] = "b"
    new_lock["develop"]["pytest"] = {"version": "==8.0"}
    got = change("Pipfile.lock", json.dumps(lock).encode(), json.dumps(new_lock).encode())
    assert got.distributions == ("pytest",) and got.added == ("pytest",) and not got.settings


def test_is_manifest() -> None:
    for p in ("pyproject.toml", "pkg/pyproject.toml", "requirements.txt", "requirements-dev.txt",
              "ci/requirements_gpu.in", "constraints.txt", "dev-requirements.txt",
              "requirements/base.txt", "setup.cfg", "poetry.lock", "uv.lock", "Pipfile",
              "Pipfile.lock"):
        assert is_manifest(p), p
    for p in ("setup.py", "requirements.py", "docs/requirements.md", "BUILD", "pyproject.toml.bak"):
        assert not is_manifest(p), p


@pytest.mark.parametrize("name, old, new, version, admits", [
    ("pyproject.toml", '[project]\ndependencies = ["tqdm>=4"]\n',
     '[project]\ndependencies = ["tqdm>=4.66"]\n', "4.70.1", True),
    ("pyproject.toml", '[project]\ndependencies = ["tqdm>=4"]\n',
     '[project]\ndependencies = ["tqdm>=4.71"]\n', "4.70.1", False),
    ("pyproject.toml", '[project]\ndependencies = ["tqdm>=4"]\n',
     # New extras install more (their dependencies switch features on): not text only.
     '[project]\ndependencies = ["tqdm[notebook]>=4.66,<5"]\n', "4.70.1", False),
    ("pyproject.toml", '[project]\ndependencies = ["tqdm>=4"]\n',
     '[project]\ndependencies = ["tqdm>=4.66; python_version>\'3.8\'"]\n', "4.70.1", False),
    ("pyproject.toml", '[project]\ndependencies = ["tqdm>=4"]\n',
     '[project]\ndependencies = ["tqdm>=4.66"]\n', None, False),  # no recorded version
    ("pyproject.toml", '[project]\ndependencies = ["tqdm>=4"]\n', '[project]\ndependencies = []\n',
     "4.70.1", False),  # removed
    ("requirements.txt", "tqdm==4.70.0\n", "tqdm==4.70.1\n", "4.70.1", True),
    ("requirements.txt", "tqdm==4.70.0\n", "tqdm==4.70.2\n", "4.70.1", False),
    ("pyproject.toml", '[tool.poetry.dependencies]\ntqdm = "^4.0"\n',
     '[tool.poetry.dependencies]\ntqdm = "^4.66"\n', "4.70.1", False),  # not PEP 440
    ("Pipfile", '[packages]\ntqdm = ">=4"\n', '[packages]\ntqdm = "*"\n', "4.70.1", True),
    ("poetry.lock", '[[package]]\nname = "tqdm"\nversion = "4.70.0"\n',
     '[[package]]\nname = "tqdm"\nversion = "4.70.1"\n', "4.70.1", True),
    ("poetry.lock", '[[package]]\nname = "tqdm"\nversion = "4.70.0"\n',
     '[[package]]\nname = "tqdm"\nversion = "4.71.0"\n', "4.70.1", False),
])
def test_a_new_requirement_admits_the_recorded_version_or_not(
        name: str, old: str, new: str, version: str | None, admits: bool) -> None:
    """Issue 38 item 3: a pin changed in text only, against the version a test ran with."""
    change = read_change(name, old.encode(), new.encode())
    assert change is not None and change.distributions == ("tqdm",)
    assert change.admits("tqdm", version) is admits


# Found in review: a pin rule that compares versions only admitted changes that are not
# about the version at all.
def test_a_lock_entry_whose_source_moved_at_the_same_version_is_not_admitted() -> None:
    old = ('[[package]]\nname = "mylib"\nversion = "0.3.0"\n[package.source]\ntype = "git"\n'
           'url = "https://example.invalid/mylib.git"\nresolved_reference = "1111111"\n')
    new = old.replace("1111111", "2222222")
    change = read_change("poetry.lock", old.encode(), new.encode())
    assert change is not None and change.distributions == ("mylib",)
    assert not change.admits("mylib", "0.3.0")
    bumped = read_change("poetry.lock", old.encode(),
                         old.replace('version = "0.3.0"', 'version = "0.3.1"').encode())
    assert bumped is not None and bumped.admits("mylib", "0.3.1")  # a bump in text only


def test_extras_or_a_local_label_are_not_admitted_by_the_version() -> None:
    extras = read_change("requirements.txt", b"accelerate==0.25.0\n",
                         b"accelerate[deepspeed]==0.25.0\n")
    assert extras is not None and not extras.admits("accelerate", "0.25.0")
    local = read_change("requirements.txt", b"torchvision==0.16.0+cpu\n",
                        b"torchvision==0.16.0\n")
    assert local is not None and not local.admits("torchvision", "0.16.0+cpu")
    plain = read_change("requirements.txt", b"tqdm>=4\n", b"tqdm>=4.60\n")
    assert plain is not None and plain.admits("tqdm", "4.66.1")
