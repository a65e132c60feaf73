"""Helpers for the HTTP transport tests: a throwaway CA with server and client certificates
(openssl CLI), tokens made by `stsd token add`, a free loopback port, and an SDK client over
Streamable HTTP."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import httpx2
from conftest import stsd_bin
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class Pki:
    """A CA, a server certificate for 127.0.0.1/localhost, and client certificates."""

    def __init__(self, d: Path):
        self.dir = d
        d.mkdir(parents=True, exist_ok=True)
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=stsd test CA",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
        self.ca = d / "ca.pem"
        self.cert, self.key = self.issue("server", "localhost",
                                         "subjectAltName=DNS:localhost,IP:127.0.0.1",
                                         "extendedKeyUsage=serverAuth")

    def issue(self, stem: str, cn: str, *exts: str) -> tuple[Path, Path]:
        d = self.dir
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", f"/CN={cn}", cwd=d)
        (d / f"{stem}.ext").write_text("\n".join(["basicConstraints=CA:FALSE", *exts]) + "\n")
        openssl("x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{stem}.pem", "-days", "2", "-extfile", f"{stem}.ext", cwd=d)
        return d / f"{stem}.pem", d / f"{stem}.key"

    def client(self, cn: str) -> tuple[Path, Path]:
        return self.issue(f"client-{cn}", cn, "extendedKeyUsage=clientAuth")

    def context(self, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if client:
            ctx.load_cert_chain(str(client[0]), str(client[1]))
        return ctx


def add_token(tokens: Path, name: str) -> str:
    r = subprocess.run([stsd_bin(), "token", "add", name, "--file", str(tokens)],
                       capture_output=True, text=True, check=True)
    return r.stdout.strip()


def get(url: str, ctx: ssl.SSLContext | None = None, headers: dict | None = None,
        data: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_ready(base: str, ctx: ssl.SSLContext | None = None, proc=None, timeout: float = 90) -> None:
    # Ready means the pool has a warm worker; the pool fills as background work (SCHED_IDLE),
    # which took over 20 s on a machine with stress-ng on every CPU. Returns at once when ready.
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"daemon exited: {proc.stderr.read()}")
        try:
            if get(base + "/readyz", ctx)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{base} did not become ready")


def client(url: str, mode: str, token: str | None = None, verify: ssl.SSLContext | bool = True,
           headers: dict | None = None, **kw) -> Client:
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {token}"
    http = httpx2.AsyncClient(headers=h, verify=verify, timeout=httpx2.Timeout(30, read=60))
    return Client(streamable_http_client(url, http_client=http), mode=mode, **kw)


def audit(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
