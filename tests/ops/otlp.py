"""A real OTLP/HTTP trace receiver on loopback: `POST /v1/traces` with an
ExportTraceServiceRequest (protobuf, optionally gzip), decoded with opentelemetry-proto."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

KIND = {
    ProtoSpan.SPAN_KIND_INTERNAL: "internal", ProtoSpan.SPAN_KIND_SERVER: "server", ProtoSpan.SPAN_KIND_CLIENT: "client",
    ProtoSpan.SPAN_KIND_PRODUCER: "producer", ProtoSpan.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any] = field(hash=False, compare=False)


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value")) if any_value.WhichOneof("value") else None


class OtlpReceiver:
    """Collects every span it is sent; `spans()` is a snapshot."""

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self.requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(Span(
                        service=str(resource.get("service.name")), name=s.name, kind=KIND.get(s.kind, "unspecified"),
                        trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_id=s.parent_span_id.hex(),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                    ))
        with self._lock:
            self.requests += 1
            self._spans.extend(spans)

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
