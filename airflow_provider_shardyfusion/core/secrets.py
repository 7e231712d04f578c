"""Where credentials must never be: URIs and Spark settings that reach logs, argv and lineage.

Credentials reach storage only through connections, the environment or the cluster's own role.
A URI with user info (``scheme://user:password@host/...``) or a signed query string
(``?X-Amz-Signature=...``, also in a fragment), a URI like that inside SQL text, or a Spark setting named like a
credential is refused here, and the error never repeats the secret.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import unquote_plus

from airflow_provider_shardyfusion.core.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "HOW_TO_PASS_CREDENTIALS", "redact_uri", "redact_values", "refuse_credential_settings", "refuse_embedded_uris",
    "refuse_secret_options", "refuse_userinfo",
]

# User info per RFC 3986 ("user:pass@" before the first "/"), and also "key:secret@" whose secret holds
# a "/" (AWS secret keys often do; Hadoop's S3A once accepted them so): a ":" not followed by a port.
_USERINFO = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?:[^/?#]*@|[^/?#:@]*:(?!\d*(?:[/?#]|$))[^@]*@)"
)
# Also the storage keys of other clouds' Hadoop connectors: fs.azure.account.key.<acct>, fs.azure.sas.*,
# google.cloud.auth.service.account.json.keyfile, fs.s3a.encryption.key (SSE-C).
_CREDENTIAL_KEY = re.compile(
    r"(?i)secret|password|passwd|token|credential|access[._-]?key|private[._-]?key|account[._-]key"
    r"|(?:^|[._-])sas(?:[._-]|$)|keyfile|encryption[._-]key"
)
# Settings that name a class (how credentials are found), not a credential: S3A's providers (per bucket,
# for the assumed role, the v1 -> v2 mapping), delegation token bindings, Azure's SAS token provider. Jobs
# choose an instance profile or IRSA with them.
_CLASS_SETTING = re.compile(r"(?i)(?:credentials|token)\.provider(?:\.type|\.mapping)?$|\.token\.binding$")
# Query parameters of signed URLs: S3 (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token; SigV2
# Signature, AWSAccessKeyId), GCS (X-Goog-Signature), Azure SAS (sig), and any named like a credential.
_SIGNATURE_PARAM = re.compile(r"(?i)signature|^sig$|^api[._-]?key$")
# A fragment is screened as a query string: "x.parquet#X-Amz-Signature=..." carries the same secret.
_QUERY = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^?#]*)(?:\?(?P<query>[^#]*))?(?:#(?P<fragment>.*))?$",
                    re.DOTALL)
_PARTS = ("query", "fragment")
# Inside a decoded value, what separates nested parameters; a name a message may show as it is.
_INNER_SEP = re.compile(r"[&;?#]")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,40}")
# The credential parameters of signed URLs and APIs, shown as they are; a name that only looks like
# one ("Signature<secret>") may have the secret glued to it, and shows as "***".
_KNOWN_SECRET_NAMES = frozenset(name.lower() for name in (
    "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "Signature", "AWSAccessKeyId",
    "X-Goog-Signature", "X-Goog-Credential", "sig", "api_key", "apikey", "api-key", "token", "access_token",
    "password", "secret",
))
# A URI inside SQL text ends at white space, a quote, a backtick or a closing parenthesis.
_EMBEDDED_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"`)]+")

HOW_TO_PASS_CREDENTIALS = (
    "give credentials through the Airflow connection (aws_conn_id), the environment of the workers, or the "
    "cluster's own role (instance profile, IRSA, spark-defaults.conf on the cluster)"
)


def _decoded(text: str) -> str:
    """``text`` percent-decoded until it no longer changes (``%253D`` is ``=`` encoded twice)."""
    for _ in range(8):
        once = unquote_plus(text)
        if once == text:
            break
        text = once
    return text


def _secret_name(name: str) -> bool:
    return bool(_SIGNATURE_PARAM.search(name) or _CREDENTIAL_KEY.search(name))


def _names_a_credential(piece: str) -> bool:
    """Whether a value (or a piece of one) without ``=`` is itself a credential parameter's name:
    "<secret>%3DX-Amz-Signature" is a signature written the wrong way round, its name the secret."""
    return bool(_SIGNATURE_PARAM.search(piece)) or piece.lower() in _KNOWN_SECRET_NAMES


class _Param(NamedTuple):
    """One parameter of a query string or fragment: as written, and decoded before it is screened."""

    raw: str
    name: str  # decoded: "X-Amz-Signature%3D<secret>" is the name "X-Amz-Signature" with a value
    value: str

    @property
    def secret(self) -> bool:
        # Its name, a name inside its decoded value ("a=1%26X-Amz-Signature%3D..."), or its value
        # itself ("<secret>%3DX-Amz-Signature") is a credential's.
        return _secret_name(self.name) or any(_secret_name(p.partition("=")[0]) if "=" in p else _names_a_credential(p)
                                              for p in _INNER_SEP.split(self.value))

    @property
    def shown(self) -> str:
        """The name as a message may show it: never a name that could hold part of the secret (one
        not plain, one only looking like a credential's, one whose value names a credential)."""
        if not _PLAIN_NAME.fullmatch(self.name):
            return "***"
        if self.name.lower() in _KNOWN_SECRET_NAMES:
            return self.name
        named = any(_names_a_credential(p) for p in _INNER_SEP.split(self.value) if "=" not in p)
        return "***" if _secret_name(self.name) or named else self.name


def _params(text: str | None) -> list[_Param]:
    """The parameters of a query string or fragment (none when absent), each decoded."""
    if not text:
        return []
    return [_Param(piece, *_decoded(piece).partition("=")[::2]) for piece in text.split("&")]


def _query_params(uri: str) -> dict[str, list[_Param]]:
    """The parameters of a URI's query string and fragment (none for a text that is no URI)."""
    m = _QUERY.match(uri)
    return {part: _params(m[part]) if m else [] for part in _PARTS}


def _redact_params(params: list[_Param]) -> str:
    return "&".join(f"{p.shown}=***" if p.secret else p.raw for p in params)


def redact_uri(uri: str) -> str:
    """``uri`` with any user info and credential parameters (query or fragment, decoded) shown as ``name=***``."""
    uri = _USERINFO.sub(lambda m: f"{m['scheme']}://***@", uri)
    m = _QUERY.match(uri)
    params = _query_params(uri)
    if m is None or not any(p.secret for ps in params.values() for p in ps):
        return uri
    query = f"?{_redact_params(params['query'])}" if m["query"] is not None else ""
    fragment = f"#{_redact_params(params['fragment'])}" if m["fragment"] is not None else ""
    return f"{m['head']}{query}{fragment}"


def refuse_userinfo(value: object, what: str) -> None:
    """A ``ConfigError`` naming ``what`` if ``value`` is a URI carrying credentials: user info or a signed query."""
    if not isinstance(value, str):
        return
    uri = value.strip()
    if _USERINFO.match(uri):
        raise ConfigError(
            f"{what} {redact_uri(uri)!r} carries credentials in the URI (user info before '@'); they "
            f"would reach logs, the spark-submit command line and lineage. Remove them and {HOW_TO_PASS_CREDENTIALS}"
        )
    params = _query_params(uri)
    signed = {part: [p.shown for p in params[part] if p.secret] for part in _PARTS}
    if any(signed.values()):
        where = " and ".join(("query string", "fragment")[i] for i, part in enumerate(_PARTS) if signed[part])
        names = ", ".join(signed["query"] + signed["fragment"])
        raise ConfigError(
            f"{what} {redact_uri(uri)!r} carries credentials in its {where} ({names}); a signed "
            f"URL would reach logs, the spark-submit command line and lineage. Remove them and {HOW_TO_PASS_CREDENTIALS}"
        )


def refuse_embedded_uris(text: object, what: str) -> None:
    """``refuse_userinfo`` for every URI inside ``text`` (SQL, which travels with the job's config)."""
    if isinstance(text, str):
        for uri in _EMBEDDED_URI.findall(text):
            refuse_userinfo(uri, f"{what}: the URI")


def refuse_credential_settings(settings: Mapping[str, object] | None, what: str) -> None:
    """A ``ConfigError`` if any key of ``settings`` is named like a credential (its value is not shown)."""
    if not settings:
        return
    named = sorted(k for k in settings if isinstance(k, str) and _CREDENTIAL_KEY.search(k) and not _CLASS_SETTING.search(k))
    if named:
        raise ConfigError(
            f"{what} {named} look like credentials; these settings travel on the spark-submit command line "
            f"(visible in `ps`) and into logs. Do not pass them here: {HOW_TO_PASS_CREDENTIALS}"
        )


def refuse_secret_options(options: Mapping[str, object] | None, what: str) -> None:
    """A ``ConfigError`` if a data-source option is named like a credential or its value is a URI with user info.

    Options travel with the job's config (argv, logs) like Spark settings do.
    """
    refuse_credential_settings(options, f"{what} keys")
    for key, value in (options or {}).items():
        refuse_userinfo(value, f"{what}[{key!r}]")


def redact_values(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each (non-empty) secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
