"""OAuth 2.1 on the HTTP transport, as the MCP authorization spec has it: stsd is a resource
server in front of a real authorization server (panva's oidc-provider from npm, run by
oauth_server.mjs: dynamic registration, PKCE, resource indicators, JWT access tokens). The
official Python SDK's client runs the whole flow (a 401 pointing at the protected-resource
metadata, discovery of the authorization server, registration, PKCE, the token) and calls a
tool; the token's subject is the principal the audit record names and its group claim is what
the policy sees. Refused: no token, an expired token, a token for another audience, a token
signed by another key, a token without the needed scope."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlparse

import anyio
import httpx2
import pytest
from conftest import Daemon
from httpkit import audit, client, free_port, get, wait_ready
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

HERE = Path(__file__).resolve().parent
PROVIDER = HERE.parents[1] / "target" / "npm" / "node_modules" / "oidc-provider"
SCOPE = "stsd:call"
REDIRECT = "http://localhost:3030/callback"
# Only members of "readers" may call echo-console: the group comes from the token's claim.
POLICY = """
@id("echo-is-for-readers")
forbid (principal, action == Stsd::Action::"call", resource)
when { resource.name == "echo-console" }
unless { principal in Stsd::Group::"oauth:readers" };
"""
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2026-07-28"}


class AuthServer:
    """oauth_server.mjs on a port of its own."""

    def __init__(self, tmp: Path, resources: dict[str, str], groups: str = "readers",
                 issuer: str | None = None):
        assert (PROVIDER / "package.json").exists(), "oidc-provider is missing: run scripts/setup-test-deps"
        self.port = free_port()
        self.issuer = issuer or f"http://127.0.0.1:{self.port}"
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, AS_PORT=str(self.port), AS_ISSUER=self.issuer,
                   AS_RESOURCES=json.dumps(resources), AS_GROUPS=groups, OIDC_PROVIDER=str(PROVIDER))
        self.log = tmp / f"as-{self.port}.log"
        self.proc = subprocess.Popen(["node", str(HERE / "oauth_server.mjs")], env=env,
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if get(self.base + "/.well-known/openid-configuration")[0] == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "the authorization server did not start"
            time.sleep(0.1)

    def client_credentials(self, resource: str, scope: str | None, name: str = "cc") -> str:
        """A JWT access token for `resource` from the client credentials grant."""
        reg = httpx2.post(self.base + "/reg", json={
            "grant_types": ["client_credentials"], "response_types": [], "redirect_uris": [],
            "token_endpoint_auth_method": "client_secret_post", "client_name": name})
        assert reg.status_code == 201, reg.text
        c = reg.json()
        form = {"grant_type": "client_credentials", "client_id": c["client_id"],
                "client_secret": c["client_secret"], "resource": resource}
        if scope:
            form["scope"] = scope
        tok = httpx2.post(self.base + "/token", data=form)
        assert tok.status_code == 200, tok.text
        return tok.json()["access_token"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


class Setup:
    def __init__(self, tmp: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/mcp"
        self.other = self.base + "/elsewhere"
        self.auth = AuthServer(tmp, {self.url: SCOPE, self.other: SCOPE})
        (tmp / "policy.cedar").write_text(POLICY)
        cfg = (f'[http.oauth]\nissuer = "{self.auth.issuer}"\nscopes = ["{SCOPE}"]\nleeway_seconds = 0\n'
               f'[policy]\nfiles = ["{tmp / "policy.cedar"}"]\n')
        self.daemon = Daemon(tmp, extra_config=cfg, args=["--listen", f"127.0.0.1:{self.port}"]).start()
        wait_ready(self.base, None, self.daemon.proc)

    def stop(self):
        if self.daemon.proc and self.daemon.proc.poll() is None:
            self.daemon.stop()
        self.auth.stop()


@pytest.fixture
def setup(tmp_path: Path):
    s = Setup(tmp_path)
    yield s
    s.stop()


class Memory:
    """The SDK's token storage, in memory."""

    def __init__(self):
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, info):
        self.client = info


class Browser:
    """The user's browser: follows the authorization server's redirects (its cookies kept)
    until they reach the client's redirect URI, and hands the code back to the SDK."""

    def __init__(self):
        self.result: AuthorizationCodeResult | None = None
        self.visited: list[str] = []

    async def redirect(self, url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as b:
            for _ in range(12):
                self.visited.append(urlparse(url).path)
                r = await b.get(url)
                assert r.status_code in (302, 303), (r.status_code, r.text[:500])
                url = urljoin(url, r.headers["location"])
                if url.startswith(REDIRECT):
                    q = parse_qs(urlparse(url).query)
                    assert "code" in q, q
                    self.result = AuthorizationCodeResult(code=q["code"][0], state=q.get("state", [None])[0],
                                                          iss=q.get("iss", [None])[0])
                    return
        raise AssertionError(f"no redirect to the client after {self.visited}")

    async def callback(self) -> AuthorizationCodeResult:
        assert self.result is not None
        return self.result


def post(setup: Setup, token: str | None, method: str = "tools/list", params: dict | None = None):
    h = dict(MCP_HEADERS)
    if token:
        h["Authorization"] = f"Bearer {token}"
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})
    return httpx2.post(setup.url, headers=h, content=body, timeout=30)


def text_of(r) -> str:
    return "".join(getattr(c, "text", "") for c in r.content)


def test_the_sdk_runs_the_whole_oauth_flow_and_calls_a_tool_as_the_token_subject(setup: Setup):
    store, browser = Memory(), Browser()
    auth = OAuthClientProvider(
        server_url=setup.url,
        client_metadata=OAuthClientMetadata(client_name="stsd test client", redirect_uris=[REDIRECT],
                                            grant_types=["authorization_code"], response_types=["code"]),
        storage=store, redirect_handler=browser.redirect, callback_handler=browser.callback)

    async def main():
        http = httpx2.AsyncClient(auth=auth, timeout=httpx2.Timeout(30, read=60))
        async with Client(streamable_http_client(setup.url, http_client=http), mode="2026-07-28") as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "echo-console" in names
            r = await c.call_tool("echo-console", {"text": "hello over oauth"})
            assert not r.is_error, text_of(r)
            assert "hello over oauth" in text_of(r)
    anyio.run(main)

    # The flow went through the authorization server's pages, and the token is a JWT for
    # this resource, from the issuer, with the scope the resource advertised.
    assert any(p.startswith("/interaction/") for p in browser.visited), browser.visited
    assert store.tokens is not None and store.client is not None
    c = claims(store.tokens.access_token)
    assert c["aud"] == setup.url and c["iss"] == setup.auth.issuer and SCOPE in c["scope"].split()
    rec = [r for r in audit(setup.daemon.audit) if r["name"] == "echo-console"]
    assert rec and rec[-1]["outcome"] == "OK", rec
    assert rec[-1]["principal"] == f"oauth:{c['sub']}" == "oauth:alice"
    assert rec[-1]["principalKind"] == "oauth"


def test_the_challenge_points_at_the_metadata_and_the_metadata_at_the_issuer(setup: Setup):
    r = post(setup, None)
    assert r.status_code == 401
    challenge = r.headers["www-authenticate"]
    meta_url = f"{setup.base}/.well-known/oauth-protected-resource/mcp"
    assert f'resource_metadata="{meta_url}"' in challenge and f'scope="{SCOPE}"' in challenge, challenge
    m = httpx2.get(meta_url).json()
    assert m["resource"] == setup.url
    assert m["authorization_servers"] == [setup.auth.issuer]
    assert m["scopes_supported"] == [SCOPE]


def test_wrong_tokens_are_refused_and_a_claimed_group_is_what_the_policy_sees(setup: Setup, tmp_path: Path):
    # A client's own token: valid, but without the user's "readers" group claim.
    good = setup.auth.client_credentials(setup.url, SCOPE)
    assert post(setup, good).status_code not in (401, 403)  # past the HTTP gate

    async def call(token):
        async with client(setup.url, "2026-07-28", token=token) as c:
            return await c.call_tool("echo-console", {"text": "x"})
    r = anyio.run(call, good)
    assert r.is_error and r.meta and r.meta.get("stsd/errorCode") == "FORBIDDEN", r

    refusals = {
        "another audience": (setup.auth.client_credentials(setup.other, SCOPE), 401, "invalid_token"),
        "no scope": (setup.auth.client_credentials(setup.url, None), 403, "insufficient_scope"),
    }
    # The same issuer's name, another key (a second authorization server claiming to be it).
    impostor = AuthServer(tmp_path, {setup.url: SCOPE}, issuer=setup.auth.issuer)
    try:
        refusals["another key"] = (impostor.client_credentials(setup.url, SCOPE), 401, "invalid_token")
    finally:
        impostor.stop()
    expiring = setup.auth.client_credentials(setup.url, SCOPE, name="short-lived")
    assert claims(expiring)["exp"] - claims(expiring)["iat"] == 2
    # Wait out its lifetime (no leeway configured), then it is refused.
    while time.time() <= claims(expiring)["exp"] + 0.5:
        time.sleep(0.2)
    refusals["expired"] = (expiring, 401, "invalid_token")
    for what, (token, status, error) in refusals.items():
        r = post(setup, token)
        assert r.status_code == status, (what, r.status_code, r.text)
        assert f'error="{error}"' in r.headers["www-authenticate"], (what, r.headers)
    # None of them reached the pipeline: the audit has only the FORBIDDEN call above.
    recs = [r for r in audit(setup.daemon.audit) if r["name"] == "echo-console"]
    assert [r["error"]["code"] for r in recs] == ["FORBIDDEN"], recs
    assert recs[0]["principalKind"] == "oauth" and recs[0]["principal"] == f"oauth:{claims(good)['sub']}"
