"""Where credentials must never be: URIs and Spark settings that reach logs, argv and lineage.

Credentials reach storage only through connections, the environment or the cluster's own role.
A URI with user info (``scheme://user:password@host/...``) or a Spark setting named like a
credential is refused here, and the error never repeats the secret.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

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

HOW_TO_PASS_CREDENTIALS = (
    "give credentials through the Airflow connection (aws_conn_id), the environment of the workers, or the "
    "cluster's own role (instance profile, IRSA, spark-defaults.conf on the cluster)"
)


def redact_uri(uri: str) -> str:
    """``uri`` with any user info replaced by ``***`` (for messages and lineage)."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}://***@", uri)


def refuse_userinfo(value: object, what: str) -> None:
    """A ``ConfigError`` naming ``what`` if ``value`` is a URI carrying user info (credentials)."""
    if isinstance(value, str) and _USERINFO.match(value.strip()):
        raise ConfigError(
            f"{what} {redact_uri(value.strip())!r} carries credentials in the URI (user info before '@'); they "
            f"would reach logs, the spark-submit command line and lineage. Remove them and {HOW_TO_PASS_CREDENTIALS}"
        )


def refuse_credential_settings(settings: Mapping[str, object] | None, what: str) -> None:
    """A ``ConfigError`` if any key of ``settings`` is named like a credential (its value is not shown)."""
    if not settings:
        return
    named = sorted(k for k in settings if isinstance(k, str) and _CREDENTIAL_KEY.search(k))
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
