#!/usr/bin/env python3
"""A stand-in OpenAI server whose replies have the wrong shapes: /v1/models with a numeric id, a null max_model_len
and, on a second listing, `data` as an object; streamed chunks whose usage counts are null or strings, whose
`choices` is an object, and lines that are JSON but not objects. `kiln bench serve` and `kiln qualify` must treat
such replies as failures or missing values, never crash. Standard library only. Prints "listening on
http://127.0.0.1:PORT" once it accepts connections.
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

listings = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        global listings
        if self.path.startswith("/v1/models"):
            listings += 1
            data = [{"id": 5, "max_model_len": None}] if listings % 2 else {"id": "x"}
            self.reply(200, json.dumps({"object": "list", "data": data}))
        elif self.path.startswith("/metrics"):
            self.reply(200, "kiln_kv_cache_tokens not-a-number\n", "text/plain")
        else:
            self.reply(404, json.dumps({"error": {"message": None}}))

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        chunks = [
            {"choices": {"0": {"text": "a"}}},
            [1, 2, 3],
            "just a string",
            {"choices": [{"text": 7}]},
            {"choices": [{"delta": {"content": "hello"}}], "usage": {"prompt_tokens": None, "completion_tokens": "3"}},
            {"choices": [], "usage": {"prompt_tokens": "many", "completion_tokens": None}},
            {"choices": [{"delta": {"content": ["not", "text"]}}], "usage": []},
        ]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self.reply(200, body, "text/event-stream")


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
