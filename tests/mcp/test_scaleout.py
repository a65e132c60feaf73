"""Statelessness for real: three daemons on loopback HTTP behind HAProxy (Debian's package,
installed by scripts/setup-test-deps), sharing one tokens file and one approval-state key and
nothing else. The official Python SDK makes 300 tool calls in the 2026-07-28 era through the
balancer; the calls spread over all three daemons (counted from their own audit logs) and
none is lost. One daemon is killed (SIGKILL) mid-run: only the calls in flight on it fail,
each with a classified error, and each succeeds when retried.

The figures (calls, spread, errors) are printed and written to target/scaleout-figures.json."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from conftest import ROOT, Daemon
from httpkit import add_token, audit, client, free_port, get, wait_ready
from mcp.shared.exceptions import MCPError

def haproxy() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
    if found is None:
        pytest.fail("haproxy is not installed: scripts/setup-test-deps installs it")
    return found


CALLS = 300
CONCURRENCY = 6
KILL_AFTER = 100
WORK_MS = 40
# A client waits this long before it retries a failed call, as any client of a balanced
# service backs off. Right after SIGKILL the dying daemon's listening socket still accepts
# connections until its last thread has exited (the kernel closes its files last): in one
# failing run HAProxy's log showed d1 accept a request 3 ms after its first in-flight request
# failed and reset it 37 ms later, a 502 for a request already sent, which is not retried.
# An immediate retry that round-robin sent to d1 in that window failed again (about one run
# in ten). The balancer's health check (`inter 200ms fall 1`) takes d1 out within this.
RETRY_AFTER_S = 0.5

# One tool whose answer names its call, so every call can be found in the audit logs.
CATALOG = [{
    "name": "work",
    "description": "test tool: spins for ms milliseconds and returns its id",
    "category": "OTHER",
    "tags": [],
    "params": [
        {"name": "id", "description": "", "required": True, "type": "STRING", "testValue": "x"},
        {"name": "ms", "description": "", "required": True, "type": "INTEGER", "testValue": "1"},
    ],
    "staticVariables": [],
    "code": "const end = Date.now() + ms; while (Date.now() < end) {}\nreturn 'done ' + id;",
    "codeType": "Javascript",
    "draft": False,
}, {
    "name": "guarded",
    "description": "test tool: needs the user's approval before it returns its id",
    "category": "OTHER",
    "tags": [],
    "params": [{"name": "id", "description": "", "required": True, "type": "STRING", "testValue": "x"}],
    "staticVariables": [],
    "code": "return 'approved ' + id;",
    "codeType": "Javascript",
    "humanInTheLoop": {"mode": "REQUIRED"},
    "draft": False,
}]

HAPROXY_CFG = """
global
    maxconn 256
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    # A request whose connection to a server failed never reached it: safe to send elsewhere.
    # A request already sent is not retried (a tool call is not idempotent): its client sees
    # the failure.
    retries 3
    retry-on conn-failure
    option redispatch 1
    # Every request on a new server connection: a request sent on an idle connection kept to
    # a daemon killed a moment ago fails after it was sent (502), where a new connection
    # fails to connect and is sent elsewhere.
    http-reuse never
    errorfile 502 {errors}/502.http
    errorfile 503 {errors}/503.http
    errorfile 504 {errors}/504.http
frontend mcp
    bind 127.0.0.1:{port}
    default_backend stsd
backend stsd
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 200ms fall 1 rise 2
{servers}
"""


def leaves(e: BaseException):
    if isinstance(e, BaseExceptionGroup):
        for x in e.exceptions:
            yield from leaves(x)
    else:
        yield e


def classify(e: BaseException) -> str:
    """The class of a failed call. The balancer's own errors carry one (deploy/haproxy/*.http);
    a connection that closed with no answer at all is CONNECTION_LOST. Either way the call
    may have run."""
    for x in leaves(e):
        data = getattr(getattr(x, "error", None), "data", None)
        if isinstance(data, dict) and data.get("stsd/errorCode"):
            return data["stsd/errorCode"]
        if type(x).__name__ in ("RemoteProtocolError", "ReadError", "ConnectError"):
            return "CONNECTION_LOST"
    return f"unclassified: {type(e).__name__}: {e}"[:300]


class Cluster:
    """Three daemons and HAProxy in front. `shared_key`: the daemons share one
    approval-state key file (as the Kubernetes Secret gives them); else each makes its own."""

    def __init__(self, tmp_path: Path, shared_key: bool = True):
        lb_bin = haproxy()
        catalog = tmp_path / "catalog.json"
        catalog.write_text(json.dumps(CATALOG))
        tokens = tmp_path / "tokens"
        self.token = add_token(tokens, "agent")
        key = tmp_path / "approval-key"
        key.write_bytes(os.urandom(32).hex().encode())
        self.daemons = []
        self.lb = None
        for i in range(3):
            d = tmp_path / f"d{i}"
            d.mkdir()
            port = free_port()
            # `work` spins on Date.now(): a step budget that never ends it early, whatever
            # the machine's speed (this test is about where calls go, not about limits).
            cfg = (f'[approval]\nstate_key_file = "{key}"\n' if shared_key else "") + (
                f'[http]\ntokens_file = "{tokens}"\nlegacy_sessions = false\n'
                '[baseline]\nmax_steps = 100000000000\n')
            dm = Daemon(d, pool=2, extra_config=cfg, catalog=catalog,
                        args=["--listen", f"127.0.0.1:{port}"]).start()
            dm.port = port
            self.daemons.append(dm)
            wait_ready(f"http://127.0.0.1:{port}", proc=dm.proc)
        lb_port = free_port()
        servers = "\n".join(f"    server d{i} 127.0.0.1:{d.port} check" for i, d in enumerate(self.daemons))
        (tmp_path / "haproxy.cfg").write_text(HAPROXY_CFG.format(
            port=lb_port, servers=servers, errors=ROOT / "deploy" / "haproxy"))
        self.lb = subprocess.Popen([lb_bin, "-db", "-f", str(tmp_path / "haproxy.cfg")],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.base = f"http://127.0.0.1:{lb_port}"
        deadline = time.time() + 20
        while True:
            assert self.lb.poll() is None, f"haproxy exited: {self.lb.stdout.read()}"
            try:
                if get(self.base + "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "haproxy did not come up"
            time.sleep(0.05)
        time.sleep(1)  # every server passes `rise 2` health checks

    def stop(self):
        if self.lb is not None:
            self.lb.terminate()
            self.lb.wait(timeout=10)
        for d in self.daemons:
            if d.proc and d.proc.poll() is None:
                d.stop()


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(tmp_path)
    yield c.base, c.token, c.daemons
    c.stop()


def test_the_example_haproxy_config_is_valid(tmp_path: Path):
    lb_bin = haproxy()
    cfg = (ROOT / "deploy" / "haproxy" / "haproxy.cfg").read_text()
    cfg = cfg.replace("/etc/haproxy/stsd", str(ROOT / "deploy" / "haproxy"))
    (tmp_path / "h.cfg").write_text(cfg)
    r = subprocess.run([lb_bin, "-c", "-f", str(tmp_path / "h.cfg")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_three_daemons_behind_haproxy_share_300_calls_and_survive_a_kill(cluster):
    base, token, daemons = cluster
    victim = daemons[1]
    done: list[str] = []
    failures: list[tuple[str, str]] = []  # (call id, class)
    retried_ok: list[str] = []
    killed_at: list[float] = []

    async def one(c, cid: str) -> None:
        r = await c.call_tool("work", {"id": cid, "ms": WORK_MS})
        assert r.is_error is False, r
        assert "".join(getattr(x, "text", "") for x in r.content) == f"done {cid}"

    async def worker(w: int, ids: list[str]) -> None:
        pending = list(ids)
        retry: set[str] = set()
        while pending:
            try:
                async with client(base + "/mcp", "2026-07-28", token=token) as c:
                    while pending:
                        cid = pending[0]
                        try:
                            with anyio.fail_after(30):
                                await one(c, cid)
                        except (MCPError, AssertionError, TimeoutError) as e:
                            # An error answer: the client is still usable; retry once.
                            failures.append((cid, classify(e)))
                            retry.add(cid)
                            await anyio.sleep(RETRY_AFTER_S)
                            with anyio.fail_after(30):
                                await one(c, cid)
                        if cid in retry:
                            retried_ok.append(cid)
                        pending.pop(0)
                        done.append(cid)
                        if len(done) == KILL_AFTER and not killed_at:
                            victim.proc.send_signal(signal.SIGKILL)
                            killed_at.append(time.time())
            except Exception as e:  # noqa: BLE001 - the connection died under the client
                cid = pending[0]
                assert cid not in retry, f"{cid} failed again on retry: {e!r}"
                failures.append((cid, classify(e)))
                retry.add(cid)  # a fresh client retries it
                await anyio.sleep(RETRY_AFTER_S)

    ids = [f"c{n:03d}" for n in range(CALLS)]
    t0 = time.time()

    async def main():
        async with anyio.create_task_group() as tg:
            for w in range(CONCURRENCY):
                tg.start_soon(worker, w, ids[w::CONCURRENCY])
    anyio.run(main)
    elapsed = time.time() - t0

    assert killed_at, "the victim was never killed"
    assert sorted(done) == ids, "a call was lost"
    per_daemon = []
    seen: dict[str, int] = {}
    for d in daemons:
        recs = [r for r in audit(d.audit) if r["name"] == "work"]
        assert all(r["principal"] == "agent" and r["transport"] == "http" for r in recs)
        ok = [r["params"]["id"] for r in recs if r["outcome"] == "OK"]
        per_daemon.append(len(ok))
        for cid in ok:
            seen[cid] = seen.get(cid, 0) + 1
    # Every call ran and was audited; only a failed-then-retried call may have run twice
    # (on the victim, its answer lost with it).
    assert sorted(seen) == ids, set(ids) - set(seen)
    twice = sorted(c for c, n in seen.items() if n > 1)
    assert set(twice) <= {c for c, _ in failures}, twice
    # Spread: every daemon served calls; the victim's share stops at the kill.
    assert all(n > 0 for n in per_daemon), per_daemon
    # Only calls in flight on the victim failed: at most one per concurrent client.
    assert len(failures) <= CONCURRENCY, failures
    assert sorted(retried_ok) == sorted(c for c, _ in failures)
    assert all(cls in ("UPSTREAM_LOST", "CONNECTION_LOST") for _, cls in failures), failures
    figures = {
        "calls": CALLS, "concurrency": CONCURRENCY, "era": "2026-07-28",
        "killed": "d1 (SIGKILL) after %d calls had completed" % KILL_AFTER,
        "served_per_daemon_from_audit": {f"d{i}": n for i, n in enumerate(per_daemon)},
        "failed_then_retried_ok": len(failures),
        "failure_classes": sorted({cls for _, cls in failures}),
        "ran_twice": len(twice), "lost": CALLS - len(set(done)),
        "elapsed_s": round(elapsed, 1),
    }
    print("\nscale-out figures:", json.dumps(figures))
    out = ROOT / "target" / "scaleout-figures.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=1) + "\n")


@pytest.mark.parametrize("shared_key", [True, False])
def test_an_approval_sealed_by_one_replica_is_honoured_by_another(tmp_path: Path, shared_key: bool):
    """2026-07-28 approval is a round trip: input_required with a sealed requestState, then a
    retry. Through a round-robin balancer the retry lands on another replica: it opens the
    state only with the shared key (the control run, each daemon with its own key, fails)."""
    c = Cluster(tmp_path, shared_key=shared_key)
    asked: list[str] = []

    async def accept(ctx, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={})

    results = []
    async def main():
        async with client(c.base + "/mcp", "2026-07-28", token=c.token, elicitation_callback=accept) as cl:
            for n in range(6):
                r = await cl.call_tool("guarded", {"id": f"g{n}"})
                results.append((r.is_error, "".join(getattr(x, "text", "") for x in r.content)))
    try:
        anyio.run(main)
    finally:
        c.stop()
    assert len(asked) == 6, asked
    recs = [r for d in c.daemons for r in audit(d.audit) if r["name"] == "guarded"]
    assert len(recs) == 6
    if shared_key:
        assert results == [(False, f"approved g{n}") for n in range(6)], results
        assert all(r["outcome"] == "OK" and r["approval"]["decision"] == "approved" for r in recs), recs
        # The retries were served by every replica, not one.
        assert len({str(d.audit) for d in c.daemons for r in audit(d.audit) if r["name"] == "guarded"}) == 3
    else:
        assert all(err for err, _ in results), results
        assert all("approval state was refused" in text for _, text in results), results
