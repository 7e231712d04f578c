"""Exactly one snapshot per streaming micro-batch (SPEC §14): run ids and the per-batch decision.

A stream's runs are named ``<stream_id>-b<batch_id:012d>[-r<n>]``: the batch id is the idempotency
key (as Delta Lake's ``txnAppId`` / ``txnVersion``), ``-r<n>`` the n-th rewrite after an attempt
that failed or was never published. ``decide_batch`` is pure: given what the root holds about the
stream's runs and which run ``_CURRENT`` names, it says whether a micro-batch is skipped or written
(again). An attempt that succeeded but never went live is written again rather than published: the
job commits only the run it writes itself (publishing a staged run, with its checks against cleanup,
is the operators' and the CLI's), and what leaves one (a crash or a refusal at the pointer move) is rare.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from airflow_provider_shardyfusion.core import layout
from airflow_provider_shardyfusion.core.errors import ConfigError, StreamOwnershipError

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "MAX_STREAM_ID_CHARS", "Action", "Decision", "StreamRun", "batch_run_id", "check_live_run", "decide_batch",
    "parse_batch_run_id", "validate_stream_id",
]

# Room left in a run id (128 chars) for "-b<12+ digits>-r<n>".
MAX_STREAM_ID_CHARS = 96
_STREAM_ID_RE = re.compile(r"^[A-Za-z0-9._-]+$")

Action = Literal["skip", "write"]


def validate_stream_id(stream_id: object) -> str:
    """A stream id is a run-id fragment: 1-96 characters of ``[A-Za-z0-9._-]``."""
    if (not isinstance(stream_id, str) or not stream_id or len(stream_id) > MAX_STREAM_ID_CHARS
            or not _STREAM_ID_RE.fullmatch(stream_id) or stream_id in (".", "..")):
        raise ConfigError(
            f"stream_id {stream_id!r} is invalid: use 1-{MAX_STREAM_ID_CHARS} characters of [A-Za-z0-9._-]; it "
            "starts the run id of every micro-batch (<stream_id>-b<batch_id>) and must stay the same across restarts"
        )
    return stream_id


def batch_run_id(stream_id: str, batch_id: int, retry: int = 0) -> str:
    """``<stream_id>-b<batch_id:012d>``, with ``-r<retry>`` for a rewrite."""
    validate_stream_id(stream_id)
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
        raise ConfigError(f"batch_id {batch_id!r} must be a non-negative integer")
    if isinstance(retry, bool) or not isinstance(retry, int) or retry < 0:
        raise ConfigError(f"retry {retry!r} must be a non-negative integer")
    return layout.validate_run_id(f"{stream_id}-b{batch_id:012d}" + (f"-r{retry}" if retry else ""))


def parse_batch_run_id(stream_id: str, run_id: str) -> tuple[int, int] | None:
    """``(batch_id, retry)`` if ``run_id`` is one of this stream's batch runs (canonical form only), else None."""
    m = re.fullmatch(re.escape(stream_id) + r"-b(\d{12,})(?:-r([1-9]\d*))?", run_id)
    if m is None:
        return None
    batch_id = int(m.group(1))
    if f"{batch_id:012d}" != m.group(1):  # "b0000000000001" with 13 digits is not a name we give
        return None
    return batch_id, int(m.group(2) or 0)


@dataclass(frozen=True)
class StreamRun:
    """What the root holds about one run of the stream (read from its run record and manifest)."""

    run_id: str
    batch_id: int
    retry: int
    status: str  # running | succeeded | failed (the run record's)
    published: bool  # ``published_at`` is set, or ``_CURRENT`` names it
    deleted: bool = False  # cleanup removed its data


@dataclass(frozen=True)
class Decision:
    """What to do with one micro-batch.

    ``skip``: ``run_id`` is the published run that makes the batch a replay (or supersedes it).
    ``write``: write the batch as ``run_id`` with ``write_mode`` on the live snapshot; the
    ``abandon`` attempts (``running`` records of writers that are gone) are marked failed first.
    """

    action: Action
    run_id: str
    reason: str
    write_mode: Literal["full", "delta"] | None = None
    abandon: tuple[str, ...] = ()
    warning: str | None = None
    last_published_batch: int | None = None
    notes: tuple[str, ...] = field(default=())


def decide_batch(stream_id: str, batch_id: int, runs: Iterable[StreamRun], *, live_run_id: str | None,
                 accept_live_run: str | None = None) -> Decision:
    """The decision for micro-batch ``batch_id`` of ``stream_id``.

    ``runs``: the stream's runs known to the caller (at least every attempt of this batch, the runs
    of later batches, and the newest published run of an earlier batch); ``live_run_id``: the run
    ``_CURRENT`` names (None: no snapshot yet). Runs of other streams are ignored. A batch to write
    while ``_CURRENT`` names another run than the stream's last published one raises
    ``StreamOwnershipError``, unless that run is ``accept_live_run``.
    """
    ours = [r for r in runs if parse_batch_run_id(stream_id, r.run_id) is not None]
    published = [r for r in ours if r.published or r.run_id == live_run_id]
    last = max((r.batch_id for r in published), default=None)
    attempts = sorted((r for r in ours if r.batch_id == batch_id), key=lambda r: r.retry)
    done = next((r for r in published if r.batch_id == batch_id), None)
    if done is not None:
        return Decision("skip", done.run_id, f"batch {batch_id} is already published as run {done.run_id!r} (a replay)",
                        last_published_batch=last)
    if last is not None and last > batch_id:
        newest = max((r for r in published if r.batch_id == last), key=lambda r: r.retry)
        return Decision("skip", newest.run_id, f"batch {batch_id} is below the last published batch {last} "
                        f"(run {newest.run_id!r}): superseded", last_published_batch=last)
    if published:
        check_live_run(stream_id, batch_id, max(published, key=lambda r: (r.batch_id, r.retry)), live_run_id,
                       accept_live_run)
    next_run = batch_run_id(stream_id, batch_id, max((r.retry for r in attempts), default=-1) + 1)
    mode: Literal["full", "delta"] = "full" if live_run_id is None else "delta"
    warning = None
    if last is not None and batch_id > last + 1:
        warning = (f"stream {stream_id!r}: batch {batch_id} follows the last published batch {last}; batches "
                   f"{last + 1}..{batch_id - 1} were never published here (a gap)")
    abandon = tuple(r.run_id for r in attempts if r.status == "running")
    notes = tuple(f"attempt {r.run_id!r} {_why_rewritten(r)}" for r in attempts)
    reason = f"writing batch {batch_id} as run {next_run!r} ({mode})" + (f": {'; '.join(notes)}" if notes else "")
    return Decision("write", next_run, reason, write_mode=mode, abandon=abandon, warning=warning,
                    last_published_batch=last, notes=notes)


def _why_rewritten(run: StreamRun) -> str:
    if run.status == "failed":
        return "failed"
    if run.status == "running":
        return "is a dead running record (its writer is gone): marked failed"
    if run.deleted:
        return "succeeded but was never published and its data was deleted"
    return "succeeded but was never published (its writer stopped before _CURRENT moved); left staged"


def check_live_run(stream_id: str, batch_id: int, newest: StreamRun, live_run_id: str | None,
                   accept_live_run: str | None) -> None:
    """Refuse to build on a ``_CURRENT`` that is not the stream's newest published batch.

    Every batch is a delta on the live snapshot: after a rollback, or a full write of another writer
    going live, the next batch would quietly continue from a snapshot without the stream's latest
    batches (or with foreign data).
    """
    if live_run_id == newest.run_id or (accept_live_run is not None and live_run_id == accept_live_run):
        return
    live = "no run (no _CURRENT)" if live_run_id is None else f"run {live_run_id!r}"
    raise StreamOwnershipError(
        f"stream {stream_id!r}: _CURRENT names {live}, but the stream's last batch {newest.batch_id} was published "
        f"as run {newest.run_id!r} (a rollback, or another writer published on this root). Batch {batch_id} would "
        "be written on a snapshot that is not the stream's; nothing was written. Publish the stream's run again to "
        f"continue (shardyfusion publish --run-id {newest.run_id}, with --allow-older if the live run started "
        "later), or pass accept_live_run="
        f"{live_run_id!r} to continue the stream on the live run deliberately"
    )
