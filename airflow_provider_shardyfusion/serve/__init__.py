"""``shardyfusion serve``: a published snapshot over HTTP, for services that are not Python (SPEC §19).

* ``serve.config``: the server's options (``ServeConfig``), passed to each worker process;
* ``serve.app``: the FastAPI application built from a reader factory (routes, errors, metrics);
* ``serve.server``: runs it under uvicorn with ``--workers N`` processes sharing one cache.

Imports ``core`` only, never Airflow (the import-linter contract says so); FastAPI and uvicorn are
imported by these modules, never by the CLI's other commands.
"""
