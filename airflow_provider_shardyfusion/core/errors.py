"""The single error hierarchy of the provider.

Every error raised on purpose by core, the Spark job or the Airflow classes derives from
``ShardyfusionError`` so callers can catch one type, and the run record can store the exact
type name a user will see in the Airflow task log.
"""

from __future__ import annotations


def show_value(value: object, limit: int = 80) -> str:
    """``repr`` of an offending value, truncated, for error messages that name it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def text_number_hint(value: object) -> str:
    """For a number that arrived as text: most likely a Jinja template, which renders to a string."""
    if not isinstance(value, str):
        return ""
    return ("; it is text, as a templated argument renders unless the DAG sets "
            "render_template_as_native_obj=True (or pass a literal number)")


class ShardyfusionError(Exception):
    """Base class of every error raised by airflow-provider-shardyfusion."""


class ConfigError(ShardyfusionError, ValueError):
    """A write/read configuration value is invalid; raised before anything is written."""


class InputDataError(ShardyfusionError, ValueError):
    """A row of the input breaks a rule (null key, duplicate key, key out of range, …)."""


class KeyEncodingError(InputDataError):
    """A key cannot be encoded with the requested key encoding."""


class ShardAssignmentError(ShardyfusionError):
    """A row was routed to an invalid shard, or routing disagrees with the reader's function."""


class ShardCoverageError(ShardyfusionError):
    """Shard results do not cover ``[0, num_dbs)`` consistently."""


class ShardWriteError(ShardyfusionError):
    """Writing one shard failed; the message names db_id, attempt, db_url and rows written."""


class PublishManifestError(ShardyfusionError):
    """The manifest or the ``_CURRENT`` pointer could not be published."""


class RunSupersededError(PublishManifestError):
    """A run that started later is live already: ``_CURRENT`` never moves back to an older run
    unless a rollback is asked for."""


class ManifestValidationError(ShardyfusionError, ValueError):
    """A manifest or ``_CURRENT`` pointer is malformed or unsafe to follow."""


class RunRecordError(ShardyfusionError):
    """A run record is malformed, missing, or says the run cannot go on."""


class RunKilled(RunRecordError):
    """The Airflow task that owned the run was stopped; the run was marked failed for it."""

    def __init__(self, message: str = "killed: the Airflow task was stopped"):
        super().__init__(message)


class RunAbandoned(RunRecordError):
    """The run's writer is gone (its lease expired, or spark-submit ended without finishing the run)."""


class WriterLost(RunRecordError):
    """A ``running`` run record's lease expired: the writer died without marking the run failed."""


class CleanupRefusedError(ShardyfusionError):
    """Cleanup would risk a snapshot that may still be needed (e.g. ``_CURRENT`` is missing); nothing deleted."""


class SparkSubmitError(ShardyfusionError):
    """spark-submit failed, or ended without the writer finishing its run record."""


class StorageError(ShardyfusionError):
    """An object store operation failed."""


class ObjectNotFoundError(StorageError, KeyError):
    """The requested object does not exist."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else "object not found"


class ChecksumMismatchError(StorageError):
    """A downloaded file does not match the size or checksum recorded in the manifest."""


class ReaderError(ShardyfusionError):
    """The reader cannot serve a request (closed, routing needs context, …)."""


def error_type_by_name(name: str) -> type[ShardyfusionError]:
    """Map a stored error type name back to its class (unknown names map to the base class)."""
    found = _ALL.get(name)
    return found if found is not None else ShardyfusionError


_ALL: dict[str, type[ShardyfusionError]] = {
    cls.__name__: cls
    for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, ShardyfusionError)
}
