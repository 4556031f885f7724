"""Shared pieces of the clients' tests (Python standard library, Debian's /usr/bin/python3): the
daemon harness of tests/api, small job specs, a free port, and a TCP proxy that cuts event
streams mid-way (to test reconnects with Last-Event-ID)."""

import hashlib
import json
import os
import re
import socket
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "api"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
import harness  # noqa: E402,F401

DATA = os.path.join(ROOT, "tests", "data")
ADDITION = os.path.join(DATA, "addition.jsonl")
DEADLINE_S = 120.0  # any single wait (generous: the ASan build and a loaded machine are slower)

# A few tiny steps: seconds per job.
SMALL_HP = {"total_steps": 3, "checkpoint_every": 1, "max_new_tokens": 4, "group_size": 4,
            "prompt_batch_size": 2}
# A job that only a cancel ends (caught running, paused, resumed, cancelled): 2^20 steps, never a
# count a fast machine could finish before the test acts.
LONG_HP = {"total_steps": 1 << 20, "checkpoint_every": 0, "max_new_tokens": 16, "group_size": 8,
           "prompt_batch_size": 4}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            h.update(block)
    return h.hexdigest()


def upload(d, path=ADDITION):
    with open(path, "rb") as f:
        data = f.read()
    r = d.request("POST", "/v1/files?purpose=fine-tune&filename=data.jsonl", body=data,
                  headers={"Content-Type": "application/x-ndjson"})
    assert r.status == 201, r
    return r.json()["id"]


def job_spec(file_id, hp=None, judge=None, seed=1):
    return {"model": "tiny", "training_file": file_id, "judge": judge or {"type": "math"},
            "seed": seed, "hyperparameters": dict(hp or SMALL_HP)}


def closed_port():
    """A loopback port that nothing listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_terminal(d, job_id, deadline_s=DEADLINE_S):
    import time
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        j = d.get("/v1/jobs/%s?wait=10" % job_id, timeout=30).json()
        if j["status"] in ("succeeded", "failed", "cancelled"):
            return j
    raise AssertionError("job %s did not finish within %.0f s" % (job_id, deadline_s))


class CuttingProxy:
    """A TCP proxy to the daemon on 127.0.0.1:0. The first `cuts` connections whose request is
    for an event stream are closed after `cut_after` bytes of the response have been passed on,
    mid-event; everything else is relayed unchanged. `streams` counts the stream connections
    and `last_event_ids` records each one's Last-Event-ID header (None when absent)."""

    def __init__(self, upstream_port, cuts=3, cut_after=700):
        self.upstream_port = upstream_port
        self.cuts = cuts
        self.cut_after = cut_after
        self.streams = 0
        self.cut_done = 0
        self.last_event_ids = []
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.sock.close()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            u = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=DEADLINE_S)
        except OSError:
            c.close()
            return
        c.settimeout(DEADLINE_S)
        # Requests: relay byte for byte, peeking at each request head for the stream path.
        state = {"sent": 0, "limit": None}

        def up():
            buf = b""
            try:
                while True:
                    data = c.recv(65536)
                    if not data:
                        break
                    buf = (buf + data)[-8192:]
                    m = re.search(rb"GET [^ ]*/events/stream[^ ]* HTTP/1\.1\r\n(.*?)\r\n\r\n",
                                  buf, re.S)
                    if m:
                        head = "x\r\n" + m.group(1).decode("latin-1")
                        lei = None
                        for line in head.split("\r\n")[1:]:
                            k, _, v = line.partition(":")
                            if k.strip().lower() == "last-event-id":
                                lei = v.strip()
                        with self.lock:
                            self.streams += 1
                            self.last_event_ids.append(lei)
                            if self.cut_done < self.cuts:
                                self.cut_done += 1
                                state["limit"] = state["sent"] + self.cut_after
                        buf = b""
                    u.sendall(data)
            except OSError:
                pass
            try:
                u.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        t = threading.Thread(target=up, daemon=True)
        t.start()
        try:
            while True:
                data = u.recv(65536)
                if not data:
                    break
                limit, sent = state["limit"], state["sent"]
                if limit is not None and sent + len(data) >= limit:
                    c.sendall(data[:max(0, limit - sent)])
                    break  # cut: close both sides mid-stream
                c.sendall(data)
                state["sent"] = sent + len(data)
        except OSError:
            pass
        for s in (c, u):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def metrics_rows(d, job_id):
    return [m for m in d.get("/v1/jobs/%s/metrics" % job_id).json()]


def events_all(d, job_id):
    out, after = [], None
    while True:
        r = d.get("/v1/jobs/%s/events?limit=100%s" % (job_id, "&after=%d" % after if after else ""))
        page = r.json()
        out += page["data"]
        if not page["has_more"]:
            return out
        after = page["data"][-1]["id"]


def dumps(obj):
    return json.dumps(obj)
