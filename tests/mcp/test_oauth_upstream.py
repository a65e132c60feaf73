"""Issue 36 item 3: stsd as the OAuth 2.1 client of an OAuth-protected hosted MCP server.

The server is the official Python SDK's example authorization server and resource server
(tests/mcp/oauth_upstream.py, on the SDK from PyPI). The operator signs in once with `stsd
upstream login`; the test is the browser: it opens the address the CLI prints, posts the
demo login form and follows the redirect back to the CLI's loopback port. Then: calls go
through with the daemon's token, refreshed after expiry and after the server drops an access
token; a revoked grant ends in a classified error that names the login; a login again brings
the upstream back; a restarted daemon keeps its tokens; the tokens are 0600 and show up in
no reply, log or audit line."""

from __future__ import annotations

import json
import re
import socket
import ssl
import stat
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import anyio
from conftest import Daemon, stsd_bin
from test_gateway import UPVENV, audit_lines, client, text_of, upstream_list, wait_for

SERVER = Path(__file__).with_name("oauth_upstream.py")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


class Browser:
    """Follows redirects and posts the login form as a browser would; the test's host
    names (auth.test) are resolved to 127.0.0.1 as the daemon's host_overrides do."""

    def __init__(self, hosts: dict[str, str], ca: Path):
        self.hosts = hosts
        self.opener = urllib.request.build_opener(
            NoRedirect, urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(ca))))

    def real(self, url: str) -> str:
        u = urllib.parse.urlsplit(url)
        host = self.hosts.get(u.hostname or "", u.hostname)
        return urllib.parse.urlunsplit(u._replace(netloc=f"{host}:{u.port}"))

    def fetch(self, url: str, form: dict | None = None) -> tuple[int, dict, str]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        try:
            r = self.opener.open(urllib.request.Request(self.real(url), data=data), timeout=30)
            return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    def sign_in(self, url: str) -> str:
        """Opens the authorization address, signs in, follows back to the redirect URI;
        returns the last page."""
        form = None
        for _ in range(10):
            status, headers, body = self.fetch(url, form)
            form = None
            if status in (301, 302, 303, 307):
                url = urllib.parse.urljoin(url, headers["location"])
                continue
            assert status == 200, (status, url, body[:500])
            action = re.search(r'<form action="([^"]+)"', body)
            if not action:
                return body
            state = re.search(r'name="state" value="([^"]+)"', body).group(1)
            url = action.group(1)
            form = {"state": state, "username": "demo_user", "password": "demo_password"}
        raise AssertionError("too many redirects")


def certificates(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signed for auth.test and 127.0.0.1 (the openssl CLI)."""
    ca_key, ca, key, csr, cert = (tmp / n for n in ("ca.key", "ca.pem", "as.key", "as.csr", "as.pem"))
    ext = tmp / "san.ext"
    ext.write_text("subjectAltName=DNS:auth.test,IP:127.0.0.1\n")
    for args in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
         "-days", "2", "-subj", "/CN=stsd test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=auth.test"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
         "-days", "2", "-extfile", ext],
    ):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)
    return ca, cert, key


class Servers:
    def __init__(self, tmp: Path, ttl: int = 3600):
        self.ca, cert, key = certificates(tmp)
        self.proc = subprocess.Popen(
            [f"{UPVENV}/bin/python", str(SERVER), "--token-ttl", str(ttl),
             "--as-host", "auth.test", "--rs-host", "upstream.test",
             "--tls-cert", str(cert), "--tls-key", str(key), "--ca", str(self.ca)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline().split()
        assert line and line[0] == "READY", line
        self.as_port, self.rs_port = int(line[1]), int(line[2])
        self.local = f"https://127.0.0.1:{self.as_port}"
        self.tls = ssl.create_default_context(cafile=str(self.ca))

    def post(self, path: str, form: dict) -> tuple[int, str]:
        req = urllib.request.Request(self.local + path, data=urllib.parse.urlencode(form).encode())
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.tls) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def active(self, token: str) -> bool:
        return json.loads(self.post("/introspect", {"token": token})[1])["active"]

    def stats(self) -> dict:
        with urllib.request.urlopen(self.local + "/stats", timeout=30, context=self.tls) as r:
            return json.loads(r.read())

    def config(self, network: bool = True) -> str:
        return (
            '[egress]\nhost_overrides = { '
            f'"upstream.test" = "127.0.0.1:{self.rs_port}", "auth.test" = "127.0.0.1:{self.as_port}" }}\n'
            # The authorization server's certificate is the test CA's.
            f'extra_ca_files = ["{self.ca}"]\n'
            f'[[upstream]]\nid = "hosted"\nurl = "http://upstream.test:{self.rs_port}/mcp"\n'
            'auth = "oauth"\n'
            # The authorization server is another host: on the upstream's allowlist.
            + ('network = ["auth.test"]\n' if network else "")
        )

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def login(d: Daemon, browser: Browser | None) -> subprocess.CompletedProcess:
    """`stsd upstream login hosted`, with the test as the browser (None: nobody comes)."""
    p = subprocess.Popen([stsd_bin(), "upstream", "login", "hosted", "--socket", str(d.socket),
                          "--timeout-seconds", "60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = redirect = None
    for line in p.stdout:
        if line.strip().startswith("http"):
            url = line.strip()
        m = re.search(r"come back to (http://127\.0\.0\.1:\d+/callback)", line)
        if m:
            redirect = m.group(1)
            break
    if url is None or redirect is None:
        out, err = p.communicate(timeout=60)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)
    if browser is not None:
        # A request to the loopback port that is not this login's callback (another local
        # process, a page loading it) is turned away and the login goes on waiting.
        try:
            urllib.request.urlopen(redirect + "?code=forged&state=forged", timeout=30)
            raise AssertionError("a forged callback was accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 400, e.code
        page = browser.sign_in(url)
        assert "signed in" in page, page
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def rpc(d: Daemon, method: str, params: dict) -> dict:
    """One JSON-RPC request on the daemon's socket (the admin channel), its answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(d.socket))
        s.sendall((json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}) + "\n").encode())
        return json.loads(s.makefile().readline())


def credentials(d: Daemon) -> dict:
    """The credentials file's rmcp credentials (beside them: the URL they were made for)."""
    f = json.loads((d.tmp / "state" / "oauth" / "hosted.json").read_text())
    assert f["url"].startswith("http://upstream.test:") and f["url"].endswith("/mcp"), f["url"]
    return f["credentials"]


def call(d: Daemon, tool: str) -> tuple[bool, str]:
    async def body(c):
        r = await c.call_tool(tool, {})
        return r.is_error, text_of(r)
    return anyio.run(client, d, body)


def test_an_oauth_upstream_is_signed_in_once_refreshed_and_signed_out_when_revoked(tmp_path):
    servers = Servers(tmp_path)
    browser = Browser({"auth.test": "127.0.0.1", "upstream.test": "127.0.0.1"}, servers.ca)
    d = Daemon(tmp_path, extra_config=servers.config())
    d.start()
    try:
        # Not signed in: nothing is served, and the upstream says what to do.
        deadline = time.time() + 60
        while "stsd upstream login hosted" not in (upstream_list(d)["hosted"].get("error") or ""):
            assert time.time() < deadline, upstream_list(d)["hosted"]
            time.sleep(0.2)

        assert upstream_list(d)["hosted"]["oauth"]["signedIn"] is False
        out = login(d, browser)
        assert out.returncode == 0, out.stderr
        assert "signed in to upstream hosted" in out.stdout and "ready" in out.stdout, out.stdout
        assert upstream_list(d)["hosted"]["oauth"]["signedIn"] is True
        wait_for(d, lambda t: "hosted__get_time" in t, "the OAuth upstream's tools served")
        assert servers.stats()["clients"] == 1  # dynamic client registration

        # The credentials: the daemon's alone, whole.
        path = d.tmp / "state" / "oauth" / "hosted.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        first = credentials(d)["token_response"]
        assert first["access_token"] and first["refresh_token"]

        err, text = call(d, "hosted__get_time")
        assert not err and "timestamp" in text, text
        # A server that echoes the bearer token: the token is masked in the reply.
        err, text = call(d, "hosted__leak_token")
        assert not err and text.startswith("token=") and first["access_token"] not in text, text

        # The server drops the access token (RFC 7009): the next call refreshes once and
        # goes through. The new tokens live 2 s.
        assert servers.post("/ttl", {"ttl": 2})[0] == 200
        client_id = credentials(d)["client_id"]
        status, body = servers.post("/revoke", {"token": first["access_token"], "client_id": client_id,
                                                "client_secret": "", "token_type_hint": "access_token"})
        assert status == 200, body
        assert not servers.active(first["access_token"])
        err, text = call(d, "hosted__get_time")
        assert not err and "timestamp" in text, text
        second = credentials(d)["token_response"]
        assert second["access_token"] != first["access_token"]
        assert servers.stats()["refreshes"] == 1

        # After expiry: the 2 s token is dead at the server; the next call refreshes first.
        deadline = time.time() + 30
        while servers.active(second["access_token"]):
            assert time.time() < deadline, "the short-lived token never expired"
            time.sleep(0.2)
        assert servers.post("/ttl", {"ttl": 3600})[0] == 200
        err, text = call(d, "hosted__get_time")
        assert not err and "timestamp" in text, text
        third = credentials(d)["token_response"]
        assert third["access_token"] not in (first["access_token"], second["access_token"])
        assert servers.stats()["refreshes"] >= 2

        # A restarted daemon keeps its sign-in.
        d.stop()
        d.start()
        wait_for(d, lambda t: "hosted__get_time" in t, "served again after a restart, no login")
        err, text = call(d, "hosted__get_time")
        assert not err, text

        # The grant revoked: the call fails, classified, naming the login; the daemon drops
        # the dead credentials and keeps serving its own tools.
        tokens = credentials(d)["token_response"]
        status, body = servers.post("/revoke", {"token": tokens["refresh_token"], "client_id": client_id,
                                                "client_secret": "", "token_type_hint": "refresh_token"})
        assert status == 200, body
        err, text = call(d, "hosted__get_time")
        assert err and text.startswith("UPSTREAM_UNAVAILABLE"), text
        assert "refused stsd's OAuth credentials" in text and "stsd upstream login hosted" in text, text
        deadline = time.time() + 60
        while "stsd upstream login hosted" not in (upstream_list(d)["hosted"].get("error") or ""):
            assert time.time() < deadline, upstream_list(d)["hosted"]
            time.sleep(0.2)
        assert not path.exists()
        err, text = call(d, "echo-console")
        assert "UPSTREAM" not in text

        # Signed in again: served again.
        out = login(d, browser)
        assert out.returncode == 0, out.stderr
        wait_for(d, lambda t: "hosted__get_time" in t, "served after the second login")
        err, text = call(d, "hosted__get_time")
        assert not err and "timestamp" in text, text

        # No token in a log or the audit.
        now = credentials(d)["token_response"]
        for f in (d.audit, d.log):
            body = f.read_text()
            for t in (first, second, third, tokens, now):
                assert t["access_token"] not in body and t["refresh_token"] not in body, f
    finally:
        d.stop()
        servers.stop()


def test_a_login_is_refused_where_it_cannot_be_completed(tmp_path):
    """The authorization server is not on the upstream's allowlist: the login fails, naming
    the refusal, and nothing is kept. A non-OAuth upstream has no login; a callback with a
    forged state is refused."""
    servers = Servers(tmp_path)
    d = Daemon(tmp_path, extra_config=servers.config(network=False)
               + '[[upstream]]\nid = "plain"\nurl = "http://upstream.test:1/mcp"\n')
    d.start()
    try:
        out = login(d, None)
        assert out.returncode != 0 and "OAuth discovery" in out.stderr, (out.stdout, out.stderr)
        assert "upstream's `network`" in out.stderr, out.stderr
        # The proxy's refusal is audited (once it has drained the refused connection).
        deadline = time.time() + 30
        while not any(h.get("event") == "UpstreamEgress" and h["host"] == "auth.test"
                      and not h["allowed"] for h in audit_lines(d)):
            assert time.time() < deadline, [h for h in audit_lines(d) if h.get("event") == "UpstreamEgress"]
            time.sleep(0.1)
        assert not (d.tmp / "state" / "oauth" / "hosted.json").exists()
        out = subprocess.run([stsd_bin(), "upstream", "login", "plain", "--socket", str(d.socket)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "not an OAuth upstream" in out.stderr, out.stderr
        answer = rpc(d, "stsd/upstream/login_finish",
                     {"id": "hosted", "callback_url": "http://127.0.0.1:1/callback?code=x&state=y"})
        assert "no login for upstream hosted is waiting" in answer["error"]["message"], answer

        # An upstream added at run time and removed: its credentials go with it.
        entry = tmp_path / "runtime.toml"
        entry.write_text(f'id = "runtime"\nurl = "http://upstream.test:{servers.rs_port}/mcp"\nauth = "oauth"\n')
        subprocess.run([stsd_bin(), "upstream", "add", str(entry), "--socket", str(d.socket)],
                       check=True, capture_output=True, timeout=120)
        kept = d.tmp / "state" / "oauth" / "runtime.json"
        kept.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        kept.write_text(json.dumps({"client_id": "c", "token_response": None}))
        subprocess.run([stsd_bin(), "upstream", "remove", "runtime", "--socket", str(d.socket)],
                       check=True, capture_output=True, timeout=120)
        assert not kept.exists()
        # An id that is not a plain name is refused before it names a file.
        answer = rpc(d, "stsd/upstream/login", {"id": "../x", "redirect_uri": "http://127.0.0.1:1/cb"})
        assert "error" in answer, answer
    finally:
        d.stop()
        servers.stop()
