"""A backend that streams slowly (one chat chunk every 0.5 s, up to a minute) for the gateway's
in-flight test: streams through the gateway stay open for as long as the test needs, whatever
a real model would do with its prompt. Speaks just enough of the OpenAI API: POST
/v1/chat/completions with stream true (SSE) or false (one whole answer at once).

usage: slow_backend.py   (prints its port, then serves)
"""
import http.server
import json
import time


class Slow(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if not body.get("stream"):
            out = json.dumps({"object": "chat.completion", "model": body.get("model"),
                              "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                           "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out.encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for _ in range(120):
                ev = "data: " + json.dumps({"object": "chat.completion.chunk", "model": body.get("model"),
                                            "choices": [{"index": 0, "delta": {"content": "x"}}]}) + "\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev.encode()))
                self.wfile.flush()
                time.sleep(0.5)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *a):
        pass


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
print(srv.server_address[1], flush=True)
srv.serve_forever()
