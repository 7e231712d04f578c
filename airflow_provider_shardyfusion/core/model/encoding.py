"""Key encodings and value formats (SPEC §5).

Stored RocksDB keys are exactly ``encode_key(key)``; stored values exactly ``encode_value``.
Routing never looks at the encoding: it hashes ``routing.canonical_bytes(key)``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import numbers
import re
import struct
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from airflow_provider_shardyfusion.core.errors import ConfigError, InputDataError, KeyEncodingError, show_value

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "KEY_ENCODINGS", "KEY_TEXTS", "PACK_INT_KEY", "VALUE_FORMATS", "KeyEncoding", "KeyKind", "KeyText", "ValueFormat",
    "decode_key", "decode_value", "default_key_encoding", "encode_binary_value", "encode_json_value", "encode_key",
    "key_from_text", "key_kind_of_encoding", "key_to_show", "keys_from_json", "null_key_error", "plain_key",
    "validate_key_encoding", "validate_value_format",
]

KeyEncoding = Literal["u64be", "u32be", "utf8", "raw"]
ValueFormat = Literal["binary", "json"]
KeyKind = Literal["int", "string", "binary"]  # the type of the key column
# How a key typed as text (CLI, UI, templated expected keys) is read; "auto" follows the key encoding.
KeyText = Literal["auto", "int", "str", "bytes", "hex"]
KEY_TEXTS: tuple[KeyText, ...] = get_args(KeyText)
KEY_ENCODINGS: tuple[KeyEncoding, ...] = get_args(KeyEncoding)
VALUE_FORMATS: tuple[ValueFormat, ...] = get_args(ValueFormat)
_DEFAULT_KEY_ENCODING: dict[KeyKind, KeyEncoding] = {"int": "u64be", "string": "utf8", "binary": "raw"}
_KEY_KIND_OF_ENCODING: dict[KeyEncoding, KeyKind] = {"u64be": "int", "u32be": "int", "utf8": "string", "raw": "binary"}
_PACK_U64 = struct.Struct(">Q")
_PACK_U32 = struct.Struct(">I")
# Stored-key packers for hot loops (struct.error when out of range); encode_key gives the messages.
PACK_INT_KEY = {"u64be": _PACK_U64.pack, "u32be": _PACK_U32.pack}
_INT_KEY_LIMIT = {"u64be": 1 << 64, "u32be": 1 << 32}  # one past the largest key
_INT_TEXT = re.compile(r"-?[0-9]+")
# The most significant digits an integer key has (u64be's largest): a longer text is refused before
# int() reads it, since Python refuses a text of over 4300 digits with a ValueError naming no key.
_INT_KEY_DIGITS = len(str(_INT_KEY_LIMIT["u64be"] - 1))
_INT_TEXT_BOUND = 10**_INT_KEY_DIGITS

def default_key_encoding(key_kind: str) -> KeyEncoding:
    try:
        return _DEFAULT_KEY_ENCODING[cast("KeyKind", key_kind)]
    except KeyError:
        raise ConfigError(f"key type {key_kind!r} is not supported: keys must be integers, strings or binary") from None


def key_kind_of_encoding(encoding: str) -> KeyKind:
    return _KEY_KIND_OF_ENCODING[validate_key_encoding(encoding)]


def validate_key_encoding(encoding: object) -> KeyEncoding:
    if encoding not in KEY_ENCODINGS:
        raise ConfigError(f"key_encoding {encoding!r} is not supported; choose one of {list(KEY_ENCODINGS)}")
    return cast("KeyEncoding", encoding)


def null_key_error(column: str) -> InputDataError:
    return InputDataError(f"column {column!r}: null key (rule: keys must not be null)")


def plain_key(key: Any) -> Any:
    """``key`` with numpy / pandas integers as the ``int`` they are (keys taken from a DataFrame); else as is."""
    if isinstance(key, numbers.Integral) and not isinstance(key, (bool, int)):
        return int(key)
    return key


def encode_key(key: Any, encoding: str, *, column: str = "key") -> bytes:
    if key is None:
        raise null_key_error(column)
    if encoding == "u64be" or encoding == "u32be":
        if isinstance(key, bool) or not isinstance(key, int):
            raise KeyEncodingError(
                f"column {column!r}: key {show_value(key)} is not an integer (rule: {encoding} needs integer keys)"
            )
        limit = _INT_KEY_LIMIT[encoding]
        if key < 0 or key >= limit:
            raise KeyEncodingError(
                f"column {column!r}: key {show_value(key)} is out of range (rule: {encoding} takes 0..{limit - 1}; "
                "negative keys need another key_encoding)"
            )
        return (_PACK_U64 if encoding == "u64be" else _PACK_U32).pack(key)
    if encoding == "utf8":
        if not isinstance(key, str):
            raise KeyEncodingError(f"column {column!r}: key {show_value(key)} is not a string (rule: utf8 needs string keys)")
        try:
            return key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise KeyEncodingError(
                f"column {column!r}: key {show_value(key)} is not valid Unicode text ({exc.reason}; rule: utf8 keys)"
            ) from None
    if encoding == "raw":
        if isinstance(key, (bytes, bytearray, memoryview)):
            return bytes(key)
        raise KeyEncodingError(f"column {column!r}: key {show_value(key)} is not binary (rule: raw needs bytes keys)")
    raise ConfigError(f"key_encoding {encoding!r} is not supported; choose one of {list(KEY_ENCODINGS)}")


def decode_key(data: bytes, encoding: str) -> Any:
    if encoding in ("u64be", "u32be"):
        packer = _PACK_U64 if encoding == "u64be" else _PACK_U32
        if len(data) != packer.size:
            raise KeyEncodingError(f"stored key {bytes(data)!r} is {len(data)} bytes; {encoding} keys are {packer.size}")
        return packer.unpack(data)[0]
    if encoding == "utf8":
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise KeyEncodingError(
                f"stored key {show_value(bytes(data))} (hex {bytes(data)[:32].hex()}) is not valid UTF-8 "
                f"({exc.reason} at byte {exc.start}; rule: utf8 keys are UTF-8 text)"
            ) from None
    if encoding == "raw":
        return bytes(data)
    raise ConfigError(f"key_encoding {encoding!r} is not supported; choose one of {list(KEY_ENCODINGS)}")


def key_from_text(text: str, key_encoding: KeyEncoding, how: KeyText = "auto") -> Any:
    """The key ``text`` stands for in a snapshot whose keys are ``key_encoding``.

    ``auto``: an integer when the keys are integers and ``text`` is one (other text is kept, and the
    look-up then fails naming the key), the UTF-8 bytes of ``text`` for raw keys, else ``text``;
    ``int``, ``str``, ``bytes`` (its UTF-8 bytes) and ``hex`` (the bytes it spells) force a type.
    The inverse of ``key_to_show`` (a ``{"hex": ...}`` shown key is read back with ``hex``).
    """
    if how not in KEY_TEXTS:
        raise ConfigError(f"key type {how!r} is not supported; choose one of {list(KEY_TEXTS)}")
    if how == "int" or (how == "auto" and key_encoding in PACK_INT_KEY):
        if _INT_TEXT.fullmatch(text):
            return _int_of_text(text, key_encoding)
        if how == "int":
            raise KeyEncodingError(f"key {show_value(text)} is not an integer")
        return text
    if how == "hex":
        try:
            return bytes.fromhex(text)
        except ValueError:
            raise KeyEncodingError(f"key {show_value(text)} is not hex") from None
    if how == "bytes" or (how == "auto" and key_encoding == "raw"):
        return text.encode("utf-8")
    return text


def _int_of_text(text: str, key_encoding: KeyEncoding) -> int:
    """The integer ``text`` (an optional ``-`` and digits) spells; refused when it has more digits than any key."""
    sign = "-" if text.startswith("-") else ""
    digits = text[len(sign):].lstrip("0") or "0"
    if len(digits) <= _INT_KEY_DIGITS:
        return int(sign + digits)
    encoding = key_encoding if key_encoding in PACK_INT_KEY else "u64be"
    rule = f"{encoding} takes 0..{_INT_KEY_LIMIT[encoding] - 1}"
    if encoding != key_encoding:
        rule = f"integer keys are u32be or u64be; {rule}"
    raise KeyEncodingError(f"key {show_value(text, 40)} ({len(digits)} digits) is out of range (rule: {rule})")


def keys_from_json(keys: list[str | int], key_encoding: KeyEncoding, how: KeyText = "auto") -> list[Any]:
    """The keys a JSON list of strings and integers stands for: ``key_from_text`` of each, with an
    integer taken as it is where the keys are integers (``auto``/``int``) rather than printed and
    parsed again: ``shardyfusion serve``'s ``multi_get`` body, on every request. An integer of more
    digits than a key has is refused as its text is (JSON decoding keeps it under 4300 digits)."""
    if how in ("auto", "int") and key_encoding in PACK_INT_KEY:
        return [k if isinstance(k, int) and -_INT_TEXT_BOUND < k < _INT_TEXT_BOUND else key_from_text(str(k), key_encoding, how)
                for k in keys]
    return [key_from_text(k if isinstance(k, str) else str(k), key_encoding, how) for k in keys]


def key_to_show(key: Any) -> int | str | dict[str, str]:
    """A key as JSON shows it: integers and text as they are, bytes as ``{"hex": ...}``."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        return {"hex": bytes(key).hex()}
    return cast("int | str", plain_key(key))


def validate_value_format(fmt: object) -> ValueFormat:
    if fmt not in VALUE_FORMATS:
        raise ConfigError(f"value_format {fmt!r} is not supported; choose one of {list(VALUE_FORMATS)}")
    return cast("ValueFormat", fmt)


def encode_binary_value(value: Any, *, column: str = "value") -> bytes:
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise InputDataError(
        f"column {column!r}: value {show_value(value)} is neither binary nor string (rule: value_format 'binary')"
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode_json_value(row: Mapping[str, Any]) -> bytes:
    """Compact JSON object with sorted keys; NaN/Infinity are refused (not valid JSON)."""
    try:
        return json.dumps(row, separators=(",", ":"), sort_keys=True, default=_json_default,
                          ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        for name, value in row.items():
            try:
                json.dumps(value, default=_json_default, allow_nan=False)
            except (TypeError, ValueError):
                raise InputDataError(
                    f"column {name!r}: value {show_value(value)} cannot be stored as JSON ({exc}; rule: value_format 'json')"
                ) from None
        raise InputDataError(f"row cannot be stored as JSON: {exc}") from None


def decode_value(data: bytes, fmt: str) -> Any:
    if fmt == "binary":
        return bytes(data)
    if fmt == "json":
        return json.loads(data)
    raise ConfigError(f"value_format {fmt!r} is not supported; choose one of {list(VALUE_FORMATS)}")
