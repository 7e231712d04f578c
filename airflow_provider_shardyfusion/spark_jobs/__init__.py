"""The bundled PySpark application (SPEC §6), shipped to the cluster with --py-files."""
