"""Run the app of ``serve.app`` under uvicorn: ``--workers N`` processes sharing one cache.

Each worker opens its own reader from the ``ServeConfig`` in the environment; they share one
``cache_dir`` (a shard is downloaded and built once, under the reader's per-shard lock). Without
``--cache-dir``, several workers share a temporary folder removed when the server stops; so is the
folder through which each ``/metrics`` scrape shows every worker (``serve.worker_metrics``). SIGTERM
(or Ctrl-C) stops accepting connections and lets in-flight requests finish (uvicorn's graceful
shutdown, at most ``GRACEFUL_S`` seconds) before the readers close.

``--shard-ids`` naming a shard the published run does not have is refused before any worker
starts (``check_shard_ids``): no later retry can fix it while that run is served.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import replace
from typing import TYPE_CHECKING

from airflow_provider_shardyfusion.core.errors import ConfigError, ShardyfusionError
from airflow_provider_shardyfusion.core.model.snapshot import SnapshotRoot
from airflow_provider_shardyfusion.core.read.shard_subset import ShardSubset
from airflow_provider_shardyfusion.core.retry import NO_RETRY
from airflow_provider_shardyfusion.core.storage import open_store
from airflow_provider_shardyfusion.serve.config import SERVE_CONFIG_ENV

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.serve.config import ServeConfig

__all__ = ["APP_FACTORY", "GRACEFUL_S", "check_shard_ids", "run_server"]

log = logging.getLogger(__name__)

APP_FACTORY = "airflow_provider_shardyfusion.serve.app:app_from_environment"
GRACEFUL_S = 30


def run_server(config: ServeConfig, *, host: str = "127.0.0.1", port: int = 8080, workers: int = 1,
               log_level: str = "info") -> None:
    """Serve ``config`` on ``host:port`` until SIGTERM/SIGINT (blocks)."""
    import uvicorn

    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be within 0-65535, got {port}")
    check_shard_ids(config)
    made: list[str] = []
    if workers > 1:
        made.append(tempfile.mkdtemp(prefix="shardyfusion-serve-metrics-"))
        config = replace(config, metrics_dir=made[-1])
    if workers > 1 and config.cache_dir is None:
        made.append(tempfile.mkdtemp(prefix="shardyfusion-serve-"))
        config = replace(config, cache_dir=made[-1])
    os.environ[SERVE_CONFIG_ENV] = config.to_json()  # read by each worker (serve.app.app_from_environment)
    try:
        uvicorn.run(APP_FACTORY, factory=True, host=host, port=port, workers=workers, log_level=log_level,
                    access_log=False, timeout_graceful_shutdown=GRACEFUL_S, server_header=False)
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def check_shard_ids(config: ServeConfig) -> None:
    """Refuse ``config.shard_ids`` naming a shard the published run does not have: one ``ConfigError``
    naming the ids and the run's shard count.

    Only when the run can be read now, in one attempt: with nothing published yet or the storage
    down the workers start, keep trying, and ``/readyz`` says why they cannot open the snapshot.
    """
    if config.shard_ids is None:
        return
    subset = ShardSubset(config.shard_ids)
    try:
        snapshots = SnapshotRoot(open_store(config.root, {**config.storage_options, "max_attempts": 1}, retry=NO_RETRY))
        pointer = snapshots.current()
        manifest = snapshots.read_manifest(pointer) if pointer is not None else None
    except ShardyfusionError as exc:
        log.warning("serve: --shard-ids not checked at start, the published run cannot be read now: %s", exc)
        return
    if manifest is not None:
        try:
            subset.check_manifest(manifest)
        except ConfigError as exc:
            raise ConfigError(f"--shard-ids: {exc} at {config.root}") from None
