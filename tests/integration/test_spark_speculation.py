"""Speculative execution is safe (SPEC §6: attempt-isolated paths, deterministic winner).

Local mode never speculates (Spark turns speculation off when ``isLocal``), and Spark never puts a
speculative copy on a host where the task already runs (``local-cluster`` executors all live on
"localhost"). So this runs a real standalone cluster on loopback with two single-core workers on two
different loopback addresses, 127.0.0.1 and 127.0.0.2: two hosts as far as Spark can tell.
"""

from __future__ import annotations

import time

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.model.manifest import stored_files
from airflow_provider_shardyfusion.core.storage import open_store
from tests.spark_cluster import WorkerSpec, standalone_cluster
from tests.spark_helpers import assert_exact, int_table, read_snapshot, run, write_parquet

pytestmark = pytest.mark.spark

NUM_DBS, SLOW_DB, SLOW_SECONDS = 4, 1, 20
# The slow original started before run_write returned, so this long after the return it would have
# woken up from its sleep and uploaded, had it survived its kill (the upload takes well under a second).
LATE_UPLOAD_WINDOW_S = SLOW_SECONDS + 5


@pytest.fixture(scope="module")
def speculative_spark(tmp_path_factory):
    from pyspark.sql import SparkSession

    logs = tmp_path_factory.mktemp("spark_speculation")
    workers = (WorkerSpec("127.0.0.1"), WorkerSpec("127.0.0.2"))
    # The driver JVM starts while the workers register; it then waits for both executors itself.
    with standalone_cluster(logs, workers, wait_for_workers=False) as master:
        session = (
            SparkSession.builder.master(master).appName("shardyfusion-speculation")
            .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.executor.memory", "1g").config("spark.cores.max", "2")
            .config("spark.sql.shuffle.partitions", "4")
            # Start no job until both executors (both hosts) are registered.
            .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
            # Hand shard tasks to the idle executor at once instead of waiting 3 s for shuffle locality.
            .config("spark.locality.wait", "0")
            .config("spark.speculation", "true")
            .config("spark.speculation.interval", "200ms")
            .config("spark.speculation.quantile", "0.5")
            .config("spark.speculation.multiplier", "2")
            .config("spark.speculation.minTaskRuntime", "500ms")
            .config("spark.speculation.efficiency.enabled", "false")
            .getOrCreate()
        )
        try:
            session.sparkContext.setLogLevel("ERROR")
            infos = session.sparkContext._jsc.sc().statusTracker().getExecutorInfos()  # the driver is listed too
            hosts = sorted(i.host() for i in infos)
            assert hosts.count("127.0.0.2") == 1 and hosts.count("127.0.0.1") == 2, f"executor hosts {hosts}; logs in {logs}"
            yield session
        finally:
            session.stop()


def _keys_under(store, prefix: str) -> list[str]:
    return sorted(o.key for o in store.list(prefix))


def test_speculative_copy_wins_and_the_slow_original_leaves_nothing(speculative_spark, tmp_path):
    table, expected = int_table(8_000, seed=21)
    root = f"file://{tmp_path}/spec"
    # Shard 1's first attempt sleeps before writing anything; nothing fails, so the only way shard 1
    # can end up written by attempt 1 is a speculative copy that Spark launched on the other host.
    record = run(speculative_spark, faults={"slow_shard_attempt": {"db_id": SLOW_DB, "attempt": 0, "seconds": SLOW_SECONDS}},
                 output_uri=root, key_column="id", input_path=write_parquet(tmp_path, table), value_column="payload",
                 num_dbs=NUM_DBS)
    returned = time.monotonic()
    manifest, shards = read_snapshot(root)
    # Exactly one winner per shard; the speculative attempt 1 for the slow shard, attempt 0 elsewhere.
    assert [s.db_id for s in manifest.shards] == list(range(NUM_DBS))
    assert {s.db_id: s.attempt for s in manifest.shards} == {0: 0, 1: 1, 2: 0, 3: 0}
    winner = manifest.shard(SLOW_DB)
    assert "/db=00001/attempt=01-task=" in winner.db_url, winner.db_url
    assert record.stats["shards_written"] == NUM_DBS and record.stats["rows"] == len(expected)
    assert_exact(manifest, shards, expected, "u64be")

    store = open_store(root)
    winner_prefixes = tuple(store.key_of(s.db_url) + "/" for s in manifest.shards)
    slow_prefix = layout.shard_db_prefix(manifest.run_id, SLOW_DB)
    winner_files = sorted(store.key_of(winner.db_url) + "/" + f.name for f in stored_files(winner.files, winner.key_index))
    # What the writer guarantees when run_write returns: only winners' objects are left in this run.
    left = _keys_under(store, layout.shards_prefix(manifest.run_id))
    assert left and all(k.startswith(winner_prefixes) for k in left), left
    assert _keys_under(store, slow_prefix) == winner_files

    # The original is killed by Spark once the copy succeeds ("another attempt succeeded"): its Python
    # worker is destroyed or loses its socket while still sleeping, so it never uploads. Were it to
    # survive and upload after the writer's loser cleanup, those objects would sit in their own
    # attempt=00-task=<id> folder that no manifest names (readers unaffected) until
    # DeferredCleanupOperator deletes them; this checks that, on this Spark, there is no such upload.
    time.sleep(max(0.0, LATE_UPLOAD_WINDOW_S - (time.monotonic() - returned)))
    assert _keys_under(store, slow_prefix) == winner_files
    assert all(k.startswith(winner_prefixes) for k in _keys_under(store, layout.shards_prefix(manifest.run_id)))
