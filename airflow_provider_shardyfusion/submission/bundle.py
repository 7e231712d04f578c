"""The PySpark application bundle handed to ``spark-submit`` (SPEC §2).

``--py-files`` gets one zip holding ``spark_jobs/`` and the pure-Python parts of this package
(``airflow_provider_shardyfusion/__init__.py``, ``compat.py``, ``streaming.py`` + ``core/``), so
executors never need the provider installed. The zip is deterministic (sorted entries, fixed timestamps and permissions): the same
sources give the same bytes, so it is cached by content hash and rebuilt only when code changes,
and two workers building it at once agree on the result.
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
    "ENTRY_SCRIPT", "STREAMING_SCRIPT", "Bundle", "build_bundle", "bundle_entries", "default_cache_dir", "find_spark_jobs_dir",
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
_BUNDLE_FORMAT = b"shardyfusion-bundle-v2\n"


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


def find_spark_jobs_dir() -> Path:
    """``spark_jobs/`` of an installed wheel (inside the package) or of a source checkout (repo root)."""
    pkg = package_dir()
    candidates = [pkg / "spark_jobs", pkg.parent / "spark_jobs"]
    for candidate in candidates:
        if (candidate / ENTRY_SCRIPT).is_file():
            return candidate
    raise FileNotFoundError(
        f"the PySpark application {ENTRY_SCRIPT} was not found in any of "
        f"{[str(c) for c in candidates]}; the provider installation is incomplete "
        "(reinstall the airflow-provider-shardyfusion wheel)"
    )


def _python_files(base: Path, arc_prefix: str) -> list[tuple[str, Path]]:
    out = []
    for path in base.rglob("*.py"):
        rel = path.relative_to(base)
        if "__pycache__" in rel.parts or not path.is_file():
            continue
        out.append((f"{arc_prefix}/{rel.as_posix()}", path))
    return out


def bundle_entries(spark_jobs_dir: Path | None = None) -> list[tuple[str, bytes]]:
    """``(name in the zip, content)`` of every file of the bundle, sorted by name."""
    jobs = spark_jobs_dir or find_spark_jobs_dir()
    pkg = package_dir()
    files = _python_files(jobs, "spark_jobs")
    files.append((f"{_PACKAGE}/__init__.py", pkg / "__init__.py"))
    files.append((f"{_PACKAGE}/compat.py", pkg / "compat.py"))  # the job's installation check
    files.append((f"{_PACKAGE}/streaming.py", pkg / "streaming.py"))  # the streaming job's foreachBatch writer
    files += _python_files(pkg / "core", f"{_PACKAGE}/core")
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


def build_bundle(cache_dir: str | os.PathLike[str] | None = None, spark_jobs_dir: Path | None = None) -> Bundle:
    """Return the cached bundle for the current sources, building it on first use.

    The cache entry ``<cache_dir>/<sha256>/`` holds ``bundle.zip`` and a copy of each entry
    script. It is assembled in a temporary directory and renamed into place, so a reader never
    sees a half-written entry even with several task processes racing on one machine. The entry
    script is submitted from that copy (not from ``spark_jobs/``) because Python puts the script's
    own folder first on ``sys.path``: a private folder keeps sibling modules from shadowing the
    zipped package, and keeps script and zip from one snapshot of the code.
    """
    entries = bundle_entries(spark_jobs_dir)
    if not any(name == f"spark_jobs/{ENTRY_SCRIPT}" for name, _ in entries):
        raise FileNotFoundError(f"spark_jobs/{ENTRY_SCRIPT} is missing from the bundle sources")
    sha = _digest(entries)
    by_name = dict(entries)
    scripts = {n: by_name[f"spark_jobs/{n}"] for n in _APPLICATIONS if f"spark_jobs/{n}" in by_name}
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
