"""Fifty clients at once against the head's API (the official `openai` client, one thread each).

    python load_client.py BASE_URL MODEL CLIENTS QUESTION...

Client i asks QUESTION[i % len] at temperature 0 for 8 tokens; prints one JSON object: every
client's question index, text, finish reason and seconds, and how many failed (with why).
"""

import json
import sys
import threading
import time

import openai

base, model, clients = sys.argv[1], sys.argv[2], int(sys.argv[3])
questions = sys.argv[4:]
results = [None] * clients


def ask(i):
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=900)
    q = i % len(questions)
    t0 = time.monotonic()
    try:
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": questions[q]}],
            temperature=0,
            max_tokens=8,
        )
        results[i] = {
            "question": q,
            "text": r.choices[0].message.content,
            "finish_reason": r.choices[0].finish_reason,
            "completion_tokens": r.usage.completion_tokens,
            "s": time.monotonic() - t0,
        }
    except Exception as e:  # every failure is reported, not raised: the test counts them
        results[i] = {"question": q, "error": repr(e), "s": time.monotonic() - t0}


threads = [threading.Thread(target=ask, args=(i,)) for i in range(clients)]
t0 = time.monotonic()
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"results": results, "wall_s": time.monotonic() - t0}))
