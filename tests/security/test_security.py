#!/usr/bin/python3
"""API keys reloaded by SIGHUP, the loopback rule, TLS, and every limit's refusal (label
security), against real dapod processes (Python standard library; curl and openssl commands for
TLS). Each refusal is checked exactly: status, problem type, the limit's config key in the
detail, Retry-After where it applies. No timing thresholds: deadlines are generous and only bound
waits for something that must happen.

Run: /usr/bin/python3 tests/security/test_security.py --dapod build/server/dapod
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "api"))
import harness  # noqa: E402

DAPOD = None
PROBLEM = "https://dapod.dev/problems/"


def sha(k):
    return hashlib.sha256(k.encode()).hexdigest()


def wait_for(cond, what, deadline_s=30.0):
    end = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("not within %.0f s: %s" % (deadline_s, what))
        time.sleep(0.05)


def read_file(name):
    with open(os.path.join(ROOT, "tests", "data", name), "rb") as f:
        return f.read()


class Case(unittest.TestCase):
    def assertProblem(self, r, status, name, *details):
        self.assertEqual(r.status, status, r)
        self.assertTrue(r.header("Content-Type").startswith("application/problem+json"), r)
        p = r.json()
        self.assertEqual(p["type"], PROBLEM + name, p)
        self.assertEqual(p["status"], status, p)
        for d in details:
            self.assertIn(d, p["detail"], p)
        return p


# ---- API keys: SIGHUP reload ------------------------------------------------------------------

class KeyReload(Case):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dapod-sec-")
        self.conf = os.path.join(self.tmp, "dapod.json")
        self.write({"alice": "a-1", "bob": "b-1"})
        self.d = harness.Daemon(DAPOD, args=["--config", self.conf])
        self.d.start()

    def tearDown(self):
        self.d.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, keys, extra=None, raw=None):
        obj = {"api_keys": [{"name": n, "sha256": sha(k)} for n, k in keys.items()]}
        obj.update(extra or {})
        tmp = self.conf + ".new"
        with open(tmp, "w") as f:
            f.write(raw if raw is not None else json.dumps(obj))
        os.replace(tmp, self.conf)

    def status(self, key):
        return self.d.get("/v1/files", headers={"Authorization": "Bearer " + key}).status

    def hup_and_wait(self, marker):
        n = self.d.log().count(marker)
        self.d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: self.d.log().count(marker) > n, "log line %r" % marker)

    def test_rotation_and_refusals(self):
        self.assertEqual((self.status("a-1"), self.status("b-1"), self.status("c-1")),
                         (200, 200, 401))
        # rotate: bob's key replaced, carol added; a setting that needs a restart is named
        self.write({"alice": "a-1", "bob": "b-2", "carol": "c-1"}, {"max_body_bytes": "2M"})
        self.hup_and_wait("SIGHUP: API keys reloaded: 3 keys (0 admin), 2 before")
        # logged just after the marker line
        self.d.wait_log(lambda log: "changed settings that need a restart (ignored): "
                        "max_body_bytes" in log, "the warning about max_body_bytes")
        self.assertEqual([self.status(k) for k in ("a-1", "b-1", "b-2", "c-1")],
                         [200, 401, 200, 200])
        # an invalid file keeps the keys in use, and says why
        self.write({}, raw='{"api_keys": [{"name": "x", "sha256": "12"}]')
        self.hup_and_wait("SIGHUP: configuration not reloaded, the 3 API keys in use stay")
        self.write({}, raw='{"api_keys": [{"name": "x", "sha256": "12"}]}')
        self.hup_and_wait("SIGHUP: configuration not reloaded, the 3 API keys in use stay")
        self.assertIn("api_keys", [line for line in self.d.log().splitlines()
                                   if "configuration not reloaded" in line][-1])
        self.assertEqual([self.status(k) for k in ("a-1", "b-2", "c-1")], [200, 200, 200])
        # a file without keys would turn authentication off: refused as well
        self.write({})
        self.hup_and_wait("SIGHUP: configuration not reloaded, the 3 API keys in use stay")
        self.assertIn("turning authentication off needs a restart", self.d.log())
        self.assertEqual(self.status("a-1"), 200)
        self.assertEqual(self.d.get("/v1/files").status, 401)
        self.assertEqual(self.d.stop(), 0, self.d.log())

    def test_requests_during_reloads_see_one_set_or_the_other(self):
        """alice is in both sets, x1 only in the first, x2 only in the second: while the sets
        alternate under a stream of requests, alice is never refused (a half-updated set would
        refuse her), and each of x1/x2 is either accepted or refused with 401."""
        sets = [{"alice": "a-1", "x1": "x-1"}, {"alice": "a-1", "x2": "x-2"}]
        stop = threading.Event()
        seen, bad = [], []

        def hammer():
            while not stop.is_set():
                for k in ("a-1", "x-1", "x-2"):
                    s = self.status(k)
                    seen.append((k, s))
                    if (k == "a-1" and s != 200) or s not in (200, 401):
                        bad.append((k, s))

        th = [threading.Thread(target=hammer) for _ in range(3)]
        for t in th:
            t.start()
        try:
            for i in range(20):
                self.write(sets[i % 2])
                self.hup_and_wait("SIGHUP: API keys reloaded")
        finally:
            stop.set()
            for t in th:
                t.join(timeout=60)
        self.assertEqual(bad, [])
        self.assertGreater(len(seen), 20)
        self.assertIn(("x-1", 200), seen)  # both sets were in force at some point
        self.assertEqual(self.status("x-2"), 200)  # the last set (i = 19) is the second
        self.assertEqual(self.status("x-1"), 401)


class LoopbackRule(Case):
    def run_dapod(self, *args):
        tmp = tempfile.mkdtemp(prefix="dapod-sec-")
        try:
            return subprocess.run([DAPOD, "serve", "--data-dir", os.path.join(tmp, "var"),
                                   "--print-config"] + list(args),
                                  capture_output=True, text=True, timeout=60)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_non_loopback_without_keys_is_refused(self):
        for listen in ("0.0.0.0:0", "[::]:0", "192.0.2.1:8080", "example.com:80"):
            r = self.run_dapod("--listen", listen)
            self.assertEqual(r.returncode, 2, (listen, r.stderr))
            self.assertIn("is not a loopback address and no api_keys are configured", r.stderr)
        for listen in ("127.0.0.1:0", "127.1.2.3:0", "[::1]:0", "localhost:0"):
            r = self.run_dapod("--listen", listen)
            self.assertEqual(r.returncode, 0, (listen, r.stderr))
        r = self.run_dapod("--listen", "0.0.0.0:0", "--api-keys", "ci:" + sha("k"))
        self.assertEqual(r.returncode, 0, r.stderr)


# ---- TLS -----------------------------------------------------------------------------------

def need(tool):
    if not shutil.which(tool):
        raise unittest.SkipTest("no %s command" % tool)


class Tls(Case):
    @classmethod
    def setUpClass(cls):
        need("openssl")
        need("curl")
        cls.tmp = tempfile.mkdtemp(prefix="dapod-tls-")
        cls.cert, cls.key = cls.path("cert.pem"), cls.path("key.pem")
        cls.other = cls.path("other.pem")
        for cert, key in ((cls.cert, cls.key), (cls.other, cls.path("other-key.pem"))):
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert,
                            "-days", "2", "-subj", "/CN=localhost", "-addext",
                            "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                           check=True, capture_output=True, timeout=120)
        cls.d = harness.Daemon(DAPOD, args=["--tls-cert", cls.cert, "--tls-key", cls.key])
        cls.d.start()

    @classmethod
    def tearDownClass(cls):
        cls.d.cleanup()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.tmp, name)

    def curl(self, *args):
        return subprocess.run(["curl", "-sS", "--max-time", "30"] + list(args),
                              capture_output=True, text=True, timeout=60)

    def url(self, path, scheme="https"):
        return "%s://127.0.0.1:%d%s" % (scheme, self.d.port, path)

    def test_https_with_the_ca(self):
        self.assertEqual(self.d.scheme, "https")
        r = self.curl("--cacert", self.cert, self.url("/healthz"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout), {"status": "ok"})
        r = self.curl("--cacert", self.cert, "-w", "%{http_code}", "-o", "/dev/null",
                      self.url("/v1/files"))
        self.assertEqual(r.stdout, "200")

    def test_wrong_ca_is_refused_by_the_client(self):
        r = self.curl("--cacert", self.other, self.url("/healthz"))
        self.assertEqual(r.returncode, 60, r.stderr)  # CURLE_PEER_FAILED_VERIFICATION
        r = self.curl(self.url("/healthz"))  # the system CAs do not know it either
        self.assertEqual(r.returncode, 60, r.stderr)

    def test_plain_http_to_the_tls_port_fails_cleanly(self):
        for _ in range(3):
            r = self.curl(self.url("/healthz", "http"))
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertNotIn("status", r.stdout)
        with socket.create_connection(("127.0.0.1", self.d.port), timeout=30) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            try:
                while True:
                    b = s.recv(4096)
                    if not b:
                        break
                    got += b
            except (ConnectionResetError, socket.timeout):
                pass
            self.assertNotIn(b"200 OK", got)
        r = self.curl("--cacert", self.cert, self.url("/healthz"))  # the daemon is fine
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIsNone(self.d.proc.poll())

    def start_fails(self, cert, key):
        r = subprocess.run([DAPOD, "serve", "--listen", "127.0.0.1:0", "--data-dir",
                            self.path("var-bad"), "--tls-cert", cert, "--tls-key", key],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0, r.stderr)
        return r.stderr

    def test_bad_certificate_or_key_is_a_clear_startup_error(self):
        junk = self.path("junk.pem")
        with open(junk, "w") as f:
            f.write("this is not PEM\n")
        err = self.start_fails(self.path("missing.pem"), self.key)
        self.assertIn("tls_cert %s: No such file or directory" % self.path("missing.pem"), err)
        err = self.start_fails(junk, self.key)
        self.assertIn("tls_cert %s: not a PEM file with a CERTIFICATE" % junk, err)
        err = self.start_fails(self.cert, junk)
        self.assertIn("tls_key %s: not a PEM file with a PRIVATE KEY" % junk, err)
        broken = self.path("broken.pem")  # PEM armour around garbage
        with open(broken, "w") as f:
            f.write("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
        err = self.start_fails(broken, self.key)
        self.assertIn("refused tls_cert %s or tls_key %s" % (broken, self.key), err)
        err = self.start_fails(self.other, self.key)  # a key that is not the certificate's
        self.assertIn("refused tls_cert", err)
        r = subprocess.run([DAPOD, "serve", "--listen", "127.0.0.1:0", "--tls-cert", self.cert],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("tls_cert and tls_key go together", r.stderr)


# ---- limits ---------------------------------------------------------------------------------

class Limits(Case):
    ARGS = ["--max-body-bytes", "2K", "--max-upload-bytes", "4K", "--max-json-depth", "5",
            "--max-header-bytes", "4K", "--max-connections", "16", "--max-connections-per-ip", "8",
            "--connection-timeout-s", "4", "--sse-heartbeat-s", "1"]

    @classmethod
    def setUpClass(cls):
        cls.d = harness.Daemon(DAPOD, args=cls.ARGS)
        cls.d.start()

    @classmethod
    def tearDownClass(cls):
        cls.d.cleanup()

    def test_body_too_large_is_413(self):
        r = self.d.post_json("/v1/judges/test", {"pad": "x" * 3000})
        self.assertProblem(r, 413, "payload_too_large", "max_body_bytes (2048 bytes)")

    def test_upload_too_large_is_413(self):
        r = self.d.request("POST", "/v1/files?purpose=train&filename=a.jsonl", b"{}\n" * 2000,
                           headers={"Content-Type": "application/x-ndjson"})
        self.assertProblem(r, 413, "payload_too_large", "max_upload_bytes (4096 bytes)")

    def test_json_too_deep_is_400_naming_the_depth(self):
        r = self.d.post_json("/v1/judges/test", '{"a": [[[[[[1]]]]]]}')
        self.assertProblem(r, 400, "invalid_json", "max_json_depth (5)", "line 1, column 11")
        r = self.d.post_json("/v1/judges/test", '{"a": [[[[1]]]]}')  # depth 5 is fine
        self.assertEqual(r.status, 422, r)

    def test_headers_too_large_is_431(self):
        """libmicrohttpd answers this itself, before any callback of ours: 431 with its own
        small HTML body (docs/RELIABILITY.md says why it cannot be problem+json)."""
        status, hdrs, body = self.d.raw_exchange(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 6000 + b"\r\n\r\n")
        self.assertEqual(status, 431)
        self.assertEqual(hdrs.get("connection"), "close")
        self.assertEqual(self.d.get("/healthz").status, 200)

    def test_connections_per_ip_and_in_total(self):
        """A daemon of its own: a long connection_timeout_s (held connections must stay) and one
        HTTP thread (libmicrohttpd splits max_connections between its threads)."""
        d = harness.Daemon(DAPOD, args=["--max-connections", "4", "--max-connections-per-ip",
                                        "2", "--http-threads", "1"])
        d.start()
        try:
            self.connection_limits(d)
        finally:
            d.cleanup()

    def refused(self, src):
        """Connects from src (a loopback address) and sends a request: True when the daemon
        closes the connection without an answer (libmicrohttpd's connection limits)."""
        s = socket.socket()
        s.settimeout(30)
        s.bind((src, 0))
        s.connect(("127.0.0.1", self.port))
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            return s.recv(100) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        finally:
            s.close()

    def hold(self, src, n):
        out = []
        for _ in range(n):
            s = socket.socket()
            s.bind((src, 0))
            s.connect(("127.0.0.1", self.port))
            out.append(s)
            # one request answered: libmicrohttpd has accepted and counts the connection, which
            # then stays open (keep-alive) until the test closes it
            s.settimeout(30)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while not got.endswith(b'{"status":"ok"}\n'):
                b = s.recv(4096)
                self.assertTrue(b, "a held connection was closed")
                got += b
        return out

    def connection_limits(self, d):
        self.port = d.port
        held = self.hold("127.0.0.1", 2)
        try:
            wait_for(lambda: self.refused("127.0.0.1"), "a third connection from one address "
                     "refused (max_connections_per_ip 2)")
            held += self.hold("127.0.0.2", 2)  # another address: 4 open, max_connections
            # At max_connections libmicrohttpd stops accepting: a fifth connection waits in the
            # kernel's accept queue, unanswered, until a slot frees, and is then served (or, had
            # it raced the listener's removal from epoll, is accepted and closed at once).
            s = socket.socket()
            s.bind(("127.0.0.3", 0))
            s.connect(("127.0.0.1", self.port))
            held.append(s)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(1.5)
            try:
                got = s.recv(100)
            except socket.timeout:
                got = None
            except ConnectionResetError:
                got = b""
            self.assertIn(got, (None, b""), "max_connections 4: a fifth connection was served")
            held.pop(0).close()
            if got is None:  # it waited in the queue: now it is served
                s.settimeout(30)
                self.assertTrue(s.recv(100).startswith(b"HTTP/1.1 200"))
        finally:
            for s in held:
                s.close()
        wait_for(lambda: d.get("/healthz").status == 200, "served again")
        self.assertFalse(self.refused("127.0.0.2"))
        d.wait_log(lambda log: "Server reached connection limit" in log,
                   "libmicrohttpd's connection-limit line")

    def test_slow_client_is_dropped_and_others_are_served(self):
        s = socket.create_connection(("127.0.0.1", self.d.port), timeout=0.25)
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100
        t0 = time.monotonic()
        dropped_after, served = None, 0
        try:
            for b in request:  # a byte every ~0.3 s: never idle for 4 s, but never done
                try:
                    s.sendall(bytes([b]))
                    if s.recv(100) == b"":
                        dropped_after = time.monotonic() - t0
                        break
                except socket.timeout:
                    pass
                except (ConnectionResetError, BrokenPipeError):
                    dropped_after = time.monotonic() - t0
                    break
                served += self.d.get("/healthz").status == 200
                if time.monotonic() - t0 > 40:
                    break
        finally:
            s.close()
        self.assertIsNotNone(dropped_after, "a byte-a-second client was never dropped")
        self.assertGreaterEqual(dropped_after, 4.0)  # not before connection_timeout_s
        self.assertGreater(served, 0)
        pattern = (r"closed \d+ connections? that sent no complete request headers within "
                   r"connection_timeout_s \(4 s\)")
        wait_for(lambda: re.search(pattern, self.d.log()), "the guard's log line: " + pattern)

    def test_keep_alive_within_the_timeout_is_not_cut(self):
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.d.port, timeout=30)
        try:
            for _ in range(4):  # 4 requests 1 s apart on one connection (timeout 4 s)
                c.request("GET", "/healthz")
                r = c.getresponse()
                self.assertEqual((r.status, r.read()), (200, b'{"status":"ok"}\n'))
                time.sleep(1.0)
        finally:
            c.close()


class JobLimits(Case):
    """max_jobs_per_key: 429 + Retry-After naming the key; max_sse_subscribers: 503 +
    Retry-After. (max_queued_jobs: tests/api/test_auth.py QueueLimitTest.)"""

    KEYS = {"alice": "a-1", "bob": "b-1"}

    @classmethod
    def setUpClass(cls):
        spec = ",".join("%s:%s" % (n, sha(k)) for n, k in cls.KEYS.items())
        cls.d = harness.Daemon(DAPOD, args=["--api-keys", spec, "--max-jobs-per-key", "1",
                                            "--max-sse-subscribers", "1", "--workers", "1"])
        cls.d.start()
        cls.jobs = []

    @classmethod
    def tearDownClass(cls):
        for who, j in cls.jobs:
            cls.req(who, "POST", "/v1/jobs/%s/cancel" % j, b"")
        cls.d.cleanup()

    @classmethod
    def req(cls, who, method, path, body=None, ctype="application/json"):
        h = {"Authorization": "Bearer " + cls.KEYS[who]}
        if body is not None:
            h["Content-Type"] = ctype
            if not isinstance(body, bytes):
                body = json.dumps(body).encode()
        return cls.d.request(method, path, body=body, headers=h)

    def job(self, who):
        r = self.req(who, "POST", "/v1/files?purpose=train&filename=a.jsonl",
                     read_file("addition.jsonl"), "application/x-ndjson")
        self.assertEqual(r.status, 201, r)
        return self.req(who, "POST", "/v1/jobs", {
            "model": "tiny", "training_file": r.json()["id"],
            "hyperparameters": {"total_steps": 100000, "max_new_tokens": 2, "group_size": 2,
                                "prompt_batch_size": 1}})

    def test_jobs_per_key_and_stream_subscribers(self):
        r = self.job("alice")
        self.assertEqual(r.status, 201, r)
        jid = r.json()["id"]
        self.jobs.append(("alice", jid))
        r = self.job("alice")
        p = self.assertProblem(r, 429, "too_many_requests", "max_jobs_per_key 1")
        self.assertEqual(r.header("Retry-After"), "30", p)
        r = self.job("bob")  # the limit is per key
        self.assertEqual(r.status, 201, r)
        self.jobs.append(("bob", r.json()["id"]))

        s = socket.create_connection(("127.0.0.1", self.d.port), timeout=30)
        try:
            s.sendall(("GET /v1/jobs/%s/events/stream HTTP/1.1\r\nHost: x\r\n"
                       "Authorization: Bearer a-1\r\n\r\n" % jid).encode())
            self.assertTrue(s.recv(64).startswith(b"HTTP/1.1 200"))
            r = self.req("alice", "GET", "/v1/jobs/%s/events/stream" % jid)
            self.assertProblem(r, 503, "unavailable", "max_sse_subscribers")
            self.assertEqual(r.header("Retry-After"), "5")
        finally:
            s.close()
        # the slot is given back when the first reader leaves
        wait_for(lambda: self.req("alice", "GET", "/v1/jobs/%s/events?limit=1" % jid).status
                 == 200, "events")


def main():
    global DAPOD
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    args, rest = ap.parse_known_args()
    DAPOD = os.path.abspath(args.dapod)
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
