"""Issue 36 item 1: an upstream's resources, resource templates, prompts and completions,
served through stsd and governed as its tools are. The upstream is the reference
"everything" server from npm (the reference filesystem server of today has no resources or
prompts); the poisoned and the changing prompt come from the hostile test server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import mcp_types as types
from conftest import ROOT, Daemon
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from test_gateway import DOCS, audit_lines, hostile, tmp_path, upstream_list, wait_for  # noqa: F401

EVERYTHING = Path(os.path.realpath(
    ROOT / "target/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"))


def params_of(d: Daemon) -> StdioServerParameters:
    return StdioServerParameters(command=d.mcp_command()[0], args=d.mcp_command()[1:], env=d.env())


def everything(extra: str = "") -> str:
    return (f'[[upstream]]\nid = "ev"\ncommand = "node"\nargs = ["{EVERYTHING}", "stdio"]\n'
            f'trust = "vendor-official"\n{DOCS}{extra}\n')


def test_resources_templates_prompts_and_completions_pass_through_governed(tmp_path):
    d = Daemon(tmp_path, extra_config=everything()).start()
    try:
        wait_for(d, lambda t: "ev__echo" in t, "the everything server up")
        updated: list[str] = []
        got_update = anyio.Event()

        async def on_message(message) -> None:
            m = message.root if hasattr(message, "root") else message
            if isinstance(m, types.ResourceUpdatedNotification):
                updated.append(m.params.uri)
                got_update.set()

        async def body():
            async with Client(stdio_client(params_of(d)), mode="legacy",
                              message_handler=on_message) as c:
                res = {r.uri: r for r in (await c.list_resources()).resources}
                doc = "demo://resource/static/document/architecture.md"
                assert doc in res and res[doc].name == "ev__architecture.md", list(res)[:5]
                templates = [t.uri_template for t in (await c.list_resource_templates()).resource_templates]
                assert "demo://resource/dynamic/text/{resourceId}" in templates, templates
                read = await c.read_resource(doc)
                assert read.contents[0].text.startswith("# Everything Server"), read
                # A URI no list names, routed by the one template that matches it.
                dyn = await c.read_resource("demo://resource/dynamic/text/3")
                assert dyn.contents and dyn.contents[0].uri == "demo://resource/dynamic/text/3", dyn
                # One nobody serves: an error, not a guess.
                try:
                    await c.read_resource("demo://nowhere/1")
                    raise AssertionError("an unserved URI was read")
                except Exception as e:  # the SDK raises the JSON-RPC error
                    assert "no upstream serves" in str(e), e

                prompts = {p.name: p for p in (await c.list_prompts()).prompts}
                assert {"ev__simple-prompt", "ev__args-prompt"} <= set(prompts), list(prompts)
                got = await c.get_prompt("ev__args-prompt", {"city": "Lyon", "state": "Rhone"})
                text = json.dumps([m.content.model_dump() for m in got.messages])
                assert "Lyon" in text, text
                done = await c.complete(types.PromptReference(type="ref/prompt", name="ev__completable-prompt"),
                                        {"name": "department", "value": "E"})
                assert done.completion.values == ["Engineering"], done

                # A subscription reaches the upstream; its update reaches this session.
                await c.subscribe_resource(doc)
                r = await c.call_tool("ev__toggle-subscriber-updates", {})
                assert not r.is_error, r
                with anyio.fail_after(20):
                    await got_update.wait()
                assert doc in updated, updated
                await c.unsubscribe_resource(doc)

        anyio.run(body)
        reads = [r for r in audit_lines(d) if r.get("name") == "resources/read"]
        ok = [r for r in reads if r["outcome"] == "OK"]
        assert ok and ok[0]["upstream"]["id"] == "ev" and ok[0]["bytes"] > 100, reads
        assert any(r["outcome"] == "ERROR" and "no upstream serves" in r["error"]["message"]
                   for r in reads), reads
        assert any(r.get("name") == "prompts/get" and r["outcome"] == "OK" for r in audit_lines(d))
    finally:
        d.stop()


def test_a_reply_over_the_upstreams_output_limit_is_refused(tmp_path):
    d = Daemon(tmp_path, extra_config=everything("max_output_bytes = 300\n")).start()
    try:
        wait_for(d, lambda t: "ev__echo" in t, "the everything server up")

        async def body():
            async with Client(stdio_client(params_of(d))) as c:
                try:
                    await c.read_resource("demo://resource/static/document/architecture.md")
                    raise AssertionError("a reply over the limit was served")
                except Exception as e:
                    assert "OUTPUT_LIMIT" in str(e), e

        anyio.run(body)
    finally:
        d.stop()


def test_a_poisoned_prompt_is_flagged_blocked_on_request_and_a_changed_one_withheld(tmp_path):
    d = Daemon(tmp_path, extra_config=hostile("hp", "prompts")).start()
    try:
        wait_for(d, lambda t: "hp__flip" in t, "the prompts upstream up")
        listed = upstream_list(d)["hp"]
        events = [r for r in audit_lines(d) if r.get("event") == "PoisoningHit"]
        assert any(e["tool"] == "prompt:sneaky" and e["pattern"] == "HIDDEN_INSTRUCTION"
                   for e in events), events
        changed = anyio.Event()

        async def on_message(message) -> None:
            m = message.root if hasattr(message, "root") else message
            if isinstance(m, types.PromptListChangedNotification):
                changed.set()

        async def body():
            async with Client(stdio_client(params_of(d)), mode="legacy",
                              message_handler=on_message) as c:
                names = {p.name for p in (await c.list_prompts()).prompts}
                # Reported, served: block_on_poisoning is off.
                assert {"hp__greet", "hp__sneaky", "hp__shifty"} <= names, names
                got = await c.get_prompt("hp__greet", {"who": "Ada"})
                assert "Ada" in got.messages[0].content.text
                # The rug pull: shifty's description changes, the upstream says so.
                r = await c.call_tool("hp__flip", {})
                assert not r.is_error
                with anyio.fail_after(20):
                    await changed.wait()
                names = {p.name for p in (await c.list_prompts()).prompts}
                assert "hp__shifty" not in names and "hp__greet" in names, names

        anyio.run(body)
        withheld = {w["tool"]: w["why"] for w in upstream_list(d)["hp"]["withheld"]}
        assert withheld.get("prompt:shifty", "").startswith("AWAITING_REREVIEW"), (withheld, listed)
        assert any(r.get("event") == "HashLedgerMismatch" and r["tool"] == "prompt:shifty"
                   for r in audit_lines(d))
        # The operator approves the new text: served again.
        import subprocess
        from conftest import stsd_bin
        out = subprocess.run([stsd_bin(), "ledger", "approve", "hp/prompt:shifty", "--socket",
                              str(d.socket)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "hp__shifty" in upstream_list(d)["hp"]["prompts"]
    finally:
        d.stop()

    # With block_on_poisoning the poisoned prompt is not served at all.
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    blocked.chmod(0o711)
    d = Daemon(blocked, extra_config=hostile("hp", "prompts")
               + "[gateway]\nblock_on_poisoning = true\n").start()
    try:
        wait_for(d, lambda t: "hp__flip" in t, "the prompts upstream up")
        withheld = {w["tool"]: w["why"] for w in upstream_list(d)["hp"]["withheld"]}
        assert withheld.get("prompt:sneaky", "").startswith("POISONING"), withheld

        async def body():
            async with Client(stdio_client(params_of(d))) as c:
                names = {p.name for p in (await c.list_prompts()).prompts}
                assert "hp__sneaky" not in names and "hp__greet" in names, names

        anyio.run(body)
    finally:
        d.stop()
