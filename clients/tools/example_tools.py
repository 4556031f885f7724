#!/usr/bin/env python3
"""Example tools for dapod's agent episodes (docs/AGENTS.md): standard library only.

dapod POSTs a call as {"job_id", "episode_id", "name", "arguments", "item"} (item: the dataset
line's fields) and reads {"content": "..."} (what the model sees) or {"error": "..."}.

  POST /lookup   the value stored for the prompt's key: the dataset line's "answer", which the
                 model cannot know without asking (a database lookup)
  POST /calc     arguments {"expression": "12*(3+4)"}: + - * / and parentheses over integers
                 and decimals, evaluated exactly
  GET  /healthz  {"ok": true}

A job names them as
  {"type": "function", "function": {"name": "lookup", "description": "...",
   "parameters": {"type": "object"}}, "url": "http://127.0.0.1:PORT/lookup"}

Usage: example_tools.py [--host 127.0.0.1] [--port 0]
The first line on stdout is the port it listens on (useful with --port 0), then it serves until
killed.
"""

import argparse
import ast
import json
import socket
import operator
import sys
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1 << 20
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv}


def calc(expression):
    """The exact value of an arithmetic expression, as text; ValueError when it is not one."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div) and b == 0:
                raise ValueError("division by zero")
            return OPS[type(node.op)](a, b)
        raise ValueError("only numbers, + - * / and parentheses")
    if not isinstance(expression, str) or len(expression) > 200:
        raise ValueError("expression: expected a string of at most 200 characters")
    try:
        v = ev(ast.parse(expression, mode="eval"))
    except SyntaxError:
        raise ValueError("not an arithmetic expression")
    return str(v.numerator) if v.denominator == 1 else str(float(v))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # a reply goes out as headers, then body: without TCP_NODELAY the body waits for the
        # client's delayed ACK of the headers (40 ms a call)
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def reply(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/healthz":
            self.reply(200, {"ok": True})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        if n > MAX_BODY:
            self.reply(413, {"error": "too large"})
            return
        try:
            call = json.loads(self.rfile.read(n))
            args = call.get("arguments") or {}
            item = call.get("item") or {}
        except (ValueError, AttributeError):
            self.reply(400, {"error": "not a dapod tool call"})
            return
        if self.path == "/lookup":
            answer = item.get("answer")
            self.reply(200, {"content": str(answer)} if answer is not None else {"error": "no key"})
        elif self.path == "/calc":
            try:
                self.reply(200, {"content": calc(args.get("expression"))})
            except ValueError as e:
                self.reply(200, {"error": str(e)})
        else:
            self.reply(404, {"error": "no such tool"})


class Server(ThreadingHTTPServer):
    # listen()'s backlog: socketserver's default of 5 drops the connections of a burst of calls
    # (dapod opens one a call, `concurrency` of them at once), whose SYNs are retried only after
    # a second: measured, 64 calls in flight took 1.5 s each instead of milliseconds
    request_queue_size = 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    server = Server((a.host, a.port), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    main()
