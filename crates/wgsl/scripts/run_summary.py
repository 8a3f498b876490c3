#!/usr/bin/env python3
"""Reads `node run --format json` on stdin; prints its prompt length, prefill and decode rates and
the GPU backend's profile, and writes its ids and hop hashes to the file named by argv[1]."""

import json
import sys

report = json.loads(sys.stdin.read().strip().splitlines()[-1])
t = report["timings"]
backend = report["backend"]
print(
    f"  prompt {len(report['prompt_ids'])} tokens, {len(report['ids'])} generated; "
    f"prefill {t['prefill_tokens_per_s']:.1f} tok/s, decode {t['decode_tokens_per_s']:.2f} tok/s; "
    f"backend {backend['name']}"
)
if backend.get("profile"):
    print("  profile:", backend["profile"])
with open(sys.argv[1], "w") as f:
    json.dump({"ids": report["ids"], "hops": report["hops"]}, f)
