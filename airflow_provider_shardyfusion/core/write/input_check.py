"""Checks of a write's input that take a second instead of a Spark start (SPEC §8.1).

Before anything is submitted, the operators refuse what is already known to fail: a path without a
scheme (Spark would read it from its default file system, which is not always the local disk), a
local input that does not exist, and a named column missing from a local parquet, ORC or CSV
input. Only the footer (parquet, ORC) or the first line (CSV) of one file is read. What cannot be
known here (S3 inputs, tables, SQL, other formats' columns) is left to the Spark job.

Pure Python; pyarrow is imported inside the readers (this module is imported by the operators).
"""

from __future__ import annotations

import csv
import glob
import gzip
import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from airflow_provider_shardyfusion.core.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from airflow_provider_shardyfusion.core.model.config import WriteConfig

__all__ = ["check_columns", "check_write_input", "input_columns", "local_path", "named_columns", "require_scheme"]

# A scheme of two or more characters, so that a Windows drive letter is not taken for one.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")
# A drive letter ("C:", "C:\\data", "c:/data") or a UNC path ("\\\\host\\share"): not for Spark here.
_WINDOWS_PATH = re.compile(r"^[A-Za-z]:(?:[\\/]|$)|^\\\\")
_GLOB_CHARS = frozenset("*?[{")
_SCHEMA_FORMATS = ("parquet", "orc", "csv")
# What a file named as CSV is when it begins with these bytes; the rest of its first 4 KiB is not read.
_BINARY_MAGIC = ((b"PAR1", "a parquet file"), (b"ORC", "an ORC file"), (b"Obj\x01", "an Avro file"))
_SNIFF_BYTES = 4096
# Column lists in messages stop here; a wide table's names would bury the error.
_SHOWN_COLUMNS = 20


def require_scheme(name: str, value: Any) -> None:
    """Refuse a path given without a scheme, naming the spelling that fixes it."""
    if not isinstance(value, str) or not value.strip() or _SCHEME.match(value.strip()):
        return
    text = value.strip()
    if _WINDOWS_PATH.match(text):
        raise ConfigError(
            f"{name} {value!r} is a Windows path: Windows paths are not supported here (Spark reads "
            "this machine's POSIX file system); give a 'file:///abs/dir' path of this machine or 's3://bucket/prefix'"
        )
    if text.startswith("~"):
        text = os.path.expanduser(text)  # Spark does not expand "~": the hint names the home folder
        if text.startswith("~"):  # "~nouser/x": no such user here, so no home folder to name
            user = text[1:].split("/", 1)[0]
            whose = f"user {user!r}, who does not exist on this machine" if user else "this user, which is unknown"
            raise ConfigError(
                f"{name} {value!r} has no scheme and names the home folder of {whose}: give a "
                "'file:///abs/dir' path of this machine or 's3://bucket/prefix'"
            )
    local = f"file://{text}" if text.startswith("/") else f"file://{os.path.abspath(text)}"
    raise ConfigError(
        f"{name} {value!r} has no scheme: write {local!r} for a local path, or 's3://bucket/prefix' "
        "(a path without a scheme is resolved against Spark's default file system, not always the local disk)"
    )


def local_path(uri: str) -> str | None:
    """The filesystem path of a ``file:`` URI, ``None`` for any other scheme."""
    parts = urlsplit(uri)
    if parts.scheme.lower() != "file" or parts.netloc not in ("", "localhost"):
        return None
    return unquote(parts.path)


def _option(options: Mapping[str, str], *names: str, default: str) -> str:
    """A reader option as Spark reads it: keys are case-insensitive."""
    lowered = {k.lower(): v for k, v in options.items()}
    return next((lowered[n.lower()] for n in names if n.lower() in lowered), default)


def _hidden(name: str) -> bool:
    # Spark's file index skips these (``_SUCCESS``, ``.crc`` files, ``_temporary`` folders).
    return name.startswith(("_", "."))


def _first_data_file(folder: str) -> tuple[str, list[str]] | None:
    """The first data file under ``folder`` in name order, with the partition columns (``k=v``
    folders) on its way; ``None`` when the folder holds no data file."""
    for current, dirs, files in os.walk(folder):
        rel = os.path.relpath(current, folder)
        parts = [] if rel == "." else rel.split(os.sep)
        dirs[:] = sorted(d for d in dirs if not _hidden(d) or "=" in d)
        data = sorted(f for f in files if not _hidden(f))
        if data:
            return os.path.join(current, data[0]), [p.split("=", 1)[0] for p in parts if "=" in p]
    return None


class _NotCsvError(Exception):
    """The file given as CSV is plainly something else (its message names the file and what it is)."""


def _csv_columns(path: str, options: Mapping[str, str]) -> list[str] | None:
    if path.endswith(".gz"):
        opener: Any = gzip.open
    elif "." in os.path.basename(path) and path.rsplit(".", 1)[1].lower() in ("bz2", "lz4", "snappy", "zst", "deflate"):
        return None
    else:
        opener = open
    sep = _option(options, "sep", "delimiter", default=",")
    quote = _option(options, "quote", default='"')
    if len(sep) != 1 or len(quote) > 1:
        return None  # multi-character separators: Spark's parser, not the csv module's
    encoding = _option(options, "encoding", "charset", default="utf-8")
    with opener(path, "rb") as raw:
        head = raw.read(_SNIFF_BYTES)
    kind = next((k for magic, k in _BINARY_MAGIC if head.startswith(magic)), None)
    if kind is None and b"\x00" in head and not encoding.lower().replace("-", "").startswith(("utf16", "utf32")):
        kind = "binary (it holds NUL bytes)"
    if kind is not None:
        raise _NotCsvError(f"{path} is {kind}")
    with opener(path, "rt", encoding=encoding, errors="replace", newline="") as f:
        first = next(csv.reader(f, delimiter=sep, quotechar=quote or None), None)
    if first is None:
        return None
    if _option(options, "header", default="false").strip().lower() == "true":
        return [name or f"_c{i}" for i, name in enumerate(first)]
    return [f"_c{i}" for i in range(len(first))]


def _file_columns(path: str, fmt: str, options: Mapping[str, str]) -> list[str] | None:
    """The top-level column names of one data file, ``None`` when they cannot be read here."""
    try:
        if fmt == "csv":
            return _csv_columns(path, options)
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        from pyarrow import orc

        return list(orc.ORCFile(path).schema.names)
    except (OSError, ValueError, LookupError):  # not readable as that format here: Spark says why
        return None


def input_columns(path: str, fmt: str, options: Mapping[str, str] | None = None) -> list[str] | None:
    """Column names Spark will see for a local parquet/ORC/CSV input (a file or a folder), or ``None``.

    A file read as CSV that begins like parquet, ORC or Avro, or holds NUL bytes, raises ``_NotCsvError``.
    """
    options = options or {}
    if fmt not in _SCHEMA_FORMATS or _option(options, "mergeSchema", default="false").lower() == "true":
        return None  # other formats, or a schema merged over every file: left to Spark
    if os.path.isdir(path):
        found = _first_data_file(path)
        if found is None:
            return None
        file, partitions = found
    else:
        file, partitions = path, []
    columns = _file_columns(file, fmt, options)
    return None if columns is None else columns + partitions


def _local_matches(name: str, uri: str) -> list[str]:
    """The local paths ``uri`` names (globs expanded); refuses one that names nothing."""
    path = local_path(uri)
    assert path is not None  # only called for file: URIs
    if any(c in _GLOB_CHARS for c in path):
        if "{" in path:
            return []  # Spark's brace alternatives: not Python's glob; left to Spark
        matches = sorted(glob.glob(path))
        if not matches:
            raise ConfigError(f"{name} {uri!r} matches no file on this machine")
        return matches
    if not os.path.exists(path):
        raise ConfigError(f"{name} {uri!r} does not exist on this machine ({path} is missing)")
    return [path]


def check_columns(name: str, uri: str, fmt: str, options: Mapping[str, str],
                  wanted: Iterable[tuple[str, str]]) -> None:
    """Refuse the first named column that the local input lacks (Spark's default: case-insensitive)."""
    matches = _local_matches(name, uri)
    try:
        columns = input_columns(matches[0], fmt, options) if matches else None
    except _NotCsvError as e:
        raise ConfigError(f"{name} {uri!r} is not CSV: its first data file {e}, not text with a header line "
                          "(check input_format, or the folder's contents)") from None
    if columns is None:
        return
    known = {c.lower() for c in columns}
    for what, column in wanted:
        # ``a.b`` is a nested field of ``a`` to Spark, unless a column has that very name.
        if column.lower() not in known and column.split(".", 1)[0].lower() not in known:
            shown = ", ".join(columns[:_SHOWN_COLUMNS]) + (", …" if len(columns) > _SHOWN_COLUMNS else "")
            raise ConfigError(f"{what} {column!r} is not a column of {name} {uri!r} ({fmt}: {shown})")


def named_columns(config: WriteConfig) -> list[tuple[str, str]]:
    """The input columns a write names, each with the argument that names it."""
    wanted = [("key_column", config.key_column)]
    value = config.value
    if value.columns:
        wanted += [("value_columns", c) for c in value.columns]
    elif value.column:
        wanted.append(("value_column", value.column))
    if config.delta.delete_column:
        wanted.append(("delete_column", config.delta.delete_column))
    if config.sharding.strategy == "cel":
        wanted += [("cel_columns", c) for c in config.sharding.resolved_cel_columns(config.key_column)]
    return list(dict.fromkeys(wanted))


def check_write_input(config: WriteConfig, *, output_uri: Any, input_name: str = "input_path",
                      read_columns: bool = True) -> None:
    """Everything about the write's paths that is known before Spark starts (``ConfigError`` if not).

    ``output_uri`` is the argument as given (the config holds it normalized). A streaming source
    passes ``input_name="source_path"`` and ``read_columns=False``: its folder must exist, but its
    files may come later (a glob may match nothing yet), and its schema is the one given.
    """
    require_scheme("output_uri", output_uri)
    spec = config.input
    if config.delta.write_mode == "compact" or spec.path is None:
        return
    require_scheme(input_name, spec.path)
    if local_path(spec.path) is None:
        return
    if read_columns:
        check_columns(input_name, spec.path, spec.format, spec.options, named_columns(config))
    elif not any(c in _GLOB_CHARS for c in spec.path):
        _local_matches(input_name, spec.path)
