"""Scoring runs of production size for a fixed fleet, written as the scorer writes them
(``scoring.write_run``: every GPU and node, reasons JSON on every row, sentences on the
riskiest ``scoring.EXPLAIN_TOP`` GPUs); risks are random. Shared by the benchmarks that
need a scoring history: ``bench_api_load.py`` and ``bench_snapshot.py``."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa

from fleetcare.models import scoring
from fleetcare.pipeline.store import Store

SENTENCES = ["uncorrectable ECC errors: 3 in 24 h (fleet median 0)",
             "row remap failures rising: 2 in 7 d",
             "XID 79 (fallen off the bus) once in 24 h"]


class Scorer:
    """Writes scoring runs of the GPUs given (node, uuid and index per GPU; every node
    with as many GPUs, ordered by node then index)."""

    def __init__(self, store: Store, model: str, node_col: np.ndarray, uuid_col: np.ndarray,
                 index_col: np.ndarray) -> None:
        self.store = store
        self.node_col, self.uuid_col, self.index_col = node_col, uuid_col, index_col
        self.nodes = np.unique(self.node_col)
        self.gpus = len(node_col) // len(self.nodes)
        assert self.gpus * len(self.nodes) == len(node_col), "every node has as many GPUs"
        self.model = model
        self.rng = np.random.default_rng(1)

    @classmethod
    def of_store(cls, store: Store, model: str) -> Scorer:
        """The GPUs of the store's telemetry."""
        rows = store.con.execute("SELECT DISTINCT node, gpu_uuid, gpu_index FROM telemetry "
                                 "ORDER BY node, gpu_index").fetchall()
        return cls(store, model, np.array([r[0] for r in rows]),
                   np.array([r[1] for r in rows]), np.array([r[2] for r in rows]))

    @classmethod
    def synthetic(cls, store: Store, model: str, nodes: int, gpus: int) -> Scorer:
        """``nodes`` nodes of ``gpus`` GPUs, named as the simulator names them."""
        names = np.array([f"node-{i:05d}" for i in range(nodes)])
        return cls(store, model, np.repeat(names, gpus),
                   np.array([f"GPU-{i:08d}" for i in range(nodes * gpus)]),
                   np.tile(np.arange(gpus), nodes))

    def run(self, ts: dt.datetime) -> None:
        n_nodes, g = len(self.nodes), self.gpus
        risk = self.rng.beta(0.3, 20.0, size=n_nodes * g)
        order = np.argsort(-risk, kind="stable")
        explained = set(order[:scoring.EXPLAIN_TOP].tolist())
        reasons = [json.dumps(SENTENCES) if i in explained else "[]" for i in order]
        gpu = pa.table({
            "ts": pa.array([ts] * len(order), pa.timestamp("us")),
            "node": self.node_col[order], "gpu_uuid": self.uuid_col[order],
            "gpu_index": pa.array(self.index_col[order], pa.int64()),
            "model": [self.model] * len(order), "risk": risk[order], "reasons": reasons,
            "model_id": ["bench"] * len(order)}, schema=scoring.GPU_SCHEMA)
        per_node = risk.reshape(n_nodes, g)
        node_risk = 1.0 - np.prod(1.0 - per_node, axis=1)
        top = per_node.argmax(axis=1)
        node_order = np.lexsort((self.nodes, -node_risk))
        node = pa.table({
            "ts": pa.array([ts] * n_nodes, pa.timestamp("us")),
            "node": self.nodes[node_order], "risk": node_risk[node_order],
            "reasons": [json.dumps([f"GPU {top[i]}: {s}" for s in SENTENCES])
                        for i in node_order],
            "top_gpu_uuid": [self.uuid_col[i * g + top[i]] for i in node_order],
            "model_id": ["bench"] * n_nodes}, schema=scoring.NODE_SCHEMA)
        scoring.write_run(self.store, ts, "bench", gpu, node)
