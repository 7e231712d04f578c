"""Every path under an output root is built and parsed here, and nowhere else (SPEC §3).

An output root is ``s3://bucket/prefix`` or ``file:///abs/dir``. Keys handed to an
``ObjectStore`` are relative to the root; URIs stored in manifests and pointers are absolute.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from airflow_provider_shardyfusion.core.errors import ConfigError, ManifestValidationError
from airflow_provider_shardyfusion.core.secrets import redact_uri, refuse_userinfo

__all__ = [
    "CURRENT_KEY",
    "MANIFESTS_DIR",
    "MANIFEST_NAME",
    "RUNS_DIR",
    "RUN_RECORD_NAME",
    "SHARDS_DIR",
    "STREAMS_DIR",
    "STREAM_OWNER_NAME",
    "ManifestKey",
    "ShardKey",
    "attempt_dir_name",
    "attempt_key",
    "format_ts",
    "join",
    "local_cache_dir",
    "local_layer_dir",
    "local_path_of",
    "manifest_key",
    "new_run_id",
    "normalize_root",
    "parse_manifest_key",
    "parse_run_record_key",
    "parse_shard_key",
    "parse_ts",
    "relative_key",
    "run_id_of_shard_url",
    "run_record_key",
    "scheme_of",
    "shard_db_dir",
    "shard_db_prefix",
    "shards_prefix",
    "split_run_record_ref",
    "stream_owner_key",
    "utc_now",
    "validate_run_id",
]

CURRENT_KEY = "_CURRENT"
MANIFESTS_DIR = "manifests"
RUNS_DIR = "runs"
SHARDS_DIR = "shards"
MANIFEST_NAME = "manifest.json"
RUN_RECORD_NAME = "run.json"
# Streams' own objects (owner, job reports); never run records, so cleanup and history pass them by.
STREAMS_DIR = f"{RUNS_DIR}/_streams"
STREAM_OWNER_NAME = "_owner.json"

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_TS_RE = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z"
_MANIFEST_KEY_RE = re.compile(
    rf"^{MANIFESTS_DIR}/(?P<ts>{_TS_RE})_run_id=(?P<run_id>[A-Za-z0-9._-]{{1,128}})/{MANIFEST_NAME}$"
)
_RUN_RECORD_KEY_RE = re.compile(rf"^{RUNS_DIR}/run_id=(?P<run_id>[A-Za-z0-9._-]{{1,128}})/{RUN_RECORD_NAME}$")
_SHARD_KEY_RE = re.compile(
    rf"^{SHARDS_DIR}/run_id=(?P<run_id>[A-Za-z0-9._-]{{1,128}})"
    r"(?:/db=(?P<db_id>\d{5})(?:/attempt=(?P<attempt>\d{2,})(?:-task=(?P<task>\d+))?(?:/(?P<rest>.*))?)?)?/?$"
)


def validate_run_id(run_id: object, *, what: str = "run_id") -> str:
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id) or run_id in (".", ".."):
        raise ConfigError(
            f"{what} {run_id!r} is invalid: use 1-128 characters of [A-Za-z0-9._-] "
            "(no slashes, not '.' or '..')"
        )
    return run_id


def new_run_id(now: datetime | None = None) -> str:
    """``<UTC yyyymmddTHHMMSSZ>-<8 hex>``: lexical order of generated ids is time order."""
    now = now or datetime.now(UTC)
    return f"{now.astimezone(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def utc_now() -> datetime:
    return datetime.now(UTC)


def format_ts(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime(_TS_FORMAT)


def parse_ts(text: str) -> datetime:
    return datetime.strptime(text, _TS_FORMAT).replace(tzinfo=UTC)


def normalize_root(uri: object) -> str:
    """Validate an output root and return its canonical form (no trailing slash).

    A bare absolute path is accepted as ``file://``; ``s3a://`` is accepted as ``s3://``.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(f"output_uri {uri!r} is invalid: expected 's3://bucket/prefix' or 'file:///abs/dir'")
    refuse_userinfo(uri, "output_uri")
    text = uri.strip()
    if text.startswith("/"):
        text = "file://" + text
    if text.startswith("s3a://"):
        text = "s3://" + text[len("s3a://") :]
    if text.startswith("file://"):
        path = text[len("file://") :]
        if not path.startswith("/"):
            raise ConfigError(f"output_uri {uri!r} is invalid: a file URI needs an absolute path, e.g. file:///data/out")
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ConfigError(f"output_uri {uri!r} is invalid: '.' and '..' segments are not allowed")
        return "file:///" + "/".join(parts) if parts else "file:///"
    if text.startswith("s3://"):
        rest = text[len("s3://") :]
        bucket, _, prefix = rest.partition("/")
        if not re.fullmatch(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", bucket):
            raise ConfigError(f"output_uri {uri!r} is invalid: {bucket!r} is not a valid S3 bucket name")
        parts = [p for p in prefix.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ConfigError(f"output_uri {uri!r} is invalid: '.' and '..' segments are not allowed")
        return f"s3://{bucket}" + ("/" + "/".join(parts) if parts else "")
    raise ConfigError(f"output_uri {uri!r} is invalid: expected 's3://bucket/prefix' or 'file:///abs/dir'")


def scheme_of(root: str) -> str:
    return root.split("://", 1)[0]


def local_path_of(root: str) -> str:
    """Filesystem path of a ``file://`` root."""
    if not root.startswith("file://"):
        raise ConfigError(f"{root!r} is not a file:// URI")
    return root[len("file://") :] or "/"


def join(root: str, key: str) -> str:
    return _with_slash(root) + key.lstrip("/")


def _with_slash(root: str) -> str:
    # ``file:///`` (the filesystem root) already ends with its separator; stripping it would give ``file:``.
    return root if root.endswith(":///") else root.rstrip("/") + "/"


def relative_key(root: str, uri: str) -> str:
    """Key of ``uri`` relative to ``root``; refuses anything outside the root."""
    prefix = _with_slash(root)
    if not uri.startswith(prefix):
        # The URI comes from a stored object (pointer, record): never echo user info it may carry.
        raise ManifestValidationError(f"{redact_uri(uri)!r} lies outside the output root {root!r}")
    key = uri[len(prefix) :]
    if any(p in ("", ".", "..") for p in key.rstrip("/").split("/")):
        raise ManifestValidationError(f"{uri!r} contains empty, '.' or '..' path segments")
    return key


# ---- keys ------------------------------------------------------------------------------------


def manifest_key(run_id: str, published_at: datetime) -> str:
    validate_run_id(run_id)
    return f"{MANIFESTS_DIR}/{format_ts(published_at)}_run_id={run_id}/{MANIFEST_NAME}"


def run_record_key(run_id: str) -> str:
    validate_run_id(run_id)
    return f"{RUNS_DIR}/run_id={run_id}/{RUN_RECORD_NAME}"


def stream_owner_key(stream_id: str) -> str:
    """Who writes the stream: its checkpoint's identity and the writer's lease (``core.stream.owner``)."""
    validate_run_id(stream_id, what="stream_id")
    return f"{STREAMS_DIR}/{stream_id}/{STREAM_OWNER_NAME}"


def shards_prefix(run_id: str) -> str:
    validate_run_id(run_id)
    return f"{SHARDS_DIR}/run_id={run_id}/"


def shard_db_prefix(run_id: str, db_id: int) -> str:
    return shards_prefix(run_id) + shard_db_dir(db_id)


def shard_db_dir(db_id: int) -> str:
    """A shard's folder within its run's ``shards_prefix`` (apart, so a check over many shards of one
    run validates the run id once)."""
    return f"db={db_id:05d}/"


def attempt_dir_name(attempt: int, task_attempt_id: int | None = None) -> str:
    """``attempt=NN`` plus ``-task=<id>``, unique even when stage retries restart attempt numbers."""
    if attempt < 0 or (task_attempt_id is not None and task_attempt_id < 0):
        raise ConfigError(f"attempt {attempt} / task attempt id {task_attempt_id} must be >= 0")
    name = f"attempt={attempt:02d}"
    return name if task_attempt_id is None else f"{name}-task={task_attempt_id}"


def attempt_key(run_id: str, db_id: int, attempt: int, task_attempt_id: int | None = None) -> str:
    return f"{shard_db_prefix(run_id, db_id)}{attempt_dir_name(attempt, task_attempt_id)}"


@dataclass(frozen=True)
class ManifestKey:
    """What a manifest's key says: when the run was published and which run it is."""

    published_at: datetime
    run_id: str


@dataclass(frozen=True)
class ShardKey:
    """What a key under ``shards/`` says: run, shard, attempt and the rest of the path (parsed, never guessed)."""

    run_id: str
    db_id: int | None
    attempt: int | None
    task_attempt_id: int | None
    rest: str | None

    @property
    def attempt_key(self) -> str | None:
        if self.db_id is None or self.attempt is None:
            return None
        return attempt_key(self.run_id, self.db_id, self.attempt, self.task_attempt_id)


def parse_manifest_key(key: str) -> ManifestKey | None:
    m = _MANIFEST_KEY_RE.fullmatch(key)
    if not m or m["run_id"] in (".", ".."):
        return None
    try:
        return ManifestKey(parse_ts(m["ts"]), m["run_id"])
    except ValueError:  # digits in the right places, but not a date (month 13, …)
        return None


def parse_run_record_key(key: str) -> str | None:
    m = _RUN_RECORD_KEY_RE.fullmatch(key)
    return m["run_id"] if m and m["run_id"] not in (".", "..") else None


def split_run_record_ref(ref: str) -> tuple[str, str]:
    """``<root>/runs/run_id=<id>/run.json`` → ``(root, run_id)``."""
    root, sep, rest = str(ref).rpartition(f"/{RUNS_DIR}/")
    run_id = parse_run_record_key(f"{RUNS_DIR}/{rest}") if sep else None
    if not root or run_id is None:
        raise ConfigError(
            f"run_record_ref {ref!r} is invalid: expected '<output_uri>/{RUNS_DIR}/run_id=<run_id>/{RUN_RECORD_NAME}', "
            "e.g. the run_record_ref returned by ShardedWriteOperator"
        )
    return normalize_root(root), run_id


def parse_shard_key(key: str) -> ShardKey | None:
    m = _SHARD_KEY_RE.fullmatch(key)
    if not m or m["run_id"] in (".", "..") or (m["rest"] and ".." in m["rest"].split("/")):
        return None
    return ShardKey(
        run_id=m["run_id"],
        db_id=int(m["db_id"]) if m["db_id"] is not None else None,
        attempt=int(m["attempt"]) if m["attempt"] is not None else None,
        task_attempt_id=int(m["task"]) if m["task"] is not None else None,
        rest=m["rest"],
    )


def local_cache_dir(cache_root: str, run_id: str, db_id: int) -> str:
    """Where a reader keeps its local copy of one shard."""
    validate_run_id(run_id)
    return os.path.join(cache_root, f"run_id={run_id}", f"db={db_id:05d}")


def run_id_of_shard_url(url: str) -> str:
    """The run whose folder holds a shard URL (``<root>/shards/run_id=<run>/db=…``)."""
    _, sep, rest = str(url).rpartition(f"/{SHARDS_DIR}/")
    parsed = parse_shard_key(f"{SHARDS_DIR}/{rest}") if sep else None
    if parsed is None:
        raise ConfigError(f"{url!r} is not a shard URL ('<output_uri>/{SHARDS_DIR}/run_id=<run_id>/db=<db_id>/...')")
    return parsed.run_id


def local_layer_dir(cache_root: str, run_id: str, db_id: int) -> str:
    """Where a reader keeps the verified files of one layer (the run that wrote it, for one shard)."""
    validate_run_id(run_id)
    return os.path.join(cache_root, "layers", f"run_id={run_id}", f"db={db_id:05d}")
