"""The dashboard over a real server and a real DuckDB: sign-in sessions (cookie flags,
revocation, sign-out, expiry), the signal history API with exact values from real
rollups, the node page's charts, and the chart drawing itself. The browser's view is in
test_browser.py."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

from fleetcare.api import auth, charts, history, sessions
from fleetcare.api.routers.web import _next
from fleetcare.collectors.contract import GpuSample, XidEvent
from fleetcare.pipeline import rollup

H0 = dt.datetime(2026, 3, 1, 9, 0)
MODEL = "NVIDIA H100 80GB HBM3"


# -- sessions -------------------------------------------------------------------------------
@pytest.fixture
def secured(store, serve_app):
    return serve_app(store, auth=True)


def login(client, token, **headers):
    """POST the sign-in form; the client keeps no cookie (each test sends its own)."""
    r = client.post("/login", data={"token": token}, headers=headers)
    client.cookies.clear()
    return r


def with_session(sid):
    return {"Cookie": f"fleetcare_session={sid}"}


def test_login_sets_a_strict_http_only_expiring_cookie(secured, tokens, store):
    token = tokens("read", name="oncall")
    r = login(secured, token)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    sid = re.match(r"fleetcare_session=([A-Za-z0-9_-]{43}); ", cookie).group(1)
    assert cookie == (f"fleetcare_session={sid}; Path=/; Max-Age=43200; HttpOnly; "
                      "SameSite=Strict")  # plain http: no Secure
    rows = store.con.execute("SELECT hash, token_id FROM api_sessions").fetchall()
    assert rows == [(auth.hash_token(sid), auth.list_tokens(store.cursor())[0].id)]
    page = secured.get("/", headers=with_session(sid))
    assert page.status_code == 200 and "Sign out" in page.text


def test_cookie_is_secure_behind_tls(secured, tokens):
    # uvicorn trusts X-Forwarded-Proto from loopback: what a TLS-terminating proxy sends
    r = login(secured, tokens("read"), **{"X-Forwarded-Proto": "https"})
    assert r.status_code == 303
    assert r.headers["set-cookie"].endswith("; HttpOnly; SameSite=Strict; Secure")


def test_bad_token_shows_the_form_with_the_fix(secured, tokens):
    tokens("read")
    r = login(secured, "fc_mistyped")
    assert r.status_code == 401 and "set-cookie" not in r.headers
    assert 'name="token"' in r.text
    assert "That token is not valid" in r.text and "fleetcare tokens create" in r.text
    assert login(secured, "").status_code == 401
    assert login(secured, "x" * 300).status_code == 401


def test_revoking_the_token_ends_its_sessions(secured, tokens, store):
    token = tokens("read")
    sid = login(secured, token).cookies["fleetcare_session"]
    assert secured.get("/alerts", headers=with_session(sid)).status_code == 200
    admin = {"Authorization": f"Bearer {tokens('admin')}"}
    token_id = auth.list_tokens(store.cursor())[0].id
    assert secured.post(f"/v1/tokens/{token_id}/revoke", headers=admin).status_code == 200
    r = secured.get("/alerts", headers=with_session(sid))
    assert r.status_code == 401 and 'name="token"' in r.text


def test_logout_ends_the_session(secured, tokens, store):
    sid = login(secured, tokens("read")).cookies["fleetcare_session"]
    r = secured.post("/logout", headers=with_session(sid))
    assert r.status_code == 303 and r.headers["location"] == "/"
    assert r.headers["set-cookie"].startswith("fleetcare_session=; Path=/; Max-Age=0;")
    assert store.con.execute("SELECT count(*) FROM api_sessions").fetchone() == (0,)
    assert secured.get("/", headers=with_session(sid)).status_code == 401


def test_sessions_expire(store, tokens):
    tokens("read")
    cur = store.cursor()
    info = auth.list_tokens(cur)[0]
    sid = sessions.create(cur, info, now=lambda: H0)
    assert sessions.lookup(cur, sid, now=lambda: H0 + sessions.TTL / 2) == info
    assert sessions.lookup(cur, sid, now=lambda: H0 + sessions.TTL) is None
    sessions.create(cur, info, now=lambda: H0 + sessions.TTL)  # prunes the expired one
    assert store.con.execute("SELECT count(*) FROM api_sessions").fetchone() == (1,)


def test_a_browser_is_sent_to_the_form_and_back(secured, tokens):
    html = {"Accept": "text/html,application/xhtml+xml"}
    r = secured.get("/nodes/n1?x=1", headers=html)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fnodes%2Fn1%3Fx%3D1"
    form = secured.get(r.headers["location"])
    assert form.status_code == 200 and 'name="next" value="/nodes/n1?x=1"' in form.text
    r = secured.post("/login", data={"token": tokens("read"), "next": "/nodes/n1?x=1"})
    assert r.status_code == 303 and r.headers["location"] == "/nodes/n1?x=1"
    secured.cookies.clear()
    assert secured.get("/", headers={"Accept": "*/*"}).status_code == 401  # not a browser


@pytest.mark.parametrize(("raw", "to"), [
    ("/nodes/a", "/nodes/a"), ("//evil.example/x", "/"), ("https://evil.example", "/"),
    ("/\\evil.example", "/"), ("/a\r\nSet-Cookie: x=1", "/"), (None, "/"), ("", "/")])
def test_next_stays_on_this_site(raw, to):
    assert _next(raw) == to


def test_pages_accept_a_bearer_token(secured, tokens):
    h = {"Authorization": f"Bearer {tokens('read')}"}
    for path in ("/", "/alerts", "/drains", "/models"):
        assert secured.get(path, headers=h).status_code == 200, path
    assert secured.get("/nodes/nope", headers=h).status_code == 404


# -- history ---------------------------------------------------------------------------------
def _sample(t: dt.datetime, node: str, gpu: str, index: int, **values: Any) -> GpuSample:
    return GpuSample(ts=t.replace(tzinfo=dt.UTC), node=node, gpu_uuid=gpu, gpu_index=index,
                     pci_bus_id=f"00000000:{index:02X}:00.0", model=MODEL, **values)


@pytest.fixture
def rolled(store, fleet):
    """3 hours of 10-minute samples: GPU-A (n1) counts one corrected ECC error a sample,
    GPU-B (n1) and GPU-C (n2) none; temperatures 70, 50, 60 °C; one XID on GPU-A in the
    second hour (by PCI bus only, as the kernel log reports it)."""
    samples = []
    for k in range(18):
        t = H0 + dt.timedelta(minutes=10 * k)
        samples += [_sample(t, "n1", "GPU-A", 0, gpu_temp_c=70.0, ecc_corrected_volatile=k),
                    _sample(t, "n1", "GPU-B", 1, gpu_temp_c=50.0, ecc_corrected_volatile=0),
                    _sample(t, "n2", "GPU-C", 0, gpu_temp_c=60.0, ecc_corrected_volatile=0)]
    store.insert_sample_records(samples)
    store.insert_events([XidEvent(ts=(H0 + dt.timedelta(minutes=75)).replace(tzinfo=dt.UTC),
                                  node="n1", xid=79, message="GPU has fallen off the bus",
                                  source="kernel-log", pci_bus_id="00000000:00:00.0")])
    rollup.refresh(store)
    fleet.node_score("n1", 0.6, reasons=["GPU 0: HBM corrected ECC errors 11/24h, 40x the "
                                         "fleet median for H100 80GB HBM3"],
                     top_gpu_uuid="GPU-A")
    fleet.gpu_score("n1", "GPU-A", 0, 0.6, reasons=["HBM corrected ECC errors 11/24h, 40x "
                                                     "the fleet median for H100 80GB HBM3"])
    store.set_meta("data_source", "simulated")
    return store


def points(*values):
    return [{"t": (H0 + dt.timedelta(hours=i)).isoformat() + "Z", "v": v}
            for i, v in enumerate(values)]


def test_history_series_and_fleet_median(rolled, client):
    r = client.get("/v1/nodes/n1/history?signals=ecc_corrected,gpu_temp_c,xid")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert (doc["node"], doc["since"], doc["until"], doc["step_s"], doc["simulated"]) == (
        "n1", "2026-02-22T12:00:00Z", "2026-03-01T12:00:00Z", 3600, True)
    assert [s["name"] for s in doc["signals"]] == ["ecc_corrected", "gpu_temp_c", "xid"]
    a, b = doc["gpus"]
    assert (a["gpu_uuid"], a["gpu_index"], a["model"], b["gpu_uuid"]) == (
        "GPU-A", 0, MODEL, "GPU-B")
    # the first sample counts 0; then one error per sample, six samples an hour
    assert a["series"] == {"ecc_corrected": points(5.0, 6.0, 6.0),
                           "gpu_temp_c": points(70.0, 70.0, 70.0),
                           "xid": points(0.0, 1.0, 0.0)}
    assert b["series"]["ecc_corrected"] == points(0.0, 0.0, 0.0)
    [median] = doc["fleet_median"]  # over GPU-A, GPU-B and n2's GPU-C
    assert median == {"model": MODEL, "series": {"ecc_corrected": points(0.0, 0.0, 0.0),
                                                 "gpu_temp_c": points(60.0, 60.0, 60.0),
                                                 "xid": points(0.0, 0.0, 0.0)}}


def test_history_of_one_gpu_since(rolled, client):
    doc = client.get("/v1/nodes/n1/history?signals=ecc_corrected&gpu=0"
                     "&since=2026-03-01T10:00:00Z").json()
    [a] = doc["gpus"]
    assert a["gpu_uuid"] == "GPU-A" and a["series"]["ecc_corrected"] == points(
        5.0, 6.0, 6.0)[1:]
    assert client.get("/v1/nodes/n1/history?gpu=GPU-B").json()["gpus"][0]["gpu_index"] == 1


@pytest.mark.parametrize(("query", "field", "says"), [
    ("signals=bogus", "signals", "should match pattern '^(ecc_uncorrected|remapped_rows|"),
    ("signals=xid,,ecc", "signals", "should match pattern"),
    ("since=2026-01-01T00:00:00Z", "since", "more than 31 days before the node's newest hour"),
    ("since=yesterday", "since", "datetime"),
    ("since=0001-01-01T00:00:00%2B14:00", "since", "since is out of range"),
    ("gpu=7", "gpu", "node 'n1' has no GPU '7'"),
    ("gpu=" + "x" * 300, "gpu", "at most 256 characters"),
    ("limit=3", "limit", "unknown query parameter"),
])
def test_history_rejects_bad_parameters(rolled, client, query, field, says):
    r = client.get(f"/v1/nodes/n1/history?{query}")
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", field]
    assert says in r.json()["message"]


def test_history_of_an_unknown_node_is_404(rolled, client):
    r = client.get("/v1/nodes/n9/history")
    assert r.status_code == 404 and "no hourly history" in r.json()["detail"]


def test_history_needs_a_read_token(rolled, serve_app, tokens):
    c = serve_app(rolled, auth=True)
    assert c.get("/v1/nodes/n1/history?signals=bogus").status_code == 401
    h = {"Authorization": f"Bearer {tokens('read')}"}
    assert c.get("/v1/nodes/n1/history", headers=h).status_code == 200


def test_node_page_charts_the_signal_behind_each_reason(rolled, client):
    page = client.get("/nodes/n1")
    assert page.status_code == 200
    assert "SIMULATED DATA" in page.text
    assert page.text.count("<figure") == 1 and "Corrected ECC errors" in page.text
    gpu_line = re.search(r'<path d="([^"]+)"[^>]*class="series"', page.text).group(1)
    assert gpu_line.count("M") == 1 and gpu_line.count("L") == 2  # three hours, no gap
    assert "GPU has fallen off the bus" in page.text  # recent XIDs
    assert "Not drained by fleetcare." in page.text
    assert client.get("/nodes/nope").status_code == 404


@pytest.mark.parametrize(("reason", "signal"), [
    ("GPU 4: 310 corrected HBM ECC errors in 24 h (fleet median for H100 80GB HBM3: 0)",
     "ecc_corrected"),
    ("uncorrected ECC errors 2/24h, 40x the fleet median for H100 80GB HBM3",
     "ecc_uncorrected"),
    ("gpu_temp_resid_24h 5.3 °C (fleet median for NVIDIA H100 80GB HBM3: -0.2 °C)",
     "gpu_temp_c"),
    ("NVLink CRC 2/1h", "nvlink_crc"), ("row remaps pending", "remapped_rows"),
    ("PCIe replays 40/24h", "pcie_replay"), ("XIDs of class application 3/24h", "xid"),
    ("failure incidents of this node in the previous 28 days 2 incidents", None),
])
def test_reasons_map_to_their_signal(reason, signal):
    found = history.signals_for_reason(reason)
    assert (found.name if found else None) == signal


# -- charts ----------------------------------------------------------------------------------
def test_chart_breaks_the_line_at_gaps_and_nulls():
    t = [(H0 + dt.timedelta(hours=h)).isoformat() + "Z" for h in range(6)]
    svg = charts.line_chart(
        [{"t": t[0], "v": 1.0}, {"t": t[1], "v": 2.0}, {"t": t[3], "v": 2.0},
         {"t": t[4], "v": None}, {"t": t[5], "v": 0.0}],
        [{"t": x, "v": 0.0} for x in t], since=t[0], until=t[5], title="T <b>", unit="u",
        gpu_name="GPU 0", median_name="fleet median")
    series = re.search(r'<path d="([^"]+)"[^>]*class="series"', svg).group(1)
    assert [p[0] for p in series.split()] == ["M", "L", "M", "M"]
    median = re.search(r'<path d="([^"]+)"[^>]*class="median"', svg).group(1)
    assert [p[0] for p in median.split()] == ["M", "L", "L", "L", "L", "L"]
    assert "T &lt;b&gt;" in svg and "<b>T <b>" not in svg


def test_chart_of_nothing_says_so():
    svg = charts.line_chart([], [], since="2026-03-01T00:00:00Z", until="2026-03-02T00:00:00Z",
                            title="x", unit="u", gpu_name="g", median_name="m")
    assert "<path" not in svg and "not reported in this period" in svg


def test_parse_signals_names_the_known_ones():
    assert [s.name for s in history.parse_signals("xid, gpu_temp_c,xid")] == ["xid",
                                                                            "gpu_temp_c"]
    assert history.parse_signals(None) == list(history.SIGNALS)
    with pytest.raises(history.HistoryError, match="unknown signal 'bogus'; known signals: "
                       "ecc_uncorrected, remapped_rows") as err:
        history.parse_signals("xid,bogus")
    assert (err.value.field, err.value.value) == ("signals", "xid,bogus")


def test_overview_counts_drains_held_overdue_and_dry_run(store, client):
    from fleetcare.api.drains import audit

    audit.ensure_schema(store)
    t = dt.datetime(2026, 3, 1, 11, 0)  # the client's clock is 2026-03-01 12:01:30
    store.con.execute("INSERT INTO drains (node, drained_at, review_at, risk, reason, "
                      "scheduler) VALUES ('n1', ?, ?, 0.9, 'HBM', 'slurm'), "
                      "('n2', ?, ?, 0.8, 'NVLink', 'slurm')",
                      [t, t + dt.timedelta(minutes=30), t, t + dt.timedelta(hours=4)]
                      ).fetchall()
    for node, dry in (("n3", True), ("n4", True), ("n3", True), ("n1", False)):
        store.con.execute("INSERT INTO drain_audit VALUES (?, ?, 'drain', 'controller', "
                          "'r', 0.9, ?, 'ok')", [t, node, dry]).fetchall()
    page = client.get("/").text
    assert ("<b>2</b><a href=\"/drains\">drains held</a> (1 overdue for review; 2 node(s) "
            "a dry run would drain)") in page
    from fleetcare.models.goodput import CostModel

    cost = CostModel()
    saved = sum(cost.expected_saving_gpu_h(r) - cost.drain_cost_gpu_h for r in (0.9, 0.8))
    assert f"<b>{saved:,.0f}</b>GPU-hours expected saved by 2 drain(s)" in page
    drains = client.get("/drains").text
    assert "2 drain(s) held, 1 past their review time." in drains
    assert drains.count("(dry run)") == 3


def test_overview_links_each_node_to_its_page(fleet, client):
    fleet.node_score("node-<b>", 0.42, reasons=["HBM errors & <rising>"])
    page = client.get("/").text
    assert '<a href="/nodes/node-%3Cb%3E">node-&lt;b&gt;</a>' in page
    node = client.get("/nodes/node-%3Cb%3E")
    assert node.status_code == 200 and "fleetcare: node node-&lt;b&gt;" in node.text
    assert "HBM errors &amp; &lt;rising&gt;" in node.text


def test_repeat_offenders_on_the_overview_and_the_node_page(fleet, client, store):
    from fleetcare.collectors.contract import Incident

    t0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)  # the client's clock: 12:01:30
    fleet.node_score("n1", 0.2)
    fleet.node_score("n2", 0.1)
    store.insert_incidents([
        Incident(ts=t0 - dt.timedelta(days=d), node="n1", kind=k, source="test",
                 cause="gpu_hbm3_memory" if k == "failure" else "repair", gpu_uuid=g)
        for d, k, g in ((20, "failure", "GPU-7"), (19, "repair", None),
                        (2, "failure", "GPU-7"), (1, "repair", None))])
    page = client.get("/").text
    panel = page[page.index("<h2>Repeat offenders</h2>"):page.index("<h2>Nodes by risk")]
    assert '<a href="/nodes/n1">n1</a></td><td class="num">2</td>' in panel
    assert "2026-02-27 12:00 UTC (gpu_hbm3_memory)" in panel
    assert "repaired 2026-02-28 12:00 UTC" in panel
    assert "<b>RMA / replace the GPU</b> (2 failures blamed GPU GPU-7)" in panel
    assert "failed 2 times in the last 30 days" in panel and "n2" not in panel
    node = client.get("/nodes/n1").text
    assert ("<b>Repeat offender</b>: 2 failures in 30 days, the last 2026-02-27 12:00 UTC "
            "(gpu_hbm3_memory), repaired 2026-02-28 12:00 UTC; recurrence risk ") in node
    assert "Suggested: <b>RMA / replace the GPU</b> (2 failures blamed GPU GPU-7)." in node
    assert "Not a repeat offender: fewer than 2 failures in the last 30 days." in client.get(
        "/nodes/n2").text


def test_no_repeat_offender_says_so(fleet, client):
    fleet.node_score("n1", 0.2)
    assert "No node failed twice in the last 30 days." in client.get("/").text


def test_a_bearer_token_on_a_page_is_checked_like_on_the_api(secured, tokens):
    """The dashboard calls the API's token check itself: an invalid bearer token gets no
    page (it once got one, when the check became a coroutine the page never awaited),
    a valid one does, and a validation error never answers before auth does."""
    html = {"Accept": "text/html"}
    bad = secured.get("/", headers={**html, "Authorization": "Bearer fc_not-a-token"})
    assert bad.status_code == 401
    good = secured.get("/", headers={**html, "Authorization": f"Bearer {tokens('read')}"})
    assert good.status_code == 200
    anon = secured.get("/v1/risk?limit=0")
    assert anon.status_code == 401
