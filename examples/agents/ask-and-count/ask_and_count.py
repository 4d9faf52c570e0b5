"""ask-and-count: one agent turn that calls a model and a tool, both through agentosd.

The agent asks a model (through the daemon's model gateway, with the official OpenAI SDK) for a
sentence about a topic, offering it the tool `text.wordcount`; it runs the tool through MCP (the
official MCP SDK and the `agentos-mcp` bridge) on the sentence — as the model's tool call, or
itself when a small model answers in text — and gives the model the tool's result to finish the
turn. Neither the model server nor the tool is reachable any other way: the agent has no network
grant and no key. Prints one JSON line per step.

usage: ask_and_count.py [TOPIC]    (OPENAI_BASE_URL or AGENTOS_MODELS_SOCKET, and AGENTOS_SOCKET come from agentosd;
                                    AGENTOS_MCP names the bridge, MODEL the model [chat])
"""

import asyncio
import json
import os
import sys

import httpx
import openai
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

MODEL = os.environ.get("MODEL", "chat")
WORDCOUNT = {
    "type": "function",
    "function": {
        "name": "text_wordcount",
        "description": "Count the words of a text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                       "required": ["text"]},
    },
}


def say(step, **kw):
    print(json.dumps({"step": step, **kw}), flush=True)


def model_client():
    # An agent without network grants gets OPENAI_BASE_URL (the gateway on its own loopback):
    # the SDK as it comes. Otherwise the gateway's Unix socket.
    if "OPENAI_BASE_URL" in os.environ:
        return openai.OpenAI(max_retries=0, timeout=120)
    return openai.OpenAI(
        base_url="http://agentos/v1", api_key="unused", max_retries=0,
        http_client=httpx.Client(
            transport=httpx.HTTPTransport(uds=os.environ["AGENTOS_MODELS_SOCKET"]), timeout=120))


async def turn(topic):
    llm = model_client()
    messages = [{"role": "user", "content": f"Write one short sentence about {topic}."}]
    first = llm.chat.completions.create(model=MODEL, messages=messages, tools=[WORDCOUNT],
                                        max_tokens=40)
    msg = first.choices[0].message
    say("model", model=first.model, tokens=first.usage.total_tokens,
        tool_calls=len(msg.tool_calls or []))
    if msg.tool_calls:
        call = msg.tool_calls[0]
        text = json.loads(call.function.arguments).get("text", "")
    else:
        # A small model answers in prose: the agent makes the call the model did not.
        text = msg.content or ""
        call = openai.types.chat.ChatCompletionMessageToolCall(
            id="call_0", type="function",
            function={"name": "text_wordcount", "arguments": json.dumps({"text": text})})
    bridge = StdioServerParameters(command=os.environ.get("AGENTOS_MCP", "agentos-mcp"),
                                   env={"AGENTOS_SOCKET": os.environ["AGENTOS_SOCKET"]})
    async with stdio_client(bridge) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            counted = await s.call_tool("text.wordcount", {"text": text})
    words = (counted.structured_content or {}).get("words")
    say("tool", tool="text.wordcount", ok=not counted.is_error, words=words,
        error="".join(getattr(c, "text", "") for c in counted.content) if counted.is_error else None)
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"words": words})},
    ]
    final = llm.chat.completions.create(model=MODEL, messages=messages, tools=[WORDCOUNT],
                                        max_tokens=40, stream=True,
                                        stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in final:
        if chunk.usage:
            usage = chunk.usage.total_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    say("answer", chunks=len(pieces), tokens=usage)


asyncio.run(turn(sys.argv[1] if len(sys.argv) > 1 else "the sea"))
say("done")
