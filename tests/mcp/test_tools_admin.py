"""Adding a tool to a running daemon reaches an MCP client none of us wrote: the official
Python SDK, in a legacy session, gets notifications/tools/list_changed and then lists and
calls the new tool."""

from __future__ import annotations

import json
import subprocess

import anyio
import mcp_types as types
from conftest import Daemon, stsd_bin
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client


def test_a_tool_added_on_the_running_daemon_is_announced_and_served(tmp_path):
    d = Daemon(tmp_path).start()
    spec = tmp_path / "greeter.json"
    spec.write_text(json.dumps({
        "name": "greeter", "description": "greets whoever it is given by name",
        "codeType": "Javascript",
        "params": [{"name": "who", "type": "STRING", "required": True, "description": "",
                    "testValue": "you"}],
        "code": "return 'hello ' + who;",
        "testCases": [{"name": "greets", "arguments": {"who": "ann"}, "expected": "hello ann"}],
    }))
    changed = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(
                message.root if hasattr(message, "root") else message, types.ToolListChangedNotification):
            changed.set()
        elif isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def body():
        params = StdioServerParameters(command=d.mcp_command()[0], args=d.mcp_command()[1:], env=d.env())
        async with Client(stdio_client(params), mode="legacy", message_handler=on_message) as c:
            before = [t.name for t in (await c.list_tools()).tools]
            assert "greeter" not in before
            out = await anyio.to_thread.run_sync(lambda: subprocess.run(
                [stsd_bin(), "tools", "add", str(spec), "--socket", str(d.socket)],
                capture_output=True, text=True))
            assert out.returncode == 0, out.stderr
            with anyio.fail_after(5):
                await changed.wait()
            after = [t.name for t in (await c.list_tools()).tools]
            assert "greeter" in after
            r = await c.call_tool("greeter", {"who": "bo"})
            assert "".join(getattr(x, "text", "") for x in r.content) == "hello bo"

    try:
        anyio.run(body)
    finally:
        d.stop()
