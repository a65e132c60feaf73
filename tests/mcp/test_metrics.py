"""Daemon metrics as Prometheus text, parsed by the Prometheus project's own Python parser,
moving with calls made by the official MCP SDK."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import anyio
from conftest import Daemon
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def scrape(port: int) -> dict:
    # The daemon binds its socket before it builds the service and then the metrics listener,
    # so right after start the port may not be listening yet: retry refusals for a while.
    deadline = time.time() + 20
    while True:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            break
        except urllib.error.URLError as e:
            if not isinstance(e.reason, ConnectionRefusedError) or time.time() > deadline:
                raise
            time.sleep(0.05)
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_prometheus_counters_move_with_calls(tmp_path):
    port = free_port()
    d = Daemon(tmp_path, extra_config=f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n').start()
    try:
        before = scrape(port)
        assert before[("stsd_pool_workers", ())] == 2
        assert before[("stsd_tools_served", ())] == 6

        async def calls():
            params = StdioServerParameters(command=d.mcp_command()[0], args=d.mcp_command()[1:], env=d.env())
            async with Client(stdio_client(params)) as c:
                for _ in range(3):
                    await c.call_tool("echo-console", {"text": "hi"})
                await c.call_tool("always-fails", {})

        anyio.run(calls)
        after = scrape(port)
        ok = ("stsd_calls_total", (("outcome", "OK"), ("tool", "echo-console")))
        failed = ("stsd_calls_total", (("outcome", "JS_ERROR"), ("tool", "always-fails")))
        assert after[ok] - before.get(ok, 0) == 3
        assert after[failed] == 1
        count = ("stsd_call_duration_seconds_count", (("tool", "echo-console"),))
        inf = ("stsd_call_duration_seconds_bucket", (("le", "+Inf"), ("tool", "echo-console")))
        assert after[count] == 3 and after[inf] == 3
    finally:
        d.stop()
