#!/usr/bin/env python3
"""A stand-in OpenAI server that answers every `kiln qualify` gate correctly, so the gates' passing paths (schema-valid
JSON, parallel and streamed tool calls assembled from deltas, the Responses round trip, an exact needle) and the
promote decision are tested; the tiny model never takes them. Standard library only. Prints "listening on
http://127.0.0.1:PORT" once it accepts connections.

    python3 qualify_fake_server.py
"""
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Sydney", "Toronto", "Mumbai"]
JSON_ANSWERS = {
    "person": {"name": "Ada Lovelace", "age": 36, "city": "London"},
    "order": {"items": [{"sku": "KILN-1", "quantity": 2}], "total": 19.5, "currency": "EUR"},
    "verdict": {"answer": "yes", "confidence": 0.9, "reasons": ["it is liquid"]},
}


def usage(prompt_text, completion_tokens):
    prompt = max(1, len(prompt_text.split()))
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}


def text_of(content):
    if isinstance(content, str):
        return content
    return " ".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def cities_in(text):
    found = sorted((text.find(c), c) for c in CITIES if c in text)
    return [c for _, c in found]


def chat_answer(body):
    """(content, tool_calls, finish_reason, prompt text) for a chat request."""
    messages = body["messages"]
    prompt = " ".join(text_of(m.get("content")) for m in messages)
    last = messages[-1]
    fmt = body.get("response_format")
    if fmt and fmt.get("type") == "json_schema":
        return json.dumps(JSON_ANSWERS[fmt["json_schema"]["name"]]), [], "stop", prompt
    if last["role"] == "tool":
        return "It is sunny in the city, 24 C.", [], "stop", prompt
    if body.get("tools"):
        calls = [{"id": f"call_{i}", "type": "function",
                  "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}
                 for i, c in enumerate(cities_in(text_of(last["content"])[-200:]))]
        return None, calls, "tool_calls", prompt
    needle = re.search(r"The secret passphrase is ([a-z]+-[0-9]+)\.", prompt)
    if needle:
        return needle.group(1), [], "stop", prompt
    if isinstance(last.get("content"), list):
        return "Red.", [], "stop", prompt
    return "Hello there!", [], "stop", prompt


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, obj, status=200):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_events(self, events):
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        data = data.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self.send_json({"object": "list", "data": [{"id": "fake", "object": "model", "max_model_len": 4096}]})
        elif self.path == "/health":
            self.send_json({"status": "ok"})
        elif self.path == "/metrics":
            data = b"kiln:kv_cache_capacity_tokens{model=\"fake\"} 8192\nkiln:kv_cache_capacity_windows{model=\"fake\"} 2\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_json({"error": {"message": "not found"}}, 404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/completions":
            n = body.get("max_tokens", 16)
            events = [{"object": "text_completion", "choices": [{"index": 0, "text": " w", "finish_reason": None}]}
                      for _ in range(n)]
            events.append({"object": "text_completion", "choices": [], "usage": usage(body["prompt"], n)})
            self.send_events(events)
        elif self.path == "/v1/chat/completions":
            content, calls, finish, prompt = chat_answer(body)
            if not body.get("stream"):
                message = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"] = calls
                self.send_json({"object": "chat.completion", "choices": [
                    {"index": 0, "message": message, "finish_reason": finish}], "usage": usage(prompt, 5)})
                return
            events = []
            for i, call in enumerate(calls):  # name first, then the arguments in two pieces, as servers stream them
                args = call["function"]["arguments"]
                events.append({"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": i, "id": call["id"], "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}}]})
                for piece in (args[:5], args[5:]):
                    events.append({"choices": [{"index": 0, "delta": {"tool_calls": [
                        {"index": i, "function": {"arguments": piece}}]}}]})
            if content:
                events.append({"choices": [{"index": 0, "delta": {"content": content}}]})
            events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
            self.send_events(events)
        elif self.path == "/v1/responses":
            inp = body["input"]
            if isinstance(inp, list) and any(i.get("type") == "function_call_output" for i in inp):
                output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "24 C and sunny."}]}]
            elif body.get("tools"):
                output = [{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                           "arguments": json.dumps({"city": "Paris"}), "status": "completed"}]
            else:
                output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi!"}]}]
            response = {"object": "response", "status": "completed", "output": output,
                        "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}}
            if body.get("stream"):
                self.send_events([{"type": "response.created", "response": {"status": "in_progress"}},
                                  {"type": "response.output_text.delta", "delta": "Hi!"},
                                  {"type": "response.completed", "response": response}])
            else:
                self.send_json(response)
        else:
            self.send_json({"error": {"message": "not found"}}, 404)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
