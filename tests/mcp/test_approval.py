"""The approval gate through the official Python SDK: the reference catalog's deleteFile
(humanInTheLoop REQUIRED) over `stsd mcp`, in both protocol eras, against a scratch workspace."""

from __future__ import annotations

import json
from pathlib import Path

import mcp_types as types
import pytest
from conftest import Daemon
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

MODES = ["auto", "legacy"]
SHARED = Path(__file__).resolve().parents[3] / "shared"


def text_of(r) -> str:
    return "".join(getattr(c, "text", "") for c in r.content)


def reference_spec(name: str) -> dict:
    import os
    shared = Path(os.environ.get("STSD_SHARED", SHARED))
    for spec in json.loads((shared / "catalog" / "default-tool-specs-builtin-fs.json").read_text()):
        if spec["name"] == name:
            # Published as `stsd test --write` would after its Local Pass; nothing else changes.
            spec["draft"] = False
            return spec
    raise AssertionError(f"{name} is not in the reference catalog")


def workspace() -> Path:
    """A workspace the worker user can use: under /tmp, traversable, owned by the worker
    user when the tests run as root (workers then run as 65534)."""
    import os
    import tempfile
    ws = Path(tempfile.mkdtemp(prefix="stsd-approval-", dir="/tmp"))
    os.chmod(ws, 0o755)
    (ws / "doomed.txt").write_text("delete me")
    if os.geteuid() == 0:
        for p in [ws, ws / "doomed.txt"]:
            os.chown(p, 65534, 65534)
    return ws


@pytest.fixture
def fs(tmp_path: Path):
    import shutil
    ws = workspace()
    catalog = tmp_path / "fs.json"
    catalog.write_text(json.dumps([reference_spec("deleteFile")]))
    d = Daemon(tmp_path, catalog=catalog, extra_config=f'\n[baseline]\nfs_base_path = "{ws}"\n').start()
    yield d, ws / "doomed.txt"
    if d.proc and d.proc.poll() is None:
        d.stop()
    shutil.rmtree(ws, ignore_errors=True)


def run(d: Daemon, mode: str, body, elicit=None):
    async def go():
        params = StdioServerParameters(command=d.mcp_command()[0], args=d.mcp_command()[1:], env=d.env())
        async with Client(stdio_client(params), mode=mode, elicitation_callback=elicit) as c:
            return await body(c)
    import anyio
    return anyio.run(go)


def answering(action: str, seen: list):
    async def cb(ctx, params):
        seen.append(params.message)
        return types.ElicitResult(action=action, content={} if action == "accept" else None)
    return cb


def audit(d: Daemon) -> list[dict]:
    return [json.loads(l) for l in d.audit.read_text().splitlines()] if d.audit.exists() else []


@pytest.mark.parametrize("mode", MODES)
def test_delete_file_runs_only_when_the_user_accepts(fs, mode):
    d, doomed = fs
    seen: list = []

    async def call(c):
        tools = (await c.list_tools()).tools
        meta = tools[0].meta["stsd/approval"]
        assert meta["required"] is True and meta["source"] == "spec" and meta["strategy"] == "elicit"
        assert meta["riskLevelWithApproval"] == "L4" and tools[0].meta["stsd/riskLevel"] == "L5"
        return await c.call_tool("deleteFile", {"path": "doomed.txt"})

    r = run(d, mode, call, answering("decline", seen))
    assert r.is_error and text_of(r).startswith("APPROVAL_REJECTED: "), text_of(r)
    assert r.meta["stsd/errorCode"] == "APPROVAL_REJECTED"
    assert doomed.exists()
    assert "DELETE a file" in seen[0] and "doomed.txt" in seen[0], seen

    r = run(d, mode, call, answering("accept", seen))
    assert not r.is_error, text_of(r)
    assert not doomed.exists()
    recs = audit(d)
    assert [x["approval"]["decision"] for x in recs] == ["rejected", "approved"], recs
    assert recs[1]["approval"]["strategy"] == "elicit" and "MCP client" in recs[1]["approval"]["approver"]


@pytest.mark.parametrize("mode", MODES)
def test_a_client_without_elicitation_gets_approval_required(fs, mode):
    d, doomed = fs

    async def call(c):
        return await c.call_tool("deleteFile", {"path": "doomed.txt"})

    r = run(d, mode, call, None)
    assert r.is_error and text_of(r).startswith("APPROVAL_REQUIRED: "), text_of(r)
    assert "elicitation" in text_of(r)
    assert doomed.exists()


def test_a_sealed_state_cannot_be_replayed_or_moved_to_other_arguments(fs):
    d, doomed = fs
    (doomed.parent / "other.txt").write_text("keep me")

    async def body(c):
        s = c.session
        first = await s.call_tool("deleteFile", {"path": "doomed.txt"}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult), first
        key = next(iter(first.input_requests))
        yes = {key: {"action": "accept", "content": {}}}
        # The state bound to doomed.txt does not approve other.txt.
        moved = await s.call_tool("deleteFile", {"path": "other.txt"}, input_responses=yes,
                                  request_state=first.request_state, allow_input_required=True)
        assert moved.is_error and "APPROVAL_ERROR" in text_of(moved), text_of(moved)
        assert (doomed.parent / "other.txt").exists()
        ok = await s.call_tool("deleteFile", {"path": "doomed.txt"}, input_responses=yes,
                               request_state=first.request_state, allow_input_required=True)
        assert not ok.is_error, text_of(ok)
        assert not doomed.exists()
        doomed.write_text("again")
        replay = await s.call_tool("deleteFile", {"path": "doomed.txt"}, input_responses=yes,
                                   request_state=first.request_state, allow_input_required=True)
        assert replay.is_error and "already used" in text_of(replay), text_of(replay)
        assert doomed.exists()
        altered = first.request_state[:-2] + ("AA" if not first.request_state.endswith("AA") else "BB")
        bad = await s.call_tool("deleteFile", {"path": "doomed.txt"}, input_responses=yes,
                                request_state=altered, allow_input_required=True)
        assert bad.is_error and "APPROVAL_ERROR" in text_of(bad), text_of(bad)
        assert doomed.exists()

    run(d, "auto", body, answering("accept", []))
