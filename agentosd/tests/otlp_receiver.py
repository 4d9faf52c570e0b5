"""A real OTLP/HTTP receiver for the telemetry tests (PyPI `opentelemetry-proto` + `protobuf`).

    python3 otlp_receiver.py OUT.jsonl [--stall]

Listens on 127.0.0.1 on a free port and prints that port on the first line of stdout. Takes
`POST /v1/traces` and `POST /v1/metrics` (application/x-protobuf, or application/json), decodes
ExportTraceServiceRequest / ExportMetricsServiceRequest with the official generated classes, and
appends what arrived to OUT.jsonl, one JSON object per span or metric data point (ids in hex,
attributes as a flat dict, the resource's attributes beside them). With --stall it accepts
connections and reads the request but never answers (a collector that hangs).
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

OUT = sys.argv[1]
STALL = "--stall" in sys.argv[2:]
LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind in ("array_value", "kvlist_value"):
        return json_format.MessageToDict(v)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def spans(req):
    for rs in req.resource_spans:
        resource = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "signal": "span",
                    "resource": resource,
                    "scope": ss.scope.name,
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": s.kind,
                    "start": s.start_time_unix_nano,
                    "end": s.end_time_unix_nano,
                    "attributes": attrs(s.attributes),
                    "status": {"code": s.status.code, "message": s.status.message},
                }


def points(req):
    for rm in req.resource_metrics:
        resource = attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                base = {"signal": "metric", "resource": resource, "name": m.name,
                        "unit": m.unit, "type": kind}
                if kind in ("sum", "gauge"):
                    for p in getattr(m, kind).data_points:
                        v = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
                        extra = {"monotonic": m.sum.is_monotonic} if kind == "sum" else {}
                        yield {**base, **extra, "attributes": attrs(p.attributes), "value": v}
                elif kind == "histogram":
                    for p in m.histogram.data_points:
                        yield {**base, "attributes": attrs(p.attributes), "count": p.count,
                               "sum": p.sum, "bucket_counts": list(p.bucket_counts),
                               "explicit_bounds": list(p.explicit_bounds)}
                else:
                    yield {**base, "raw": json_format.MessageToDict(m)}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if STALL:
            time.sleep(3600)
            return
        ctype = self.headers.get("Content-Type", "")
        if self.path.endswith("/v1/traces"):
            req, resp, rows = trace_service_pb2.ExportTraceServiceRequest(), \
                trace_service_pb2.ExportTraceServiceResponse(), spans
        elif self.path.endswith("/v1/metrics"):
            req, resp, rows = metrics_service_pb2.ExportMetricsServiceRequest(), \
                metrics_service_pb2.ExportMetricsServiceResponse(), points
        else:
            self.answer(404, b"unknown path", "text/plain")
            return
        try:
            if ctype.startswith("application/json"):
                json_format.Parse(body, req)
            else:
                req.ParseFromString(body)
        except Exception as e:  # a malformed request is the sender's bug: say so
            self.answer(400, str(e).encode(), "text/plain")
            return
        with LOCK, open(OUT, "a") as f:
            for row in rows(req):
                row["content_type"] = ctype
                f.write(json.dumps(row) + "\n")
        self.answer(200, resp.SerializeToString(), "application/x-protobuf")

    def answer(self, code, body, ctype):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
