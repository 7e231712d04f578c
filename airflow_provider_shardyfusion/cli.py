"""``shardyfusion``: inspect and query published snapshots from a shell; every command prints JSON.

    shardyfusion current  URI                     the _CURRENT pointer
    shardyfusion manifest URI [--run-id RUN]      the live manifest, or the one of a given run
    shardyfusion runs     URI                     every run record under runs/
    shardyfusion get      URI KEY [KEY ...]       look keys up through ShardedReader
    shardyfusion publish  URI --run-id RUN [--allow-older]   move _CURRENT to a staged run / roll back
    shardyfusion history  URI                     every run: live / staged / superseded / rolled back / ...
    shardyfusion diff     URI RUN_A RUN_B         per-shard rows and bytes of two runs
    shardyfusion serve    URI [--port 8080]       the live snapshot over HTTP (see docs/serve.md)

S3-compatible servers: ``--endpoint-url``, ``--region``, ``--path-style``. Credentials are never
flags: boto3 takes them from the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, roles, ...).
Errors print one line on stderr and exit with status 1.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Any, NoReturn

from .core import layout
from .core.errors import KeyEncodingError, ObjectNotFoundError, ShardyfusionError
from .core.model.encoding import KEY_TEXTS, KeyEncoding, KeyText, key_from_text, key_to_show
from .core.model.snapshot import SnapshotRoot
from .core.storage import StorageOptions

__all__ = ["PROG", "main"]

PROG = "shardyfusion"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and status 1, like every other failure
        raise _UsageError(f"{message} (see '{self.prog} --help')")


def _build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("uri", metavar="URI", help="output root: s3://bucket/prefix or file:///abs/dir")
    common.add_argument("--endpoint-url", help="S3-compatible endpoint, e.g. http://127.0.0.1:9000")
    common.add_argument("--region", help="S3 region name")
    common.add_argument("--path-style", action="store_true", help="path-style S3 addressing (most non-AWS servers)")

    parser = _Parser(
        prog=PROG,
        description="Inspect and query published shardyfusion snapshots; every command prints JSON. "
                    "S3 credentials come from the environment (boto3's default chain), never from flags.",
    )
    subs = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    subs.add_parser("current", parents=[common], help="print the _CURRENT pointer")
    manifest = subs.add_parser("manifest", parents=[common], help="print a manifest (default: the live one)")
    manifest.add_argument("--run-id", help="print the manifest of this run instead of the one _CURRENT names")
    subs.add_parser("runs", parents=[common], help="list run records")
    pub = subs.add_parser(
        "publish", parents=[common], help="move _CURRENT to a staged run, or back to an older one",
        description="Checks the run's manifest, files and run record, then moves _CURRENT with a conditional put. "
                    "A run older than the live one needs --allow-older (a rollback).",
    )
    target = pub.add_mutually_exclusive_group(required=True)
    target.add_argument("--run-id", help="the run to publish")
    target.add_argument("--manifest-ref", help="the manifest URI to publish")
    pub.add_argument("--allow-older", action="store_true", help="allow a run older than the live one (rollback)")
    val = subs.add_parser(
        "validate", parents=[common], help="check a snapshot (default: the live one) and print the report",
        description="Checks structure, files on storage, the run record, the given thresholds and look-ups; prints "
                    "the report, or every failure on stderr with exit status 1.",
    )
    val_target = val.add_mutually_exclusive_group()
    val_target.add_argument("--run-id", help="the run to validate (default: the live snapshot)")
    val_target.add_argument("--manifest-ref", help="the manifest URI to validate")
    val.add_argument("--min-rows", type=int, help="fail below this many rows")
    val.add_argument("--max-row-change-ratio", type=float,
                     help="fail when |rows - baseline| / baseline is larger (baseline: the live snapshot, or the newest "
                          "older succeeded run when validating the live one)")
    val.add_argument("--max-empty-shards", type=int, help="fail when more shards are empty")
    val.add_argument("--max-shard-skew", type=float, help="fail when largest shard rows / mean rows is larger")
    val.add_argument("--sample-lookups", type=int, default=0, help="read N keys from the shards' min/max keys")
    val.add_argument("--expected-key", dest="expected_keys", action="append", metavar="KEY",
                     help="a key that must be present (repeat; text converted to the snapshot's key type)")
    val.add_argument("--verify-checksums", action="store_true", help="download every file and check its checksum")
    val.add_argument("--max-delta-ratio", type=float,
                     help="for a delta run: fail when (puts + deletes) / its base's rows is larger")
    val.add_argument("--absent-key", dest="absent_keys", action="append", metavar="KEY",
                     help="a key that must read nothing, e.g. one a delta deleted (repeat)")
    # core.lifecycle.validation.SCHEMA_CHANGE_POLICIES, spelled out: importing validation for every command is not worth it.
    val.add_argument("--schema-change", choices=("additions", "none", "any"), default="additions",
                     help="what may differ from the live run's value schema: additions (default: only added nullable "
                          "columns), none, any (every change passes and is still reported)")
    val.add_argument("--cache-dir", help="keep downloaded shards here (default: a temporary folder)")
    get = subs.add_parser(
        "get", parents=[common], help="look keys up in the live snapshot",
        description="Values print as JSON objects (value_format json), UTF-8 text when the bytes decode, "
                    "else base64; 'value_encoding' says which ('json', 'utf8', 'base64'; null if absent).",
    )
    get.add_argument("keys", metavar="KEY", nargs="+")
    get.add_argument(
        "--key-type", choices=KEY_TEXTS, default="auto",
        help="auto (default): int if KEY parses as one and the snapshot's key_encoding is u64be/u32be, "
             "UTF-8 bytes for raw keys, else str; bytes: the UTF-8 bytes of KEY; hex: KEY is hex of the bytes",
    )
    get.add_argument("--routing-context", metavar="JSON",
                     help="JSON object of the other CEL routing columns, for multi-column CEL snapshots")
    get.add_argument("--cache-dir", help="keep downloaded shards here (default: a temporary folder)")
    subs.add_parser(
        "history", parents=[common], help="every run with what became of it, newest first",
        description="States: running, failed, staged (never published), live, superseded (replaced by a newer run), "
                    "rolled_back (_CURRENT moved from it to an older run), deleted (cleaned up), unreadable.",
    )
    diff = subs.add_parser("diff", parents=[common], help="compare two runs' manifests shard by shard")
    diff.add_argument("run_a", metavar="RUN_A")
    diff.add_argument("run_b", metavar="RUN_B")
    clean = subs.add_parser(
        "cleanup", parents=[common], help="delete failed, abandoned, orphaned and expired snapshot data",
        description="Plans, then deletes: never the live run, pinned runs, anything younger than the grace period "
                    "or a running run with a valid lease. Run records stay (deleted_at set). Prints the report.",
    )
    clean.add_argument("--dry-run", action="store_true", help="print the plan; write and delete nothing")
    clean.add_argument("--keep-runs", type=int, default=3, help="newest succeeded runs whose data stays (default 3)")
    clean.add_argument("--grace-period-seconds", type=float, default=3600.0,
                       help="nothing younger is touched (default 3600)")
    clean.add_argument("--keep-run-id", dest="keep_run_ids", action="append", default=[], metavar="ID",
                       help="a run readers are pinned to (repeat)")
    _add_serve(subs, common)
    return parser


def _add_serve(subs: Any, common: argparse.ArgumentParser) -> None:
    serve = subs.add_parser(
        "serve", parents=[common], help="serve the live snapshot over HTTP (FastAPI + uvicorn)",
        description="GET /v1/keys/{key}, POST /v1/multi_get, /healthz, /readyz, /metrics; follows _CURRENT. "
                    "Runs until SIGTERM or Ctrl-C (in-flight requests finish).",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this host only)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    serve.add_argument("--follow-interval-s", type=float, default=5.0,
                       help="check _CURRENT about this often and serve a new run once published (default 5)")
    serve.add_argument("--shard-ids", metavar="IDS", help="serve only these shards, e.g. 0-15,20 (others: 421)")
    serve.add_argument("--value-decoding", choices=("json", "typed", "raw"), default="json",
                       help="json (default): values as stored; typed: by the run's value_schema, rendered to JSON; "
                            "raw: the stored bytes, base64")
    serve.add_argument("--max-staleness-s", type=float,
                       help="/readyz answers 503 once the served run went live longer ago than this")
    serve.add_argument("--workers", type=int, default=1, help="uvicorn worker processes, sharing one cache (default 1)")
    serve.add_argument("--cache-dir", help="the shared shard cache (default: a temporary folder)")
    serve.add_argument("--key-type", choices=KEY_TEXTS, default="auto",
                       help="how a key's text becomes a key, as for 'get' (default auto)")
    serve.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info")


def _run_serve(args: argparse.Namespace) -> int:
    from .serve.config import ServeConfig, parse_shard_ids
    from .serve.server import run_server

    config = ServeConfig(
        root=layout.normalize_root(args.uri), storage_options=_storage_options(args).to_dict(),
        follow_interval_s=args.follow_interval_s,
        shard_ids=parse_shard_ids(args.shard_ids) if args.shard_ids is not None else None,
        value_decoding=args.value_decoding, max_staleness_s=args.max_staleness_s,
        cache_dir=args.cache_dir, key_type=args.key_type,
    )
    run_server(config, host=args.host, port=args.port, workers=args.workers, log_level=args.log_level)
    return 0


def _storage_options(args: argparse.Namespace) -> StorageOptions:
    return StorageOptions.from_dict({
        k: v for k, v in (
            ("endpoint_url", args.endpoint_url), ("region_name", args.region),
            ("addressing_style", "path" if args.path_style else None),
        ) if v is not None
    })


def _cmd_current(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    pointer = snapshots.current()
    if pointer is None:
        raise ObjectNotFoundError(f"no snapshot is published at {snapshots.root}: _CURRENT does not exist")
    return pointer.to_dict()


def _cmd_manifest(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    if args.run_id is None:
        pointer = snapshots.current()
        if pointer is None:
            raise ObjectNotFoundError(f"no snapshot is published at {snapshots.root}: _CURRENT does not exist")
        return snapshots.read_manifest(pointer).to_dict()
    layout.validate_run_id(args.run_id, what="--run-id")
    ref = snapshots.find_manifest(args.run_id)
    if ref is None:
        where = layout.join(snapshots.root, layout.MANIFESTS_DIR)
        raise ObjectNotFoundError(f"no manifest of run {args.run_id!r} under {where}/")
    return snapshots.read_manifest(ref).to_dict()


def _cmd_runs(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    runs = []
    for run_id, record, error in snapshots.iter_runs():
        ref = snapshots.run_record_ref(run_id)
        if error is not None:  # one bad record must not hide the others
            runs.append({"run_id": run_id, "ref": ref, "invalid": str(error)})
        elif record is not None:
            runs.append({**record.to_dict(), "ref": ref})
    return runs


def _cmd_publish(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    from .core.lifecycle.publish import publish_run

    result = publish_run(snapshots, run_id=args.run_id, manifest_ref=args.manifest_ref, allow_older=args.allow_older)
    return result.to_dict()


def _cmd_validate(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    from .core.lifecycle.validation import validate_snapshot

    report = validate_snapshot(
        snapshots, run_id=args.run_id, manifest_ref=args.manifest_ref, min_rows=args.min_rows,
        max_row_change_ratio=args.max_row_change_ratio, max_empty_shards=args.max_empty_shards,
        max_shard_skew=args.max_shard_skew, sample_lookups=args.sample_lookups, expected_keys=args.expected_keys,
        verify_checksums=args.verify_checksums, cache_dir=args.cache_dir, storage_options=_storage_options(args),
        max_delta_ratio=args.max_delta_ratio, absent_keys=args.absent_keys, schema_change=args.schema_change,
    )
    return report.to_dict()


def _parse_key(text: str, key_type: KeyText, key_encoding: KeyEncoding) -> Any:
    try:
        return key_from_text(text, key_encoding, key_type)
    except KeyEncodingError as exc:
        raise _UsageError(f"get: {exc} (--key-type {key_type})") from None


def _show_value(value: Any, value_format: str) -> tuple[Any, str | None]:
    if value is None:
        return None, None
    if value_format == "json":
        return value, "json"
    try:
        return value.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii"), "base64"


def _cmd_cleanup(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    from .core.arguments import as_duration
    from .core.lifecycle.cleanup import execute_cleanup, make_plan

    grace = as_duration("--grace-period-seconds", args.grace_period_seconds)  # errors name the flag
    plan = make_plan(snapshots, keep_runs=args.keep_runs, grace_period=grace, keep_run_ids=args.keep_run_ids)
    report = execute_cleanup(snapshots, plan, dry_run=args.dry_run)
    try:
        report.raise_if_nothing_deleted()
    except ShardyfusionError as exc:
        raise _FailedWithReport(report.to_dict(), exc) from exc
    return report.to_dict()


def _cmd_get(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    from .core.read.reader import ShardedReader

    context = None
    if args.routing_context is not None:
        try:
            context = json.loads(args.routing_context)
        except ValueError as exc:
            raise _UsageError(f"get: --routing-context is not valid JSON: {exc}") from None
        if not isinstance(context, dict):
            raise _UsageError("get: --routing-context must be a JSON object")
    # The command prints JSON: values as stored (json.loads), not typed Python values.
    with ShardedReader(snapshots.root, cache_dir=args.cache_dir, storage_options=_storage_options(args),
                       value_decoding="json") as reader:
        manifest = reader.manifest
        keys = [_parse_key(k, args.key_type, manifest.key_encoding) for k in args.keys]
        values = reader.multi_get(keys, routing_context=context)
        out = []
        for key, value in zip(keys, values, strict=False):
            shown, how = _show_value(value, manifest.value_format)
            out.append({
                "key": key_to_show(key), "found": value is not None,
                "db_id": reader.shard_for_key(key, routing_context=context),
                "value": shown, "value_encoding": how,
            })
        return {"run_id": reader.run_id, "results": out}


def _cmd_history(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    from .core.lifecycle.history import root_history

    return root_history(snapshots).to_dict()


def _cmd_diff(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    from .core.lifecycle.history import diff_runs

    for name in ("run_a", "run_b"):
        layout.validate_run_id(getattr(args, name), what=name.upper())
    return diff_runs(snapshots, args.run_a, args.run_b).to_dict()


_COMMANDS = {
    "current": _cmd_current, "manifest": _cmd_manifest, "runs": _cmd_runs, "get": _cmd_get,
    "validate": _cmd_validate, "publish": _cmd_publish, "cleanup": _cmd_cleanup,
    "history": _cmd_history, "diff": _cmd_diff,
}


class _FailedWithReport(Exception):
    """The command failed, but its report is still printed (e.g. a cleanup whose deletions all failed)."""

    def __init__(self, report: Any, error: ShardyfusionError):
        super().__init__(str(error))
        self.report = report
        self.error = error


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "serve":  # runs until stopped; prints no JSON
            return _run_serve(args)
        snapshots = SnapshotRoot.open(args.uri, _storage_options(args))
        result = _COMMANDS[args.command](snapshots, args)
    except _FailedWithReport as failed:
        json.dump(failed.report, sys.stdout, indent=2, sort_keys=True, ensure_ascii=False)
        sys.stdout.write("\n")
        print(f"{PROG}: error: {type(failed.error).__name__}: {_one_line(failed.error)}", file=sys.stderr)
        return 1
    except _UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except ShardyfusionError as exc:
        print(f"{PROG}: error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # anything unexpected still ends as one line, not a traceback
        print(f"{PROG}: error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 1
    try:
        json.dump(result, sys.stdout, indent=2, sort_keys=True, ensure_ascii=False)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `| head`: stop quietly, and keep the interpreter's final flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def _one_line(exc: BaseException) -> str:
    return " | ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or repr(exc)
