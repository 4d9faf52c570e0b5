#!/usr/bin/python3
"""text.wordcount: count lines, words and characters of a text (an agentos exec tool).

Reads the arguments object as JSON on stdin, prints the result object as JSON on stdout.
"""
import json
import sys

args = json.load(sys.stdin)
text = args["text"]
words = text.split()
out = {"lines": len(text.splitlines()), "words": len(words), "characters": len(text)}
top = args.get("top", 0)
if top:
    counts = {}
    for w in words:
        w = w.strip(".,;:!?\"'()[]").lower()
        if w:
            counts[w] = counts.get(w, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    out["top"] = [{"word": w, "count": c} for w, c in ranked]
json.dump(out, sys.stdout)
