#!/usr/bin/python3
"""crypto.hmac: sign a message with a secret key (HMAC); the key never reaches the audit log.

Reads {"message", "key", "algorithm"?} as JSON on stdin, prints {"algorithm", "mac"}.
"""
import hashlib
import hmac
import json
import sys

args = json.load(sys.stdin)
alg = args.get("algorithm", "sha256")
mac = hmac.new(args["key"].encode(), args["message"].encode(), getattr(hashlib, alg))
json.dump({"algorithm": alg, "mac": mac.hexdigest()}, sys.stdout)
