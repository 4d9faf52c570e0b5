"""notes-stats: an example agent that uses only tools the daemon mediates.

It lists the notes in a directory with the filesystem MCP server (tool `files`, the npm package
@modelcontextprotocol/server-filesystem run by agentosd in a sandbox), reads each one, counts
its words with `text.wordcount`, and prints one JSON line per note and a total. It talks MCP
through the official Python SDK (`pip install mcp`) and the `agentos-mcp` bridge, like any MCP
host would.

usage: notes_stats.py [NOTES_DIR]   (default /srv/notes; AGENTOS_MCP names the bridge)
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def text(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def main(notes):
    bridge = StdioServerParameters(
        command=os.environ.get("AGENTOS_MCP", "agentos-mcp"),
        env={"AGENTOS_SOCKET": os.environ["AGENTOS_SOCKET"]},
    )
    async with stdio_client(bridge) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            tools = sorted(t.name for t in (await s.list_tools()).tools)
            print(json.dumps({"tools": tools}), flush=True)
            listing = await s.call_tool("files.list_directory", {"path": notes})
            if listing.is_error:
                raise SystemExit(f"cannot list {notes}: {text(listing)}")
            names = sorted(
                line[len("[FILE] "):]
                for line in text(listing).splitlines()
                if line.startswith("[FILE] ")
            )
            total = 0
            for name in names:
                body = await s.call_tool("files.read_text_file", {"path": f"{notes}/{name}"})
                counted = await s.call_tool("text.wordcount", {"text": text(body), "top": 3})
                words = counted.structured_content["words"]
                total += words
                print(json.dumps({"note": name, "words": words,
                                  "top": counted.structured_content.get("top", [])}), flush=True)
            print(json.dumps({"notes": len(names), "total_words": total}), flush=True)


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "/srv/notes"))
