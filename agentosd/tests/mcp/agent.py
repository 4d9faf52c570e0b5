"""An agent for agentosd/tests/mcp.rs: it uses its tools through the official MCP Python SDK
(PyPI `mcp`) and the `agentos-mcp` bridge, exactly as any MCP host would, and prints one JSON
line per step to stdout (the agent's log), which the test reads.

argv: BRIDGE ALLOWED_FILE FORBIDDEN_FILE
"""

import asyncio
import json
import os
import socket
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError


def say(step, **kw):
    print(json.dumps({"step": step, **kw}), flush=True)


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(session, step, name, args):
    try:
        r = await session.call_tool(name, args)
        say(step, ok=not r.is_error, is_error=bool(r.is_error), text=text_of(r),
            structured=r.structured_content)
    except MCPError as e:
        say(step, ok=False, code=e.error.code, message=e.error.message)


async def sdk(bridge, allowed, forbidden):
    params = StdioServerParameters(
        command=bridge, env={"AGENTOS_SOCKET": os.environ["AGENTOS_SOCKET"]})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            say("initialize", server=init.server_info.name, version=init.protocol_version)
            tools = await s.list_tools()
            say("list", tools=sorted(t.name for t in tools.tools))
            await call(s, "wordcount", "text.wordcount", {"text": "one two two three", "top": 1})
            await call(s, "wordcount-bad-args", "text.wordcount", {"text": 5})
            # 200 KB of arguments: over what an audit record keeps, so the record has its hash.
            await call(s, "wordcount-large", "text.wordcount", {"text": "word " * 40000})
            await call(s, "ungranted", "clock.now", {})
            await call(s, "unknown", "no.such.tool", {})
            await call(s, "read-allowed", "files.read_text_file", {"path": allowed})
            await call(s, "read-forbidden", "files.read_text_file", {"path": forbidden})
            for step in ("consent-approve", "consent-deny", "consent-expire"):
                say(step + "-asking")
                await call(s, step, "payment.charge", {"amount": 12, "api_key": "sk-live-123"})


def raw():
    """Malformed input on a raw connection to the agent's socket."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["AGENTOS_SOCKET"])
    f = s.makefile("rwb")

    def send(b):
        f.write(b + b"\n")
        f.flush()

    def recv():
        return json.loads(f.readline())

    send(b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
    say("raw-before-initialize", reply=recv())
    send(b"{not json")
    say("raw-not-json", reply=recv())
    send(b"[1,2]")
    say("raw-batch", reply=recv())
    send(b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"pad":"' + b"x" * (2 << 20) + b'"}}')
    say("raw-huge", reply=recv())
    send(b'{"jsonrpc":"2.0","id":3,"method":"ping"}')
    say("raw-after-huge", reply=recv())
    send(b'{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}')
    say("raw-initialize", reply=recv())
    send(b'{"jsonrpc":"2.0","id":5,"method":"resources/list"}')
    say("raw-unknown-method", reply=recv())
    # A flood: 20000 pings as fast as the socket takes them (written from a thread while this
    # one reads: a client that never reads would block on its own full socket, by design);
    # every one is answered, in order.
    n = 20000

    def flood():
        w = s.makefile("wb")
        for i in range(n):
            w.write(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % (100 + i))
        w.flush()

    import threading
    t = threading.Thread(target=flood)
    t.start()
    ids = [recv()["id"] for _ in range(n)]
    t.join()
    say("raw-flood", answered=len(ids), in_order=ids == list(range(100, 100 + n)))
    # In-flight limit: 40 slow calls at once; the 32 first run, the rest are refused.
    for i in range(40):
        f.write(b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"slow.sleep","arguments":{}}}\n' % (50000 + i))
    f.flush()
    replies = [recv() for _ in range(40)]
    too_many = sum(1 for r in replies if r.get("error", {}).get("code") == -32003)
    ok = sum(1 for r in replies if "result" in r)
    say("raw-in-flight", too_many=too_many, ok=ok)
    # Cancellation: a slow call cancelled right away gets no answer; the next request does.
    send(b'{"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"slow.sleep","arguments":{}}}')
    send(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow","reason":"test"}}')
    time.sleep(3)
    send(b'{"jsonrpc":"2.0","id":"after","method":"ping"}')
    say("raw-cancel", next_reply=recv())
    # Cancelling a call that waits for consent: the request is withdrawn (audited), the call
    # gets no answer, and the connection goes on.
    send(b'{"jsonrpc":"2.0","id":"held","method":"tools/call","params":{"name":"payment.charge","arguments":{"amount":1,"api_key":"sk-live-123"}}}')
    time.sleep(1)
    send(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"held","reason":"test"}}')
    send(b'{"jsonrpc":"2.0","id":"after-held","method":"ping"}')
    say("raw-cancel-held", next_reply=recv())
    s.close()


def main():
    bridge, allowed, forbidden = sys.argv[1:4]
    raw()
    asyncio.run(sdk(bridge, allowed, forbidden))
    say("done")


main()
