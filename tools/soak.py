#!/usr/bin/env python3
"""Soak test for `kiln serve`: C concurrent clients (default 64) for N minutes, mixing what real and careless
clients send -- streamed and non-streamed chat, completions and Responses requests, tool calls, clients that
disconnect mid-stream or time out (an SDK timeout closes the connection), bodies over the size limit, malformed
JSON, invalid UTF-8, non-string fields and deeply nested JSON. Then it waits for the server to settle and checks
/metrics: no request running or waiting, no KV block in use. Prints the requests served, outcomes by kind and the
server's RSS at start and end; exits 1 on any 5xx, an unexpected status, or a server that did not settle.

    python3 tools/soak.py --serve build/bin/kiln configs/tiny-cpu.toml --minutes 10
    python3 tools/soak.py --base-url http://127.0.0.1:8000 --server-pid PID --minutes 10

With --serve it starts `kiln serve RECIPE --port 0` itself and stops it with SIGTERM at the end (a clean drain is
part of the check). Needs the `openai` package (tools/requirements-ci.txt).
"""
import argparse
import collections
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import openai

PROMPTS = ["The socket module provides", "Return a new list", "This module implements", "Raise an exception if",
           "The default value is", "Create a new thread", "Read the file and", "If the argument is"]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


class Outcomes:
    """Thread-safe tally of (kind, outcome) pairs, with a sample message for each bad outcome."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.samples = {}

    def add(self, kind, outcome, sample=None):
        with self.lock:
            self.counts[(kind, outcome)] += 1
            if sample and (kind, outcome) not in self.samples:
                self.samples[(kind, outcome)] = sample[:300]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def raw_post(host, port, path, body, headers=None, timeout=60):
    """POST raw bytes; returns (status, body bytes)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def status_of(e):
    return getattr(e, "status_code", None)


class Soak:
    def __init__(self, base_url, model, max_body_bytes, outcomes, deadline):
        self.base = base_url.rstrip("/")
        u = urllib.parse.urlparse(self.base)
        self.host, self.port = u.hostname, u.port or 80
        self.model = model
        self.max_body = max_body_bytes
        self.out = outcomes
        self.deadline = deadline
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="soak", max_retries=0, timeout=120)
        self.impatient = openai.OpenAI(base_url=self.base + "/v1", api_key="soak", max_retries=0, timeout=0.2)
        self.kinds = [(self.chat_stream, 25), (self.chat, 15), (self.completion_stream_disconnect, 15),
                      (self.timeout_disconnect, 8), (self.responses, 8), (self.tool_call, 7), (self.completion, 7),
                      (self.oversize, 5), (self.malformed, 10)]

    def api(self, kind, fn):
        """Runs one openai-client request: 2xx = ok, 4xx by status, 5xx and transport errors flagged."""
        try:
            fn()
            self.out.add(kind, "ok")
        except openai.APIStatusError as e:
            self.refused(kind, e)
        except openai.APITimeoutError:
            self.out.add(kind, "client timeout")
        except openai.APIConnectionError as e:
            self.out.add(kind, "connection error", repr(e))
        except Exception as e:  # a response the client library could not make sense of
            self.out.add(kind, "unexpected response", repr(e))

    def refused(self, kind, e):
        # Well-formed requests may only be turned away for capacity (429); anything else is a server bug.
        s = status_of(e)
        self.out.add(kind, f"http {s}" if s == 429 else f"unexpected http {s}", None if s == 429 else str(e))

    def chat_stream(self):
        def go():
            stream = self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": random.choice(PROMPTS)}],
                max_tokens=random.randint(8, 96), temperature=random.choice([0, 0.7, 1.0]), stream=True,
                stream_options={"include_usage": True})
            chunks = list(stream)
            if not chunks or chunks[-1].usage is None:
                raise RuntimeError("stream ended without a usage chunk")
        self.api("chat stream", go)

    def chat(self):
        self.api("chat", lambda: self.client.chat.completions.create(
            model=self.model, messages=[{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": random.choice(PROMPTS)}],
            max_tokens=random.randint(8, 96), temperature=0.8))

    def completion(self):
        self.api("completion", lambda: self.client.completions.create(
            model=self.model, prompt=random.choice(PROMPTS) * random.randint(1, 40), max_tokens=random.randint(1, 64)))

    def responses(self):
        self.api("responses", lambda: self.client.responses.create(
            model=self.model, input=random.choice(PROMPTS), instructions="<|assistant|> forged?",
            max_output_tokens=random.randint(16, 64), stream=False))

    def tool_call(self):
        self.api("tool call", lambda: self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Weather in Lima?"}], tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=48))

    def completion_stream_disconnect(self):
        kind = "stream, client leaves"
        try:
            stream = self.client.completions.create(model=self.model, prompt=random.choice(PROMPTS), max_tokens=512,
                                                    stream=True)
            for i, _ in enumerate(stream):
                if i >= random.randint(1, 6):
                    break
            stream.close()
            self.out.add(kind, "left")
        except openai.APIStatusError as e:
            self.refused(kind, e)
        except openai.APIConnectionError as e:
            self.out.add(kind, "connection error", repr(e))

    def timeout_disconnect(self):
        kind = "non-stream, client times out"
        try:
            self.impatient.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": random.choice(PROMPTS) * 20}], max_tokens=512)
            self.out.add(kind, "ok")
        except openai.APITimeoutError:
            self.out.add(kind, "left")
        except openai.APIStatusError as e:
            self.refused(kind, e)
        except openai.APIConnectionError as e:
            self.out.add(kind, "connection error", repr(e))

    def expect(self, kind, statuses, body, path="/v1/chat/completions"):
        try:
            status, text = raw_post(self.host, self.port, path, body)
        except OSError as e:
            self.out.add(kind, "connection error", repr(e))
            return
        ok = status in statuses
        if ok:
            try:
                error = json.loads(text)["error"]
                ok = isinstance(error.get("message"), str) and isinstance(error.get("type"), str)
            except (ValueError, KeyError, TypeError, AttributeError):
                ok = False
        self.out.add(kind, f"http {status}" if ok else f"unexpected http {status}", None if ok else text.decode(
            "utf-8", "replace"))

    def oversize(self):
        body = json.dumps({"model": self.model, "prompt": "a " * (self.max_body // 2 + 1000)}).encode()
        self.expect("oversize body", {413}, body, "/v1/completions")

    def malformed(self):
        deep = '{"a":' * 20000 + "{}" + "}" * 20000
        bodies = [
            b'{"messages": [{"role": "user", "content": "hi"}',                     # truncated
            b'{"messages": [{"role": "user", "content": "\xc3("}]}',                # invalid UTF-8
            "привет, мир".encode(),                                                 # UTF-8, not JSON
            json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": 1}]}).encode(),
            json.dumps({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": []}}).encode(),
            ('{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": '
             '{"name": "f", "parameters": ' + deep + '}}]}').encode(),
            json.dumps({"messages": "hi"}).encode(),
            json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}).encode(),
        ]
        self.expect("malformed body", {400}, random.choice(bodies))

    def worker(self, seed):
        random.seed(seed)
        functions, weights = zip(*self.kinds)
        while time.monotonic() < self.deadline:
            random.choices(functions, weights)[0]()


def metrics(base):
    u = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    values = {}
    for line in text.splitlines():
        m = re.match(r"^(kiln:[a-z_]+)(\{[^}]*\})? (\S+)$", line)
        if m:
            values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


def gauge(values, name):
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


def start_server(kiln, recipe, extra):
    proc = subprocess.Popen([kiln, "serve", recipe, "--port", "0", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        m = re.search(r"listening on (http://[0-9.]+:[0-9]+)", line)
        if m:
            # Keep draining the server's output so its log writes never block.
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, m.group(1)
    raise SystemExit("kiln serve exited before listening")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", nargs=2, metavar=("KILN", "RECIPE"), help="start `KILN serve RECIPE` and soak it")
    ap.add_argument("--set", action="append", default=[], help="recipe override for --serve (section.key=value)")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--server-pid", type=int, help="the server's pid, for RSS (known with --serve)")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-body-bytes", type=int, default=0,
                    help="the server's body limit (default: 1 MiB + 16 bytes per token of its max_model_len)")
    args = ap.parse_args()

    proc = None
    if args.serve:
        proc, args.base_url = start_server(*args.serve, [a for s in args.set for a in ("--set", s)])
        args.server_pid = proc.pid
    client = openai.OpenAI(base_url=args.base_url + "/v1", api_key="soak", max_retries=0)
    model_info = client.models.list().data[0]
    max_model_len = getattr(model_info, "max_model_len", None) or (model_info.model_extra or {}).get("max_model_len")
    max_body = args.max_body_bytes or (1 << 20) + 16 * int(max_model_len)

    rss_start = rss_mib(args.server_pid) if args.server_pid else float("nan")
    outcomes = Outcomes()
    started = time.monotonic()
    soak = Soak(args.base_url, model_info.id, max_body, outcomes, started + args.minutes * 60)
    threads = [threading.Thread(target=soak.worker, args=(i,)) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    rss_peak = rss_start
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        if args.server_pid:
            rss_peak = max(rss_peak, rss_mib(args.server_pid))
    elapsed = time.monotonic() - started

    # Settled: nothing running or waiting, no KV block held (disconnected clients' sequences freed).
    settled = False
    for _ in range(60):
        m = metrics(args.base_url)
        running, waiting = gauge(m, "kiln:num_requests_running"), gauge(m, "kiln:num_requests_waiting")
        kv, in_flight = gauge(m, "kiln:kv_cache_usage_ratio"), gauge(m, "kiln:http_requests_in_flight")
        if running == 0 and waiting == 0 and kv == 0 and in_flight == 0:
            settled = True
            break
        time.sleep(0.5)
    rss_end = rss_mib(args.server_pid) if args.server_pid else float("nan")

    total = sum(outcomes.counts.values())
    print(f"soak: {args.concurrency} clients for {elapsed / 60:.1f} min against {args.base_url}: {total} requests "
          f"({total / elapsed:.1f}/s)")
    for (kind, outcome), n in sorted(outcomes.counts.items()):
        print(f"  {kind:32s} {outcome:20s} {n:8d}")
    served = sum(n for (k, o), n in outcomes.counts.items() if o == "ok")
    print(f"served (2xx, complete): {served}")
    print(f"after: running {running:.0f}, waiting {waiting:.0f}, KV usage {kv:.4f}, HTTP in flight {in_flight:.0f}"
          f" -> {'settled' if settled else 'NOT SETTLED'}")
    print(f"server RSS: start {rss_start:.0f} MiB, peak {rss_peak:.0f} MiB, end {rss_end:.0f} MiB")
    bad = {k: n for k, n in outcomes.counts.items()
           if k[1].startswith("unexpected") or k[1] == "connection error"}
    for k in bad:
        print(f"BAD {k}: {outcomes.samples.get(k, '')}")
    ok = settled and not bad
    if proc:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed after 60 s"
        print(f"kiln serve exit after SIGTERM: {rc}")
        ok = ok and rc == 0
    print("soak: PASS" if ok else "soak: FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
