"""An OAuth-protected MCP server for stsd's OAuth client tests (issue 36 item 3).

This is the official MCP Python SDK's example pair, `examples/servers/simple-auth`
(mcp_simple_auth/auth_server.py, simple_auth_provider.py, server.py, token_verifier.py; MIT,
Model Context Protocol a Series of LF Projects, LLC), run on the SDK from PyPI (mcp==2.3.0):
an authorization server built on the SDK's `create_auth_routes` (RFC 8414 metadata, dynamic
client registration, PKCE-checked authorization codes, the token endpoint, RFC 7009
revocation) with the example's demo login form and RFC 7662 introspection, and a resource
server, the SDK's MCPServer with RFC 9728 protected-resource metadata that checks every
bearer token by introspection.

What differs from the example, all of it to test a client's life with tokens:
- refresh tokens are issued and exchanged (the example leaves them out: "not supported in
  this example"), rotated on every refresh;
- the access token's lifetime is `--token-ttl` seconds (the example's is an hour), and
  `POST /ttl` changes it for the tokens issued next; `GET /stats` counts refreshes;
- revoking a refresh token revokes its grant's access tokens too (RFC 7009 2.1);
- both servers can be named by a host name of the test's (`--as-host`, `--rs-host`), and
  the authorization server serves HTTPS with the test's certificate (`--tls-cert`);
- the resource server has a `leak_token` tool that returns the bearer token it was called
  with (a server that echoes credentials: stsd must mask them), and binds the sockets it is
  given so the test learns the ports without a race.

Prints `READY <as_port> <rs_port>` when both serve.
"""

import argparse
import asyncio
import secrets
import socket
import sys
import time
from typing import Any

import httpx2
import uvicorn
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    OAuthAuthorizationServerProvider,
    RefreshToken,
    TokenVerifier,
    construct_redirect_uri,
)
from mcp.server.auth.routes import cors_middleware, create_auth_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver.server import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

USERNAME, PASSWORD, SCOPE = "demo_user", "demo_password", "user"


class SimpleOAuthProvider(OAuthAuthorizationServerProvider[AuthorizationCode, RefreshToken, AccessToken]):
    """The example's provider, with refresh tokens and a token lifetime."""

    def __init__(self, server_url: str, ttl: int):
        self.server_url = server_url
        self.ttl = ttl
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.auth_codes: dict[str, AuthorizationCode] = {}
        self.tokens: dict[str, AccessToken] = {}
        self.refresh_tokens: dict[str, RefreshToken] = {}
        # refresh token -> the access tokens issued with it (its grant)
        self.grant: dict[str, set[str]] = {}
        self.state_mapping: dict[str, dict[str, str | None]] = {}
        self.refreshes = 0

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull):
        if not client_info.client_id:
            raise ValueError("No client_id provided")
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        state = params.state or secrets.token_hex(16)
        self.state_mapping[state] = {
            "redirect_uri": str(params.redirect_uri),
            "code_challenge": params.code_challenge,
            "redirect_uri_provided_explicitly": str(params.redirect_uri_provided_explicitly),
            "client_id": client.client_id,
            "resource": params.resource,
        }
        return f"{self.server_url}/login?state={state}&client_id={client.client_id}"

    async def get_login_page(self, state: str) -> HTMLResponse:
        return HTMLResponse(
            f"""<!DOCTYPE html><html><body><h2>MCP Demo Authentication</h2>
            <form action="{self.server_url}/login/callback" method="post">
            <input type="hidden" name="state" value="{state}">
            <input type="text" name="username" value="{USERNAME}">
            <input type="password" name="password" value="{PASSWORD}">
            <button type="submit">Sign In</button></form></body></html>"""
        )

    async def handle_login_callback(self, request: Request) -> Response:
        form = await request.form()
        username, password, state = form.get("username"), form.get("password"), form.get("state")
        if not isinstance(username, str) or not isinstance(password, str) or not isinstance(state, str):
            raise HTTPException(400, "Missing username, password, or state parameter")
        data = self.state_mapping.get(state)
        if not data:
            raise HTTPException(400, "Invalid state parameter")
        if username != USERNAME or password != PASSWORD:
            raise HTTPException(401, "Invalid credentials")
        code = f"mcp_{secrets.token_hex(16)}"
        self.auth_codes[code] = AuthorizationCode(
            code=code,
            client_id=str(data["client_id"]),
            redirect_uri=AnyHttpUrl(str(data["redirect_uri"])),
            redirect_uri_provided_explicitly=data["redirect_uri_provided_explicitly"] == "True",
            expires_at=time.time() + 300,
            scopes=[SCOPE],
            code_challenge=str(data["code_challenge"]),
            resource=data.get("resource"),
            subject=username,
        )
        del self.state_mapping[state]
        return RedirectResponse(construct_redirect_uri(str(data["redirect_uri"]), code=code, state=state), 302)

    async def load_authorization_code(self, client, authorization_code: str) -> AuthorizationCode | None:
        return self.auth_codes.get(authorization_code)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None, subject: str | None) -> OAuthToken:
        access = f"mcp_{secrets.token_hex(32)}"
        refresh = f"mcp_r_{secrets.token_hex(32)}"
        self.tokens[access] = AccessToken(
            token=access,
            client_id=client_id,
            scopes=scopes,
            expires_at=int(time.time()) + self.ttl,
            resource=resource,
            subject=subject,
        )
        self.refresh_tokens[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource, subject=subject
        )
        self.grant[refresh] = {access}
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=self.ttl,
            refresh_token=refresh,
            scope=" ".join(scopes),
        )

    async def exchange_authorization_code(self, client, authorization_code: AuthorizationCode) -> OAuthToken:
        if authorization_code.code not in self.auth_codes:
            raise ValueError("Invalid authorization code")
        del self.auth_codes[authorization_code.code]
        return self._issue(
            client.client_id, authorization_code.scopes, authorization_code.resource, authorization_code.subject
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        access = self.tokens.get(token)
        if not access:
            return None
        if access.expires_at and access.expires_at < time.time():
            del self.tokens[token]
            return None
        return access

    async def load_refresh_token(self, client, refresh_token: str) -> RefreshToken | None:
        return self.refresh_tokens.get(refresh_token)

    async def exchange_refresh_token(self, client, refresh_token: RefreshToken, scopes: list[str]) -> OAuthToken:
        # Rotation: the old refresh token is spent.
        self.refresh_tokens.pop(refresh_token.token, None)
        self.grant.pop(refresh_token.token, None)
        self.refreshes += 1
        return self._issue(client.client_id, scopes, refresh_token.resource, refresh_token.subject)

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.tokens.pop(token.token, None)
        if token.token in self.refresh_tokens:
            del self.refresh_tokens[token.token]
            for access in self.grant.pop(token.token, set()):
                self.tokens.pop(access, None)


def authorization_server(url: str, ttl: int) -> tuple[Starlette, SimpleOAuthProvider]:
    provider = SimpleOAuthProvider(url, ttl)
    routes = create_auth_routes(
        provider=provider,
        issuer_url=AnyHttpUrl(url),
        client_registration_options=ClientRegistrationOptions(
            enabled=True, valid_scopes=[SCOPE], default_scopes=[SCOPE]
        ),
        revocation_options=RevocationOptions(enabled=True),
    )

    async def login_page(request: Request) -> Response:
        state = request.query_params.get("state")
        if not state:
            raise HTTPException(400, "Missing state parameter")
        return await provider.get_login_page(state)

    async def login_callback(request: Request) -> Response:
        return await provider.handle_login_callback(request)

    async def introspect(request: Request) -> Response:
        form = await request.form()
        token = form.get("token")
        if not token or not isinstance(token, str):
            return JSONResponse({"active": False}, status_code=400)
        access = await provider.load_access_token(token)
        if not access:
            return JSONResponse({"active": False})
        return JSONResponse(
            {
                "active": True,
                "client_id": access.client_id,
                "scope": " ".join(access.scopes),
                "exp": access.expires_at,
                "iat": int(time.time()),
                "token_type": "Bearer",
                "aud": access.resource,
                "sub": access.subject,
                "iss": url,
            }
        )

    async def stats(request: Request) -> Response:
        # For the test's assertions: how many refresh grants were served.
        return JSONResponse({"refreshes": provider.refreshes, "clients": len(provider.clients)})

    async def set_ttl(request: Request) -> Response:
        # For the test: the lifetime of the tokens issued from now on.
        provider.ttl = int((await request.form())["ttl"])
        return JSONResponse({"ttl": provider.ttl})

    routes += [
        Route("/login", endpoint=login_page, methods=["GET"]),
        Route("/login/callback", endpoint=login_callback, methods=["POST"]),
        Route("/introspect", endpoint=cors_middleware(introspect, ["POST", "OPTIONS"]), methods=["POST", "OPTIONS"]),
        Route("/stats", endpoint=stats, methods=["GET"]),
        Route("/ttl", endpoint=set_ttl, methods=["POST"]),
    ]
    return Starlette(routes=routes), provider


class IntrospectionTokenVerifier(TokenVerifier):
    """The example's verifier: every bearer token checked at the AS (RFC 7662)."""

    def __init__(self, endpoint: str, ca: str | None):
        self.endpoint = endpoint
        self.verify = ca or True

    async def verify_token(self, token: str) -> AccessToken | None:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0, connect=5.0), verify=self.verify) as client:
            try:
                r = await client.post(self.endpoint, data={"token": token})
            except Exception:
                return None
            if r.status_code != 200:
                return None
            data = r.json()
            if not data.get("active", False):
                return None
            return AccessToken(
                token=token,
                client_id=data.get("client_id", "unknown"),
                scopes=data.get("scope", "").split() if data.get("scope") else [],
                expires_at=data.get("exp"),
                resource=data.get("aud"),
                subject=data.get("sub"),
                claims=data,
            )


def resource_server(as_url: str, rs_url: str, introspect_url: str, ca: str | None) -> Starlette:
    app = MCPServer(
        name="MCP Resource Server",
        instructions="Resource Server that validates tokens via Authorization Server introspection",
        token_verifier=IntrospectionTokenVerifier(introspect_url, ca),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(as_url),
            required_scopes=[SCOPE],
            resource_server_url=AnyHttpUrl(rs_url),
            # RFC 8707: a token issued for another resource is refused.
            validate_token_resource=True,
        ),
    )

    @app.tool()
    async def get_time() -> dict[str, Any]:
        """Get the current server time."""
        now = time.time()
        return {"timestamp": now, "formatted": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now))}

    @app.tool()
    async def leak_token() -> str:
        """Return the bearer token this call was made with."""
        token = get_access_token()
        return f"token={token.token if token else None}"

    host = rs_url.split("/")[2]
    return app.streamable_http_app(
        host="127.0.0.1",
        transport_security=TransportSecuritySettings(allowed_hosts=[host]),
    )


def bound() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--token-ttl", type=int, default=3600)
    # The names the servers are known by (the test maps them to 127.0.0.1): stsd reaches
    # both through an upstream's egress proxy, which takes host names.
    ap.add_argument("--as-host", default="127.0.0.1")
    ap.add_argument("--rs-host", default="127.0.0.1")
    # The SDK's authorization server is HTTPS (its issuer must be, off localhost): a
    # certificate for --as-host and 127.0.0.1, and the CA that signed it.
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--ca")
    args = ap.parse_args()
    scheme = "https" if args.tls_cert else "http"

    as_sock, rs_sock = bound(), bound()
    as_port, rs_port = as_sock.getsockname()[1], rs_sock.getsockname()[1]
    as_url = f"{scheme}://{args.as_host}:{as_port}"
    rs_url = f"http://{args.rs_host}:{rs_port}/mcp"
    as_app, _ = authorization_server(as_url, args.token_ttl)
    rs_app = resource_server(as_url, rs_url, f"{scheme}://127.0.0.1:{as_port}/introspect", args.ca)
    servers = [
        uvicorn.Server(uvicorn.Config(as_app, log_level="warning", ssl_certfile=args.tls_cert,
                                      ssl_keyfile=args.tls_key)),
        uvicorn.Server(uvicorn.Config(rs_app, log_level="warning")),
    ]
    tasks = [
        asyncio.create_task(servers[0].serve(sockets=[as_sock])),
        asyncio.create_task(servers[1].serve(sockets=[rs_sock])),
    ]
    while not all(s.started for s in servers):
        await asyncio.sleep(0.02)
    print(f"READY {as_sock.getsockname()[1]} {rs_sock.getsockname()[1]}", flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
