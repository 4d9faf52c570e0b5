"""An agent that uses models only through agentosd's gateway, with the official OpenAI SDK.

Each step prints one JSON line `{"step": NAME, ...}` to stdout (the agent's log), so the test
reads what happened from the outside. Steps are chosen by argv[1]: `tour` (the whole API),
`budget` (call until the budget says no), `fallback` (call a model whose backend is down),
`consent` (call a model held for consent). argv[2] is a backend address the agent must not
reach directly.
"""
import errno
import json
import os
import socket
import sys

import httpx
import openai


def emit(step, **kw):
    print(json.dumps({"step": step, **kw}), flush=True)


sock = os.environ["AGENTOS_MODELS_SOCKET"]
client = openai.OpenAI(
    base_url="http://agentos/v1",
    api_key="not-a-key",  # the daemon holds the backends' keys; the SDK wants some string
    http_client=httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=120),
    max_retries=0,
)


def error_of(e):
    body = getattr(e, "body", None) or {}
    if isinstance(body, dict) and "error" in body:
        body = body["error"]
    return {"status": getattr(e, "status_code", None), "code": (body or {}).get("code"),
            "type": (body or {}).get("type"), "message": (body or {}).get("message")}


def chat(model, **kw):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], **kw)


def tour(backend):
    emit("models", ids=[m.id for m in client.models.list().data])
    r = chat("chat", max_tokens=8)
    emit("chat", model=r.model, usage=r.usage.model_dump(), choices=len(r.choices),
         finish=r.choices[0].finish_reason)
    chunks, usage_chunks, model = 0, 0, None
    for c in chat("chat", max_tokens=8, stream=True, stream_options={"include_usage": True}):
        model = c.model
        if c.usage is not None:
            usage_chunks += 1
            usage = c.usage.model_dump()
        if c.choices and c.choices[0].delta.content:
            chunks += 1
    emit("stream", model=model, chunks=chunks, usage_chunks=usage_chunks, usage=usage)
    usage_chunks = 0
    for c in chat("chat", max_tokens=4, stream=True):
        if c.usage is not None or not c.choices:
            usage_chunks += 1
    emit("stream-no-usage", usage_chunks=usage_chunks)
    try:
        chat("chat", max_tokens=4, n=99)
        emit("n-99", status=200)
    except openai.APIStatusError as e:
        emit("n-99", **error_of(e))
    for model in ["forbidden", "nowhere"]:
        try:
            chat(model, max_tokens=4)
            emit("refused-" + model, status=200)
        except openai.APIStatusError as e:
            emit("refused-" + model, **error_of(e))
    e = client.embeddings.create(model="embed", input=["first text", "second text"])
    emit("embeddings", n=len(e.data), dims=len(e.data[0].embedding), model=e.model,
         usage=e.usage.model_dump())
    try:
        chat("embed", max_tokens=4)
        emit("embed-as-chat", status=200)
    except openai.APIStatusError as err:
        emit("embed-as-chat", **error_of(err))
    direct(backend)
    # A raw HTTP request that is not JSON, and one too large.
    t = httpx.Client(transport=httpx.HTTPTransport(uds=sock))
    r = t.post("http://agentos/v1/chat/completions", content=b"not json")
    emit("not-json", status=r.status_code, code=r.json()["error"]["code"])
    r = t.post("http://agentos/v1/chat/completions", content=b"x" * (5 << 20))
    emit("too-large", status=r.status_code)


def direct(backend):
    """The backend itself, without the gateway: the kernel must refuse every way there."""
    host, port = backend.rsplit(":", 1)
    try:
        s = socket.socket()
        s.settimeout(5)
        s.connect((host, int(port)))
        emit("direct", connected=True)
    except OSError as e:
        emit("direct", connected=False, errno=errno.errorcode.get(e.errno, str(e.errno)))


def sdk_env():
    """The SDK as an unchanged program would use it: OPENAI_BASE_URL and OPENAI_API_KEY."""
    plain = openai.OpenAI(max_retries=0)
    emit("env", base_url=os.environ.get("OPENAI_BASE_URL"), key=os.environ.get("OPENAI_API_KEY"))
    r = plain.chat.completions.create(model="chat", max_tokens=4,
                                      messages=[{"role": "user", "content": "Say hello."}])
    emit("sdk-env", model=r.model, usage=r.usage.model_dump())
    # Any other port, or UDP, on the same loopback: refused.
    for port in (8081, 22):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            emit("other-port", port=port, connected=True)
        except OSError as e:
            emit("other-port", port=port, connected=False,
                 errno=errno.errorcode.get(e.errno, str(e.errno)))
    try:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.sendto(b"x", ("127.0.0.1", 53))
        emit("udp", sent=True)
    except OSError as e:
        emit("udp", sent=False, errno=errno.errorcode.get(e.errno, str(e.errno)))
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).bind(("127.0.0.1", 9000))
        emit("bind", bound=True)
    except OSError as e:
        emit("bind", bound=False, errno=errno.errorcode.get(e.errno, str(e.errno)))


def sdk_across_restart():
    """Call through the port, then keep calling while the daemon restarts: once a call failed,
    the next success means the new daemon listens in this namespace again."""
    import time
    plain = openai.OpenAI(max_retries=0, timeout=10)
    ask = lambda: plain.chat.completions.create(
        model="chat", max_tokens=2, messages=[{"role": "user", "content": "Hi."}])
    ask()
    emit("first")
    failed = False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        time.sleep(0.3)
        try:
            ask()
            if failed:
                emit("restored")
                return
        except openai.APIError as e:
            failed = True
    emit("restored", timeout=True)


def tls():
    r = chat("chat", max_tokens=4, stream=True)
    model = None
    for c in r:
        model = c.model
    emit("tls-trusted", model=model)
    try:
        chat("forbidden", max_tokens=4)
        emit("tls-untrusted", status=200)
    except openai.APIStatusError as e:
        emit("tls-untrusted", **error_of(e))


def inflight():
    """Four streams the agent does not read hold its four in-flight calls: a fifth is refused
    until one of them ends."""
    import threading
    import time
    t = httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=120)
    body = {"model": "chat", "max_tokens": 300, "stream": True,
            "messages": [{"role": "user", "content": "Count to one hundred."}]}
    stop = threading.Event()
    started = []

    def hold():
        with t.stream("POST", "http://agentos/v1/chat/completions", json=body) as r:
            started.append(r.status_code)
            stop.wait(60)

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for th in threads:
        th.start()
        time.sleep(0.2)
    time.sleep(0.5)
    r = t.post("http://agentos/v1/chat/completions",
               json={"model": "chat", "max_tokens": 2, "messages": body["messages"]})
    emit("fifth", status=r.status_code, code=r.json().get("error", {}).get("code"))
    stop.set()
    for th in threads:
        th.join()
    time.sleep(0.5)
    r = t.post("http://agentos/v1/chat/completions",
               json={"model": "chat", "max_tokens": 2, "messages": body["messages"]})
    emit("after", status=r.status_code, heads=sorted(started))


def flood():
    """Slowloris on its own socket: 64 connections, each with half a request head, held."""
    import time
    held = []
    for _ in range(64):
        c = socket.socket(socket.AF_UNIX)
        c.setblocking(False)
        try:
            c.connect(sock)
            c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            pass
        held.append(c)
    emit("holding", n=len(held))
    time.sleep(40)


def bigflood():
    """Large requests on 4 connections (the calls in flight an agent may have), each sent again
    as soon as it is answered, for 6 s: how many
    MiB a second the gateway reads from this agent (its rate, when it has one)."""
    import threading
    import time
    body = {"model": "not-granted", "messages": [{"role": "user", "content": "x" * (1 << 20)}]}
    data = json.dumps(body).encode()
    sent = [0]
    statuses = {}
    lock = threading.Lock()
    stop = time.monotonic() + 6

    def one():
        c = httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=60)
        while time.monotonic() < stop:
            try:
                r = c.post("http://agentos/v1/chat/completions", content=data,
                           headers={"content-type": "application/json"})
                code = r.status_code
            except httpx.HTTPError as e:
                code = type(e).__name__
            with lock:
                sent[0] += len(data)
                statuses[str(code)] = statuses.get(str(code), 0) + 1

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(2)
    with lock:
        a = sent[0]
    t0 = time.monotonic()
    time.sleep(3)
    with lock:
        b = sent[0]
    secs = time.monotonic() - t0
    for t in threads:
        t.join()
    emit("bigflood", mib_per_s=(b - a) / secs / (1 << 20), statuses=statuses)


def conns():
    """Four connections held open at once, each asking GET /v1/models: how many are served."""
    held, served, refused = [], 0, 0
    for _ in range(4):
        c = socket.socket(socket.AF_UNIX)
        c.settimeout(10)
        c.connect(sock)
        held.append(c)
    for c in held:
        try:
            c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            head = c.recv(4096)
            if head.startswith(b"HTTP/1.1 200"):
                served += 1
            else:
                refused += 1
        except OSError:
            refused += 1
    emit("conns", served=served, refused=refused)


def budget():
    ok = 0
    while ok < 50:
        try:
            chat("chat", max_tokens=16)
            ok += 1
        except openai.APIStatusError as e:
            emit("budget", ok=ok, **error_of(e))
            return
    emit("budget", ok=ok, status=200)


def fallback():
    r = chat("primary", max_tokens=4)
    emit("fallback", model=r.model, usage=r.usage.model_dump())


def consent():
    for _ in range(2):
        try:
            r = chat("chat", max_tokens=4)
            emit("consent", status=200, model=r.model)
        except openai.APIStatusError as e:
            emit("consent", **error_of(e))


mode = sys.argv[1]
if mode == "tour":
    tour(sys.argv[2])
elif mode == "flood":
    flood()
elif mode == "bigflood":
    bigflood()
elif mode == "conns":
    conns()
elif mode == "inflight":
    inflight()
elif mode == "tls":
    tls()
elif mode == "sdk-restart":
    sdk_across_restart()
elif mode == "sdk-env":
    sdk_env()
elif mode == "wait":
    emit("waiting")
    import time
    time.sleep(60)
elif mode == "direct":
    direct(sys.argv[2])
elif mode == "budget":
    budget()
elif mode == "fallback":
    fallback()
elif mode == "consent":
    consent()
emit("done")
