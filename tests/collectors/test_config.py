from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetcare.collectors.config import ConfigError, describe, load


@dataclass(frozen=True)
class Cfg:
    db: str = "var/f.duckdb"
    port: int = 8000
    verbose: bool = False
    threshold: float = 0.5
    api_token: str | None = None


def test_env_over_file_over_defaults(tmp_path: Path) -> None:
    f = tmp_path / "f.toml"
    f.write_text('[serve]\nport = 8001\ndb = "a.duckdb"\n')
    cfg = load(Cfg, section="serve", path=f, env={"FLEETCARE_SERVE_PORT": "9000",
                                                  "FLEETCARE_SERVE_VERBOSE": "yes"})
    assert cfg == Cfg(db="a.duckdb", port=9000, verbose=True)
    assert load(Cfg, section="serve", env={}) == Cfg()
    assert load(Cfg, section="serve", env={"FLEETCARE_SERVE_PORT": "1"}, overrides={"port": 2}).port == 2


def test_unknown_key_names_the_known_ones(tmp_path: Path) -> None:
    f = tmp_path / "f.toml"
    f.write_text("[serve]\nprot = 1\n")
    with pytest.raises(ConfigError, match="unknown key; known keys: api_token, db, port"):
        load(Cfg, section="serve", path=f, env={})


def test_bad_values_say_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'FLEETCARE_SERVE_PORT' = 'eighty': expected int"):
        load(Cfg, section="serve", env={"FLEETCARE_SERVE_PORT": "eighty"})
    with pytest.raises(ConfigError, match="expected bool"):
        load(Cfg, section="serve", env={"FLEETCARE_SERVE_VERBOSE": "maybe"})
    with pytest.raises(ConfigError, match="does not exist"):
        load(Cfg, section="serve", path=tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[serve\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(Cfg, section="serve", path=bad, env={})


def test_secrets_are_masked() -> None:
    assert describe(Cfg(api_token="s3cret"))["api_token"] == "********"
    assert describe(Cfg())["api_token"] is None
