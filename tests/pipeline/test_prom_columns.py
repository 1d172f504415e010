"""Backfill's columnar mapping gives the same samples as the exporter's per-point one.

The reference groups every point by timestamp and maps it with
``dcgm_exporter.gpu_samples`` (what a live scrape of dcgm-exporter does); the columnar
path reads the same Prometheus JSON with ``decode_matrix`` and ``samples_table``. Random
matrices cover what the rules are about: points missing at some times, DCGM blanks and
NaN/±Inf, MIG instances beside the whole GPU (fb_used adds up, the whole GPU wins), two
names for one field, per-link NVLink with gaps, blank links and both naming schemes, a
host relabelled by ``node_label``.
"""

from __future__ import annotations

import datetime as dt
import json
import random

import msgspec
import pytest

from fleetcare.collectors.dcgm_exporter import gpu_samples, meaning
from fleetcare.pipeline.prom_columns import decode_matrix, samples_table

T0 = 1_748_736_000

BLANKS = ["NaN", "+Inf", "-Inf", "9223372036854775794", "2147483647", "140737488355328"]


def _reference(docs: list[bytes], node_label: str | None = None) -> list[dict]:
    by_ts: dict[float, list] = {}
    for raw in docs:
        for e in json.loads(raw)["data"]["result"]:
            labels = dict(e["metric"])
            name = labels.pop("__name__", "")
            if node_label and node_label in labels:
                labels["Hostname"] = labels[node_label]
            m = meaning(name, labels)
            if m is None:
                continue
            for t, v in e["values"]:
                by_ts.setdefault(float(t), []).append((m, float(v)))
    out = []
    for t in sorted(by_ts):
        samples, _ = gpu_samples(by_ts[t], ts=dt.datetime.fromtimestamp(t, dt.UTC))
        out += [msgspec.structs.asdict(s) for s in samples]
    for r in out:       # the store's timestamps are naive UTC
        r["ts"] = r["ts"].astimezone(dt.UTC).replace(tzinfo=None)
    return out


def _columnar(docs: list[bytes], node_label: str | None = None) -> list[dict]:
    matrices = []
    for raw in docs:
        got = decode_matrix(raw)
        assert got is not None
        matrices.append(got[0])
    return samples_table(matrices, node_label=node_label).to_pylist()


def _doc(series: list[tuple[dict, list]]) -> bytes:
    body = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": m, "values": v} for m, v in series]}}
    return json.dumps(body, separators=(",", ":")).encode()


def _random_docs(seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    times = [T0 + 60 * i for i in range(rnd.randint(1, 8))]

    def values(kind: str) -> list:
        out = []
        for t in times:
            if rnd.random() < 0.25:
                continue
            if rnd.random() < 0.15:
                out.append([t, rnd.choice(BLANKS)])
            elif kind == "float":
                out.append([t, repr(round(rnd.uniform(20, 700), 3))])
            else:
                out.append([t, str(rnd.randint(0, 3 if kind == "bool" else 5000))])
        return out

    gpus = [{"UUID": f"GPU-{g}", "gpu": str(g), "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0",
             "modelName": "NVIDIA H100 80GB HBM3", "Hostname": f"host-{g % 2}",
             "kubernetes_node": f"k8s-{g % 2}"} for g in range(3)]
    docs = []
    for name, kind in [("DCGM_FI_DEV_GPU_TEMP", "float"), ("DCGM_FI_DEV_FB_USED", "int"),
                       ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "int"),
                       ("DCGM_FI_DEV_ROW_REMAP_PENDING", "bool"),
                       ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "int"),
                       ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "int")]:
        series = []
        for g in gpus:
            if rnd.random() < 0.15:     # labelled apart: identity comes from the first series
                g = {**g, "Hostname": "elsewhere", "modelName": "relabelled"}
            if rnd.random() < 0.8:
                series.append(({"__name__": name, **g}, values(kind)))
            if name == "DCGM_FI_DEV_FB_USED" or rnd.random() < 0.2:   # MIG instances
                for inst in range(rnd.randint(0, 2)):
                    series.append(({"__name__": name, **g, "GPU_I_ID": str(inst)}, values(kind)))
        rnd.shuffle(series)
        docs.append(_doc(series))
    series = []
    for g in gpus:
        for link in rnd.sample(range(6), rnd.randint(0, 4)):
            if rnd.random() < 0.5:
                series.append(({"__name__": f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L{link}",
                                **g}, values("int")))
            else:
                series.append(({"__name__": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT",
                                "nvlink": str(link), **g}, values("int")))
    series.append(({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "9"}, values("float")))  # no UUID
    docs.append(_doc(series))
    return docs


@pytest.mark.parametrize("seed", range(60))
def test_columnar_equals_per_point(seed):
    docs = _random_docs(seed)
    assert _columnar(docs) == _reference(docs)


def test_full_grids_and_grids_that_only_look_alike():
    def temp(uuid, times):
        return ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": uuid, "gpu": uuid[-1]},
                [[t, str(40 + i)] for i, t in enumerate(times)])

    grid = [T0, T0 + 60, T0 + 120]
    full = [_doc([temp("GPU-1", grid), temp("GPU-2", grid)])]      # every point: no sort
    assert _columnar(full) == _reference(full)
    assert len(_columnar(full)) == 6
    shifted = [_doc([temp("GPU-1", grid), temp("GPU-2", [t + 30 for t in grid])])]
    assert _columnar(shifted) == _reference(shifted)
    assert len({r["ts"] for r in _columnar(shifted)}) == 6


def test_node_label_and_plus_inf_and_empty():
    docs = _random_docs(7)
    assert _columnar(docs, "kubernetes_node") == _reference(docs, "kubernetes_node")
    assert {r["node"] for r in _columnar(docs, "kubernetes_node")} <= {"k8s-0", "k8s-1"}
    assert samples_table([]).num_rows == 0
    temp = _doc([({"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": "GPU-1", "gpu": "1"},
                  [[T0, "+Inf"], [T0 + 60, "41.5"]])])
    rows = _columnar([temp])
    assert [r["gpu_temp_c"] for r in rows] == [None, 41.5]
    assert [r["node"] for r in rows] == ["unknown", "unknown"]


def test_anything_but_a_clean_matrix_is_left_to_the_checked_path():
    assert decode_matrix(b'{"status":"error","errorType":"timeout","error":"x"}') is None
    assert decode_matrix(b'{"status":"success","data":{"resultType":"vector","result":[]}}') is None
    assert decode_matrix(b"<html>Grafana</html>") is None
    spaced = b'{"status":"success","data":{"resultType":"matrix","result":[' \
             b'{"metric":{},"values":[[1, "+Inf"]]}]}}'
    assert decode_matrix(spaced) is None      # not Prometheus' own spacing: json path


def test_every_mapped_field_converts_as_its_contract_type():
    """samples_table converts by the field's contract type; the exporter by its own
    converter: they must agree for every mapped DCGM field."""
    import pyarrow as pa

    from fleetcare.collectors.dcgm_exporter import FIELD_MAP
    from fleetcare.pipeline import schema

    for fname, conv in FIELD_MAP.values():
        typ = schema.SAMPLE_SCHEMA.field(fname).type
        got = conv(7.9)
        want = (bool if pa.types.is_boolean(typ) else int if pa.types.is_integer(typ)
                else float)
        assert type(got) is want, (fname, got, typ)
