"""The single error hierarchy of the provider.

Every error raised on purpose by core, the Spark job or the Airflow classes derives from
``ShardyfusionError`` so callers can catch one type, and the run record can store the exact
type name a user will see in the Airflow task log.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "BaseNotLiveError", "ChecksumMismatchError", "CleanupRefusedError", "ClockSkewError", "ConfigError", "InputDataError",
    "KeyEncodingError", "ManifestValidationError", "ObjectNotFoundError", "PublishManifestError", "ReaderError",
    "RunAbandoned", "RunFailedError", "RunKilled", "RunRecordError", "RunSupersededError", "ShardAssignmentError",
    "ShardCoverageError", "ShardNotServedError", "ShardWriteError", "ShardyfusionError", "SparkConnectError",
    "SparkSubmitError", "StorageError",
    "StreamOwnershipError", "UnusableSnapshotError", "WriterLost", "error_type_by_name", "show_value", "text_number_hint",
]


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


class BaseNotLiveError(PublishManifestError):
    """A delta or compaction whose base is not the live run: publishing it would drop the live run's
    changes, so it goes live only once its base is live again."""


class RunSupersededError(PublishManifestError):
    """A run that started later is live already: ``_CURRENT`` never moves back to an older run
    unless a rollback is asked for."""


class StreamOwnershipError(ConfigError):
    """A streaming writer may not write its stream: another checkpoint or a live writer owns it, or
    ``_CURRENT`` names a run that is not the stream's last batch (a rollback, another writer)."""


class ManifestValidationError(ShardyfusionError, ValueError):
    """A manifest or ``_CURRENT`` pointer is malformed or unsafe to follow.

    ``report``: the validation report (``core.lifecycle.validation.ValidationReport``) when a validation
    found the problems; its ``failures`` lists each one.
    """

    report: Any = None

    def __init__(self, message: str, *, report: Any = None):
        super().__init__(message)
        self.report = report

    @property
    def failures(self) -> list[str]:
        """Every problem the validation found (empty without a report)."""
        return list(self.report.failures) if self.report is not None else []


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


class ClockSkewError(RunRecordError):
    """The writer's clock disagrees with the storage's by more than ``run_record.MAX_CLOCK_SKEW``.

    Run start times decide which of two runs is newer (the never-backwards rule) and leases expire
    by the clock, so such a run is refused at its start rather than judged wrongly later.
    """


class RunFailedError(RunRecordError):
    """A run ended without a snapshot to use: the writer failed, was lost, or never went live.

    ``error_type`` is the writer's own error type name, ``writer_message`` its message, ``reason``
    what ended the wait (``failed``, ``writer_lost``, ``missing``, ``unreadable``, ``not_live``,
    ``timed_out``) and ``run_id`` the run. ``RunFailedError.of`` returns an instance of a class
    that derives from the writer's own class too, so ``except InputDataError`` catches it and
    ``type(e).__name__`` is the writer's.
    """

    def __init__(self, message: str, *, error_type: str | None = None, reason: str | None = None,
                 run_id: str | None = None, writer_message: str | None = None):
        super().__init__(message)
        self.error_type = error_type or type(self).__name__
        self.reason = reason
        self.run_id = run_id
        self.writer_message = writer_message

    @classmethod
    def of(cls, error_type: str | None, message: str, *, reason: str | None = None, run_id: str | None = None,
           writer_message: str | None = None) -> RunFailedError:
        """The failure as the writer's own class (by name) with ``message``."""
        name = error_type or cls.__name__
        failure_cls = _failure_class(name)
        if failure_cls is RunFailedError and name not in _ALL:
            message = f"{name}: {message}"  # not one of ours (e.g. a Py4J error): keep its name visible
        return failure_cls(message, error_type=name, reason=reason, run_id=run_id, writer_message=writer_message)

    def __reduce__(self) -> Any:  # the dynamic classes are rebuilt by name, so the error pickles
        return (_rebuild_failure, (self.error_type, str(self), self.reason, self.run_id, self.writer_message))


class CleanupRefusedError(ShardyfusionError):
    """Cleanup would risk a snapshot that may still be needed (e.g. ``_CURRENT`` is missing); nothing deleted."""


class SparkSubmitError(ShardyfusionError):
    """spark-submit failed, or ended without the writer finishing its run record."""


class SparkConnectError(SparkSubmitError):
    """The Spark Connect path's counterpart of ``SparkSubmitError``: the Connect server could not be
    reached or stopped answering, or the job's Connect client process failed (no spark-submit ran)."""


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


class ShardNotServedError(ReaderError):
    """A key routes to a shard this reader does not serve (``ShardedReader(shard_ids=…)``).

    ``key``, ``db_id`` and ``served`` (the served ids, compactly, e.g. ``"0-15,32"``) say which
    host should answer instead: route the key with ``reader.route(key)`` before asking.
    """

    def __init__(self, message: str, *, key: object = None, db_id: int = -1, served: str = ""):
        super().__init__(message)
        self.key = key
        self.db_id = db_id
        self.served = served

    def __reduce__(self) -> Any:  # keyword-only fields: rebuilt explicitly, so the error pickles
        return (_shard_not_served, (str(self), self.key, self.db_id, self.served))


class UnusableSnapshotError(ReaderError):
    """``_CURRENT`` names a run the reader cannot serve: the pointer is malformed or gone, or the
    manifest it names is missing or invalid. The reader keeps serving its snapshot; the check that
    found it failed (``health()`` says so), and ``refresh()`` returns False for it (SPEC §9).
    Built by the class methods below, so that ``refresh()`` and the follower word it alike."""

    @classmethod
    def malformed_pointer(cls, current_uri: str, cause: BaseException, serving: str) -> UnusableSnapshotError:
        return cls(f"{current_uri} is malformed: {cause}; the reader keeps serving run {serving}")

    @classmethod
    def pointer_gone(cls, current_uri: str, serving: str) -> UnusableSnapshotError:
        return cls(f"{current_uri} has disappeared; the reader keeps serving run {serving}")

    @classmethod
    def run(cls, current_uri: str, run_id: str, manifest_ref: str, cause: BaseException,
            serving: str) -> UnusableSnapshotError:
        return cls(f"{current_uri} names run {run_id} ({manifest_ref}), which cannot be served: {cause}; "
                   f"the reader keeps serving run {serving}")


def _shard_not_served(message: str, key: object, db_id: int, served: str) -> ShardNotServedError:
    return ShardNotServedError(message, key=key, db_id=db_id, served=served)


@functools.cache
def _failure_class(name: str) -> type[RunFailedError]:
    """``RunFailedError`` joined with the error class called ``name`` (created once per name)."""
    base = _ALL.get(name)
    if base is None or base is RunFailedError:
        return RunFailedError
    # A base of RunFailedError itself (RunRecordError, ShardyfusionError) cannot come first in the MRO.
    bases: tuple[type, ...] = (RunFailedError,) if issubclass(RunFailedError, base) else (base, RunFailedError)
    namespace = {"__module__": base.__module__, "__qualname__": base.__qualname__, "__doc__": base.__doc__,
                 "__init__": RunFailedError.__init__, "__str__": Exception.__str__}
    return type(base.__name__, bases, namespace)


def _rebuild_failure(error_type: str, message: str, reason: str | None, run_id: str | None,
                     writer_message: str | None) -> RunFailedError:
    return _failure_class(error_type)(message, error_type=error_type, reason=reason, run_id=run_id,
                                      writer_message=writer_message)


def error_type_by_name(name: str) -> type[ShardyfusionError]:
    """Map a stored error type name back to its class (unknown names map to the base class)."""
    found = _ALL.get(name)
    return found if found is not None else ShardyfusionError


_ALL: dict[str, type[ShardyfusionError]] = {
    cls.__name__: cls
    for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, ShardyfusionError)
}
