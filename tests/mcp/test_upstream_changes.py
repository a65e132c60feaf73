"""Issue 36 item 2: upstreams added, updated, removed and restarted on a running daemon
(`stsd upstream add|update|remove|restart`, and SIGHUP for the config's), under load from
four SDK clients, with a legacy session told each change; and a kill -9 in the middle of a
change leaves the persisted state whole."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import anyio
import mcp_types as types
import pytest
from conftest import Daemon, stsd_bin
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from test_gateway import _gone, hostile, served, text_of, tmp_path, upstream_list, wait_for  # noqa: F401


def cli(d: Daemon, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([stsd_bin(), *args, "--socket", str(d.socket)], capture_output=True,
                         text=True, timeout=120)
    if ok:
        assert out.returncode == 0, f"{args}: {out.stderr}"
    return out


def params(d: Daemon) -> StdioServerParameters:
    return StdioServerParameters(command=d.mcp_command()[0], args=d.mcp_command()[1:], env=d.env())


def test_upstreams_change_on_a_running_daemon_under_load(tmp_path):
    d = Daemon(tmp_path, extra_config=hostile("base", "plain") + "[gateway]\ndrain_seconds = 3\n")
    d.start()
    entry = tmp_path / "extra.toml"
    try:
        wait_for(d, lambda t: "base__echo" in t, "the config's upstream up")
        failures: list[str] = []
        calls = [0]
        announced = [0]
        stop = anyio.Event()

        async def worker(n: int) -> None:
            async with Client(stdio_client(params(d))) as c:
                while not stop.is_set():
                    for tool, args in (("echo-console", {"text": f"w{n}"}),
                                       ("base__echo", {"text": f"w{n}"})):
                        r = await c.call_tool(tool, args)
                        calls[0] += 1
                        if r.is_error:
                            failures.append(f"{tool}: {text_of(r)}")

        async def on_message(message) -> None:
            m = message.root if hasattr(message, "root") else message
            if isinstance(m, types.ToolListChangedNotification):
                announced[0] += 1

        async def until(pred, what: str, timeout: float = 60):
            deadline = time.time() + timeout
            while not pred():
                assert time.time() < deadline, what
                await anyio.sleep(0.05)

        async def in_flight(uid: str) -> None:
            """Until the upstream counts a call in flight (the call reached it)."""
            await until(lambda: upstream_list(d).get(uid, {}).get("callsInFlight", 0) > 0,
                        f"a call in flight through {uid}")

        async def run(*args: str) -> subprocess.CompletedProcess:
            return await anyio.to_thread.run_sync(lambda: cli(d, *args))

        async def body() -> None:
            async with anyio.create_task_group() as tg:
                for n in range(4):
                    tg.start_soon(worker, n)
                async with Client(stdio_client(params(d)), mode="legacy",
                                  message_handler=on_message) as watcher:
                    await until(lambda: calls[0] >= 20, "the clients call")
                    # Added: connected, confined and scored before its tools are served.
                    entry.write_text(hostile("extra", "slow"))
                    out = json.loads((await run("upstream", "add", str(entry), "--json")).stdout)
                    assert out["upstream"]["state"] == "ready", out
                    assert out["upstream"]["serverRisk"]["level"], out
                    assert {t["alias"] for t in out["upstream"]["tools"]} >= {"extra__slow"}, out
                    await until(lambda: announced[0] >= 1, "list_changed for the add")
                    names = [t.name for t in (await watcher.list_tools()).tools]
                    assert "extra__slow" in names, names
                    old_pid = upstream_list(d)["extra"]["pid"]
                    assert old_pid

                    # Updated while a call is in flight: the call finishes within the drain
                    # period; the new entry serves other tools; the old process is gone.
                    slow: dict = {}

                    async def slow_call(c, seconds: float) -> None:
                        t0 = time.time()
                        r = await c.call_tool("extra__slow", {"seconds": seconds})
                        slow.update(text=text_of(r), error=r.is_error, took=time.time() - t0)

                    async with anyio.create_task_group() as inner:
                        inner.start_soon(slow_call, watcher, 1.0)
                        await in_flight("extra")
                        seen = announced[0]
                        entry.write_text(hostile("extra", "flood"))
                        await run("upstream", "update", str(entry), "--json")
                    assert slow == {"text": "done", "error": False, "took": slow["took"]}, slow
                    await until(lambda: announced[0] > seen, "list_changed for the update")
                    names = [t.name for t in (await watcher.list_tools()).tools]
                    assert "extra__flood" in names and "extra__slow" not in names, names
                    assert _gone(old_pid), old_pid

                    # Restarted: a new process, same tools.
                    pid = upstream_list(d)["extra"]["pid"]
                    out = json.loads((await run("upstream", "restart", "extra", "--json")).stdout)
                    assert out["upstream"]["state"] == "ready" and out["upstream"]["pid"] != pid
                    assert _gone(pid), pid

                    # Removed: its tools leave with list_changed, its processes are killed.
                    pid = upstream_list(d)["extra"]["pid"]
                    seen = announced[0]
                    await run("upstream", "remove", "extra")
                    await until(lambda: announced[0] > seen, "list_changed for the removal")
                    names = [t.name for t in (await watcher.list_tools()).tools]
                    assert not [n for n in names if n.startswith("extra__")], names
                    assert "extra" not in upstream_list(d)
                    assert _gone(pid), pid
                    stop.set()

        anyio.run(body)
        assert failures == [], failures[:5]
        assert calls[0] > 40, calls

        # What the config declares is changed by SIGHUP, not by the admin methods.
        out = cli(d, "upstream", "remove", "base", ok=False)
        assert out.returncode != 0 and "declared in the config" in out.stderr, out.stderr
        d.config.write_text(d.config.read_text().replace('id = "base"', 'id = "base2"'))
        d.proc.send_signal(signal.SIGHUP)
        wait_for(d, lambda t: "base2__echo" in t and "base__echo" not in t,
                 "SIGHUP applied the [[upstream]] change")
    finally:
        d.stop()


def test_a_drained_call_past_the_grace_period_ends_upstream_lost(tmp_path):
    d = Daemon(tmp_path, extra_config="[gateway]\ndrain_seconds = 1\n").start()
    entry = tmp_path / "slow.toml"
    entry.write_text(hostile("sl", "slow"))
    try:
        cli(d, "upstream", "add", str(entry))
        wait_for(d, lambda t: "sl__slow" in t, "the added upstream served")

        async def body():
            async with Client(stdio_client(params(d))) as c:
                async def removal():
                    deadline = time.time() + 60
                    while upstream_list(d)["sl"].get("callsInFlight", 0) == 0:
                        assert time.time() < deadline, "the slow call never reached the upstream"
                        await anyio.sleep(0.05)
                    await anyio.to_thread.run_sync(lambda: cli(d, "upstream", "remove", "sl"))
                async with anyio.create_task_group() as tg:
                    tg.start_soon(removal)
                    # Past the 1 s drain the 60 s call is cut (undrained it would answer "done").
                    r = await c.call_tool("sl__slow", {"seconds": 60})
                assert r.is_error and "UPSTREAM_LOST" in text_of(r), text_of(r)

        anyio.run(body)
    finally:
        d.stop()


@pytest.mark.parametrize("point,kept", [("upstream-written", False), ("upstream-committed", True)])
def test_a_kill_in_the_middle_of_an_add_leaves_the_state_whole(tmp_path, monkeypatch, point, kept):
    """kill -9 inside the store's transaction: nothing was added; just after the commit: the
    upstream is there after the restart, and served."""
    monkeypatch.setenv("STSD_TEST_CRASH_AT", point)
    d = Daemon(tmp_path).start()
    monkeypatch.delenv("STSD_TEST_CRASH_AT")
    entry = tmp_path / "e.toml"
    entry.write_text(hostile("ek", "plain"))
    out = cli(d, "upstream", "add", str(entry), ok=False)
    assert out.returncode != 0
    assert d.proc.wait(timeout=30) == -signal.SIGKILL
    d.socket.unlink(missing_ok=True)
    d.start()
    try:
        if kept:
            wait_for(d, lambda t: "ek__echo" in t, "the committed upstream served after restart")
        else:
            assert "ek" not in upstream_list(d)
            # The store is whole: the same add now succeeds.
            cli(d, "upstream", "add", str(entry))
            wait_for(d, lambda t: "ek__echo" in t, "the upstream added after restart")
        exported = json.loads(subprocess.run(
            [stsd_bin(), "store", "export", "--config", str(d.config)], capture_output=True,
            text=True, env=d.env(), timeout=60).stdout)
        assert [u["id"] for u in exported["upstreams"]] == ["ek"], exported["upstreams"]
    finally:
        d.stop()
