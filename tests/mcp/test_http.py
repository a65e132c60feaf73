"""Remote MCP over Streamable HTTP (`--listen`), driven by the official Python SDK over HTTPS
with a test CA made here: bearer tokens (hashed at rest) and client certificates, each mapped
to a principal that the audit record names; no token, a wrong token and a wrong Origin are
refused; health endpoints answer without authentication and say nothing more."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import httpx2
import pytest
from conftest import CATALOG, Daemon, stsd_bin
from httpkit import Pki, add_token, audit, client, free_port, get, wait_ready
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

ORIGIN = "https://app.example.com"


def text_of(r) -> str:
    return "".join(getattr(c, "text", "") for c in r.content)


class Remote:
    def __init__(self, tmp: Path, legacy_sessions: bool = True, extra: str = ""):
        self.pki = Pki(tmp / "pki")
        self.tokens = tmp / "tokens"
        self.alice = add_token(self.tokens, "alice")
        self.ops = add_token(self.tokens, "ops")
        self.port = free_port()
        self.base = f"https://127.0.0.1:{self.port}"
        self.url = self.base + "/mcp"
        self.ctx = self.pki.context()
        cfg = (
            f'[http]\ntls_cert = "{self.pki.cert}"\ntls_key = "{self.pki.key}"\n'
            f'client_ca = "{self.pki.ca}"\ntokens_file = "{self.tokens}"\n'
            f'allowed_origins = ["{ORIGIN}"]\nadmin_principals = ["ops"]\n'
            f'legacy_sessions = {"true" if legacy_sessions else "false"}\n'
        ) + extra
        self.daemon = Daemon(tmp, extra_config=cfg, args=["--listen", f"127.0.0.1:{self.port}"]).start()
        wait_ready(self.base, self.ctx, self.daemon.proc)

    def stop(self):
        if self.daemon.proc and self.daemon.proc.poll() is None:
            self.daemon.stop()


@pytest.fixture
def remote(tmp_path: Path):
    r = Remote(tmp_path)
    yield r
    r.stop()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_sdk_calls_tools_over_https_with_a_token_and_the_audit_names_the_principal(remote: Remote, mode: str):
    async def main():
        async with client(remote.url, mode, token=remote.alice, verify=remote.ctx) as c:
            assert c.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
            names = [t.name for t in (await c.list_tools()).tools]
            assert "echo-console" in names and "writer" in names
            r = await c.call_tool("echo-console", {"text": f"over https {mode}"})
            assert r.is_error is False and text_of(r) == f"echo: over https {mode}"
            r = await c.call_tool("always-fails", {})
            assert r.is_error is True and r.meta["stsd/errorCode"] == "JS_ERROR"
    anyio.run(main)
    recs = [r for r in audit(remote.daemon.audit) if r["name"] in ("echo-console", "always-fails")]
    assert [(r["name"], r["outcome"]) for r in recs] == [("echo-console", "OK"), ("always-fails", "ERROR")]
    for r in recs:
        assert r["principal"] == "alice" and r["transport"] == "http" and r["peerUid"] is None, r
    assert recs[0]["params"] == {"text": f"over https {mode}"}


def test_no_token_a_wrong_token_and_a_wrong_origin_are_refused(remote: Remote):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    status, text = get(remote.url, remote.ctx, h, body)
    assert status == 401 and "Bearer" in text, (status, text)
    status, _ = get(remote.url, remote.ctx, {**h, "Authorization": "Bearer stsd_" + "0" * 64}, body)
    assert status == 401
    # The right token from a page on an origin not allowed: 403 before anything else.
    status, _ = get(remote.url, remote.ctx,
                    {**h, "Authorization": f"Bearer {remote.alice}", "Origin": "https://evil.example"}, body)
    assert status == 403
    # An allowed origin with the right token passes the HTTP gate.
    status, _ = get(remote.url, remote.ctx,
                    {**h, "Authorization": f"Bearer {remote.alice}", "Origin": ORIGIN}, body)
    assert status not in (401, 403)

    # The SDK sees the refusals as errors; nothing reached a tool.
    async def refused(token, headers=None):
        with pytest.raises(Exception) as e:
            async with client(remote.url, "2026-07-28", token=token, verify=remote.ctx, headers=headers) as c:
                await c.call_tool("echo-console", {"text": "must not run"})
        return str(e.value)
    async def main():
        await refused(None)
        await refused("stsd_wrong")
        await refused(remote.alice, {"Origin": "https://evil.example"})
    anyio.run(main)
    assert not [r for r in audit(remote.daemon.audit) if r["name"] == "echo-console"]


def test_plain_http_is_refused_by_the_tls_listener_and_an_untrusted_server_cert_by_the_client(remote: Remote):
    with pytest.raises(Exception):
        get(f"http://127.0.0.1:{remote.port}/healthz")
    async def main():
        with pytest.raises(Exception):
            async with client(remote.url, "2026-07-28", token=remote.alice, verify=True) as c:
                await c.list_tools()
    anyio.run(main)


def test_a_client_certificate_is_a_principal_too(remote: Remote, tmp_path: Path):
    cert = remote.pki.client("build-agent")
    async def main():
        async with client(remote.url, "2026-07-28", verify=remote.pki.context(cert)) as c:
            r = await c.call_tool("echo-console", {"text": "by cert"})
            assert text_of(r) == "echo: by cert"
    anyio.run(main)
    rec = [r for r in audit(remote.daemon.audit) if r["params"] == {"text": "by cert"}]
    assert len(rec) == 1 and rec[0]["principal"] == "build-agent"
    # A certificate from another CA is not accepted (the handshake fails).
    other = Pki(tmp_path / "other")
    foreign = other.client("mallory")
    ctx = remote.pki.context()
    ctx.load_cert_chain(str(foreign[0]), str(foreign[1]))
    with pytest.raises(Exception):
        get(remote.base + "/healthz", ctx)


def test_health_endpoints_need_no_auth_and_leak_nothing(remote: Remote):
    assert get(remote.base + "/healthz", remote.ctx) == (200, "ok\n")
    assert get(remote.base + "/readyz", remote.ctx) == (200, "ready\n")
    status, text = get(remote.base + "/nothing-here", remote.ctx)
    assert status == 404 and text == "not found\n"


def test_admin_rights_belong_to_principals(remote: Remote):
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "stsd/status"}).encode()
    h = {"Content-Type": "application/json"}
    status, text = get(remote.base + "/admin", remote.ctx, {**h, "Authorization": f"Bearer {remote.ops}"}, body)
    assert status == 200
    reply = json.loads(text)
    assert reply["id"] == 7 and "pool" in json.dumps(reply["result"]), reply
    status, text = get(remote.base + "/admin", remote.ctx, {**h, "Authorization": f"Bearer {remote.alice}"}, body)
    reply = json.loads(text)
    assert reply["error"]["code"] == -32001 and "principal alice" in reply["error"]["message"], reply
    assert get(remote.base + "/admin", remote.ctx, h, body)[0] == 401


def test_an_admin_principal_cannot_name_a_file_outside_the_catalog(remote: Remote, tmp_path: Path):
    """Issue 31 item 1, over HTTP: a remote admin token once turned `stsd/tools/add` of a spec
    named `../../x/PWNED` into a file written as the daemon's uid. Every name outside the
    tool-name grammar is refused before the gate, and nothing lands outside the catalog."""
    outside = tmp_path / "outside"
    outside.mkdir()
    h = {"Content-Type": "application/json", "Authorization": f"Bearer {remote.ops}"}
    names = ["../outside/PWNED", "../../outside/PWNED", "..", ".hidden", "a/b", "a\\b", "a\u0000b",
             "a\u2024\u2024b", "\u2024\u2024\u2215outside", "a\uff0fb", "a" * 129]
    for i, name in enumerate(names):
        spec = {"name": name, "description": "greets whoever it is given", "codeType": "Javascript",
                "params": [], "code": "return 'hi';"}
        calls = [("stsd/tools/add", {"spec": spec})] + [
            (m, {"name": name}) for m in ("stsd/tools/rollback", "stsd/tools/remove", "stsd/tools/disable")]
        for method, params in calls:
            body = json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode()
            status, text = get(remote.base + "/admin", remote.ctx, h, body)
            reply = json.loads(text)
            assert status == 200 and reply["error"]["code"] == -32602, (method, name, reply)
            assert "tool-name rule" in reply["error"]["message"], (method, name, reply)
    assert list(outside.iterdir()) == []
    assert not [p for p in tmp_path.rglob("PWNED*")]


LEGACY_ACCEPT = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def open_legacy_session(http, remote: Remote, token: str) -> dict:
    """A 2025-11-25 session opened (initialize, initialized) with `token`; the headers that
    name it (session id and protocol version), without authorization."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    r = http.post(remote.url, json=init, headers={**LEGACY_ACCEPT, "Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    sh = {**LEGACY_ACCEPT, "mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    http.post(remote.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
              headers={**sh, "Authorization": f"Bearer {token}"})
    return sh


def test_a_legacy_session_stays_with_its_principal(remote: Remote):
    with httpx2.Client(verify=remote.ctx) as http:
        sh = open_legacy_session(http, remote, remote.alice)
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "echo-console", "arguments": {"text": "mine"}}}
        r = http.post(remote.url, json=call, headers={**sh, "Authorization": f"Bearer {remote.alice}"})
        assert "echo: mine" in r.text, r.text
        call["id"] = 3
        call["params"]["arguments"]["text"] = "hijack"
        r = http.post(remote.url, json=call, headers={**sh, "Authorization": f"Bearer {remote.ops}"})
        assert "another principal" in r.text, r.text
    assert not [r for r in audit(remote.daemon.audit) if r["params"] == {"text": "hijack"}]


def test_a_legacy_session_is_bound_to_its_principal_at_initialize(remote: Remote):
    """Issue 31 item 8: another principal holding the session id, calling before the owner
    has called anything, is refused; the owner is not locked out. Before, the session was
    bound at its first tools/call, so the first caller took it."""
    with httpx2.Client(verify=remote.ctx) as http:
        sh = open_legacy_session(http, remote, remote.alice)
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "echo-console", "arguments": {"text": "takeover"}}}
        r = http.post(remote.url, json=call, headers={**sh, "Authorization": f"Bearer {remote.ops}"})
        assert "another principal" in r.text, r.text
        call["id"] = 3
        call["params"]["arguments"]["text"] = "still mine"
        r = http.post(remote.url, json=call, headers={**sh, "Authorization": f"Bearer {remote.alice}"})
        assert "echo: still mine" in r.text, r.text
    assert not [r for r in audit(remote.daemon.audit) if r["params"] == {"text": "takeover"}]


def test_the_daemon_refuses_to_start_without_auth_or_with_plain_http_off_loopback(tmp_path: Path):
    def start(cfg: str, listen: str) -> str:
        conf = tmp_path / "c.toml"
        conf.write_text(f'[daemon]\naudit_log = "{tmp_path / "a.jsonl"}"\n{cfg}')
        r = subprocess.run([stsd_bin(), "--config", str(conf), "--socket", str(tmp_path / "s.sock"),
                            "--catalog", str(CATALOG), "--pool", "1", "--listen", listen],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0
        return r.stderr
    assert "authenticate" in start("", "127.0.0.1:0")
    tokens = tmp_path / "tokens"
    add_token(tokens, "a")
    assert "plain HTTP" in start(f'[http]\ntokens_file = "{tokens}"\n', "0.0.0.0:0")


def test_sigterm_drains_a_call_in_flight_over_http(tmp_path: Path):
    """At SIGTERM the listener stops taking connections while the call in flight finishes
    and its answer reaches the client; then the daemon exits cleanly."""
    import signal
    import threading

    # A step budget that lets `slow` spin for its 1.5 s.
    remote = Remote(tmp_path, extra="[baseline]\nmax_steps = 100000000000\n")
    got: list = []
    async def main():
        async with client(remote.url, "2026-07-28", token=remote.alice, verify=remote.ctx) as c:
            await c.list_tools()
            threading.Timer(0.5, lambda: remote.daemon.proc.send_signal(signal.SIGTERM)).start()
            got.append(await c.call_tool("slow", {"ms": 1500}))
    try:
        anyio.run(main)
    finally:
        remote.stop()
    assert got[0].is_error is False and text_of(got[0]) == "slept 1500"
    assert remote.daemon.proc.wait(timeout=30) == 0
    assert [r["outcome"] for r in audit(remote.daemon.audit) if r["name"] == "slow"] == ["OK"]


def test_an_approver_principal_answers_an_operator_approval_over_http(tmp_path: Path):
    """A call over HTTP waits for an operator; `POST /admin` shows it with its principal to a
    principal in approver_principals, who approves it; one who is not may not."""
    import threading
    import time

    remote = Remote(tmp_path, extra=(
        '\napprover_principals = ["ops"]\n'
        '[[approval.rule]]\ntools = ["echo-console"]\nrequire = true\nstrategy = "operator"\n'))
    h = {"Content-Type": "application/json"}

    def admin(token: str, method: str, params: dict) -> dict:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        return json.loads(get(remote.base + "/admin", remote.ctx, {**h, "Authorization": f"Bearer {token}"}, body)[1])

    decided: list = []
    def operator():
        deadline = time.time() + 20
        while time.time() < deadline:
            pending = admin(remote.ops, "stsd/approvals/list", {}).get("result", {}).get("pending", [])
            if pending:
                p = pending[0]
                decided.append(p)
                refused = admin(remote.alice, "stsd/approvals/decide", {"id": p["id"], "approve": True})
                decided.append(refused)
                decided.append(admin(remote.ops, "stsd/approvals/decide", {"id": p["id"], "approve": True}))
                return
            time.sleep(0.1)
    t = threading.Thread(target=operator)
    t.start()
    got: list = []
    async def main():
        async with client(remote.url, "2026-07-28", token=remote.alice, verify=remote.ctx) as c:
            got.append(await c.call_tool("echo-console", {"text": "approved by ops"}))
    try:
        anyio.run(main)
        t.join(timeout=30)
    finally:
        remote.stop()
    assert text_of(got[0]) == "echo: approved by ops", got
    pending, refused, ok = decided
    assert pending["principal"] == "alice" and pending["tool"] == "echo-console", pending
    assert refused["error"]["code"] == -32001 and "principal alice may not answer" in refused["error"]["message"]
    assert ok["result"] == {"id": pending["id"], "approved": True}
    rec = [r for r in audit(remote.daemon.audit) if r["name"] == "echo-console"][0]
    assert rec["principal"] == "alice" and rec["approval"]["approver"] == "operator principal ops", rec


def test_without_legacy_sessions_only_the_2026_07_28_era_is_served(tmp_path: Path):
    remote = Remote(tmp_path, legacy_sessions=False)
    try:
        async def modern():
            async with client(remote.url, "auto", token=remote.alice, verify=remote.ctx) as c:
                assert c.protocol_version == "2026-07-28"
                return text_of(await c.call_tool("echo-console", {"text": "modern"}))
        assert anyio.run(modern) == "echo: modern"

        async def legacy():
            async with client(remote.url, "legacy", token=remote.alice, verify=remote.ctx) as c:
                await c.call_tool("echo-console", {"text": "legacy"})
        with pytest.raises(Exception):
            anyio.run(legacy)
    finally:
        remote.stop()
    assert [r["params"]["text"] for r in audit(remote.daemon.audit) if r["name"] == "echo-console"] == ["modern"]


def test_a_rate_limited_call_over_http_is_429_with_retry_after(tmp_path: Path):
    # One call a second for alice's echo-console: of calls in a row, the excess is refused
    # RATE_LIMITED, which the HTTP transport says as 429 with Retry-After (the JSON-RPC reply,
    # with _meta stsd/retryAfterMs, stays the body).
    remote = Remote(tmp_path, extra='[[limits]]\nprincipal = "alice"\ntool = "echo-console"\n'
                                    'calls_per_second = 1\nburst = 1\n')
    seen: list[tuple[int, str | None, str]] = []

    async def hook(resp):
        if resp.request.method == "POST" and b'"tools/call"' in resp.request.content:
            await resp.aread()
            seen.append((resp.status_code, resp.headers.get("retry-after"), resp.text))

    async def main():
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {remote.alice}"}, verify=remote.ctx,
                                  timeout=httpx2.Timeout(30, read=60), event_hooks={"response": [hook]})
        async with Client(streamable_http_client(remote.url, http_client=http), mode="2026-07-28") as c:
            for _ in range(20):
                try:
                    await c.call_tool("echo-console", {"text": "x"})
                except Exception:
                    pass
                if any(s == 429 for s, _, _ in seen):
                    return
    try:
        anyio.run(main)
    finally:
        remote.stop()
    assert seen and seen[0][0] == 200, seen
    limited = [x for x in seen if x[0] == 429]
    assert limited, seen
    status, retry_after, body = limited[0]
    assert retry_after is not None and int(retry_after) >= 1, limited
    assert "RATE_LIMITED" in body and "stsd/retryAfterMs" in body, body
    codes = [r["error"]["code"] for r in audit(remote.daemon.audit) if r.get("error")]
    assert "RATE_LIMITED" in codes, codes
