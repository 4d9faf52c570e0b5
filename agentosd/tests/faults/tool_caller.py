import json, os, socket, sys, time
out = open(sys.argv[1], "a", buffering=1)
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["AGENTOS_SOCKET"])
f = s.makefile("rwb")
def rpc(i, method, params):
    f.write((json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n").encode())
    f.flush()
    return json.loads(f.readline())
rpc(0, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
for i, tool in enumerate(sys.argv[2:], 1):
    t = time.monotonic()
    r = rpc(i, "tools/call", {"name": tool, "arguments": {}})
    out.write(json.dumps({"tool": tool, "ms": int((time.monotonic() - t) * 1000), "reply": r}) + "\n")
out.write(json.dumps({"done": True}) + "\n")
time.sleep(3600)
