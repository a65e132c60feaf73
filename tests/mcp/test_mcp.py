"""stsd driven by a real MCP client none of us wrote: the official Python SDK (`mcp` on PyPI),
through `stsd mcp` on stdio, in both protocol eras."""

from __future__ import annotations

import json
import os

import anyio
import mcp_types as types
import pytest
from conftest import CATALOG, SECRET, Daemon, stsd_bin
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

MODES = ["auto", "legacy"]  # auto negotiates 2026-07-28; legacy is 2025-11-25 with initialize


def text_of(r) -> str:
    return "".join(getattr(c, "text", "") for c in r.content)


def params_for(cmd: list[str], env: dict[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=env)


async def session(cmd, mode, body, env=None):
    logs: list[tuple[str, object]] = []

    async def on_log(p: types.LoggingMessageNotificationParams) -> None:
        logs.append((p.level, p.data))

    async with Client(stdio_client(params_for(cmd, env)), mode=mode, logging_callback=on_log, log_level="debug") as c:
        if mode == "legacy":
            await c.set_logging_level("debug")
        return await body(c, logs)


@pytest.mark.parametrize("mode", MODES)
def test_list_call_errors_and_console_through_the_daemon(daemon: Daemon, mode: str):
    async def body(c, logs):
        assert c.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
        tools = (await c.list_tools()).tools
        names = [t.name for t in tools]
        # ACTIVE specs only (no draft, no missing-env spec), in a stable order.
        assert names == ["always-fails", "echo-console", "leaky", "slow", "with-secret", "writer"]
        echo = next(t for t in tools if t.name == "echo-console")
        assert echo.input_schema == {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "Text to echo"}},
            "required": ["text"],
            "additionalProperties": False,
        }
        assert echo.annotations.read_only_hint is True
        assert echo.annotations.open_world_hint is False
        writer = next(t for t in tools if t.name == "writer")
        assert writer.annotations.read_only_hint is False
        assert writer.annotations.destructive_hint is True
        assert writer.meta["stsd/riskLevel"] == "L5"

        r = await c.call_tool("echo-console", {"text": "hello"})
        assert r.is_error is False and text_of(r) == "echo: hello"
        await anyio.sleep(0.1)
        assert ("info", "starting hello") in logs and ("warning", "warned") in logs, logs

        r = await c.call_tool("always-fails", {})
        assert r.is_error is True
        assert text_of(r) == "JS_ERROR: TypeError: this tool always fails"
        assert r.meta["stsd/errorCode"] == "JS_ERROR"

        # Arguments are checked before any worker is touched.
        r = await c.call_tool("slow", {"ms": "ten"})
        assert r.is_error is True and text_of(r).startswith("INVALID_INPUT"), text_of(r)
        r = await c.call_tool("echo-console", {})
        assert r.is_error is True and "missing required argument" in text_of(r)

        with pytest.raises(MCPError):
            await c.call_tool("no-such-tool", {})
        # A known tool that is not served says why (and is audited); an unknown name is a
        # protocol error.
        r = await c.call_tool("a-draft", {})
        assert r.is_error is True and text_of(r).startswith("TOOL_WITHHELD: a-draft is not served: DRAFT"), text_of(r)
        assert r.meta["stsd/errorCode"] == "TOOL_WITHHELD"

    anyio.run(session, daemon.mcp_command(), mode, body)


@pytest.mark.parametrize("mode", MODES)
def test_secrets_are_masked_in_results_console_and_audit(daemon: Daemon, mode: str):
    async def body(c, logs):
        r = await c.call_tool("with-secret", {"count": 2})
        assert r.is_error is False
        assert SECRET not in text_of(r) and "Bearer ***" in text_of(r), text_of(r)
        assert r.structured_content == {"sent": "Bearer ***", "n": 2}
        await anyio.sleep(0.1)
        assert ("info", "using token ***") in logs, logs
        assert all(SECRET not in json.dumps(d) for _, d in logs)

    anyio.run(session, daemon.mcp_command(), mode, body)
    audit = daemon.audit.read_text()
    assert SECRET not in audit
    recs = [json.loads(line) for line in audit.splitlines()]
    rec = next(r for r in recs if r["name"] == "with-secret")
    assert rec["outcome"] == "OK" and rec["params"] == {"count": 2}
    assert rec["toolSafety"]["capabilities"]["network"]["mode"] == "blocked"
    assert rec["riskLevel"] == "L0" and rec["peerUid"] == os.geteuid() and rec["workerPid"] > 0


def test_embedded_supervisor_when_no_daemon_runs(tmp_path):
    env = dict(os.environ, STSD_TEST_TOKEN=SECRET)
    cfg = tmp_path / "c.toml"
    # A hand-written test catalog (the Local Pass gate has its own test).
    cfg.write_text(f'[daemon]\naudit_log = "{tmp_path / "audit.jsonl"}"\nrequire_local_pass = false\n')
    cmd = [stsd_bin(), "mcp", "--config", str(cfg), "--socket", str(tmp_path / "none.sock"),
           "--catalog", str(CATALOG), "--pool", "1"]

    async def body(c, logs):
        assert "echo-console" in [t.name for t in (await c.list_tools()).tools]
        r = await c.call_tool("echo-console", {"text": "x"})
        assert text_of(r) == "echo: x"
        r = await c.call_tool("always-fails", {})
        assert r.is_error is True

    for mode in MODES:
        anyio.run(session, cmd, mode, body, env)
    assert (tmp_path / "audit.jsonl").read_text().count("\n") == 4


def test_every_audit_line_is_complete_json(daemon: Daemon):
    async def body(c, logs):
        for i in range(5):
            await c.call_tool("echo-console", {"text": str(i)})

    anyio.run(session, daemon.mcp_command(), "auto", body)
    lines = daemon.audit.read_text().splitlines()
    assert len(lines) == 5
    for line in lines:
        rec = json.loads(line)
        for key in ["toolId", "name", "category", "toolSafety", "riskLevel", "params", "outcome", "elapsedMs", "callId"]:
            assert key in rec, key
