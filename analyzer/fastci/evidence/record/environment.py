"""The environment fingerprint: recorded with every trace, compared by selection.

The fingerprint changes when anything that can change test behaviour without a
source change does:

* the Python version and the OS/architecture;
* the installed distributions (torch and the ``nvidia-*`` CUDA/NCCL/cuDNN wheels
  included, via their versions), from the site-packages directories;
* the GPU models and the NVIDIA driver version (``nvidia-smi``, which ignores
  ``CUDA_VISIBLE_DEVICES``; else ``/proc/driver/nvidia/version`` for the driver);
* the CUDA toolkit at ``/usr/local/cuda`` (where it points, and its version file);
* the C library version (glibc) and the system copies of the GPU stack and the
  C++ runtime (``libcuda``, ``libcudart``, ``libnccl``, ``libcudnn``,
  ``libcublas``, ``libstdc++``) in the dynamic linker's cache, resolved to the
  real files, whose names carry the versions.

It reads files and the interpreter, never environment variables other than
``PATH`` (to find ``nvidia-smi``): the recorder takes it inside test processes
(Bazel's test environment is scrubbed), and the planner takes it by running the
*test runner's* interpreter (``<python> -m fastci.evidence.record.environment``, see
:func:`environment_of_interpreter`), so both sides describe the same place.
Libraries found only through ``LD_LIBRARY_PATH`` are not covered, nor are the
kernel version and host name (they change often and rarely matter).

Everything is computed once per process (the recorder asks at every trace stop);
the answers of ``ldconfig -p`` and ``nvidia-smi`` are also kept in a private per-user
folder under the temporary directory, keyed by what they depend on (the linker
cache's stat; the driver's version file and the boot id), for the next process.
This module needs only the standard library, so any interpreter can run it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import site
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from fastci.evidence.record import trace

#: Soname stems of the system libraries whose version is part of the fingerprint.
LIBRARIES: tuple[str, ...] = ("libcuda", "libcudart", "libnccl", "libcudnn", "libcublas",
                              "libstdc++")
#: Where ``nvidia-smi`` usually lives when it is not on ``PATH`` (Bazel's strict PATH).
_SMI_FALLBACKS = ("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi",
                  "/usr/local/bin/nvidia-smi")
_LDCONFIG = ("/sbin/ldconfig", "/usr/sbin/ldconfig")
_LD_SO_CACHE = "/etc/ld.so.cache"
_CUDA_HOME = "/usr/local/cuda"
_LDCACHE_LINE = re.compile(r"^\s*(lib[\w+.-]*?\.so\.[0-9.]+)\s+\(([^)]*)\)\s+=>\s+(\S.*?)\s*$")
_FINGERPRINT = re.compile(r"[0-9a-f]{16}")
_CANONICAL = re.compile(r"[-_.]+")
#: Parts of :func:`describe` that are not in the fingerprint (it has their digest).
LISTING_KEYS = ("packages_list",)


def _site_dirs() -> list[str]:
    dirs = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return sorted(dirs)


def packages_listing(site_dirs: list[str] | None = None) -> tuple[str, ...]:
    """``name==version`` of every installed distribution (canonical names), sorted.

    From the same metadata directory names as :func:`packages_digest` (no file is
    read): two environments' listings say *which* packages differ, where the
    digests only say that some do. Not part of the fingerprint (the digest is).
    """
    out: set[str] = set()
    for entry in _metadata_dirs(site_dirs):
        # Wheel and egg folder names escape "-" in the name: the first "-" ends it.
        name, _, version = entry.rsplit(".", 1)[0].partition("-")
        if entry.endswith(".egg-info"):
            version = version.split("-py", 1)[0]
        out.add(f"{_CANONICAL.sub('-', name).lower()}=={version}")
    return tuple(sorted(out))


def _metadata_dirs(site_dirs: list[str] | None) -> Iterator[str]:
    """The ``.dist-info`` / ``.egg-info`` entry names of the site-packages directories
    (:func:`_site_dirs` when None); an unreadable directory has none."""
    for site_dir in _site_dirs() if site_dirs is None else site_dirs:
        try:
            entries = os.listdir(site_dir)
        except OSError:
            continue
        yield from (e for e in entries if e.endswith((".dist-info", ".egg-info")))


def parse_listing(text: str) -> dict[str, str]:
    """``{name: version}`` from a ``packages_list`` (one ``name==version`` a line)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and name:
            out[name] = version
    return out


def packages_digest(site_dirs: list[str] | None = None) -> str:
    """Digest of the installed distributions, from their metadata directory names.

    ``name-version.dist-info`` (and ``.egg-info``) entries of the site-packages
    directories name every installed distribution and version; listing them
    costs a millisecond where reading each distribution's metadata costs 0.1 s
    per test process. Only site-packages: sys.path also holds the cwd and
    source trees, which would make the digest depend on where a process started.
    The user site counts only where the interpreter enables it (not in a venv).
    """
    names = {entry.rsplit(".", 1)[0].lower().replace("_", "-")
             for entry in _metadata_dirs(site_dirs)}
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def _torch_versions() -> tuple[str, str]:
    torch = sys.modules.get("torch")
    if torch is not None:
        version = getattr(torch, "__version__", "")
        cuda = getattr(getattr(torch, "version", None), "cuda", None) or ""
        return str(version), str(cuda)
    return _torch_distribution(), ""


@functools.lru_cache(maxsize=1)
def _torch_distribution() -> str:
    # Reading distribution metadata costs 1-5 ms, and the recorder asks at every stop.
    # importlib.metadata itself is imported here: ~20 ms in a recorded child process.
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout if out.returncode == 0 else ""


#: Where probe outputs are kept between processes (see :func:`_cached_run`).
_PROBE_CACHE = "fastci-probes-{uid}"


def _file_key(path: str, *, content: bool = False) -> str | None:
    """What identifies ``path``'s current version: its stat, or (``/proc``) its content."""
    try:
        if content:
            return Path(path).read_text()
        st = os.stat(path)
    except OSError:
        return None
    return f"{path} {st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns}"


def _probe_dir() -> str | None:
    """This user's probe cache folder (created private), ``None`` when it is not safe to use."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    folder = os.path.join(tempfile.gettempdir(), _PROBE_CACHE.format(uid=uid))
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    # Someone else's folder, or one others can write to, could hold a planted answer.
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
        return None
    return folder


def _cached_run(cmd: list[str], key: list[str | None],
                keep: Callable[[str], str] = lambda out: out) -> str:
    """``_run(cmd)``, its ``keep``-filtered output kept in a per-user file keyed by ``key``.

    Every recorded process (each test process, each child a test starts) takes the
    fingerprint; ``ldconfig -p`` costs about 17 ms and ``nvidia-smi`` far more.
    ``key`` names what their answers depend on (files' stat or content); a
    ``None`` in it (a file missing) means no caching. An empty answer (the tool
    failed) is never kept.
    """
    folder = _probe_dir() if None not in key else None
    if folder is None:
        return keep(_run(cmd))
    digest = hashlib.sha256("\0".join([*cmd, "", *(k or "" for k in key)]).encode())
    path = os.path.join(folder, f"{os.path.basename(cmd[0])}-{digest.hexdigest()[:32]}.txt")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        pass
    out = keep(_run(cmd))
    if out:
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(out)
            os.replace(tmp, path)
        except OSError:  # a cache that cannot be written is only slower
            pass
    return out


def _find(name: str, fallbacks: tuple[str, ...]) -> str | None:
    found = shutil.which(name)
    if found is not None:
        return found
    return next((p for p in fallbacks if os.access(p, os.X_OK)), None)


def parse_gpus(smi_csv: str) -> tuple[str, str]:
    """``(models, drivers)`` from ``nvidia-smi --query-gpu=name,driver_version`` CSV lines."""
    models: set[str] = set()
    drivers: set[str] = set()
    for line in smi_csv.splitlines():
        name, _, driver = line.rpartition(",")
        if name.strip() and driver.strip():
            models.add(name.strip())
            drivers.add(driver.strip())
    return ",".join(sorted(models)), ",".join(sorted(drivers))


def _gpus() -> tuple[str, str]:
    """GPU models and driver version of the machine (every GPU, whatever is visible to CUDA)."""
    smi = _find("nvidia-smi", _SMI_FALLBACKS)
    models, driver = ("", "")
    if smi is not None:
        # GPUs change only with a reboot, the driver with its version file.
        key = [_file_key(smi), _file_key("/proc/sys/kernel/random/boot_id", content=True),
               _file_key("/proc/driver/nvidia/version", content=True)]
        models, driver = parse_gpus(_cached_run(
            [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"], key))
    if not driver:
        try:
            driver = Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
        except (OSError, IndexError):
            pass
    return models, driver


def parse_ldcache(listing: str, stems: tuple[str, ...] = LIBRARIES) -> tuple[str, ...]:
    """``soname (flags) => real file`` for the ``stems`` in ``ldconfig -p`` output.

    Only versioned sonames (``libcudart.so.12``) count, resolved through their
    symlinks to the real file (``libcudart.so.12.4.127``): the file name carries
    the version, the path says which installation.
    """
    out: set[str] = set()
    for line in listing.splitlines():
        m = _LDCACHE_LINE.match(line)
        if m is None or m.group(1).split(".so.", 1)[0] not in stems:
            continue
        out.add(f"{m.group(1)} ({m.group(2)}) => {os.path.realpath(m.group(3))}")
    return tuple(sorted(out))


def _libraries() -> tuple[str, ...]:
    ldconfig = _find("ldconfig", _LDCONFIG)
    if not ldconfig:
        return ()
    # `ldconfig -p` prints the linker cache: the same answer while that file is the same.
    # Symlinks are resolved after the cache (parse_ldcache): a library replaced in place counts.
    listing = _cached_run([ldconfig, "-p"], [_file_key(ldconfig), _file_key(_LD_SO_CACHE)],
                          keep=_ldcache_relevant)
    return parse_ldcache(listing)


def _ldcache_relevant(listing: str) -> str:
    """The lines of an ``ldconfig -p`` listing that can name one of :data:`LIBRARIES`."""
    return "".join(line + "\n" for line in listing.splitlines()
                   if any(stem in line for stem in LIBRARIES))


def _libc() -> str:
    try:
        value = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        value = None
    if value:
        return value
    lib, version = platform.libc_ver()
    return f"{lib} {version}".strip()


def _cuda_toolkit(home: str = _CUDA_HOME) -> str:
    """Where ``/usr/local/cuda`` points and the version its ``version.json``/``.txt`` gives."""
    if not os.path.exists(home):
        return ""
    real = os.path.realpath(home)
    version = ""
    try:
        data = json.loads(Path(real, "version.json").read_text())
        version = str(data.get("cuda", {}).get("version", ""))
    except (OSError, ValueError, AttributeError):
        try:
            version = Path(real, "version.txt").read_text().strip()
        except OSError:
            pass
    return f"{real} {version}".strip()


@functools.lru_cache(maxsize=1)
def describe() -> dict[str, str]:
    """Every part of this process's environment that the fingerprint covers (cached)."""
    models, driver = _gpus()
    return {
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "platform": f"{platform.system()}-{platform.machine()}",
        "packages": packages_digest(),
        "gpu_model": models,
        "driver": driver,
        "cuda_toolkit": _cuda_toolkit(),
        "libc": _libc(),
        "libraries": "; ".join(_libraries()),
        # Not fingerprinted (``packages`` is its digest): says which packages differ.
        "packages_list": "\n".join(packages_listing()),
    }


def fingerprint_of(*parts: str) -> str:
    """The fingerprint of the given parts (in order)."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def current_fingerprint() -> str:
    """The fingerprint of this process's environment (what the recorder stamps on traces)."""
    return fingerprint_of(*(v for k, v in describe().items() if k not in LISTING_KEYS))


def base_fingerprint(parts: dict[str, str] | None = None) -> str:
    """The fingerprint of everything but the installed packages (interpreter, machine, GPU stack).

    Two environments with equal base fingerprints differ at most in packages,
    which their ``packages_list`` names.
    """
    parts = describe() if parts is None else parts
    return fingerprint_of(*(v for k, v in parts.items()
                            if k not in LISTING_KEYS and k != "packages"))


def current() -> trace.TraceMsg:
    """The environment of this process (cached; torch/CUDA read if torch is imported)."""
    from fastci.evidence.record import trace  # the protobuf runtime: only the recorder needs it

    parts = describe()
    torch_version, cuda = _torch_versions()
    return trace.Environment(
        fingerprint=current_fingerprint(), python=parts["python"], platform=parts["platform"],
        packages_digest=parts["packages"], torch=torch_version, cuda=cuda,
        gpu_model=parts["gpu_model"], base_fingerprint=base_fingerprint(),
        packages_list=parts["packages_list"])


def environment_of_interpreter(python: str, *, cwd: Path | None = None,
                               timeout: float = 120.0) -> dict[str, str]:
    """Every part of the environment ``python`` runs tests in (``--json``), by running it.

    Holds ``fingerprint``, ``base_fingerprint``, ``packages_list`` and the
    :func:`describe` parts.

    Raises:
        FastCIError: ``python`` cannot be run or printed no environment.
    """
    from fastci.errors import FastCIError

    package_parent = str(Path(__file__).resolve().parents[3])
    code = (f"import sys; sys.path.insert(0, {package_parent!r}); "
            "from fastci.evidence.record.environment import main; raise SystemExit(main(['--json']))")
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=cwd)
        data = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise FastCIError(f"cannot read the environment of {python}: {exc}") from exc
    if not isinstance(data, dict) or not _FINGERPRINT.fullmatch(str(data.get("fingerprint"))):
        err = (proc.stderr.strip().splitlines() or ["no environment printed"])[-1]
        raise FastCIError(f"{python} could not describe its environment: {err}")
    return {str(k): str(v) for k, v in data.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m fastci.evidence.record.environment [--json]``: print the fingerprint (or its parts)."""
    args = sys.argv[1:] if argv is None else argv
    if "--json" in args:
        print(json.dumps({"fingerprint": current_fingerprint(),
                          "base_fingerprint": base_fingerprint(), **describe()}, indent=2))
    else:
        print(current_fingerprint())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
