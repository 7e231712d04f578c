"""``shardyfusion``: inspect and query published snapshots from a shell.

    shardyfusion current  URI                     the _CURRENT pointer
    shardyfusion manifest URI [--run-id RUN]      the live manifest, or the one of a given run
    shardyfusion runs     URI                     every run record under runs/
    shardyfusion get      URI KEY [KEY ...] [--run-id RUN | --manifest-ref REF]   look keys up (live or a kept run)
    shardyfusion publish  URI --run-id RUN [--allow-older]   move _CURRENT to a staged run / roll back
    shardyfusion history  URI                     every run: live / staged / superseded / rolled back / ...
    shardyfusion diff     URI RUN_A RUN_B [--keys [--kind K] [--limit N]]   shards, or the changed keys
    shardyfusion serve    URI [--port 8080]       the live snapshot over HTTP (see docs/serve.md)

Output, as ``gh`` and ``kubectl`` do it: a table on a terminal; JSON with ``--json`` or whenever
stdout is not a terminal (pipes, files, scripts). S3-compatible servers: ``--endpoint-url``,
``--region``, ``--path-style``. Credentials are never flags: boto3 takes them from the environment
(AWS_ACCESS_KEY_ID, AWS_PROFILE, roles, ...). Errors print one line on stderr and exit with status 1.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Any, NoReturn

import msgspec

from .core import layout
from .core.errors import KeyEncodingError, ObjectNotFoundError, ShardyfusionError
from .core.lifecycle.history import CHANGE_KINDS, STATE_MEANINGS, change_label
from .core.model.encoding import KEY_TEXTS, KeyEncoding, KeyText, key_from_text, key_to_show
from .core.model.snapshot import SnapshotRoot
from .core.storage import StorageOptions

__all__ = ["PROG", "main"]

PROG = "shardyfusion"
# Changed keys `diff --keys` lists unless --limit says otherwise: a screenful.
DIFF_KEYS_LIMIT = 50


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
    # Every command but serve prints a result: a table on a terminal, JSON for scripts.
    printed = _Parser(add_help=False, parents=[common])
    printed.add_argument("--json", action="store_true",
                         help="print JSON even on a terminal (it is always JSON when stdout is not a terminal)")

    parser = _Parser(
        prog=PROG,
        description="Inspect and query published shardyfusion snapshots: a table on a terminal, JSON with --json "
                    "or when stdout is not a terminal. S3 credentials come from the environment (boto3's default "
                    "chain), never from flags.",
    )
    subs = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    subs.add_parser("current", parents=[printed], help="print the _CURRENT pointer")
    manifest = subs.add_parser("manifest", parents=[printed], help="print a manifest (default: the live one)")
    manifest.add_argument("--run-id", help="print the manifest of this run instead of the one _CURRENT names")
    subs.add_parser("runs", parents=[printed], help="list run records")
    pub = subs.add_parser(
        "publish", parents=[printed], help="move _CURRENT to a staged run, or back to an older one",
        description="Checks the run's manifest, files and run record, then moves _CURRENT with a conditional put. "
                    "A run older than the live one needs --allow-older (a rollback).",
    )
    target = pub.add_mutually_exclusive_group(required=True)
    target.add_argument("--run-id", help="the run to publish")
    target.add_argument("--manifest-ref", help="the manifest URI to publish")
    pub.add_argument("--allow-older", action="store_true", help="allow a run older than the live one (rollback)")
    val = subs.add_parser(
        "validate", parents=[printed], help="check a snapshot (default: the live one) and print the report",
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
        "get", parents=[printed], help="look keys up in the live snapshot, or in any kept run",
        description="Values print as JSON objects (value_format json), UTF-8 text when the bytes decode, "
                    "else base64; 'value_encoding' says which ('json', 'utf8', 'base64'; null if absent).",
    )
    get.add_argument("keys", metavar="KEY", nargs="+")
    get_target = get.add_mutually_exclusive_group()
    get_target.add_argument("--run-id", help="read the snapshot as run RUN_ID wrote it (default: the live one)")
    get_target.add_argument("--manifest-ref", help="read the snapshot this manifest URI describes")
    get.add_argument(
        "--key-type", choices=KEY_TEXTS, default="auto",
        help="auto (default): int if KEY parses as one and the snapshot's key_encoding is u64be/u32be, "
             "UTF-8 bytes for raw keys, else str; bytes: the UTF-8 bytes of KEY; hex: KEY is hex of the bytes",
    )
    get.add_argument("--routing-context", metavar="JSON",
                     help="JSON object of the other CEL routing columns, for multi-column CEL snapshots")
    get.add_argument("--cache-dir", help="keep downloaded shards here (default: a temporary folder)")
    subs.add_parser(
        "history", parents=[printed], help="every run with what became of it, newest first",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Every run, newest first, with its state as the history UI shows it:\n"
                    + "\n".join(f"  {state:<13} {meaning}" for state, meaning in STATE_MEANINGS.items()),
    )
    diff = subs.add_parser(
        "diff", parents=[printed], help="compare two runs shard by shard, or list the keys that changed",
        description="Without --keys: per-shard rows, bytes and whether the files are the same, and the value "
                    "schemas. With --keys: the keys RUN_B inserted, updated or deleted against RUN_A, with the "
                    "value before and after (only shards whose files differ are read; both runs must be sharded "
                    "the same way).",
    )
    diff.add_argument("run_a", metavar="RUN_A")
    diff.add_argument("run_b", metavar="RUN_B")
    diff.add_argument("--keys", action="store_true", help="list the changed keys with their values before and after")
    diff.add_argument("--kind", dest="kinds", action="append", choices=CHANGE_KINDS,
                      help="with --keys: only this kind of change (repeat for more; default: all three)")
    diff.add_argument("--limit", type=int, default=DIFF_KEYS_LIMIT,
                      help=f"with --keys: at most this many keys (default {DIFF_KEYS_LIMIT})")
    diff.add_argument("--cache-dir", help="with --keys: keep downloaded shards here (default: a temporary folder)")
    clean = subs.add_parser(
        "cleanup", parents=[printed], help="delete failed, abandoned, orphaned and expired snapshot data",
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
    from .serve.config import DEFAULT_MAX_STALENESS_S  # core only: no FastAPI import

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
    serve.add_argument("--max-staleness-s", type=float, default=DEFAULT_MAX_STALENESS_S,
                       help="/readyz answers 503 once the reader has not confirmed for this long that it serves "
                            "what _CURRENT names (its checks failing); a failed check alone keeps it ready "
                            f"(default {DEFAULT_MAX_STALENESS_S:g})")
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
        return msgspec.to_builtins(value), "json"
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
    ref = args.manifest_ref
    if args.run_id is not None:
        from .core.lifecycle.history import manifest_ref_of_run

        layout.validate_run_id(args.run_id, what="--run-id")
        ref = manifest_ref_of_run(snapshots, args.run_id).uri
    # The command prints JSON: typed values rendered as serve renders them (a timestamp stored as
    # epoch microseconds shows as RFC 3339 text, a decimal as exact text), by _show_value.
    with ShardedReader(snapshots.root, cache_dir=args.cache_dir, storage_options=_storage_options(args),
                       value_decoding="typed", manifest_ref=ref) as reader:
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
        return {"run_id": reader.run_id, "live": ref is None, "results": out}


def _cmd_history(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    from .core.lifecycle.history import root_history

    return root_history(snapshots).to_dict()


def _cmd_diff(snapshots: SnapshotRoot, args: argparse.Namespace) -> Any:
    from .core.lifecycle.history import changed_keys, diff_runs

    for name in ("run_a", "run_b"):
        layout.validate_run_id(getattr(args, name), what=name.upper())
    if not args.keys:
        if args.kinds or args.limit != DIFF_KEYS_LIMIT:
            raise _UsageError("diff: --kind and --limit go with --keys")
        return diff_runs(snapshots, args.run_a, args.run_b).to_dict()
    if args.limit < 1:
        raise _UsageError(f"diff: --limit must be at least 1, got {args.limit}")
    from .core.read.reader import ShardedReader

    diff = diff_runs(snapshots, args.run_a, args.run_b)
    opts = _storage_options(args)
    # One cache for both readers: the layers the two runs share are downloaded once.
    with ShardedReader(snapshots.root, cache_dir=args.cache_dir, storage_options=opts,
                       manifest_ref=diff.manifest_a) as before, \
         ShardedReader(snapshots.root, cache_dir=args.cache_dir, storage_options=opts,
                       manifest_ref=diff.manifest_b) as after:
        return changed_keys(diff, before, after, kinds=args.kinds or CHANGE_KINDS, limit=args.limit).to_dict()


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
    command, as_json = None, True
    try:
        args = parser.parse_args(argv)
        if args.command == "serve":  # runs until stopped; prints no result
            return _run_serve(args)
        command, as_json = args.command, args.json or not sys.stdout.isatty()
        snapshots = SnapshotRoot.open(args.uri, _storage_options(args))
        result = _COMMANDS[args.command](snapshots, args)
    except _FailedWithReport as failed:
        _print(failed.report, command, as_json)
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
    return 0 if _print(result, command, as_json) else 1


def _print(result: Any, command: str | None, as_json: bool) -> bool:
    """Write the result; False when the reader of stdout went away (``| head``)."""
    try:
        if as_json:
            json.dump(result, sys.stdout, indent=2, sort_keys=True, ensure_ascii=False)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(_human_text(result, command) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # stop quietly, and keep the interpreter's final flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False
    return True


def _one_line(exc: BaseException) -> str:
    return " | ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or repr(exc)


# -- tables for people ---------------------------------------------------------------------------

# The columns a person reads first, per command and list (None: the result is the list); lists
# not named here show every field that is not itself a list or an object.
_COLUMNS: dict[tuple[str, str | None], tuple[str, ...]] = {
    ("runs", None): ("run_id", "status", "num_dbs", "started_at", "finished_at", "published_at", "deleted_at",
                     "invalid"),
    ("history", "runs"): ("run_id", "state", "write_mode", "change_label", "rows", "bytes", "started_at",
                          "duration_s", "replaced_by", "error"),
    ("get", "results"): ("key", "found", "db_id", "value", "value_encoding"),
    ("diff", "shards"): ("db_id", "rows_a", "rows_b", "bytes_a", "bytes_b", "same_files", "changes"),
    ("diff", "changes"): ("db_id", "kind", "key", "before", "after", "fields"),
    ("validate", "checks"): ("name", "ok", "skipped", "figure", "limit", "detail"),
}
# Widest cell of a table and of a "field: value" line; longer text is cut with "…" (--json has it whole).
_CELL_CHARS = 48
# Columns whose numbers are names, not amounts: no thousands separators (a key reads as typed).
_VERBATIM = frozenset({"key", "db_id"})
_LINE_CHARS = 100
# Columns whose informative end is their tail (a shard's db=/attempt= folder): cut from the left.
_TAIL = frozenset({"db_url"})
# Why a cleanup deletes what it does, per rule of core.lifecycle.cleanup_plan (its JSON names the rule).
_CLEANUP_WHY = {
    "failed": "the run failed",
    "expired": "beyond the newest keep_runs succeeded runs",
    "running": "abandoned: its lease expired; marked failed first",
    "orphan": "shard folder without a run record",
    "losing_attempts": "attempts the manifest does not name",
}


def _human_text(result: Any, command: str | None) -> str:
    """A command's result as a person reads it on a terminal: ``field: value`` lines for the scalar
    fields, then each list of records as a table (as ``kubectl get``: upper-case headings, no borders)."""
    if command in _FOR_PEOPLE and isinstance(result, dict):
        result = _FOR_PEOPLE[command](result)
    if isinstance(result, list):
        return "\n".join(_table(result, _COLUMNS.get((command or "", None)))) if result else "(none)"
    fields = {k: v for k, v in result.items() if not _is_records(v)}
    width = max((len(k) for k in fields), default=0)
    lines = [f"{k.ljust(width)}  {_cell(v, _LINE_CHARS)}" for k, v in fields.items()]
    for name, records in result.items():
        if _is_records(records):
            lines += ["", f"{name}:", *_table(records, _COLUMNS.get((command or "", name)))]
    return "\n".join(lines)


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _table(records: list[dict[str, Any]], columns: tuple[str, ...] | None) -> list[str]:
    if columns is None:  # every scalar field, in the order the records have them
        columns = tuple(k for k in dict.fromkeys(k for r in records for k in r)
                        if not any(isinstance(r.get(k), (dict, list)) for r in records))
    # A column empty in every row says nothing (e.g. no run has an error).
    columns = tuple(c for c in columns if any(r.get(c) not in (None, "", [], {}) for r in records))
    cells = [[_cell(r.get(c), _CELL_CHARS, verbatim=c in _VERBATIM, tail=c in _TAIL) for c in columns]
             for r in records]
    numeric = [all(_is_number(r.get(c)) or r.get(c) is None for r in records) for c in columns]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    return [line([c.upper() for c in columns]), *(line(row) for row in cells)]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(value: Any, limit: int, *, verbatim: bool = False, tail: bool = False) -> str:
    if value is None or value == []:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, int):
        text = str(value) if verbatim else f"{value:,}"
    elif isinstance(value, str):
        first, *more = value.strip().splitlines() or [""]
        text = first + (" …" if more else "")
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        text = ", ".join(value)  # e.g. the fields an update changed
    elif isinstance(value, dict) and isinstance(value.get("summary"), str):
        text = value["summary"]  # e.g. diff's value_schema: its one-line summary
    elif isinstance(value, dict) and set(CHANGE_KINDS) <= value.keys():
        text = change_label(value)  # +inserted ~updated −deleted
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1):] if tail else text[:limit - 1] + "…"


def _manifest_for_people(manifest: dict[str, Any]) -> dict[str, Any]:
    """Shard folders relative to the root (printed above them): the run and attempt stay readable."""
    prefix = str(manifest.get("output_uri") or "").rstrip("/") + "/"
    shards = [{**s, "db_url": s["db_url"].removeprefix(prefix)} if isinstance(s.get("db_url"), str) else s
              for s in manifest.get("shards") or []]
    return {**manifest, "shards": shards}


def _cleanup_for_people(report: dict[str, Any]) -> dict[str, Any]:
    """A cleanup report as a person reads it: the plan's settings, then one row per run it deletes
    (what, why, objects, bytes), what it leaves alone and why, and what was deleted per category."""
    plan = report["plan"]
    dry = bool(report["dry_run"])
    out: dict[str, Any] = {
        "dry_run": dry, "output_uri": plan["output_uri"], "live_run_id": plan["current_run_id"],
        "keep_runs": plan["keep_runs"], "grace_period": f"{plan['grace_period_seconds']:g} s",
        "pinned": plan["keep_run_ids"],
        "planned": f"{plan['objects']:,} object(s), {plan['bytes']:,} bytes in {len(plan['items']):,} run(s)",
    }
    if not dry:
        out["deleted"] = f"{report['deleted_objects']:,} object(s), {report['deleted_bytes']:,} bytes"
        out["marked_failed"] = report["marked_failed"]
        out["marked_deleted"] = report["marked_deleted"]
    if report["abandoned"]:
        out["abandoned"] = report["abandon_reason"] or True
    out["would_delete" if dry else "plan"] = [
        {"run_id": i["run_id"], "what": _cleanup_what(i), "why": _CLEANUP_WHY.get(i["rule"], i["rule"]),
         "objects": i["objects"], "bytes": i["bytes"], "record": "deleted_at set" if i["mark_deleted"] else None}
        for i in plan["items"]]
    out["left_alone"] = [{"run_id": s["run_id"], "rule": s["rule"], "why": s["reason"]} for s in plan["skipped"]]
    if not dry:
        out["deleted_by_category"] = [{"category": c, **d} for c, d in report["deleted"].items() if d["objects"]]
    out["skipped_at_execution"] = [{"run_id": s["run_id"], "why": s["reason"]} for s in report["skipped_at_execution"]]
    out["errors"] = report["errors"]
    return {k: v for k, v in out.items() if v != []}  # an empty table or list says nothing


def _cleanup_what(item: dict[str, Any]) -> str:
    if item["category"] != "losing_attempts":
        return item["category"].replace("_", " ")
    # The attempt folders (shards/run_id=R/db=N/attempt=A-task=T/...) the run loses, from the listed keys.
    folders = dict.fromkeys("/".join(k.split("/")[2:4]) for k in item["keys"])
    more = " …" if item["keys_truncated"] else ""
    return f"losing attempts: {', '.join(folders)}{more}"


_FOR_PEOPLE = {"manifest": _manifest_for_people, "cleanup": _cleanup_for_people}
