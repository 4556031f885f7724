"""A stand-in tool server for tests/reward/test_tools.c (Python standard library only): POST
routes answer a dapod tool call ({"job_id", "episode_id", "name", "arguments", "item"}) in the
ways a real tool can behave, and GET /log lists every call with its start and end times.

  /echo          {"content": the call's fields as sorted JSON}
  /error         {"error": "nope"}
  /fail?n=K      HTTP 500 for an episode's first K calls, then /echo's answer
  /gate?n=N&ms=M holds each call until N calls to this same route are in flight together (or M
                 ms pass), then echoes
  /slow?ms=M     sleeps M ms, then echoes
  /garbage       200 with a body that is not JSON
  /huge?kb=K     {"content": K KiB of text}
  /status?code=C that HTTP status with an empty JSON body

Run: python3 tool_server.py  (prints the port it listens on, on 127.0.0.1, as its first line)
"""
import json
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Condition()
LOG = []
FAILS = {}
IN_FLIGHT = {}  # by the call's path and query: one count per test's route


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # a reply goes out as headers, then body: without TCP_NODELAY the body waits for the
        # client's delayed ACK of the headers (40 ms a call)
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/log":
            with LOCK:
                self.reply(200, LOG)
        else:
            self.reply(404, {})

    def do_POST(self):
        url = urllib.parse.urlparse(self.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        n = int(self.headers.get("Content-Length", "0"))
        call = json.loads(self.rfile.read(n) or b"{}")
        entry = {"path": url.path, "episode_id": call.get("episode_id"), "start": time.time()}
        route = self.path
        with LOCK:
            IN_FLIGHT[route] = IN_FLIGHT.get(route, 0) + 1
            entry["in_flight"] = IN_FLIGHT[route]
            LOCK.notify_all()
        try:
            status, body = self.answer(url.path, q, call, route)
        finally:
            with LOCK:  # before the reply goes out: the next call may come as soon as it has
                IN_FLIGHT[route] -= 1
                entry["end"] = time.time()
                LOG.append(entry)
        self.reply(status, body)

    def answer(self, path, q, call, route):
        echo = {"content": json.dumps(call, sort_keys=True)}
        if path == "/echo":
            return 200, echo
        if path == "/error":
            return 200, {"error": "nope"}
        if path == "/fail":
            key = call.get("episode_id")
            with LOCK:
                FAILS[key] = FAILS.get(key, 0) + 1
                k = FAILS[key]
            return (500, {"error": "try again"}) if k <= int(q.get("n", "1")) else (200, echo)
        if path == "/gate":
            deadline = time.time() + int(q.get("ms", "10000")) / 1000.0
            with LOCK:
                while IN_FLIGHT[route] < int(q.get("n", "2")) and time.time() < deadline:
                    LOCK.wait(max(0.0, deadline - time.time()))
            return 200, echo
        if path == "/slow":
            time.sleep(int(q.get("ms", "1000")) / 1000.0)
            return 200, echo
        if path == "/garbage":
            return 200, b"this is not json"
        if path == "/huge":
            return 200, {"content": "x" * (1024 * int(q.get("kb", "64")))}
        if path == "/status":
            return int(q.get("code", "500")), {}
        return 404, {}


class Server(ThreadingHTTPServer):
    # listen()'s backlog: socketserver's default of 5 drops the connections of a burst of calls
    # (dapod opens one a call, `concurrency` of them at once), whose SYNs are retried only after
    # a second: measured, 64 calls in flight took 1.5 s each instead of milliseconds
    request_queue_size = 1024


def main():
    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.handle_error = lambda request, address: None  # clients that hung up (timeouts, stops)
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    main()
