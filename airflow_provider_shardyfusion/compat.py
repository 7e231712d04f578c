"""Installation checks that turn a broken environment into one clear error.

Two known traps, both silent without these checks:

- ``pyspark`` and ``pyspark-client`` (pulled by apache-airflow-providers-apache-spark 6.x) install
  into the same ``pyspark/`` folder. When their versions differ, whichever was installed last wins
  file by file: Python files of one Spark release run against the jars of another, and removing
  either distribution deletes files the other needs. ``check_pyspark_install`` refuses such a mix.
- ``ShardyfusionSparkSubmitHook`` overrides private methods of the spark provider's
  ``SparkSubmitHook``; on a provider without them the credentials meant for the spark-submit
  process would never arrive. ``check_spark_provider`` says so instead.

Stdlib only at import time: this module is shipped to Spark drivers in the job bundle, where
neither Airflow nor the provider is installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata as md
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_shardyfusion.core.errors import ConfigError

__all__ = [
    "PYSPARK_DISTRIBUTIONS", "SPARK_HOOK_MEMBERS", "SPARK_PROVIDER_FLOOR", "PysparkDistribution", "PysparkInstall",
    "check_pyspark_install", "check_spark_provider", "inspect_pyspark_install", "pyspark_install_problem",
    "spark_provider_problem",
]

PYSPARK_DISTRIBUTIONS = ("pyspark", "pyspark-client")
# Private members of SparkSubmitHook that hooks/spark_submit.py overrides or calls (its module
# docstring lists why each is needed), and the first apache-airflow-providers-apache-spark release
# that has all of them.
SPARK_HOOK_MEMBERS = ("_build_spark_common_args", "_process_spark_submit_log", "_start_driver_status_tracking")
SPARK_PROVIDER_FLOOR = "5.6.0"

_VERSION_RE = re.compile(r"""^__version__(?:\s*:\s*str)?\s*=\s*["']([^"']+)["']""", re.MULTILINE)


@dataclass(frozen=True)
class PysparkDistribution:
    """One installed distribution that ships a ``pyspark/`` folder."""

    name: str
    version: str
    package_dir: Path  # where its pyspark/ folder is (resolved)


@dataclass(frozen=True)
class PysparkInstall:
    """What ``import pyspark`` would load, and which distributions claim that folder."""

    package_dir: Path | None  # None: pyspark is not importable
    file_version: str | None  # __version__ in pyspark/version.py of that folder
    distributions: tuple[PysparkDistribution, ...]

    def owners(self) -> dict[str, str]:
        """``{distribution name: version}`` of the distributions installed into ``package_dir``."""
        return {d.name: d.version for d in self.distributions if d.package_dir == self.package_dir}


def pyspark_install_problem(install: PysparkInstall, *, connect_client: bool = False) -> str | None:
    """Why this pyspark installation cannot run the shardyfusion job, or ``None`` when it can.

    Only distributions installed into the folder that is actually imported are compared: a
    pyspark from ``SPARK_HOME/python`` or another ``sys.path`` entry is not this check's business.
    ``connect_client``: the job runs as a Spark Connect client, for which pyspark-client alone is
    the intended installation (a mix of the two is still refused).
    """
    if install.package_dir is None:
        return None
    owners = install.owners()
    if not owners:
        return None
    fix = (
        "install both at one version, pyspark last, e.g. "
        "`pip install 'pyspark-client==X' && pip install --force-reinstall --no-deps 'pyspark==X'` "
        "(X: a release both are published for), or uninstall pyspark-client if nothing else needs it"
    )
    where = f"in {install.package_dir}"
    pyspark_version = owners.get("pyspark")
    client_version = owners.get("pyspark-client")
    if pyspark_version is None:
        if connect_client:
            return None
        return (
            f"only pyspark-client {client_version} (the Spark Connect client) is installed {where}; "
            "spark-submit jobs need the full pyspark distribution "
            "(pip install 'airflow-provider-shardyfusion[spark]')"
        )
    if install.file_version is not None and install.file_version != pyspark_version:
        return (
            f"the pyspark files {where} are version {install.file_version} but the pyspark "
            f"distribution (and its jars) is {pyspark_version}: another installation "
            f"(pyspark-client {client_version}?) overwrote them; {fix}"
        )
    if client_version is not None and client_version != pyspark_version:
        return (
            f"pyspark {pyspark_version} and pyspark-client {client_version} are both installed {where} "
            f"and share its files, so the Python side mixes two Spark releases; {fix}"
        )
    return None


def inspect_pyspark_install(path: list[str] | None = None) -> PysparkInstall:
    """Collect what ``pyspark_install_problem`` needs without importing pyspark.

    Not importing matters: a mixed installation may fail on import with an error that names
    neither distribution. ``path`` replaces ``sys.path`` for both look-ups (tests use a fake
    site-packages folder).
    """
    spec = (importlib.util.find_spec("pyspark") if path is None
            else importlib.machinery.PathFinder.find_spec("pyspark", path))
    package_dir = Path(spec.origin).resolve().parent if spec is not None and spec.origin else None
    file_version = None
    if package_dir is not None:
        try:
            match = _VERSION_RE.search((package_dir / "version.py").read_text(encoding="utf-8"))
            file_version = match.group(1) if match else None
        except OSError:
            file_version = None
    found: list[PysparkDistribution] = []
    for dist in md.distributions() if path is None else md.distributions(path=path):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name not in PYSPARK_DISTRIBUTIONS:
            continue
        init = Path(str(dist.locate_file("pyspark/__init__.py")))
        found.append(PysparkDistribution(name=name, version=dist.version, package_dir=init.resolve().parent))
    return PysparkInstall(package_dir=package_dir, file_version=file_version, distributions=tuple(found))


def check_pyspark_install(install: PysparkInstall | None = None, *, connect_client: bool = False) -> None:
    """Raise ``ConfigError`` when pyspark and pyspark-client are mixed in the imported folder (or when
    only pyspark-client is there for a job that is not a Spark Connect client)."""
    problem = pyspark_install_problem(install if install is not None else inspect_pyspark_install(),
                                      connect_client=connect_client)
    if problem:
        raise ConfigError(f"broken pyspark installation: {problem}")


def spark_provider_problem(hook_class: type, provider_version: str | None) -> str | None:
    """Why ``hook_class`` (a ``SparkSubmitHook``) cannot carry our overrides, or ``None``."""
    missing = [name for name in SPARK_HOOK_MEMBERS if not callable(getattr(hook_class, name, None))]
    if not missing:
        return None
    return (
        f"apache-airflow-providers-apache-spark {provider_version or '(unknown version)'} lacks "
        f"SparkSubmitHook.{', .'.join(missing)}, which shardyfusion overrides to hand credentials to "
        f"spark-submit's process only; install apache-airflow-providers-apache-spark>={SPARK_PROVIDER_FLOOR}"
    )


def check_spark_provider(hook_class: type | None = None, provider_version: str | None = None) -> None:
    """Raise ``ConfigError`` unless the installed spark provider has the members we override.

    Imports the provider: call it from ``execute`` (or when the hook class is built), not at
    DAG-parse time.
    """
    if hook_class is None:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        hook_class = SparkSubmitHook
        provider_version = _installed_version("apache-airflow-providers-apache-spark")
    problem = spark_provider_problem(hook_class, provider_version)
    if problem:
        raise ConfigError(problem)


def _installed_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None

