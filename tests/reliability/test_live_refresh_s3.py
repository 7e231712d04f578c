"""A live reader on S3 through storage faults during a refresh (issue 42 item 11).

A reader that ingests refreshes (``ingest_refreshes=True``) follows a root on the moto S3 server
through the fault proxy (``fault_proxy.py``): one botocore attempt a call and a fast provider retry.
While it refreshes to a delta, the delta's layer downloads get 503 answers, then lost responses
(the connection closed after the server answered), each for longer than the retries: the refresh
fails with a ``StorageError`` and the old snapshot keeps serving exactly, from its live shards. A
transient 503 is retried; once the faults end, the next refresh succeeds and serves the delta
exactly, ingested into the same live shards.
"""

from __future__ import annotations

import pytest

from airflow_provider_shardyfusion.core.errors import StorageError
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.retry import RetryPolicy
from airflow_provider_shardyfusion.core.storage import s3 as s3_module
from tests.reliability.fault_proxy import FaultProxy, Rule
from tests.snapshot_factory import build_delta, build_snapshot, keys_by_shard

pytestmark = pytest.mark.s3

NUM_DBS = 4
# The delta's layer files (not its manifest): the faults hit the refresh's downloads.
LAYERS = r"run_id=t1/.*\.sst"


def test_a_live_reader_on_s3_keeps_its_snapshot_through_faults_during_a_refresh(s3_server, s3_root, s3_options,
                                                                               monkeypatch, figure):
    monkeypatch.setattr(s3_module, "DEFAULT_RETRY", RetryPolicy(attempts=2, base_delay_s=0.02, max_delay_s=0.05))
    keys = sorted(k for ks in keys_by_shard(NUM_DBS, 30).values() for k in ks)
    old = {k: b"t0-%d" % k for k in keys}
    build_snapshot(s3_root, list(old.items()), num_dbs=NUM_DBS, run_id="t0", shard_layout="sst",
                   storage_options=s3_options)
    checked = 0
    with FaultProxy(s3_server) as proxy, ShardedReader(
            s3_root, storage_options={**s3_options, "endpoint_url": proxy.url, "max_attempts": 1},
            ingest_refreshes=True) as reader:
        assert reader.multi_get(keys) == [old[k] for k in keys]
        live_before = sorted(s.db_id for s in reader.describe().live_shards)
        assert live_before == list(range(NUM_DBS))
        new = dict(old)
        new.update({k: b"t1-%d" % k for k in keys[::2]})
        build_delta(s3_root, {k: new[k] for k in keys[::2]}, run_id="t1", storage_options=s3_options)

        failed = 0
        for rule in (Rule("error", "GET", LAYERS, count=None, status=503, code="SlowDown"),
                     Rule("drop", "GET", LAYERS, count=None)):
            proxy.add(rule)
            with pytest.raises(StorageError):
                reader.refresh()
            proxy.remove(rule)
            assert rule.hits > 0, rule
            failed += 1
            assert reader.run_id == "t0" and reader.multi_get(keys) == [old[k] for k in keys]
            assert {k: reader.get(k) for k in keys} == old
            checked += 2 * len(keys)
        transient = proxy.add(Rule("error", "GET", LAYERS, count=1, status=500))
        assert reader.refresh() and reader.run_id == "t1"
        assert transient.hits == 1
        assert reader.multi_get(keys) == [new[k] for k in keys]
        assert {k: reader.get(k) for k in keys} == new
        checked += 2 * len(keys)
        live_after = sorted(s.db_id for s in reader.describe().live_shards)
        assert live_after == live_before and reader.health().shards_read_only == 0
        faulted = sum(1 for _, _, outcome in proxy.log if outcome != "forwarded")
    figure(refreshes_failed=failed, old_snapshot_kept=failed, requests_faulted=faulted, transient_retried=transient.hits,
           later_refresh="t1", live_shards_after=len(live_after), values_checked=checked)
