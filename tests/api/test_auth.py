"""Bearer tokens and scopes: a real server, a real DuckDB, tokens made as the CLI makes them."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re

import pytest

from fleetcare.api import auth
from fleetcare.api.cli import main

# an hour ago: POST /v1/incidents takes what ingest takes (at most 400 days old)
INCIDENT = {"ts": (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat(), "node": "n1",
            "kind": "failure", "cause": "faulty_gpu"}


@pytest.fixture
def secured(store, serve_app):
    return serve_app(store, auth=True)


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def test_missing_token_is_401_with_www_authenticate(secured):
    r = secured.get("/v1/risk")
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {"detail": (
        "no Authorization header: this endpoint needs a bearer token of scope 'read' "
        "(create one with `fleetcare tokens create --scope read --db PATH`)")}
    r = secured.get("/v1/risk", headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert r.status_code == 401
    assert r.json()["detail"].startswith("the Authorization header is not 'Bearer <token>'")


def test_unknown_and_revoked_tokens_are_401(secured, store, tokens):
    r = secured.get("/v1/risk", headers=bearer("fc_not-a-token"))
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert "not valid" in r.json()["detail"]
    token = tokens("read")
    token_id = auth.list_tokens(store.cursor())[-1].id
    auth.revoke_token(store.cursor(), token_id)
    assert secured.get("/v1/risk", headers=bearer(token)).status_code == 401


@pytest.mark.parametrize(("scope", "expected"), [
    ("read", {"read": 200, "write": 403, "admin": 403}),
    ("write", {"read": 200, "write": 201, "admin": 403}),
    ("admin", {"read": 200, "write": 201, "admin": 200}),
])
def test_scopes_nest(secured, tokens, scope, expected):
    h = bearer(tokens(scope))
    got = {
        "read": secured.get("/v1/risk", headers=h).status_code,
        "write": secured.post("/v1/incidents", json=INCIDENT, headers=h).status_code,
        "admin": secured.put("/v1/nodes/n1/labels", json={"labels": {"partition": "a"}},
                             headers=h).status_code,
    }
    assert got == expected


def test_wrong_scope_is_403_naming_the_scope(secured, store, tokens):
    token = tokens("read", name="slurm")
    token_id = auth.list_tokens(store.cursor())[0].id
    r = secured.post("/v1/incidents", json=INCIDENT, headers=bearer(token))
    assert r.status_code == 403
    assert r.json() == {"detail": f"this endpoint needs scope 'write'; token {token_id} has "
                                  "scope 'read' (scopes nest: read < write < admin)"}
    assert r.headers["www-authenticate"] == 'Bearer error="insufficient_scope", scope="write"'


def test_every_v1_endpoint_and_the_dashboard_need_a_token(secured):
    for method, path in [("GET", "/v1/risk"), ("GET", "/v1/nodes/n1"), ("GET", "/v1/gpus/g"),
                         ("GET", "/v1/drain-candidates"), ("GET", "/v1/alerts"),
                         ("GET", "/v1/model"), ("POST", "/v1/incidents"),
                         ("PUT", "/v1/nodes/n1/labels"), ("GET", "/")]:
        assert secured.request(method, path).status_code == 401, (method, path)


def test_probes_metrics_and_docs_are_open(secured):
    for path in ("/healthz", "/metrics", "/docs", "/openapi.json"):
        assert secured.get(path).status_code == 200, path


def test_openapi_declares_the_bearer_scheme(secured):
    spec = secured.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert spec["paths"]["/v1/risk"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in spec["paths"]["/healthz"]["get"]


def test_tokens_are_stored_hashed(store, tokens):
    token = tokens("admin")
    assert re.fullmatch(r"fc_[A-Za-z0-9_-]{43}", token)
    rows = store.con.execute("SELECT * FROM api_tokens").fetchall()
    assert token not in json.dumps(rows, default=str)
    assert rows[0][3] == hashlib.sha256(token.encode()).hexdigest()


def test_scope_allows():
    assert [(h, n) for h in auth.SCOPES for n in auth.SCOPES if auth.scope_allows(h, n)] == [
        ("read", "read"), ("write", "read"), ("write", "write"),
        ("admin", "read"), ("admin", "write"), ("admin", "admin")]


def test_token_cache_expires(store, tokens):
    now = [0.0]
    cache = auth.TokenCache(ttl_s=5, clock=lambda: now[0])
    token = tokens("read")
    cur = store.cursor()
    assert cache.get(cur, token).scope == "read"
    auth.revoke_token(cur, auth.list_tokens(cur)[0].id)
    assert cache.get(cur, token) is not None  # cached
    now[0] = 5.0
    assert cache.get(cur, token) is None


# -- the CLI -----------------------------------------------------------------------------------
def test_cli_create_prints_the_token_once(store, capsys):
    db = store.path
    store.close()
    assert main(["tokens", "create", "--scope", "read", "--db", db, "--name", "slurm"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert out == token + "\n" and token.startswith("fc_")
    assert "shown only this once" in err
    assert main(["tokens", "create", "--scope", "admin", "--db", db, "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert list(created) == ["token", "id", "scope"] and created["scope"] == "admin"

    assert main(["tokens", "list", "--db", db, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(t["name"], t["scope"], t["revoked_at"]) for t in listed] == [
        ("slurm", "read", None), (None, "admin", None)]
    assert token not in json.dumps(listed) and created["token"] not in json.dumps(listed)

    assert main(["tokens", "revoke", created["id"], "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["revoked_at"] is not None
    from fleetcare.pipeline.store import Store

    with Store(db) as s:
        assert auth.lookup(s.cursor(), created["token"]) is None
        assert auth.lookup(s.cursor(), token).scope == "read"


def test_cli_revoke_unknown_id_and_bad_scope(store, capsys):
    db = store.path
    store.close()
    assert main(["tokens", "revoke", "tok_nope", "--db", db]) == 1
    assert "no token with id 'tok_nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["tokens", "create", "--scope", "root", "--db", db])
    assert exc.value.code == 2
    assert "--scope" in capsys.readouterr().err


def test_serve_no_auth_refuses_a_non_loopback_address(capsys):
    assert main(["serve", "--db", "unused.duckdb", "--no-auth", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--no-auth refuses to bind 0.0.0.0, which is not a loopback address" in err


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
    ("gpu-head.example", False),
])
def test_is_loopback(host, ok):
    assert auth.is_loopback(host) is ok


def test_tokens_are_managed_through_the_api_while_the_server_holds_the_db(
        secured, store, tokens, capsys):
    from fleetcare.api.cli import main

    url = str(secured.base_url)
    admin = tokens("admin", name="root")
    read = tokens("read")
    # the API: admin only
    assert secured.get("/v1/tokens", headers=bearer(read)).status_code == 403
    r = secured.post("/v1/tokens", json={"scope": "read", "name": "slurm-prolog"},
                     headers=bearer(admin))
    assert r.status_code == 201 and r.json()["token"].startswith("fc_")
    new, new_id = r.json()["token"], r.json()["id"]
    assert secured.get("/v1/risk", headers=bearer(new)).status_code == 200
    listed = secured.get("/v1/tokens", headers=bearer(admin)).json()["tokens"]
    assert [t["name"] for t in listed][-1] == "slurm-prolog"
    assert all("token" not in t and "hash" not in t for t in listed)
    r = secured.post(f"/v1/tokens/{new_id}/revoke", headers=bearer(admin))
    assert r.status_code == 200 and r.json()["revoked_at"]
    assert secured.get("/v1/risk", headers=bearer(new)).status_code == 401  # at once
    assert secured.post("/v1/tokens/tok_nope/revoke", headers=bearer(admin)).status_code == 404
    assert secured.post("/v1/tokens", json={"scope": "root"},
                        headers=bearer(admin)).status_code == 422
    # the CLI, through the API
    assert main(["tokens", "create", "--scope", "write", "--name", "ci", "--api", url,
                 "--token", admin, "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["scope"] == "write" and made["token"].startswith("fc_")
    assert main(["tokens", "list", "--api", url, "--token", admin, "--json"]) == 0
    assert made["id"] in {t["id"] for t in json.loads(capsys.readouterr().out)}
    assert main(["tokens", "revoke", made["id"], "--api", url, "--token", admin]) == 0
    assert f"revoked {made['id']} (scope write)" in capsys.readouterr().out
    assert main(["tokens", "list", "--api", url, "--token", read]) == 1
    assert "HTTP 403" in capsys.readouterr().err
    assert main(["tokens", "list"]) == 2  # neither --db nor --api
    assert "--db PATH" in capsys.readouterr().err
