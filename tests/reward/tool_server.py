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
import os
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import standin  # noqa: E402

LOCK = threading.Condition()
LOG = []
FAILS = {}
IN_FLIGHT = {}  # by the call's path and query: one count per test's route


class Handler(standin.JsonHandler):
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


if __name__ == "__main__":
    standin.serve(Handler)
