"""Secrets never printed: ``mask_secrets`` for any text that may hold a URL.

URLs carry secrets in two places, and operators put them there (``kafka://user:pass@…``,
a dcgm-exporter or Prometheus URL with credentials, a webhook with ``?token=…``):

- the user information: ``scheme://user:password@host`` → ``scheme://user:****@host``,
  and ``scheme://token@host`` (a user name alone is often a token) → ``scheme://****@host``;
- query parameters whose name holds a secret word (token, password, secret, key, auth,
  signature, credential, …): ``?token=abc`` → ``?token=****``.

Every place that prints goes through it: ``--print-config`` (``config.describe``), the
CLIs' error lines, and the log formatter the CLIs install (``MaskingFormatter``), so
start-up logs and tracebacks are masked too. Masking is textual and idempotent.
"""

from __future__ import annotations

import logging
import re

MASK = "****"
_AUTHORITY = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^\s/?#]*)")
_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;][^\s=&#?;]*?(?:token|passw|pwd|secret|key|auth|sig|credential|session)"
    r"[^\s=&#?;]*=)(?P<value>[^\s&#;]*)", re.IGNORECASE)


def _host(part: str) -> str:
    """One ``[user[:password]@]host[:port]`` of an authority (Kafka lists several)."""
    if "@" not in part:
        return part
    userinfo, host = part.rsplit("@", 1)
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}@{host}" if colon else f"{MASK}@{host}"


def _authority(m: re.Match[str]) -> str:
    return m.group("scheme") + ",".join(_host(p) for p in m.group("authority").split(","))


def mask_secrets(text: str) -> str:
    """``text`` with the secrets of every URL in it masked (see the module doc)."""
    if "@" in text:
        text = _AUTHORITY.sub(_authority, text)
    if "=" in text:
        text = _SECRET_PARAM.sub(lambda m: m.group("name") + (MASK if m.group("value") else ""),
                                 text)
    return text


class MaskingFormatter(logging.Formatter):
    """Wraps a formatter: its whole output (message, fields, traceback) goes through
    ``mask_secrets``. The CLIs install it; libraries never configure logging."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(self.inner.format(record))
