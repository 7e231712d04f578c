"""Pure-Python heart of the provider: never imports Airflow or PySpark (shipped to executors).

Its rooms, each importing only the ones listed after it (``make lint`` checks it):

* ``core.lifecycle``: a root after the write (publish, validation, cleanup, history, run outcomes);
* ``core.stream``: one snapshot per streaming micro-batch, the stream's owner, the job's contract;
* ``core.read`` and ``core.write``: the reader with its shard cache; the writer's logic;
* ``core.model``: what is stored (manifest, run record, pointer), routing, and ``SnapshotRoot``;
* ``core.storage``: the object stores;

and beside them, used by all: ``errors``, ``layout`` (every path), ``serialization`` (the one JSON
codec of what crosses a boundary), ``retry``, ``secrets``, ``arguments`` and ``scratch``.

The public subset, kept compatible across minor releases (the API reference documents it):

* ``core.read.reader``: ``ShardedReader``, ``RefreshReport``, and ``ReaderDescription`` with its
  ``OpenShard`` (``describe()``), reading a published snapshot;
* ``core.read.async_reader``: ``AsyncShardedReader``, the same for an asyncio event loop;
* ``core.model.config``: ``build_write_config``, the write's arguments for your own Spark job;
* ``core.errors``: the error hierarchy (``ShardyfusionError`` and its subclasses);
* ``core.model.encoding``: the key encodings and value formats, ``key_from_text`` / ``key_to_show``.

Every other module of ``core`` serves the operators, the Spark job, the CLI and the UI; its
``__all__`` says what the rest of the package may use, not what users can rely on.
"""

__all__ = ["errors", "model", "read"]
