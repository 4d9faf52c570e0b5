"""A TLS-terminating reverse proxy for tests/models.rs, as a hosted API looks to the gateway:
https on 127.0.0.1 with the given certificate, forwarding to a plain-HTTP upstream (the
llama.cpp server) and streaming the answer back. It writes the Authorization header of each
request to AUTH_LOG, so the test can see which key reached the backend.

usage: tls_proxy.py CERT KEY UPSTREAM_URL AUTH_LOG   (prints the port, then serves)
"""
import http.client
import http.server
import ssl
import sys
import urllib.parse

cert, key, upstream, auth_log = sys.argv[1:5]
up = urllib.parse.urlparse(upstream)


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def forward(self):
        with open(auth_log, "a") as f:
            f.write((self.headers.get("Authorization") or "-") + "\n")
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        c = http.client.HTTPConnection(up.hostname, up.port, timeout=120)
        c.request(self.command, self.path, body=body,
                  headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
        r = c.getresponse()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        c.close()

    do_GET = forward
    do_POST = forward

    def log_message(self, *a):
        pass


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
