"""Simulated dcgm-exporter history in a real Prometheus: for the backfill tests and bench.

``dcgm_series(samples)`` turns the simulator's columnar samples into the series
dcgm-exporter would export; ``running_prometheus(series, dir)`` writes them as OpenMetrics,
builds a TSDB with ``promtool tsdb create-blocks-from openmetrics`` and serves it from a
private ``prometheus`` on a free 127.0.0.1 port (Debian's package, installed by
``deploy/prometheus/install.sh``) until the context exits.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fleetcare.collectors.dcgm_exporter import FIELD_MAP, NVLINK_MAP

BLANK = 9223372036854775794  # DCGM "not supported" (int64 blank sentinel)
Series = tuple[str, dict[str, str], np.ndarray, list[Any]]


def dcgm_series(s: dict[str, np.ndarray]) -> list[Series]:
    """(name, labels, ts seconds, values) per series, as dcgm-exporter would export them,
    plus a blank-valued counter and an unmapped DCP series."""
    field_to_dcgm: dict[str, str] = {}
    for name, (fname, _) in FIELD_MAP.items():
        field_to_dcgm.setdefault(fname, name)
    ts = s["ts"].astype("datetime64[s]").astype(np.int64)
    rows_by_gpu: dict[str, np.ndarray] = {}
    for u in dict.fromkeys(s["gpu_uuid"].tolist()):
        rows_by_gpu[u] = np.flatnonzero(s["gpu_uuid"] == u)

    def labels(i: int) -> dict[str, str]:
        node = str(s["node"][i])
        return {"gpu": str(s["gpu_index"][i]), "UUID": str(s["gpu_uuid"][i]),
                "pci_bus_id": str(s["pci_bus_id"][i]), "device": f"nvidia{s['gpu_index'][i]}",
                "modelName": str(s["model"][i]), "Hostname": node,
                "kubernetes_node": f"k8s-{node}", "job": "dcgm-exporter",
                "instance": f"{node}:9400"}

    out = []
    for fname, name in field_to_dcgm.items():
        if fname not in s:
            continue
        col = s[fname]
        for rows in rows_by_gpu.values():
            vals = col[rows]
            vals = vals.astype(np.int64) if vals.dtype == bool else vals
            out.append((name, labels(rows[0]), ts[rows], vals.tolist()))
    for name, fname in NVLINK_MAP.items():
        col = np.asarray(s[fname])  # (the simulator's per-link counters: SparseLinks)
        for k in range(col.shape[1]):
            for rows in rows_by_gpu.values():
                out.append((f"{name}_L{k}", labels(rows[0]), ts[rows], col[rows, k].tolist()))
    for rows in rows_by_gpu.values():
        out.append(("DCGM_FI_DEV_RETIRED_SBE", labels(rows[0]), ts[rows], [BLANK] * len(rows)))
        out.append(("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels(rows[0]), ts[rows],
                    [0.5] * len(rows)))
    return out


def write_openmetrics(series: list[Series],
                      path: Path) -> None:
    """OpenMetrics text for promtool: one family per name, timestamps in seconds, # EOF."""
    by_name: dict[str, list[tuple[dict[str, str], np.ndarray, list[Any]]]] = {}
    for name, labels, ts, values in series:
        by_name.setdefault(name, []).append((labels, ts, values))
    with path.open("w") as fh:
        for name, members in by_name.items():
            fh.write(f"# TYPE {name} gauge\n")
            for labels, ts, values in members:
                lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
                fh.writelines(f"{name}{{{lab}}} {v!r} {t}\n"
                              for t, v in zip(ts.tolist(), values, strict=True))
        fh.write("# EOF\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_prometheus(series: list[Series], d: Path) -> Iterator[str]:
    """Base URL of a private Prometheus holding ``series`` (its files under ``d``)."""
    om, tsdb = d / "dcgm.om", d / "tsdb"
    write_openmetrics(series, om)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
                   check=True, capture_output=True, timeout=1200)
    om.unlink()
    (d / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    port = free_port()
    log = (d / "prometheus.log").open("w")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={tsdb}",
         "--storage.tsdb.retention.time=10y", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prometheus did not become ready:\n"
                                   + (d / "prometheus.log").read_text()[-3000:])
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
