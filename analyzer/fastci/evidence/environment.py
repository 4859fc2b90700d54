"""The environment fingerprint recorded with every trace.

The fingerprint changes when anything that can change test behaviour without a
source change does: the Python version, the OS/architecture, the installed
distributions (torch and its CUDA build included, via their versions) and the
GPU model. Selection compares it with :func:`current` and widens on a mismatch.
The kernel version and host name are deliberately left out (they change often
and rarely matter); they are not recorded at all.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import shutil
import site
import subprocess
import sys

from fastci.evidence import trace


def packages_digest(site_dirs: list[str] | None = None) -> str:
    """Digest of the installed distributions, from their metadata directory names.

    ``name-version.dist-info`` (and ``.egg-info``) entries of the site-packages
    directories name every installed distribution and version; listing them
    costs a millisecond where reading each distribution's metadata costs 0.1 s
    per test process. Only site-packages: sys.path also holds the cwd and
    source trees, which would make the digest depend on where a process started.
    """
    names: set[str] = set()
    if site_dirs is None:
        site_dirs = sorted({*site.getsitepackages(), site.getusersitepackages()})
    for site_dir in site_dirs:
        try:
            entries = os.listdir(site_dir)
        except OSError:
            continue
        for entry in entries:
            if entry.endswith((".dist-info", ".egg-info")):
                names.add(entry.rsplit(".", 1)[0].lower().replace("_", "-"))
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def _torch_versions() -> tuple[str, str]:
    torch = sys.modules.get("torch")
    if torch is not None:
        version = getattr(torch, "__version__", "")
        cuda = getattr(getattr(torch, "version", None), "cuda", None) or ""
        return str(version), str(cuda)
    try:
        return importlib.metadata.version("torch"), ""
    except importlib.metadata.PackageNotFoundError:
        return "", ""


def _gpu_model() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    names = sorted({line.strip() for line in out.stdout.splitlines() if line.strip()})
    return ",".join(names)


@functools.lru_cache(maxsize=1)
def _stable() -> tuple[str, str, str, str]:
    python = f"{platform.python_version()} ({platform.python_implementation()})"
    plat = f"{platform.system()}-{platform.machine()}"
    return python, plat, packages_digest(), _gpu_model()


def fingerprint_of(python: str, plat: str, packages: str, gpu_model: str) -> str:
    """The fingerprint of the given parts (torch/CUDA are inside ``packages``)."""
    text = "\n".join((python, plat, packages, gpu_model))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def current() -> trace.TraceMsg:
    """The environment of this process (cached; torch/CUDA read if torch is imported)."""
    python, plat, packages, gpu = _stable()
    torch_version, cuda = _torch_versions()
    return trace.Environment(
        fingerprint=fingerprint_of(python, plat, packages, gpu), python=python, platform=plat,
        packages_digest=packages, torch=torch_version, cuda=cuda, gpu_model=gpu)


def current_fingerprint() -> str:
    """The fingerprint selection compares against recorded runs."""
    fp: str = current().fingerprint
    return fp
