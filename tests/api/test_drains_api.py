"""Held drains and clearing them over the API, while the server's drain controller (with
an in-memory scheduler) holds the database: a real server, a real DuckDB."""

from __future__ import annotations

import datetime as dt

from fleetcare.api.drains import BreakerPolicy
from fleetcare.api.drains.audit import AuditLog

from .test_drains_controller import NODES, FakeDrainer, controller, put_scores


def _drained(store, clock):
    now = dt.datetime.fromtimestamp(clock(), dt.UTC).replace(tzinfo=None)
    put_scores(store, now, {n: 0.001 for n in NODES} | {"n01": 0.9, "n02": 0.8})
    d = FakeDrainer(NODES)
    ctl = controller(store, d, clock=clock, breaker=BreakerPolicy(max_fraction=1.0))
    ctl.run_once()
    return ctl, d, now


def test_held_drains_are_listed(store, clock, serve_app):
    ctl, _, now = _drained(store, clock)
    client = serve_app(store, clock=clock, drains=ctl)
    got = client.get("/v1/drains").json()["drains"]
    assert [(x["node"], x["scheduler"], x["cleared_at"]) for x in got] == [
        ("n01", "fake", None), ("n02", "fake", None)]
    assert got[0]["drained_at"] == now.isoformat() + "Z" and got[0]["risk"] == 0.9
    assert got[0]["reason"].startswith("fleetcare: risk 0.90")


def test_an_admin_clears_a_drain_through_the_api(store, clock, serve_app, tokens):
    ctl, d, _ = _drained(store, clock)
    client = serve_app(store, clock=clock, drains=ctl, auth=True)
    path = "/v1/drains/n01/clear"
    body = {"note": "reseated GPU 3", "force": True}
    assert client.post(path, json=body).status_code == 401
    write = {"Authorization": f"Bearer {tokens('write')}"}
    assert client.post(path, json=body, headers=write).status_code == 403
    admin = {"Authorization": f"Bearer {tokens('admin', name='alice')}"}
    r = client.post(path, json=body, headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["dry_run"] is False
    assert [(x["action"], x["actor"], x["result"]) for x in r.json()["decisions"]] == [
        ("clear", "api:alice (force)", "ok"), ("resume", "api:alice (force)", "ok")]
    assert d.nodes["n01"].state == "idle" and set(AuditLog(store).active()) == {"n02"}
    assert AuditLog(store).rows(node="n01", limit=1)[0].action == "resume"
    # not held (any more): 404 naming the audit command
    r = client.post(path, json={}, headers=admin)
    assert r.status_code == 404 and "fleetcare drain audit --node n01" in r.json()["detail"]
    # still risky and not forced: cleared, held until its risk falls
    r = client.post("/v1/drains/n02/clear", headers=admin)
    assert [x["action"] for x in r.json()["decisions"]] == ["clear", "hold"]
    assert d.nodes["n02"].state == "drained"


def test_clear_without_a_drain_controller_says_how(store, clock, serve_app):
    client = serve_app(store, clock=clock)
    r = client.post("/v1/drains/n01/clear", json={})
    assert r.status_code == 409 and "--drain-scheduler" in r.json()["detail"]
    assert client.get("/v1/drains").json() == {"drains": []}


def test_cli_clears_through_the_api_while_the_server_holds_the_database(
        store, clock, serve_app, tokens, tmp_path, capsys):
    import subprocess
    import sys

    from fleetcare.api.cli import main

    ctl, d, _ = _drained(store, clock)
    client = serve_app(store, clock=clock, drains=ctl, auth=True)
    url = str(client.base_url)
    assert main(["drain", "clear", "n01", "--api", url, "--token", "fc_wrong"]) == 1
    assert "HTTP 401" in capsys.readouterr().err
    token = tokens("admin", name="bob")
    assert main(["drain", "clear", "n01", "--api", url, "--token", token, "--force",
                 "--note", "swapped GPU 3", "--json"]) == 0
    out = __import__("json").loads(capsys.readouterr().out)
    assert [x["action"] for x in out["decisions"]] == ["clear", "resume"]
    assert d.nodes["n01"].state == "idle"
    assert AuditLog(store).rows(node="n01", limit=2)[1].reason == "swapped GPU 3"
    # another process holds a database: the local path says how to use the API
    db = tmp_path / "held.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; "
                               f"c = duckdb.connect({str(db)!r}); print('ok', flush=True); "
                               "time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        assert main(["drain", "clear", "n01", "--db", str(db)]) == 1
        err = capsys.readouterr().err
        assert "one writing process" in err and "--api http://HOST:8000" in err
    finally:
        holder.kill()
        holder.wait()
