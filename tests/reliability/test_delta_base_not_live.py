"""Promise: a delta on a base that is not live never goes live and is never advertised as publishable.

Real Spark (local mode) on a local root: a full run, then two deltas (the second live). A delta on
the first delta asked to publish is refused at the job's start, before its input is read (the
input path does not exist), naming both runs; nothing is written and ``_CURRENT`` does not move.
Staged (``publish=False``) the same delta is written, its publish is refused naming both runs
without suggesting a publish, and once its base is live again (a rollback) it publishes and reads
back exactly.
"""

from __future__ import annotations

import pytest

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import BaseNotLiveError
from airflow_provider_shardyfusion.core.lifecycle.publish import publish_run
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.reader import ShardedReader
from airflow_provider_shardyfusion.core.storage import open_store
from tests.integration import test_delta
from tests.spark_helpers import run

pytestmark = pytest.mark.spark
spark = test_delta.spark  # the same module-scoped local session fixture
NO_SLEEP = {"sleep": lambda s: None}


def test_a_delta_on_a_base_that_is_not_live(spark, tmp_path, figure):
    root = f"file://{tmp_path}/snap"
    store = open_store(root)
    snapshots = SnapshotRoot(store)
    chain = test_delta.Chain(spark, tmp_path, root, None)
    chain.write("full", {k: f"v0-{k}" for k in range(150)})
    chain.write("delta", {1: "d1"}, [2])
    base_model = dict(chain.model)
    chain.write("delta", {3: "d2"}, [4])

    def data_keys():
        return {o.key for o in store.list(layout.SHARDS_DIR + "/")} | {o.key for o in store.list(layout.MANIFESTS_DIR + "/")}

    before, pointer = data_keys(), store.get(layout.CURRENT_KEY).data
    with pytest.raises(BaseNotLiveError) as refused:
        run(spark, output_uri=root, key_column="id", value_column="payload", run_id="eager", write_mode="delta",
            delete_column="deleted", base_run_id="step02-delta", input_path=str(tmp_path / "never-read"))
    message = str(refused.value)
    assert "'eager' is written on run 'step02-delta', but _CURRENT names 'step03-delta'" in message
    assert "PublishSnapshotOperator" not in message and "nothing was written" in message
    objects_written = len(data_keys() - before)
    pointer_moves = int(store.get(layout.CURRENT_KEY).data != pointer)
    assert objects_written == 0 and pointer_moves == 0

    chain.write("delta", {5: "late"}, [], base_run_id="step02-delta", publish=False)  # step04-delta, staged
    refusals = 0
    for allow_older in (False, True):
        with pytest.raises(BaseNotLiveError) as refused:
            publish_run(snapshots, run_id="step04-delta", allow_older=allow_older, **NO_SLEEP)
        assert "'step04-delta' is written on run 'step02-delta', but _CURRENT names 'step03-delta'" in str(refused.value)
        assert "PublishSnapshotOperator" not in str(refused.value)
        refusals += 1
    assert snapshots.current().run_id == "step03-delta"

    publish_run(snapshots, run_id="step02-delta", allow_older=True, **NO_SLEEP)
    publish_run(snapshots, run_id="step04-delta", **NO_SLEEP)
    model = {**base_model, 5: b"late"}
    with ShardedReader(root, cache_dir=tmp_path / "cache") as reader:
        assert reader.run_id == "step04-delta"
        assert reader.multi_get(sorted(model)) == [model[k] for k in sorted(model)]
    figure(refused_at_start=1, objects_written=objects_written, pointer_moves=pointer_moves,
           staged_publishes_refused=refusals, rows_checked=len(model))
