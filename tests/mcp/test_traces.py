"""Issue 36 item 5: OpenTelemetry traces. A real OTLP/HTTP receiver started by the test (an
HTTP server decoding the protobuf with the `opentelemetry-proto` package) gets the span tree
of a wrapped-tool call: `tools/call` with the resolved risk (seed 001's `mcp.risk.*`,
`mcp.upstream.*`, `mcp.composition.*`) and the principal, its child `upstream.call`, the
caller's W3C traceparent as parent, and the trace carried on to the upstream; an own tool's
call is a `worker.run` child; no argument or secret in any span. (An `egress.hop` span per
fetch is not asserted here: the test catalog has no fetching tool.)"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import anyio
from conftest import SECRET, Daemon
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_gateway import hostile, text_of, tmp_path, wait_for  # noqa: F401

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Receiver:
    """An OTLP/HTTP traces endpoint on loopback: every span it is sent, decoded."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.requests = 0
        me = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                me.requests += 1
                for rs in req.resource_spans:
                    service = {a.key: a.value.string_value for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            attrs = {}
                            for a in s.attributes:
                                v = a.value
                                attrs[a.key] = (v.string_value if v.HasField("string_value") else
                                                v.int_value if v.HasField("int_value") else
                                                v.bool_value if v.HasField("bool_value") else str(v))
                            me.spans.append({
                                "name": s.name, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                                "parent": s.parent_span_id.hex(), "attrs": attrs,
                                "events": [e.name for e in s.events],
                                "event_attrs": [{a.key: a.value.string_value for a in e.attributes}
                                                for e in s.events],
                                "service": service.get("service.name"),
                            })
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(b"")

            def log_message(self, *a):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, pred, what: str, timeout: float = 30) -> list[dict]:
        deadline = time.time() + timeout
        while not pred(self.spans):
            assert time.time() < deadline, f"{what}: {json.dumps(self.spans, indent=1)[:4000]}"
            time.sleep(0.1)
        return self.spans


def params_of(d: Daemon) -> StdioServerParameters:
    return StdioServerParameters(command=d.mcp_command()[0], args=d.mcp_command()[1:], env=d.env())


def test_a_wrapped_tool_call_is_traced_with_its_risk_and_the_callers_parent(tmp_path):
    rx = Receiver()
    d = Daemon(tmp_path, extra_config=hostile("tr", "trace")
               + f'[telemetry]\notlp_endpoint = "http://127.0.0.1:{rx.port}"\n'
               + 'service_name = "stsd-under-test"\n').start()
    try:
        wait_for(d, lambda t: "tr__traceparent" in t, "the traced upstream up")

        async def body():
            async with Client(stdio_client(params_of(d))) as c:
                r = await c.call_tool("tr__traceparent", {}, meta={"traceparent": TRACEPARENT})
                assert not r.is_error, text_of(r)
                return text_of(r)

        seen_upstream = anyio.run(body)
        # The trace went on to the upstream: same trace, a span of stsd's as parent.
        assert seen_upstream.startswith(f"00-{TRACE_ID}-"), seen_upstream
        assert PARENT_ID not in seen_upstream, seen_upstream
        spans = rx.wait(lambda s: any(x["name"] == "tools/call" for x in s)
                        and any(x["name"] == "upstream.call" for x in s), "the call's spans")
        call = next(s for s in spans if s["name"] == "tools/call")
        assert call["trace"] == TRACE_ID and call["parent"] == PARENT_ID, call
        assert call["service"] == "stsd-under-test"
        a = call["attrs"]
        assert a["mcp.tool.name"] == "tr__traceparent", a
        assert a["mcp.upstream.id"] == "tr" and a["mcp.risk.level"].startswith("L"), a
        assert a["mcp.risk.server_level"].startswith("L") and a["mcp.composition.level"], a
        assert a["enduser.id"].startswith("uid:") and a["mcp.outcome"] == "OK", a
        up = next(s for s in spans if s["name"] == "upstream.call")
        assert up["trace"] == TRACE_ID and up["parent"] == call["id"], up
        assert seen_upstream.split("-")[2] == up["id"], (seen_upstream, up)
        # The gateway's risk computation is traced too, seed 001's events as span events.
        rx.wait(lambda s: any(x["name"] == "gateway.recompute" and x["events"] for x in s),
                "the recompute span with its risk events")
        names = {e.get("event") for s in spans for e in s["event_attrs"]}
        assert {"ServerRiskComputed", "ToolPublishRiskComputed"} <= names, names
    finally:
        d.stop()


def test_an_own_tool_runs_in_a_worker_run_span_and_no_secret_reaches_a_span(tmp_path):
    from test_gateway import _readable_copy  # noqa: F401
    rx = Receiver()
    d = Daemon(tmp_path, extra_config=f'[telemetry]\notlp_endpoint = "http://127.0.0.1:{rx.port}/v1/traces"\n'
               ).start()
    try:
        async def body():
            async with Client(stdio_client(params_of(d))) as c:
                r = await c.call_tool("with-secret", {})
                assert not r.is_error, text_of(r)
                return text_of(r)

        anyio.run(body)
        spans = rx.wait(lambda s: any(x["name"] == "tools/call" for x in s), "the call span")
        call = next(s for s in spans if s["name"] == "tools/call")
        assert call["attrs"]["mcp.tool.name"] == "with-secret"
        kids = {s["name"] for s in spans if s["parent"] == call["id"]}
        assert "worker.run" in kids, (kids, spans)
        everything = json.dumps(spans)
        assert SECRET not in everything, "a secret reached a span"
    finally:
        d.stop()
