"""TLS, tokens and the Host allow-list, for real: a CA and certificates made here, a real
server over loopback, hosts with the right and the wrong CA, token, service and client
certificate; HTTPS with and without the read token; the UI's login in a real Chromium;
the start-up refusal."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from profiler_core.model import EventKind
from profiler_host.functions import FunctionRegistry
from profiler_host.recording import Request
from profiler_host.security import ChannelSecurity
from profiler_host.settings import HostSettings
from profiler_host.transport import Transport, TransportSettings
from profiler_server.access.exposure import default_allowed_hosts
from profiler_server.access.http import host_name
from profiler_server.access.policy import AccessError, AccessPolicy
from tests.browser import chromium_page
from tests.certs import Authority
from tests.conftest import TEST_SETTINGS
from tests.helpers import eventually
from tests.processes import UVICORN, host, serve_profiled
from tests.prometheus_server import running_prometheus

SHOP_TOKEN = "shop-token-0123456789abcdef"
ANY_TOKEN = "any-service-token-0123456789"
READ_TOKEN = "read-token-0123456789abcdef"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict:
    where = tmp_path_factory.mktemp("pki")
    ca = Authority("profiler", where)
    other = Authority("stranger", where)
    server_cert, server_key = ca.issue("server", server=True)
    client_cert, client_key = ca.issue("host", server=False)
    stranger_cert, stranger_key = other.issue("stranger-host", server=False)
    tokens = where / "ingest-tokens"
    tokens.write_text(f"# service token\nshop {SHOP_TOKEN}\n* {ANY_TOKEN}\n")
    read = where / "read-token"
    read.write_text(READ_TOKEN + "\n")
    return {
        "ca": ca.pem,
        "other_ca": other.pem,
        "server": (server_cert, server_key),
        "client": (client_cert, client_key),
        "stranger": (stranger_cert, stranger_key),
        "tokens": tokens,
        "read": read,
    }


def secure(pki: dict, **overrides) -> dict:
    cert, key = pki["server"]
    return {
        "tls_cert": str(cert),
        "tls_key": str(key),
        "ingest_tokens_file": str(pki["tokens"]),
        "read_token_file": str(pki["read"]),
        **overrides,
    }


@pytest.fixture
def https(pki: dict) -> Iterator[Callable[..., httpx.Client]]:
    """HTTPS clients of a server that trust the test's CA, closed before the server stops
    (an open TLS connection holds the server's stop until its grace runs out)."""
    clients: list[httpx.Client] = []

    def connect(server, token: str | None = READ_TOKEN, **headers: str) -> httpx.Client:
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        client = httpx.Client(
            base_url=f"https://localhost:{server.server.http_port}",
            verify=ssl.create_default_context(cafile=pki["ca"]),
            headers=headers,
            timeout=30,
        )
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    text = client.get("/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def stored(client: httpx.Client, service: str) -> int:
    response = client.get("/api/requests", params={"service": service})
    assert response.status_code == 200, response.text
    return len(response.json()["requests"])


def finished_request(request_id: int, fid: int) -> Request:
    request = Request(request_id, f"/r/{request_id}", "GET", event_cap=1000)
    t = request.start_ns
    request.main.append((int(EventKind.ENTER), fid, 1, t + 1))
    request.main.append((int(EventKind.EXIT), fid, 1, t + 2))
    request.finish(200)
    return request


def send(server, service: str, security: ChannelSecurity, requests: int = 3) -> Transport:
    """A host's transport that has submitted `requests` finished requests."""
    registry = FunctionRegistry()
    fid = registry.register("shop.views", compile("pass", "shop/views.py", "exec"))
    transport = Transport(
        TransportSettings(
            f"localhost:{server.server.grpc_port}", service, flush_interval=0.05, security=security
        ),
        registry,
        running=list,
    )
    for n in range(1, requests + 1):
        transport.submit(finished_request(n, fid))
    return transport


def test_hosts_with_the_right_ca_and_token_are_stored_the_others_refused_and_counted(
    tmp_path: Path, start_server, https, pki: dict, caplog: pytest.LogCaptureFixture
):
    server = start_server(f"sqlite:///{tmp_path / 'p.db'}", **secure(pki))
    api = https(server)
    ca = str(pki["ca"])
    good = send(server, "shop", ChannelSecurity(token=SHOP_TOKEN, ca=ca))
    wildcard = send(server, "billing", ChannelSecurity(token=ANY_TOKEN, ca=ca))
    wrong_ca = send(server, "wrong-ca", ChannelSecurity(token=ANY_TOKEN, ca=str(pki["other_ca"])))
    no_token = send(server, "no-token", ChannelSecurity(ca=ca))
    bad_token = send(server, "bad-token", ChannelSecurity(token="x" * 24, ca=ca))
    plaintext = send(server, "plaintext", ChannelSecurity(token=ANY_TOKEN))
    other_service = send(server, "billing", ChannelSecurity(token=SHOP_TOKEN, ca=ca))
    refused = {
        wrong_ca: "tls_handshake",
        no_token: "unauthenticated",
        bad_token: "unauthenticated",
        other_service: "permission_denied",
    }
    try:
        assert good.flush(timeout=30) and wildcard.flush(timeout=30)
        assert stored(api, "shop") == 3 and stored(api, "billing") == 3
        for transport, reason in refused.items():
            dropped = eventually(lambda t=transport, r=reason: t.dropped_requests[r] == 3, 30)
            assert dropped, (reason, transport.dropped_requests, transport.refused)
            assert transport.backlog_bytes == 0
        for reason, count in (("no_token", 1), ("bad_token", 1), ("wrong_service", 1)):
            seen = metric(api, "profiler_access_denied_total", listener="grpc", reason=reason)
            assert seen >= count, reason
        assert stored(api, "billing") == 3  # the token for shop sent nothing for billing
        for service in ("wrong-ca", "no-token", "bad-token", "plaintext"):
            assert stored(api, service) == 0
        # a plaintext host cannot tell a TLS server from one away: it keeps its backlog
        assert plaintext.stored_batches == 0 and plaintext.backlog_bytes > 0
        warnings = [r.getMessage() for r in caplog.records if "refuses this host" in r.message]
        for reason in set(refused.values()):
            assert any(reason in w for w in warnings), (reason, warnings)
        assert len(warnings) == len(set(warnings))  # each cause said once
    finally:
        for transport in (good, wildcard, plaintext, *refused):
            transport.stop(timeout=1)


def test_a_profiled_app_streams_over_tls_with_its_token_and_runs_on_when_refused(
    tmp_path: Path, start_server, https, pki: dict
):
    """`profiler-host run` with the token in PROFILER_TOKEN and the server's CA: stored.
    The same app without a token serves every request as before; its host says once why
    the server refuses it."""
    server = start_server(f"sqlite:///{tmp_path / 'p.db'}", **secure(pki))
    api = https(server)

    def products(service: str) -> list[dict]:
        found = api.get("/api/requests", params={"service": service}).json()["requests"]
        return [r for r in found if r["route"] != "/health"]

    target = f"localhost:{server.server.grpc_port}"
    options = ("--sample-rate", "1000", "--tls-ca", str(pki["ca"]))
    apps = {}
    for service, token in (("shop", SHOP_TOKEN), ("anonymous", "")):
        where = tmp_path / service
        where.mkdir()
        with pytest.MonkeyPatch.context() as env:
            env.setenv("PROFILER_TOKEN", token)
            apps[service] = serve_profiled(target, where, service, *UVICORN, options=options)
    try:
        for app in apps.values():
            for _ in range(3):
                assert httpx.get(app.url + "/products/1", timeout=30).status_code == 200
        assert len(eventually(lambda: len(products("shop")) == 3 and products("shop"), 30)) == 3
        refused = eventually(
            lambda: metric(api, "profiler_access_denied_total", reason="no_token"), 30
        )
        assert refused >= 1
        # the server counts the refusal before the host has read it: the host's word on it
        # is awaited, not raced by the stop
        said = "refuses this host (unauthenticated"
        assert eventually(lambda: said in apps["anonymous"].log.read_text(), 30)
    finally:
        for app in apps.values():
            app.stop(grace=15)
    assert products("anonymous") == []
    log = apps["anonymous"].log.read_text()
    assert log.count(said) == 1, log
    assert "Traceback" not in log


def test_mutual_tls_takes_hosts_with_a_certificate_from_its_ca_only(
    tmp_path: Path, start_server, https, pki: dict
):
    server = start_server(
        f"sqlite:///{tmp_path / 'p.db'}", **secure(pki, tls_client_ca=str(pki["ca"]))
    )
    api = https(server)
    ca = str(pki["ca"])
    cert, key = (str(p) for p in pki["client"])
    strange_cert, strange_key = (str(p) for p in pki["stranger"])
    good = send(server, "shop", ChannelSecurity(token=SHOP_TOKEN, ca=ca, cert=cert, key=key))
    no_cert = send(server, "shop", ChannelSecurity(token=SHOP_TOKEN, ca=ca))
    stranger = send(
        server,
        "shop",
        ChannelSecurity(token=SHOP_TOKEN, ca=ca, cert=strange_cert, key=strange_key),
    )
    try:
        assert good.flush(timeout=30)
        for transport in (no_cert, stranger):
            dropped = eventually(lambda t=transport: t.dropped_requests["tls_handshake"] == 3, 30)
            assert dropped, (transport.dropped_requests, transport.refused)
        assert stored(api, "shop") == 3  # the good host's only
    finally:
        for transport in (good, no_cert, stranger):
            transport.stop(timeout=1)


def test_http_asks_for_the_read_token_and_checks_the_host_header(
    tmp_path: Path, start_server, https, pki: dict
):
    server = start_server(f"sqlite:///{tmp_path / 'p.db'}", **secure(pki))
    reader = https(server)
    anonymous = https(server, token=None)
    wrong = https(server, token="y" * 24)
    for path in ("/api/requests", "/api/flamegraph", "/api/functions", "/metrics"):
        assert reader.get(path).status_code == 200, path
        response = anonymous.get(path)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "read token" in response.json()["error"]
        assert wrong.get(path).status_code == 403, path
        assert "wrong read token" in wrong.get(path).json()["error"]
    # what holds no profile data stays open: the UI's code, the health check
    assert anonymous.get("/").status_code == 200
    assert anonymous.get("/ui/app.js").status_code == 200
    assert anonymous.get("/healthz").status_code == 200
    # the login's cookie stands for the token (the UI's download links carry no header)
    assert anonymous.post("/api/login", json={"token": "z" * 24}).status_code == 403
    login = anonymous.post("/api/login", json={"token": READ_TOKEN})
    assert login.status_code == 204
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" in cookie
    assert anonymous.get("/api/requests").status_code == 200
    assert anonymous.post("/api/login", content=b"x" * 10_000).status_code == 400
    elsewhere = https(server, token=None, origin="https://evil.example")
    assert elsewhere.post("/api/login", json={"token": READ_TOKEN}).status_code == 403
    # a rebound DNS name reaches the right address with the wrong Host: 421, even with the
    # token, and whatever the path but /healthz
    rebound = https(server, host="evil.example")
    for path in ("/api/requests", "/metrics", "/", "/api/login"):
        response = rebound.get(path)
        assert response.status_code == 421, path
        assert "evil.example" in response.json()["error"]
    assert rebound.get("/healthz").status_code == 200
    denied = {
        reason: metric(reader, "profiler_access_denied_total", listener="http", reason=reason)
        for reason in ("no_token", "bad_token", "bad_host", "bad_origin")
    }
    assert denied == {"no_token": 4, "bad_token": 9, "bad_host": 4, "bad_origin": 1}, denied


def test_loopback_without_a_read_token_is_open_but_checks_the_host(tmp_path: Path, server):
    assert httpx.get(server.http + "/api/requests").status_code == 200
    assert httpx.get(server.http.replace("127.0.0.1", "localhost") + "/metrics").status_code == 200
    response = httpx.get(server.http + "/api/requests", headers={"host": "attacker.test"})
    assert response.status_code == 421


def test_the_ui_logs_in_with_the_read_token(tmp_path: Path, start_server, pki: dict):
    server = start_server(f"sqlite:///{tmp_path / 'p.db'}", **secure(pki))
    registry = FunctionRegistry()
    fid = registry.register("shop.views", compile("pass", "shop/views.py", "exec"))
    transport = Transport(
        TransportSettings(
            f"localhost:{server.server.grpc_port}",
            "shop",
            flush_interval=0.05,
            security=ChannelSecurity(token=SHOP_TOKEN, ca=str(pki["ca"])),
        ),
        registry,
        running=list,
    )
    transport.submit(finished_request(1, fid))
    try:
        assert transport.flush(timeout=30)
    finally:
        transport.stop(timeout=1)
    url = f"https://localhost:{server.server.http_port}/"
    with chromium_page(ignore_https_errors=True) as page:
        page.goto(url + "#/requests")  # the landing page is the routes overview
        page.wait_for_function("window.__profilerUI.view === 'login'", timeout=15_000)
        assert "read token" in page.inner_text("form.login")
        page.fill("#token", "not-the-token-0123456789")
        page.click("form.login button")
        page.wait_for_function(
            "document.getElementById('login-error').textContent !== ''", timeout=15_000
        )
        assert "wrong read token" in page.inner_text("#login-error")
        page.fill("#token", (pki["read"]).read_text().strip())
        page.click("form.login button")
        page.wait_for_function("window.__profilerUI.view === 'requests'", timeout=15_000)
        assert page.inner_text("#status") == ""
        rows = page.locator("tbody tr.link")
        assert eventually(lambda: rows.count() == 1)
        assert "/r/1" in rows.first.inner_text()
        assert page.evaluate("document.cookie") == ""  # HttpOnly
        # a download link carries no header: the cookie lets it through
        rows.first.click()
        page.wait_for_function("window.__profilerUI.view === 'request'", timeout=15_000)
        link = page.locator("a.export").first
        with page.expect_download() as download:
            link.click()
        assert Path(download.value.path()).stat().st_size > 0
        # what the console shows: the API's refusals before the login, nothing else
        unexpected = [
            e for e in page.errors if "status of 401" not in e and "status of 403" not in e
        ]
        assert unexpected == []


def test_prometheus_scrapes_over_tls_with_the_read_token(tmp_path: Path, start_server, pki: dict):
    """A real Prometheus with the deployment's scrape settings (CA file, credentials file)
    gets /metrics; the same target without the token is down with a 401."""
    server = start_server(f"sqlite:///{tmp_path / 'p.db'}", **secure(pki))
    target = [f"localhost:{server.server.http_port}"]
    tls = {"ca_file": str(pki["ca"])}
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "with-token",
                "scheme": "https",
                "tls_config": tls,
                "authorization": {"credentials_file": str(pki["read"])},
                "static_configs": [{"targets": target}],
            },
            {
                "job_name": "without-token",
                "scheme": "https",
                "tls_config": tls,
                "static_configs": [{"targets": target}],
            },
        ],
    }
    with running_prometheus([], tmp_path / "prom", config=json.dumps(config)) as prom:

        def health() -> dict[str, dict]:
            found = {t["labels"]["job"]: t for t in prom.targets()}
            return found if all(t["health"] != "unknown" for t in found.values()) else {}

        targets = prom.wait_for(lambda: len(health()) == 2 and health())
        assert targets, prom.targets()
        assert targets["with-token"]["health"] == "up", targets["with-token"]
        assert targets["without-token"]["health"] == "down"
        assert "401" in targets["without-token"]["lastError"]
        up = prom.wait_for(lambda: prom.scalar('up{job="with-token"}'))
        assert up == 1


def test_the_default_host_allow_list_follows_the_bound_address():
    loopback = {"localhost", "127.0.0.1", "::1"}
    assert default_allowed_hosts("127.0.0.1:9999") == loopback
    assert default_allowed_hosts("[::1]:9999") == loopback
    assert default_allowed_hosts("127.0.0.2:9999") == loopback | {"127.0.0.2"}
    machine = {socket.gethostname().lower(), socket.getfqdn().lower()}
    assert default_allowed_hosts("0.0.0.0:9999") == loopback | machine
    assert default_allowed_hosts("10.1.2.3:9999") == loopback | machine | {"10.1.2.3"}
    assert [host_name(h) for h in ("Example.COM:80", "[::1]:9999", "::1", "a.b")] == [
        "example.com",
        "::1",
        "::1",
        "a.b",
    ]


@pytest.mark.parametrize(
    ("where", "missing"),
    [
        ({"listen": "0.0.0.0:0"}, "gRPC ingest on 0.0.0.0:0"),
        ({"http": "0.0.0.0:0"}, "HTTP on 0.0.0.0:0"),
        ({"listen": "[::]:0", "http": "10.1.2.3:0"}, "HTTP on 10.1.2.3:0"),
    ],
)
def test_a_server_open_to_the_network_refuses_to_start_unless_insecure(
    pki: dict, where: dict, missing: str
):
    with pytest.raises(AccessError, match="refusing to start") as refused:
        AccessPolicy.from_settings(replace(TEST_SETTINGS, **where))
    assert missing in str(refused.value) and "--insecure" in str(refused.value)
    insecure = AccessPolicy.from_settings(replace(TEST_SETTINGS, insecure=True, **where))
    assert any(missing in exposed for exposed in insecure.exposed)  # logged at start
    AccessPolicy.from_settings(replace(TEST_SETTINGS, **where, **secure(pki)))
    tls_only = {k: v for k, v in secure(pki).items() if k.startswith("tls")}
    with pytest.raises(AccessError, match=r"without (ingest tokens|a read token)"):
        AccessPolicy.from_settings(replace(TEST_SETTINGS, **where, **tls_only))


def test_bad_access_settings_stop_the_start_with_a_clear_message(tmp_path: Path, pki: dict):
    cert, _ = pki["server"]
    short = tmp_path / "short"
    short.write_text("shop tooshort\n")
    _, other_key = pki["client"]
    cases = {
        "go together": {"tls_cert": str(cert)},
        "cannot use --tls-cert/--tls-key": {"tls_cert": str(cert), "tls_key": str(other_key)},
        "cannot use --tls-client-ca": {
            **secure(pki),
            "tls_client_ca": str(pki["tokens"]),  # not a certificate
        },
        "needs TLS": {"tls_client_ca": str(pki["ca"])},
        "at least 16 characters": {"ingest_tokens_file": str(short)},
        "cannot read token file": {"read_token_file": str(tmp_path / "absent")},
    }
    for message, settings in cases.items():
        with pytest.raises(AccessError, match=message):
            AccessPolicy.from_settings(replace(TEST_SETTINGS, **settings))


def test_host_tls_options_are_checked_before_the_app_starts(tmp_path: Path, pki: dict):
    cert, key = (str(p) for p in pki["client"])
    with pytest.raises(ValueError, match="go together"):
        HostSettings.load({"tls_cert": cert}, environ={})
    with pytest.raises(ValueError, match="--tls-ca: no such file"):
        HostSettings.load({"tls_ca": str(tmp_path / "absent.pem")}, environ={})
    settings = HostSettings.load(
        {"tls_cert": cert, "tls_key": key}, environ={"PROFILER_TOKEN": SHOP_TOKEN}
    )
    assert settings.security.uses_tls
    assert settings.security.metadata() == (("authorization", f"Bearer {SHOP_TOKEN}"),)
    result = subprocess.run(
        [*host("--tls-ca", str(tmp_path / "absent.pem")), "--", sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "--tls-ca: no such file" in result.stderr


def test_the_command_refuses_0_0_0_0_without_tls_and_tokens(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "profiler_server",
            "--listen",
            "0.0.0.0:0",
            "--http",
            "127.0.0.1:0",
            "--db",
            f"sqlite:///{tmp_path / 'p.db'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "refusing to start" in result.stderr and "--insecure" in result.stderr
    assert not (tmp_path / "p.db").exists()  # refused before touching anything
