"""Configuration: environment (``FLEETCARE_*``) over a TOML file over defaults.

Read once at start-up into a frozen dataclass, validated, with errors that name the
key, the bad value and what would be accepted. Secrets are masked when printed.

    @dataclass(frozen=True)
    class ServeConfig:
        db: str = "var/fleetcare.duckdb"
        port: int = 8000

    cfg = load(ServeConfig, section="serve", path="/etc/fleetcare/fleetcare.toml")
    # FLEETCARE_SERVE_PORT=9000 overrides [serve] port = 8001 overrides 8000

Exceptions::

    ConfigError   (.key, .value)
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from fleetcare.collectors.redact import mask_secrets

T = TypeVar("T")
ENV_PREFIX = "FLEETCARE_"
CONFIG_ENV = "FLEETCARE_CONFIG"
_SECRET_WORDS = ("token", "password", "secret", "key")


class ConfigError(ValueError):
    def __init__(self, key: str, value: object, message: str) -> None:
        super().__init__(f"config {key!r} = {value!r}: {message}")
        self.key = key
        self.value = value


def _convert(key: str, raw: object, tp: Any) -> object:
    target = tp
    if isinstance(tp, type) is False and hasattr(tp, "__args__"):  # X | None
        args = [a for a in tp.__args__ if a is not type(None)]
        if raw in (None, "") and type(None) in tp.__args__:
            return None
        target = args[0]
    try:
        if target is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if target in (int, float, str):
            if target is int and isinstance(raw, float):
                raise ValueError
            return target(raw)
    except (TypeError, ValueError):
        raise ConfigError(key, raw, f"expected {getattr(target, '__name__', target)}") from None
    return raw


def read_section(section: str, *, path: str | Path | None = None,
                 env: Mapping[str, str] | None = None) -> Mapping[str, Any]:
    """The ``[section]`` table of the TOML file at ``path`` (or ``$FLEETCARE_CONFIG``);
    empty when no file is named. A named file that is missing or not TOML is an error."""
    env = os.environ if env is None else env
    path = path or env.get(CONFIG_ENV)
    if not path:
        return {}
    p = Path(path)
    if not p.exists():
        raise ConfigError("config file", str(p), "does not exist (set FLEETCARE_CONFIG "
                          "or --config to an existing TOML file)")
    try:
        table: Mapping[str, Any] = tomllib.loads(p.read_text()).get(section, {})
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config file", str(p), f"is not valid TOML: {exc}") from exc
    return table


def load(cls: type[T], *, section: str, path: str | Path | None = None,
         env: Mapping[str, str] | None = None, overrides: Mapping[str, object] | None = None) -> T:
    """Build ``cls`` from defaults, then the TOML ``[section]``, then the environment,
    then ``overrides`` (command-line flags that were given)."""
    env = os.environ if env is None else env
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, object] = {}
    for key, raw in read_section(section, path=path, env=env).items():
        if key not in names:
            raise ConfigError(f"[{section}] {key}", raw,
                              f"unknown key; known keys: {', '.join(sorted(names))}")
        values[key] = _convert(f"[{section}] {key}", raw, hints[key])
    for name in names:
        var = f"{ENV_PREFIX}{section.upper()}_{name.upper()}"
        if var in env:
            values[name] = _convert(var, env[var], hints[name])
    for name, raw in (overrides or {}).items():
        if raw is not None:
            values[name] = _convert(f"--{name.replace('_', '-')}", raw, hints[name])
    return cls(**values)


def describe(cfg: object) -> dict[str, object]:
    """The config as a dict for printing, with secrets masked: keys named like a secret
    entirely, and the credentials of URLs in any string (``redact.mask_secrets``)."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        secret = any(w in f.name.lower() for w in _SECRET_WORDS)
        if secret and value:
            value = "********"
        elif isinstance(value, str):
            value = mask_secrets(value)
        out[f.name] = value
    return out
