"""``python -m airflow_provider_shardyfusion``: the ``shardyfusion`` command line (see ``cli``)."""

from airflow_provider_shardyfusion.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
