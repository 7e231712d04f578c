"""The PySpark application bundle handed to ``spark-submit`` (SPEC §2).

``--py-files`` gets one zip holding the parts of this package the job imports
(``airflow_provider_shardyfusion/__init__.py``, ``compat.py``, ``streaming.py``, ``core/`` and
``spark_jobs/``) under their package names, so driver and executors import the same modules and
never need the provider installed. The application spark-submit runs is a two-line script from
``spark_jobs/scripts/`` that imports the job from the zip. The zip is deterministic (sorted
entries, fixed timestamps and permissions): the same sources give the same bytes, so it is cached
by content hash and rebuilt only when code changes, and two workers building it at once agree on
the result.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ENTRY_SCRIPT", "STREAMING_SCRIPT", "Bundle", "build_bundle", "bundle_entries", "default_cache_dir",
    "package_dir", "zip_bytes",
]

ENTRY_SCRIPT = "sharded_write_job.py"
STREAMING_SCRIPT = "streaming_job.py"
# Every application the cache entry holds a copy of (submitted from there, next to the zip).
_APPLICATIONS = (ENTRY_SCRIPT, STREAMING_SCRIPT)
_PACKAGE = "airflow_provider_shardyfusion"
_FIXED_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest timestamp a zip can hold
_FILE_MODE = 0o100644  # regular file, rw-r--r--
# Bump when the bundle layout changes, so old cache entries are never reused for a new layout.
_BUNDLE_FORMAT = b"shardyfusion-bundle-v3\n"
# The package's modules the job imports, besides core/ and spark_jobs/.
_MODULES = ("__init__.py", "compat.py", "streaming.py")
_SCRIPTS = "spark_jobs/scripts"


@dataclass(frozen=True)
class Bundle:
    """What spark-submit gets: the zip for ``--py-files``, the entry script (the application), the zip's hash."""

    zip_path: str
    entry_script: str
    sha256: str

    def application(self, name: str) -> str:
        """The cached copy of the entry script ``name`` (e.g. ``STREAMING_SCRIPT``), next to ``entry_script``."""
        path = os.path.join(os.path.dirname(self.entry_script), name)
        if name not in _APPLICATIONS or not os.path.isfile(path):
            raise FileNotFoundError(f"the PySpark application {name} is not in the bundle {self.zip_path}")
        return path


def package_dir() -> Path:
    return Path(__file__).resolve().parent.parent


def _python_files(base: Path, arc_prefix: str) -> list[tuple[str, Path]]:
    out = []
    for path in base.rglob("*.py"):
        rel = path.relative_to(base)
        if "__pycache__" in rel.parts or not path.is_file():
            continue
        out.append((f"{arc_prefix}/{rel.as_posix()}", path))
    return out


def bundle_entries(package: Path | None = None) -> list[tuple[str, bytes]]:
    """``(name in the zip, content)`` of every file of the bundle, sorted by name."""
    pkg = package or package_dir()
    files = [(f"{_PACKAGE}/{name}", pkg / name) for name in _MODULES]
    files += _python_files(pkg / "core", f"{_PACKAGE}/core")
    files += _python_files(pkg / "spark_jobs", f"{_PACKAGE}/spark_jobs")
    names = [name for name, _ in files]
    if len(set(names)) != len(names):
        raise RuntimeError(f"bundle would contain duplicate entries: {sorted(names)}")
    return sorted((name, path.read_bytes()) for name, path in files)


def _digest(entries: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256(_BUNDLE_FORMAT)
    for name, data in entries:
        # Length-prefixed so that no two different file sets can hash the same.
        h.update(f"{len(name)}:{name}:{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()


def zip_bytes(entries: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_FIXED_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so external_attr means the same everywhere
            info.external_attr = _FILE_MODE << 16
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return buf.getvalue()


def default_cache_dir() -> Path:
    # Per user: the bundle runs with the task's cloud credentials, so nobody else may plant one.
    owner = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return Path(tempfile.gettempdir()) / f"shardyfusion-bundles-{owner}"


def _private_dir(root: Path) -> None:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not hasattr(os, "getuid"):
        return
    st = root.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(
            f"bundle cache {root} is not private to this user (owner uid {st.st_uid}, mode "
            f"{oct(st.st_mode & 0o777)}); remove it or point the cache elsewhere"
        )


def build_bundle(cache_dir: str | os.PathLike[str] | None = None, package: Path | None = None) -> Bundle:
    """Return the cached bundle for the current sources, building it on first use.

    The cache entry ``<cache_dir>/<sha256>/`` holds ``bundle.zip`` and a copy of each entry
    script. It is assembled in a temporary directory and renamed into place, so a reader never
    sees a half-written entry even with several task processes racing on one machine. The entry
    script is submitted from that copy, which keeps script and zip from one snapshot of the code.
    ``package`` (tests): the package folder to bundle instead of this one.
    """
    pkg = package or package_dir()
    missing = [name for name in _APPLICATIONS if not (pkg / _SCRIPTS / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the PySpark application {missing[0]} was not found in {pkg / _SCRIPTS}; the provider installation "
            "is incomplete (reinstall the airflow-provider-shardyfusion wheel)")
    entries = bundle_entries(pkg)
    sha = _digest(entries)
    by_name = dict(entries)
    scripts = {name: by_name[f"{_PACKAGE}/{_SCRIPTS}/{name}"] for name in _APPLICATIONS}
    data = zip_bytes(entries)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    _private_dir(root)
    final = root / sha
    zip_path, entry = final / "bundle.zip", final / ENTRY_SCRIPT
    if _holds(final, data, scripts):
        return Bundle(str(zip_path), str(entry), sha)
    if final.exists():  # damaged or tampered: content, not the name, decides what is shipped
        shutil.rmtree(final, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}-", dir=root))
    try:
        (staging / "bundle.zip").write_bytes(data)
        for name, script in scripts.items():
            (staging / name).write_bytes(script)
        for p in (staging, staging / "bundle.zip", *(staging / name for name in scripts)):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        try:
            os.rename(staging, final)
        except OSError:
            # Another process published the same content first; theirs is byte-identical.
            if not _holds(final, data, scripts):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Bundle(str(zip_path), str(entry), sha)


def _holds(folder: Path, data: bytes, scripts: dict[str, bytes]) -> bool:
    try:
        return (folder / "bundle.zip").read_bytes() == data and all(
            (folder / name).read_bytes() == script for name, script in scripts.items())
    except OSError:
        return False
