#!/usr/bin/env python3
"""A reference HTTP judge for dapod: standard library only.

Speaks dapod's judge format (POST /score, also POST /) and OpenRLHF's remote reward format
(POST /openrlhf), scoring math answers with a simplified form of the built-in `math` judge's
rules: the last \\boxed{} (or the text after the last "answer is" / "####" / "=", or the last
number), normalised, compared as exact fractions when both sides are numbers.

Usage: math_judge.py [--host 127.0.0.1] [--port 0]
The first line on stdout is the port it listens on (useful with --port 0), then it serves until
killed. GET /log returns what it saw (path, groups, item count, server-side monotonic start/end
times of each request); GET /healthz answers {"ok": true}.

Fault injection, for tests only: --fail-first N (HTTP 500 for the first N POSTs), --hang-first N
(the first N POSTs sleep --hang-ms, past any judge timeout), --garbage (malformed JSON replies),
--delay-ms MS (every POST waits first), --omit-result (each reply leaves out its last result),
--reward-override X (every reward becomes X, e.g. 1e7 to test range checks).
"""

import argparse
import json
import re
import sys
import threading
import time
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 64 << 20

# ---- the math rules (simplified) ----

def last_boxed(s):
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", s):
        depth, i = 1, m.end()
        while i < len(s) and depth:
            if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(s[i], 0)
            i += 1
        if depth == 0:
            best = s[m.end():i - 1]
    return best


def sentence(s):
    s = s.lstrip(" \t\r\n:*")
    m = re.search(r"\n|[.!?](?=\s|$)", s)
    return (s[:m.start()] if m else s).strip() or None


def extract(response):
    b = last_boxed(response)
    if b is not None:
        return b
    hits = [m.end() for m in re.finditer(r"answer is|answer:|####", response, re.I)]
    if hits:
        seg = sentence(response[hits[-1]:])
        if seg:
            return seg
    if "=" in response:
        seg = sentence(response[response.rindex("=") + 1:])
        if seg:
            return seg
    nums = re.findall(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?", response)
    return nums[-1] if nums else None


def normalize(s):
    b = last_boxed(s)
    if b is not None:
        s = b
    elif "####" in s:
        s = s[s.rindex("####") + 4:].strip().split("\n")[0]
    s = s.replace("\u2212", "-")
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r" \1 ", s)
    s = re.sub(r"\\(?:left|right)\.?", "", s)
    s = re.sub(r"\^\s*\{?\\circ\}?|\u00b0", "", s)
    s = re.sub(r"\\[dtc]frac", r"\\frac", s)
    s = re.sub(r"\\[!,;: ]|\\\$|\\%|[$%]|\\\(|\\\)|\\\[|\\\]", " ", s)
    s = s.strip().rstrip(".").strip()
    m = re.match(r"^([-+]?[\d.,/]+)\s+[A-Za-z]{2,}[A-Za-z\s^{}]*$", s)  # "5 apples"
    if m:
        s = m.group(1)
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^\\?[A-Za-z]+=", "", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    return s.lstrip("+")


def as_fraction(s):
    m = re.fullmatch(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s)
    try:
        if m:
            v = Fraction(m.group(2)) / Fraction(m.group(3))
            return -v if m.group(1) else v
        if re.fullmatch(r"-?[\d.]+(/-?[\d.]+)?", s):
            a, _, b = s.partition("/")
            return Fraction(a) / Fraction(b) if b else Fraction(a)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def same(extracted, answer):
    if extracted is None:
        return False
    a, b = normalize(extracted), normalize(answer)
    if not a and not b:
        return False
    fa, fb = as_fraction(a), as_fraction(b)
    if fa is not None and fb is not None:
        return fa == fb
    return a == b or (a.isalpha() and b.isalpha() and a.lower() == b.lower())


# ---- the server ----

class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.posts = 0
        self.log = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "math_judge/1"

    def log_message(self, fmt, *a):
        if self.server.state.args.verbose:
            sys.stderr.write("math_judge: " + (fmt % a) + "\n")

    def reply(self, status, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def do_GET(self):
        st = self.server.state
        if self.path == "/log":
            with st.lock:
                self.reply(200, {"requests": list(st.log)})
        elif self.path == "/healthz":
            self.reply(200, {"ok": True})
        else:
            self.reply(404, {"error": "not found: " + self.path})

    def do_POST(self):
        st, args = self.server.state, self.server.state.args
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            self.reply(413, {"error": "body too large"})
            self.close_connection = True
            return
        raw = self.rfile.read(n)
        start = time.monotonic()
        with st.lock:
            st.posts += 1
            k = st.posts
        if self.path not in ("/", "/score", "/openrlhf"):
            self.reply(404, {"error": "not found: " + self.path})
            return
        record = {"path": self.path, "start": start, "groups": [], "n": 0, "status": 200,
                  "authorization": self.headers.get("Authorization"),
                  "content_type": self.headers.get("Content-Type")}
        if k <= args.hang_first:
            time.sleep(args.hang_ms / 1000.0)
        if args.delay_ms:
            time.sleep(args.delay_ms / 1000.0)
        try:
            body = json.loads(raw)
        except ValueError:
            self.reply(400, {"error": "body is not JSON"})
            return
        if k <= args.fail_first:
            status, out = 500, ("Internal error: injected failure %d of %d" % (k, args.fail_first)).encode()
        elif args.garbage:
            status, out = 200, b'this is not JSON {"results": ['
        elif self.path == "/openrlhf":
            status, out = 200, self.openrlhf(body, record)
        else:
            status, out = 200, self.dapod(body, record)
        record["status"] = status
        record["end"] = time.monotonic()
        with st.lock:
            st.log.append(record)
        self.reply(status, out, "application/json" if status == 200 and not args.garbage else "text/plain")

    def score(self, response, answer):
        x = extract(response or "")
        ok = same(x, answer or "")
        args = self.server.state.args
        reward = args.reward_override if args.reward_override is not None else (1.0 if ok else -1.0)
        return reward, ok, x

    def dapod(self, body, record):
        results = []
        record["job_id"], record["step"] = body.get("job_id"), body.get("step")
        record["finish_reasons"] = [it.get("finish_reason") for it in body.get("items", [])]
        record["metadata"] = [it.get("metadata") for it in body.get("items", [])]
        for it in body.get("items", []):
            if it.get("group") not in record["groups"]:
                record["groups"].append(it.get("group"))
            reward, ok, x = self.score(it.get("response"), it.get("answer"))
            results.append({"id": it.get("id"), "reward": reward, "correct": ok,
                            "info": {"extracted": x}})
        record["n"] = len(results)
        if self.server.state.args.omit_result and results:
            results.pop()
        results.reverse()  # any order is allowed: exercise it
        return json.dumps({"results": results}).encode()

    def openrlhf(self, body, record):
        rewards = []
        for q, p, label in zip(body.get("query", []), body.get("prompts", []), body.get("labels", [])):
            response = q[len(p):] if q.startswith(p) else q
            rewards.append(self.score(response, label)[0])
        record["n"] = len(rewards)
        return json.dumps({"rewards": rewards}).encode()


class Server(ThreadingHTTPServer):
    # listen()'s backlog: socketserver's default of 5 drops the connections of a burst of calls
    # (dapod opens one a call, `concurrency` of them at once), whose SYNs are retried only after
    # a second: measured, 64 calls in flight took 1.5 s each instead of milliseconds
    request_queue_size = 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: any free port (printed first)")
    ap.add_argument("--fail-first", type=int, default=0, metavar="N")
    ap.add_argument("--hang-first", type=int, default=0, metavar="N")
    ap.add_argument("--hang-ms", type=int, default=610000, metavar="MS")
    ap.add_argument("--garbage", action="store_true")
    ap.add_argument("--delay-ms", type=int, default=0, metavar="MS")
    ap.add_argument("--omit-result", action="store_true")
    ap.add_argument("--reward-override", type=float, default=None, metavar="X")
    ap.add_argument("--verbose", action="store_true", help="log each request to stderr")
    args = ap.parse_args()
    srv = Server((args.host, args.port), Handler)
    srv.daemon_threads = True
    srv.state = State(args)
    print(srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
