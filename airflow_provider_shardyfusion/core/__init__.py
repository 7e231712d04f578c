"""Pure-Python heart of the provider: never imports Airflow or PySpark (shipped to executors).

The public subset, kept compatible across minor releases (the API reference documents it):

* ``core.reader``: ``ShardedReader`` and ``RefreshReport``, reading a published snapshot;
* ``core.config``: ``build_write_config``, the write's arguments for your own Spark job;
* ``core.errors``: the error hierarchy (``ShardyfusionError`` and its subclasses);
* ``core.encoding``: the key encodings and value formats, ``key_from_text`` / ``key_to_show``.

Every other module of ``core`` serves the operators, the Spark job, the CLI and the UI; its
``__all__`` says what the rest of the package may use, not what users can rely on.
"""

__all__ = ["config", "encoding", "errors", "reader"]
