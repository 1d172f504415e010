"""The agent installs alone on a GPU node: no LightGBM, DuckDB, pyarrow, sklearn, FastAPI."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("lightgbm", "duckdb", "pyarrow", "scikit-learn", "sklearn", "fastapi", "pandas")
AGENT_MODULES = [
    "fleetcare.collectors.agent", "fleetcare.collectors.contract", "fleetcare.collectors.config",
    "fleetcare.collectors.transport.embedded", "fleetcare.collectors.sim",
    "fleetcare.collectors.nvml", "fleetcare.collectors.kernel_log",
    "fleetcare.collectors.dcgm_exporter",
]


def test_declared_dependencies_are_light() -> None:
    meta = tomllib.loads((ROOT / "collectors" / "pyproject.toml").read_text())["project"]
    deps = list(meta["dependencies"])
    for extra in meta.get("optional-dependencies", {}).values():
        deps.extend(extra)
    for dep in deps:
        assert not dep.lower().startswith(HEAVY), dep


def test_importing_the_agent_loads_no_heavy_module() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in AGENT_MODULES)
        + f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_pip_install_collectors_alone(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(ROOT / "collectors")], check=True, capture_output=True)
    frozen = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze"],
                            capture_output=True, text=True, check=True).stdout.lower()
    names = {line.split("==")[0].split(" @ ")[0] for line in frozen.splitlines()}
    assert "fleetcare-collectors" in names
    assert not names & {"lightgbm", "duckdb", "pyarrow", "scikit-learn", "fastapi", "pandas"}
    agent = venv / "bin" / "fleetcare-agent"
    assert agent.exists()
