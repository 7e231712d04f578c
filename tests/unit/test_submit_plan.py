"""The spark-submit plan as data: deploy-mode policy without Airflow, connections or processes."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.submission.plan import (
    CONFIG_ARG,
    Host,
    SparkSettings,
    SparkTarget,
    build_submit_plan,
)

ROOT = Path(__file__).resolve().parents[2]
SECRET = "PlanSecretValue/9d2e"
CREDS = {"AWS_ACCESS_KEY_ID": "AKIAPLAN", "AWS_SECRET_ACCESS_KEY": SECRET}
HOST = Host(python="/venv/bin/python", environ={"PATH": "/usr/bin"}, binary_on_path=True, binary_next_to_python=True)
LOCAL = SparkTarget("sf_spark", "local[2]")
YARN_CLUSTER = SparkTarget("sf_yarn", "yarn", "cluster")
YARN_CLIENT = SparkTarget("sf_yarn", "yarn", "client")
K8S_CLUSTER = SparkTarget("sf_k8s", "k8s://https://kube:6443", "cluster")
STANDALONE_CLUSTER = SparkTarget("sf_sa", "spark://m:7077", "cluster")
STANDALONE_CLIENT = SparkTarget("sf_sa", "spark://m:7077")


DEFAULT_SPARK = SparkSettings()


def plan(target=LOCAL, spark=DEFAULT_SPARK, host=HOST, **kw):
    args = dict(target=target, spark=spark, host=host, application="/b/sharded_write_job.py", py_files="/b/bundle.zip",
                config_json='{"run_id":"r1"}', name="shardyfusion-write-r1")
    args.update(kw)
    return build_submit_plan(**args)


def test_local_client_mode_runs_the_workers_on_this_interpreter_and_waits():
    p = plan(spark=SparkSettings(env_vars={"MY_FLAG": 1}, executor_memory="2g"))
    assert p.env_vars == {"MY_FLAG": "1", "PYSPARK_PYTHON": "/venv/bin/python", "SPARK_LOCAL_IP": "127.0.0.1"}
    assert (p.defer, p.wait_for_driver, p.cluster_mode, p.archives) == (False, False, False, None)
    assert p.conf == {"spark.log.level": "WARN"} and p.resources["executor_memory"] == "2g"
    assert p.application_args[0] == CONFIG_ARG
    assert json.loads(base64.urlsafe_b64decode(p.application_args[1])) == {"run_id": "r1"}
    kwargs = p.hook_kwargs()
    assert kwargs["py_files"] == "/b/bundle.zip" and kwargs["conn_id"] == "sf_spark"
    assert kwargs["env_vars"]["MY_FLAG"] == "1" and kwargs["executor_memory"] == "2g"


def test_the_workers_own_interpreter_setting_wins():
    host = Host("/venv/bin/python", {"PYSPARK_PYTHON": "/opt/py", "SPARK_LOCAL_IP": "10.0.0.1"}, True, False)
    assert plan(host=host).env_vars == {}
    assert plan(spark=SparkSettings(env_vars={"PYSPARK_PYTHON": "/x"})).env_vars["PYSPARK_PYTHON"] == "/x"


@pytest.mark.parametrize(("target", "conf_key"), [
    (YARN_CLUSTER, "spark.yarn.submit.waitAppCompletion"),
    (K8S_CLUSTER, "spark.kubernetes.submission.waitAppCompletion"),
    (STANDALONE_CLUSTER, "spark.standalone.submit.waitAppCompletion"),
])
def test_deferrable_cluster_mode_submits_without_waiting(target, conf_key):
    p = plan(target=target, deferrable=True)
    assert p.defer and p.conf[conf_key] == "false" and not p.wait_for_driver and not p.notes
    waiting = plan(target=target, deferrable=False)
    assert not waiting.defer and conf_key not in waiting.conf
    assert waiting.wait_for_driver is (target is STANDALONE_CLUSTER)  # the master runs the driver
    assert waiting.hook_kwargs()["wait_for_driver"] is waiting.wait_for_driver  # the hook's submit waits


@pytest.mark.parametrize("target", [LOCAL, YARN_CLIENT, STANDALONE_CLIENT])
def test_deferrable_in_client_mode_waits_in_the_worker_and_says_why(target):
    p = plan(target=target, deferrable=True)
    assert not p.defer and any("needs a cluster deploy mode" in n for n in p.notes)


def test_python_env_archive_is_the_executors_interpreter():
    p = plan(target=YARN_CLUSTER, spark=SparkSettings(python_env_archive="hdfs:///envs/sf.tar.gz#pyenv"))
    assert p.archives == "hdfs:///envs/sf.tar.gz#pyenv"
    assert p.conf["spark.pyspark.python"] == p.conf["spark.executorEnv.PYSPARK_PYTHON"] == "./pyenv/bin/python"
    assert p.conf["spark.yarn.appMasterEnv.PYSPARK_PYTHON"] == "./pyenv/bin/python"
    assert "spark.pyspark.driver.python" not in p.conf and "PYSPARK_PYTHON" not in p.env_vars
    client = plan(target=YARN_CLIENT, spark=SparkSettings(python_env_archive="s3://b/env.tar.gz"))
    assert client.archives == "s3://b/env.tar.gz#shardyfusion_env"
    assert client.conf["spark.pyspark.driver.python"] == "/venv/bin/python"  # the driver runs here
    assert "spark.yarn.appMasterEnv.PYSPARK_PYTHON" not in client.conf


def test_credentials_reach_only_the_spark_submit_process_in_client_mode():
    for target in (LOCAL, YARN_CLIENT, STANDALONE_CLIENT):
        p = plan(target=target, credential_env=CREDS)
        assert p.process_env["AWS_SECRET_ACCESS_KEY"] == SECRET and p.redact == ("AKIAPLAN", SECRET)
        public = json.dumps({k: v for k, v in p.hook_kwargs().items() if k not in ("process_env", "redact")})
        assert SECRET not in public and SECRET not in repr(p)


def test_credentials_are_not_forwarded_to_a_driver_on_the_cluster():
    p = plan(target=YARN_CLUSTER, credential_env=CREDS)
    public = {k: v for k, v in p.hook_kwargs().items() if k != "redact"}  # redact: masks the tail only
    assert p.process_env == {} and SECRET not in json.dumps(public)
    assert any("credentials are not forwarded" in n for n in p.notes)


def test_spark_submit_next_to_the_interpreter_is_put_on_path():
    host = Host("/venv/bin/python", {"PATH": "/usr/bin"}, binary_on_path=False, binary_next_to_python=True)
    assert plan(host=host).process_env["PATH"].split(":") == ["/venv/bin", "/usr/bin"]
    assert "PATH" not in plan().process_env


@pytest.mark.parametrize(("spark", "target", "named"), [
    (SparkSettings(conf=["a"]), LOCAL, "spark_conf"),
    (SparkSettings(env_vars={1: "x"}), LOCAL, "spark_env_vars"),
    (SparkSettings(python_env_archive="#"), LOCAL, "python_env_archive"),
    (SparkSettings(env_vars={"A": "1"}), STANDALONE_CLUSTER, "spark_env_vars cannot be used"),
])
def test_bad_spark_arguments_name_themselves(spark, target, named):
    with pytest.raises(ConfigError, match=named):
        plan(target=target, spark=spark)


def test_the_plan_modules_import_no_airflow():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('airflow', 'pyspark', 'boto3'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import airflow_provider_shardyfusion.submission.plan\n"
        "import airflow_provider_shardyfusion.core.lifecycle.write_attempts\n"
        "import airflow_provider_shardyfusion.core.model.write_args\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ---- Spark Connect (the job as a Connect client in a child process) ------------------------------

def connect_plan(**kw):
    from airflow_provider_shardyfusion.submission.connect import build_connect_plan
    from airflow_provider_shardyfusion.submission.plan import SparkSettings

    args = dict(conn_id="sc", remote_url="sc://cluster:15002/;user_id=bob;token=TOKEN-42;use_ssl=True",
                spark=SparkSettings(conf={"spark.sql.shuffle.partitions": "64"}), python="/venv/bin/python",
                application="/cache/sharded_write_job.py", bundle_zip="/cache/bundle.zip", config_json='{"a": 1}',
                credential_env={"AWS_SECRET_ACCESS_KEY": "S3CRET"})
    args.update(kw)
    return build_connect_plan(**args)


def test_connect_plan_keeps_the_url_and_credentials_off_argv():
    from airflow_provider_shardyfusion.core.write import job_environment as job_env

    plan = connect_plan()
    assert plan.argv == ("/venv/bin/python", "/cache/sharded_write_job.py", "--config-b64", "eyJhIjogMX0=")
    assert not [a for a in plan.argv if "TOKEN-42" in a or "S3CRET" in a]
    assert plan.env[job_env.REMOTE_URL].endswith("token=TOKEN-42;use_ssl=True")
    assert plan.env[job_env.BUNDLE] == plan.env["PYTHONPATH"] == "/cache/bundle.zip"
    assert json.loads(plan.env[job_env.SPARK_CONF]) == {"spark.sql.shuffle.partitions": "64"}
    assert {"TOKEN-42", "S3CRET"} <= set(plan.redact) and plan.env["AWS_SECRET_ACCESS_KEY"] == "S3CRET"
    assert "TOKEN-42" not in repr(plan) and "S3CRET" not in repr(plan)
    assert not plan.defer and not plan.cluster_mode
    assert job_env.CA_CERT not in plan.env
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    trusting = connect_plan(ca_cert=pem)
    assert trusting.env[job_env.CA_CERT] == pem and trusting.argv == plan.argv


def test_connect_plan_refuses_what_a_connect_client_cannot_do():
    from airflow_provider_shardyfusion.submission.plan import SparkSettings

    with pytest.raises(ConfigError, match=r"deferrable=True cannot be used with the Spark Connect connection 'sc'"):
        connect_plan(deferrable=True)
    with pytest.raises(ConfigError, match=r"spark_env_vars cannot be used with the Spark Connect connection 'sc'"):
        connect_plan(spark=SparkSettings(env_vars={"X": "1"}))
    with pytest.raises(ConfigError, match=r"spark_conf keys \['spark.hadoop.fs.s3a.secret.key'\] look like credentials"):
        connect_plan(spark=SparkSettings(conf={"spark.hadoop.fs.s3a.secret.key": "x"}))
    with pytest.raises(ConfigError, match=r"python_env_archive 's3://b/env.tgz#e' must be a file on this worker"):
        connect_plan(spark=SparkSettings(python_env_archive="s3://b/env.tgz#e"))
    defaulted = connect_plan(deferrable=True, deferrable_by_default=True)
    assert not defaulted.defer and defaulted.notes == (
        "[operators] default_deferrable is ignored with the Spark Connect connection 'sc': the job runs as a "
        "Connect client inside this task, which waits for it",)
    plan = connect_plan(spark=SparkSettings(executor_memory="4g", num_executors=8, python_env_archive="/envs/e.tgz#e"))
    assert [n.split(" ")[0] for n in plan.notes] == ["executor_memory", "num_executors"]
    assert plan.env["SHARDYFUSION_PYTHON_ENV_ARCHIVE"] == "/envs/e.tgz#e"


@pytest.mark.parametrize(("settings", "named"), [
    (SparkSettings(python_env_archive="s3://AKIAEXAMPLE:topsecret@bucket/env.tar.gz#env"), "python_env_archive"),
    (SparkSettings(conf={"spark.eventLog.dir": "s3a://AKIAEXAMPLE:topsecret@bucket/logs"}), "spark_conf['spark.eventLog.dir']"),
])
def test_credentials_in_a_uri_setting_are_refused_without_repeating_them(settings, named):
    with pytest.raises(ConfigError) as refused:
        settings.validate()
    assert str(refused.value).startswith(named) and "topsecret" not in str(refused.value)


def test_spark_mappings_rendered_as_text_are_read():
    settings = SparkSettings(conf="{'spark.sql.shuffle.partitions': 8}", env_vars='{"TZ": "UTC"}').validate()
    assert settings.conf == {"spark.sql.shuffle.partitions": 8} and settings.env_vars == {"TZ": "UTC"}
    with pytest.raises(ConfigError, match=r"spark_conf keys \['spark.hadoop.fs.s3a.secret.key'\] look like"):
        SparkSettings(conf="{'spark.hadoop.fs.s3a.secret.key': 'x'}").validate()


def test_executor_sizes_rendered_as_text_are_read_and_bad_ones_named():
    settings = SparkSettings(executor_cores="4", num_executors=2, total_executor_cores=" 8 ").validate()
    assert (settings.executor_cores, settings.num_executors, settings.total_executor_cores) == (4, 2, 8)
    with pytest.raises(ConfigError, match=r"^num_executors 0 must be an integer >= 1$"):
        SparkSettings(num_executors="0").validate()
    with pytest.raises(ConfigError, match=r"^executor_cores 'four' must be an integer >= 1; .*native_obj=True"):
        SparkSettings(executor_cores="four").validate()
    with pytest.raises(ConfigError, match=r"^total_executor_cores True must be an integer >= 1$"):
        SparkSettings(total_executor_cores=True).validate()
