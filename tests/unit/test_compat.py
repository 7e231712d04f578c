"""Installation checks (compat.py): a pyspark / pyspark-client mix and a spark provider without the
members we override are refused with one clear error, at the Spark job's entry before pyspark loads."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_shardyfusion import compat
from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.core.model.config import build_write_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "airflow_provider_shardyfusion" / "spark_jobs" / "scripts"  # the two spark-submit applications


def fake_site(root: Path, *, files: str | None, pyspark: str | None = None, client: str | None = None,
              importable: bool = True) -> Path:
    """A site-packages folder as pip leaves it: one pyspark/ folder claimed by the given distributions."""
    site = root / "site-packages"
    pkg = site / "pyspark"
    pkg.mkdir(parents=True)
    # A mixed install may not even import; the check must not depend on importing it.
    (pkg / "__init__.py").write_text("" if importable else "raise ImportError('mixed pyspark files')\n")
    if files is not None:
        (pkg / "version.py").write_text(f'__version__: str = "{files}"\n')
    for dist, version in (("pyspark", pyspark), ("pyspark_client", client)):
        if version is None:
            continue
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
        (info / "RECORD").write_text("pyspark/__init__.py,,\npyspark/version.py,,\n")
    return site


def problem(tmp_path: Path, **kwargs) -> str | None:
    site = fake_site(tmp_path, **kwargs)
    install = compat.inspect_pyspark_install([str(site)])
    assert install.package_dir == (site / "pyspark").resolve()
    return compat.pyspark_install_problem(install)


def test_this_venv_has_both_distributions_at_one_version():
    install = compat.inspect_pyspark_install()
    owners = install.owners()
    # make install pins both to one version (Makefile PYSPARK_VERSION), the dev venv is the good case.
    assert owners["pyspark"] == owners["pyspark-client"] == install.file_version
    assert compat.pyspark_install_problem(install) is None
    compat.check_pyspark_install()


def test_same_version_is_fine(tmp_path):
    assert problem(tmp_path, files="4.2.0", pyspark="4.2.0", client="4.2.0") is None


def test_pyspark_alone_is_fine(tmp_path):
    assert problem(tmp_path, files="4.1.0", pyspark="4.1.0") is None


def test_client_files_over_pyspark_jars_are_refused(tmp_path):
    text = problem(tmp_path, files="4.2.0", pyspark="4.3.0", client="4.2.0")
    assert text and "files" in text and "4.2.0" in text and "distribution (and its jars) is 4.3.0" in text
    assert "pip install" in text


def test_two_versions_sharing_the_folder_are_refused_even_when_pyspark_won(tmp_path):
    text = problem(tmp_path, files="4.3.0", pyspark="4.3.0", client="4.2.0")
    assert text and "pyspark 4.3.0 and pyspark-client 4.2.0 are both installed" in text


def test_client_only_is_refused_unless_the_job_is_a_connect_client(tmp_path):
    text = problem(tmp_path, files="4.2.0", client="4.2.0")
    assert text and "only pyspark-client 4.2.0" in text and "[spark]" in text
    install = compat.inspect_pyspark_install([str(fake_site(tmp_path / "thin", files="4.2.0", client="4.2.0"))])
    assert compat.pyspark_install_problem(install, connect_client=True) is None
    mixed = compat.inspect_pyspark_install([str(fake_site(tmp_path / "mixed", files="4.3.0", pyspark="4.3.0",
                                                          client="4.2.0"))])
    assert "are both installed" in compat.pyspark_install_problem(mixed, connect_client=True)  # a mix stays refused


def test_distributions_elsewhere_on_the_path_are_not_compared(tmp_path):
    # pyspark from SPARK_HOME/python while an unrelated site-packages holds other versions.
    spark_home = tmp_path / "spark_home" / "python" / "pyspark"
    spark_home.mkdir(parents=True)
    (spark_home / "__init__.py").write_text("")
    (spark_home / "version.py").write_text('__version__ = "4.1.1"\n')
    other = fake_site(tmp_path / "other", files="4.3.0", pyspark="4.3.0", client="4.2.0")
    install = compat.inspect_pyspark_install([str(spark_home.parent), str(other)])
    assert install.package_dir == spark_home.resolve() and install.file_version == "4.1.1"
    assert {d.name for d in install.distributions} == {"pyspark", "pyspark-client"}
    assert install.owners() == {}
    assert compat.pyspark_install_problem(install) is None


def test_check_raises_the_provider_error(tmp_path):
    site = fake_site(tmp_path, files="4.2.0", pyspark="4.3.0", client="4.2.0")
    with pytest.raises(ConfigError, match="broken pyspark installation: the pyspark files"):
        compat.check_pyspark_install(compat.inspect_pyspark_install([str(site)]))


def test_job_entry_refuses_a_mix_before_importing_pyspark(tmp_path):
    """The real entry script, with a mixed site-packages first on its path (and a pyspark that
    cannot be imported): exit 2, one line naming both versions, nothing written."""
    site = fake_site(tmp_path, files="4.2.0", pyspark="4.3.0", client="4.2.0", importable=False)
    out = tmp_path / "out"
    cfg = build_write_config(input_path=str(tmp_path / "in"), key_column="id", value_column="v", num_dbs=2,
                             output_uri=f"file://{out}", run_id="mixed")
    b64 = base64.urlsafe_b64encode(cfg.to_json().encode()).decode()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    # PYTHONPATH comes before the venv's site-packages, so the mixed folder is the pyspark imported.
    proc = subprocess.run([sys.executable, str(SCRIPTS / "sharded_write_job.py"), "--config-b64", b64],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("shardyfusion job failed:")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("shardyfusion job failed: ConfigError: broken pyspark installation:")
    assert "4.2.0" in lines[0] and "4.3.0" in lines[0]
    assert "mixed pyspark files" not in proc.stderr
    assert not out.exists()


def test_installed_spark_provider_has_the_overridden_members():
    compat.check_spark_provider()


def test_spark_provider_without_the_members_is_refused():
    class OldSparkSubmitHook:  # the shape of apache-airflow-providers-apache-spark 5.5
        def _process_spark_submit_log(self, itr):
            return None

        def _mask_cmd(self, cmd):
            return cmd

    with pytest.raises(ConfigError) as info:
        compat.check_spark_provider(OldSparkSubmitHook, "5.5.0")
    text = str(info.value)
    assert "5.5.0" in text and "_build_spark_common_args" in text and ">=5.6.0" in text
    assert "_process_spark_submit_log" not in text
