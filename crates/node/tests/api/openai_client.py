"""Drives the head's API with the official `openai` client; prints one JSON object of what it saw.

    python openai_client.py MODE BASE_URL MODEL API_KEY QUESTION...

MODE `not-ready` asks once before the ring is formed; `main` runs everything else. The Rust test
(`crates/node/tests/api.rs`) compares what this prints with `node run` on the same messages.
"""

import json
import sys
import threading
import time

import http.client
import urllib.parse

import openai

mode, base, model, key = sys.argv[1:5]
questions = sys.argv[5:]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=600)
out = {}


def user(text):
    return [{"role": "user", "content": text}]


def error_of(call):
    """Run `call`; return the HTTP status and the error body of the API error it raises."""
    try:
        call()
    except openai.APIStatusError as e:
        return {"status": e.status_code, "body": e.body, "headers": dict(e.response.headers)}
    return {"status": 200, "body": None, "headers": {}}


if mode == "not-ready":
    out["not_ready"] = error_of(
        lambda: client.chat.completions.create(model=model, messages=user("hi"), max_tokens=2)
    )
    print(json.dumps(out))
    sys.exit(0)

q0, q1, q2 = questions[:3]
out["models"] = [m.id for m in client.models.list().data]

# Non-streamed and streamed at temperature 0.
whole = client.chat.completions.create(
    model=model, messages=user(q0), temperature=0, max_tokens=24, extra_body={"verify": True}
)
out["whole"] = {
    "text": whole.choices[0].message.content,
    "finish_reason": whole.choices[0].finish_reason,
    "usage": whole.usage.model_dump(),
    "verify": (whole.model_extra or {}).get("verify"),
}
raw = client.chat.completions.with_raw_response.create(
    model=model, messages=user(q0), temperature=0, max_tokens=24, extra_body={"verify": True}
)
out["verify_header"] = raw.headers.get("x-daisy-verify")

pieces, finish, usage, chunks = [], None, None, 0
stream = client.chat.completions.create(
    model=model,
    messages=user(q0),
    temperature=0,
    max_tokens=24,
    stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    chunks += 1
    if chunk.usage is not None:
        usage = chunk.usage.model_dump()
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
out["stream"] = {
    "text": "".join(pieces),
    "content_chunks": len(pieces),
    "chunks": chunks,
    "finish_reason": finish,
    "usage": usage,
}

# The legacy completions endpoint, raw text.
completion = client.completions.create(model=model, prompt=q1, temperature=0, max_tokens=12)
out["completion"] = {
    "text": completion.choices[0].text,
    "usage": completion.usage.model_dump(),
    "finish_reason": completion.choices[0].finish_reason,
}

# A stop string cuts the answer before it (and is not part of it).
stopped = client.completions.create(
    model=model, prompt=q1, temperature=0, max_tokens=12, stop=[" the"]
)
out["stopped"] = {
    "text": stopped.choices[0].text,
    "finish_reason": stopped.choices[0].finish_reason,
}

# JSON mode.
js = client.chat.completions.create(
    model=model,
    messages=user("Give a JSON object with a name and an age."),
    temperature=0,
    max_tokens=120,
    response_format={"type": "json_object"},
)
text = js.choices[0].message.content
try:
    out["json"] = {"text": text, "value": json.loads(text), "parsed": True}
except ValueError:
    out["json"] = {"text": text, "parsed": False}

# A seed at temperature 0.8 repeats; other seeds are drawn too.
seeded = [
    client.chat.completions.create(
        model=model, messages=user(q2), temperature=0.8, seed=seed, max_tokens=16
    ).choices[0].message.content
    for seed in (7, 7, 8, 9, 10)
]
out["seeded"] = seeded

# Two clients at once: both complete, one after the other.
both = {}


def ask(name, q):
    r = client.chat.completions.create(model=model, messages=user(q), temperature=0, max_tokens=16)
    both[name] = {"text": r.choices[0].message.content, "done": time.monotonic()}


threads = [threading.Thread(target=ask, args=(n, q)) for n, q in (("a", q1), ("b", q2))]
for t in threads:
    t.start()
for t in threads:
    t.join()
out["concurrent"] = both

# A client that goes away mid-stream frees the ring; a queue of two turns is full behind it.
where = urllib.parse.urlsplit(base)


def post(body, raw=None):
    """POST to /v1/chat/completions over a connection of its own (stdlib only)."""
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=600)
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=data,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    return conn, conn.getresponse()


def wait_queued(n, limit=60.0):
    """Poll the head's /api/ring until `n` turns wait in its queue; the count last seen."""
    deadline = time.monotonic() + limit
    seen = None
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
        conn.request("GET", "/api/ring")
        seen = json.loads(conn.getresponse().read()).get("queued")
        conn.close()
        if seen is not None and seen >= n:
            return seen
        time.sleep(0.005)
    return seen


body = {"model": model, "messages": user(q0), "temperature": 0, "max_tokens": 200, "stream": True}
conn, r = post(body)
read = 0
waiters, waiting = [], {}
while read < 3:
    line = r.readline().decode()
    if not line:
        break
    if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
        read += 1
        if read == 1:
            # The ring is busy with this turn: two more may wait (--max-queued 2), a third is
            # refused.
            def queued(n):
                res = client.chat.completions.create(
                    model=model, messages=user(q1), temperature=0, max_tokens=8
                )
                waiting[n] = res.choices[0].message.content

            waiters = [threading.Thread(target=queued, args=(n,)) for n in range(2)]
            for w in waiters:
                w.start()
            # Ask the head how many turns wait (its page's /api/ring) until both do: a fixed
            # pause could outlast this turn on a fast machine, and the queue would be draining.
            out["queued_before_third"] = wait_queued(2)
            out["queue_full"] = error_of(
                lambda: client.chat.completions.create(model=model, messages=user("hi"), max_tokens=2)
            )
r.close()
conn.close()
for w in waiters:
    w.join()
out["after_queue"] = [waiting.get(n) for n in range(2)]

# A client that reads three tokens and goes away: its turn stops there, and the next one runs.
conn, r = post(body)
read = 0
while read < 3:
    line = r.readline().decode()
    if not line:
        break
    if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
        read += 1
r.close()
conn.close()
out["cancelled_after_chunks"] = read
after = client.chat.completions.create(model=model, messages=user(q1), temperature=0, max_tokens=8)
out["after_cancel"] = after.choices[0].message.content

# Bad requests: each an OpenAI-shaped error, and the server keeps serving.
bad = {
    "unknown_model": error_of(
        lambda: client.chat.completions.create(model="no/such-model", messages=user("hi"))
    ),
    "negative_max_tokens": error_of(
        lambda: client.chat.completions.create(model=model, messages=user("hi"), max_tokens=-5)
    ),
    "n_2": error_of(lambda: client.chat.completions.create(model=model, messages=user("hi"), n=2)),
    "wrong_key": error_of(
        lambda: openai.OpenAI(base_url=base + "/v1", api_key="not-the-key", max_retries=0)
        .chat.completions.create(model=model, messages=user("hi"))
    ),
    "prompt_beyond_context": error_of(
        lambda: client.completions.create(model=model, prompt=[1] * 100000, max_tokens=1)
    ),
}
for name, raw in (
    ("malformed_json", b'{"model": "x", "messages": ['),
    ("ten_mb_body", json.dumps({"model": model, "messages": user("a" * (10 << 20))}).encode()),
):
    conn, r = post(None, raw)
    bad[name] = {"status": r.status, "body": json.loads(r.read())}
    conn.close()
out["bad"] = bad
after = client.chat.completions.create(model=model, messages=user(q1), temperature=0, max_tokens=16)
out["after_bad"] = after.choices[0].message.content
print(json.dumps(out))
