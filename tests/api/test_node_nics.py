"""Issue 16 §1: a node's InfiniBand/RoCE ports on GET /v1/nodes/{node} and its page —
each port's newest state, counters and saturation, and its flaps over 24 h from the
hourly rollup. Real HTTP server, real DuckDB file."""

from __future__ import annotations

import datetime as dt

from fleetcare.collectors.contract import GpuSample, NicSample
from fleetcare.pipeline import nic_rollup

from .conftest import T0

UTC = dt.UTC


def nic(minute: int, **kw) -> NicSample:
    base = dict(ts=T0.replace(tzinfo=UTC) + dt.timedelta(minutes=minute), node="n1",
                device="mlx5_0", port=1, link_layer="InfiniBand", state="ACTIVE",
                phys_state="LinkUp", rate_gbps=400.0, link_downed=0, symbol_error=0)
    return NicSample(**(base | kw))


def test_node_detail_and_page_show_ports_with_flaps(client, store, fleet) -> None:
    fleet.node_score("n1", 0.3, ts=T0)
    store.insert_sample_records([GpuSample(
        ts=T0.replace(tzinfo=UTC), node="n1", gpu_uuid="GPU-1", gpu_index=0,
        pci_bus_id="00000000:3B:00.0", model="H100")])
    assert client.get("/v1/nodes/n1").json()["nics"] == []  # no NIC data: nothing read
    store.insert_nic_samples([
        # the rollup's rule (nic_rollup): a step counts a flap when the state leaves ACTIVE or
        # link_downed rises: the DOWN sample, its counter rising a sample later, and a flap
        # shorter than a tick that only the counter saw
        nic(-60), nic(-50, state="DOWN", phys_state="Polling"), nic(-40, link_downed=1),
        nic(-30, link_downed=2, symbol_error=7),
        nic(-20, device="mlx5_1", link_layer="Ethernet", rate_gbps=200.0,
            link_downed=255, saturated=["link_downed"]),
        nic(-200, device="mlx5_9"),  # silent for over an hour before the newest: left out
    ])
    nic_rollup.refresh(store)
    body = client.get("/v1/nodes/n1").json()
    assert [(p["device"], p["port"], p["state"], p["rate_gbps"], p["flaps_24h"],
             p["link_downed_24h"], p["symbol_error_24h"], p["saturated"])
            for p in body["nics"]] == [
        ("mlx5_0", 1, "ACTIVE", 400.0, 3, 2, 7, []),
        ("mlx5_1", 1, "ACTIVE", 200.0, 0, 0, 0, ["link_downed"]),
    ]
    assert body["nics"][0]["counters"]["link_downed"] == 2
    assert body["nics"][0]["counters"]["port_rcv_errors"] is None  # not reported: null
    assert body["nics"][0]["ts"] == "2026-03-01T11:30:00Z"

    page = client.get("/nodes/n1").text
    assert "<h2>Network ports</h2>" in page and "mlx5_1/1" in page
    assert "link_downed" in page  # the saturated counter is named
    assert 'id="network-risk"' not in page  # no model with a network head scored it


def test_the_page_shows_the_network_heads_risk_and_where_it_alerts(
        client, store, fleet) -> None:
    """A model with a network head (the fleet prior) scored the node: its page says the
    head's probability from the ports and the threshold its alerts fire at."""
    fleet.node_score("n1", 0.09, ts=T0, model_id="prior-x")
    fleet.model("prior-x", metrics={"threshold": 0.74, "network_head": {"threshold": 0.052}})
    store.insert_nic_samples([nic(-10, symbol_error=900)])
    for minutes, p in ((-60, 0.01), (0, 0.081)):  # the newest run's is shown
        store.con.execute("INSERT INTO node_network_scores VALUES (?, 'n1', ?, 'prior-x')",
                          [T0 + dt.timedelta(minutes=minutes), p]).fetchall()
    page = client.get("/nodes/n1").text
    line = page[page.index('id="network-risk"'):].split("</p>")[0]
    assert "Network failure risk <b>8.1%</b> <b>(alerting level)</b> within 72 h" in line
    assert "at or above 5.2% it alerts on its own" in line


def test_a_node_without_ports_has_no_network_section(client, store, fleet) -> None:
    fleet.node_score("n2", 0.1, ts=T0)
    store.insert_sample_records([GpuSample(
        ts=T0.replace(tzinfo=UTC), node="n2", gpu_uuid="GPU-2", gpu_index=0,
        pci_bus_id="00000000:3B:00.0", model="H100")])
    store.insert_nic_samples([nic(0)])  # another node's port
    assert client.get("/v1/nodes/n2").json()["nics"] == []
    assert "Network ports" not in client.get("/nodes/n2").text


def test_a_bad_network_threshold_in_the_registry_is_not_shown(client, store, fleet) -> None:
    fleet.node_score("n1", 0.09, ts=T0, model_id="prior-x")
    fleet.model("prior-x", metrics={"threshold": 0.74, "network_head": {"threshold": "x"}})
    store.insert_nic_samples([nic(-10)])
    store.con.execute("INSERT INTO node_network_scores VALUES (?, 'n1', 0.02, 'prior-x')",
                      [T0]).fetchall()
    r = client.get("/nodes/n1")
    assert r.status_code == 200
    line = r.text[r.text.index('id="network-risk"'):].split("</p>")[0]
    assert "<b>2.0%</b> within 72 h" in line and "alerts on its own" not in line
