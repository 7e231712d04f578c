"""Run the app of ``serve.app`` under uvicorn: ``--workers N`` processes sharing one cache.

Each worker opens its own reader from the ``ServeConfig`` in the environment; they share one
``cache_dir`` (a shard is downloaded and built once, under the reader's per-shard lock). Without
``--cache-dir``, several workers share a temporary folder removed when the server stops. SIGTERM
(or Ctrl-C) stops accepting connections and lets in-flight requests finish (uvicorn's graceful
shutdown, at most ``GRACEFUL_S`` seconds) before the readers close.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from typing import TYPE_CHECKING

from airflow_provider_shardyfusion.core.errors import ConfigError
from airflow_provider_shardyfusion.serve.config import SERVE_CONFIG_ENV

if TYPE_CHECKING:
    from airflow_provider_shardyfusion.serve.config import ServeConfig

__all__ = ["APP_FACTORY", "GRACEFUL_S", "run_server"]

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
    shared: str | None = None
    if workers > 1 and config.cache_dir is None:
        shared = tempfile.mkdtemp(prefix="shardyfusion-serve-")
        config = replace(config, cache_dir=shared)
    os.environ[SERVE_CONFIG_ENV] = config.to_json()  # read by each worker (serve.app.app_from_environment)
    try:
        uvicorn.run(APP_FACTORY, factory=True, host=host, port=port, workers=workers, log_level=log_level,
                    access_log=False, timeout_graceful_shutdown=GRACEFUL_S, server_header=False)
    finally:
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
