"""``ValidateManifestOperator``: the gate between a staged write and its publication (SPEC §8).

A thin shell around ``core.lifecycle.validation.validate_snapshot``: storage comes from the Airflow
connection through ``ShardyfusionHook``; every check is logged with its figure; the report is the
XCom; any failure fails the task with one ``ManifestValidationError`` listing all of them.

Importing this module is light (no pyspark, rocksdict or boto3): it is parsed with every DAG.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator

from airflow_provider_shardyfusion.hooks.hook_property import WithShardyfusionHook

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

    from airflow_provider_shardyfusion.core.lifecycle.validation import ValidationReport

__all__ = ["ValidateManifestOperator"]


class ValidateManifestOperator(WithShardyfusionHook, BaseOperator):
    """Check a snapshot's manifest, files, run record, data-quality thresholds, value schema and sample look-ups.

    Validates the run ``run_id`` (or the manifest ``manifest_ref``); with neither, the live
    snapshot ``_CURRENT`` names. Every check runs; all failures are raised together as one
    ``ManifestValidationError``. Returns (XCom) the report: each check with its figure, limit and
    outcome, and the keys looked up (with a digest of each value read).

    :param output_uri: the snapshot root (``s3://bucket/prefix`` or ``file:///abs/dir``).
    :param run_id: the run to validate (e.g. a staged write's ``run_id`` from its XCom).
    :param manifest_ref: the manifest URI to validate instead of the run's own manifest.
    :param min_rows: fail when the snapshot holds fewer rows.
    :param max_row_change_ratio: fail when ``|rows - baseline rows| / baseline rows`` is larger; the
        baseline is the live snapshot when validating another run, else the newest older succeeded
        run (no baseline: the check is skipped with a note).
    :param max_empty_shards: fail when more shards than this hold no rows.
    :param max_shard_skew: fail when the largest shard's rows divided by the mean rows per shard
        (over ``num_dbs``) is larger.
    :param sample_lookups: read this many keys taken from the shards' min/max keys through
        ``ShardedReader`` on the manifest; each must be found in the shard it came from.
    :param expected_keys: keys that must be present (text is converted to the snapshot's key type:
        integers for ``u64be``/``u32be``, UTF-8 bytes for ``raw``).
    :param verify_checksums: also download every file and check its checksum (else presence and size).
    :param max_delta_ratio: for a delta run, fail when its puts plus deletes divided by its base's rows is
        larger (skipped for full and compacted runs).
    :param absent_keys: keys that must read ``None`` through the whole chain (e.g. the keys a delta deleted).
    :param schema_change: what may differ between the run's value schema and the live run's (SPEC §18):
        ``"additions"`` (default) passes only added nullable columns, ``"none"`` no change, ``"any"``
        every change (still reported). A refused change fails naming the column and both types;
        skipped when the run is the live one, nothing is live, or either run recorded no schema.
    :param aws_conn_id: AWS connection for ``s3://`` roots.
    """

    template_fields: Sequence[str] = (
        "output_uri", "run_id", "manifest_ref", "min_rows", "max_row_change_ratio", "max_empty_shards",
        "max_shard_skew", "sample_lookups", "expected_keys", "verify_checksums", "max_delta_ratio", "absent_keys",
        "schema_change", "aws_conn_id",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {"expected_keys": "json", "absent_keys": "json"}
    ui_color = "#d5f5e3"

    def __init__(
        self,
        *,
        output_uri: str,
        run_id: str | None = None,
        manifest_ref: str | None = None,
        min_rows: int | None = None,
        max_row_change_ratio: float | None = None,
        max_empty_shards: int | None = None,
        max_shard_skew: float | None = None,
        sample_lookups: int = 0,
        expected_keys: Sequence[Any] | None = None,
        verify_checksums: bool = False,
        max_delta_ratio: float | None = None,
        absent_keys: Sequence[Any] | None = None,
        schema_change: str = "additions",
        aws_conn_id: str | None = "aws_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Verbatim on purpose: templates render after __init__, so validation lives in execute().
        self.output_uri = output_uri
        self.run_id = run_id
        self.manifest_ref = manifest_ref
        self.min_rows = min_rows
        self.max_row_change_ratio = max_row_change_ratio
        self.max_empty_shards = max_empty_shards
        self.max_shard_skew = max_shard_skew
        self.sample_lookups = sample_lookups
        self.expected_keys = expected_keys
        self.verify_checksums = verify_checksums
        self.max_delta_ratio = max_delta_ratio
        self.absent_keys = absent_keys
        self.schema_change = schema_change
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_shardyfusion.core import layout
        from airflow_provider_shardyfusion.core.arguments import as_bool
        from airflow_provider_shardyfusion.core.errors import ManifestValidationError
        from airflow_provider_shardyfusion.core.lifecycle.validation import schema_change_policy, validate_snapshot

        output_uri = layout.normalize_root(self.output_uri)
        self.verify_checksums = as_bool("verify_checksums", self.verify_checksums)
        self.schema_change = schema_change_policy(self.schema_change)
        run_id = self.run_id or None  # an empty rendered template means "not given"
        manifest_ref = self.manifest_ref or None
        hook = self.hook
        snapshots = hook.get_snapshots(output_uri)
        what = f"run {run_id!r}" if run_id else (manifest_ref or "the live snapshot")
        self.log.info("Validating %s under %s", what, output_uri)
        try:
            report = validate_snapshot(
                snapshots, run_id=run_id, manifest_ref=manifest_ref, min_rows=self.min_rows,
                max_row_change_ratio=self.max_row_change_ratio, max_empty_shards=self.max_empty_shards,
                max_shard_skew=self.max_shard_skew, sample_lookups=self.sample_lookups,
                expected_keys=self.expected_keys, verify_checksums=self.verify_checksums,
                max_delta_ratio=self.max_delta_ratio, absent_keys=self.absent_keys, schema_change=self.schema_change,
                storage_options=hook.storage_options(output_uri),
            )
        except ManifestValidationError as exc:
            failed: ValidationReport | None = getattr(exc, "report", None)
            if failed is not None:
                self._log_checks(failed)
            raise
        self._log_checks(report)
        self.log.info("Run %s (%s) passed validation: %d checks", report.run_id, report.manifest_ref, len(report.checks))
        return report.to_dict()

    def _log_checks(self, report: ValidationReport) -> None:
        for check in report.checks:
            if check.ok:
                self.log.info("check %s", check.describe())
            else:
                self.log.error("check %s", check.describe())
                for problem in check.problems:
                    self.log.error("  %s", problem)
