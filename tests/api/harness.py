"""Integration-test harness for dapod (Python standard library only, Debian's /usr/bin/python3).

Daemon starts the built `dapod serve` on 127.0.0.1 port 0 with a scratch data directory, reads
the bound port from its stderr line "dapod: listening on http://HOST:PORT" with a deadline, waits
for GET /readyz with a deadline, and stops it with SIGTERM, checking that it exits 0 within a few
seconds (under ASan a leak at exit makes the exit status non-zero, so this also checks that).
Nothing here sleeps without a deadline.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time

START_TIMEOUT_S = 60.0  # generous: the sanitizer build starts slower
STOP_TIMEOUT_S = 20.0


def _die_with_parent():
    """In the child before exec: SIGKILL when the test process dies (a test runner's timeout, a
    crash), so that no daemon outlives its test (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case name -> value
        self.body = body

    def header(self, name):
        return self.headers.get(name.lower())

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self):
        return "Response(%d, %r, %r)" % (self.status, self.headers, self.body[:300])


class Daemon:
    """One dapod process. Use as a context manager or call start()/stop()."""

    def __init__(self, dapod, args=(), data_dir=None, listen="127.0.0.1:0"):
        self.dapod = dapod
        self.args = list(args)
        self.listen = listen
        self.scheme = "http"
        self.host = None
        self.tmp = tempfile.mkdtemp(prefix="dapod-api-")
        self.data_dir = data_dir or os.path.join(self.tmp, "var")
        self.models_dir = os.path.join(self.tmp, "models")
        os.makedirs(self.models_dir, exist_ok=True)
        self.proc = None
        self.port = None
        self.lines = []
        self._lock = threading.Condition()  # guards lines; notified for each new line
        self._listening = threading.Event()
        self._reader = None

    # ---- lifecycle ----

    def start(self):
        cmd = [self.dapod, "serve", "--listen", self.listen, "--data-dir", self.data_dir,
               "--models-dir", self.models_dir] + self.args
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        if not self._listening.wait(timeout=START_TIMEOUT_S):
            self.kill()
            raise RuntimeError("dapod did not report its port within %.0f s:\n%s"
                               % (START_TIMEOUT_S, self.log()))
        if self.port is None:
            self.kill()
            raise RuntimeError("dapod exited before listening:\n%s" % self.log())
        while True:
            try:
                if self.request("GET", "/readyz", timeout=5).status == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                raise RuntimeError("dapod not ready within %.0f s:\n%s"
                                   % (START_TIMEOUT_S, self.log()))
            time.sleep(0.05)

    def _read_stderr(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self.lines.append(line)
                self._lock.notify_all()
            marker = "dapod: listening on "
            if line.startswith(marker) and self.port is None:
                url = line[len(marker):].strip()  # http://127.0.0.1:PORT, https://[::1]:PORT
                self.scheme, rest = url.split("://", 1)
                host, port = rest.rsplit(":", 1)
                self.host = host.strip("[]")
                self.port = int(port)
                self._listening.set()
        self._listening.set()  # EOF: wake start() if it is still waiting
        with self._lock:
            self._lock.notify_all()

    def stop(self, sig=signal.SIGTERM):
        """Sends sig and returns the exit status (waits at most STOP_TIMEOUT_S)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("dapod did not exit within %.0f s of %s:\n%s"
                               % (STOP_TIMEOUT_S, sig.name, self.log()))
        self._reader.join(timeout=5)
        return rc

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)

    def cleanup(self):
        self.kill()
        if self._reader:
            self._reader.join(timeout=5)
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def log(self):
        """What the daemon has written to stderr so far, as far as the reader thread has read it:
        a line written just before a reply may not be here yet when the reply arrives; wait for
        it with wait_log."""
        with self._lock:
            return "\n".join(self.lines)

    def wait_log(self, test, what, timeout=60):
        """Waits until test(log text) is true and returns its value; fails naming what after
        timeout seconds, or at once when the daemon's stderr has ended without it."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                text = "\n".join(self.lines)
                got = test(text)
                if got:
                    return got
                left = deadline - time.monotonic()
                ended = self._reader is None or not self._reader.is_alive()
                if left <= 0 or ended:
                    raise AssertionError("%s waiting for %s; the log:\n%s"
                                         % ("stderr ended" if ended else
                                            "%.0f s passed" % timeout, what, text[-3000:]))
                self._lock.wait(min(left, 1.0))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()

    # ---- HTTP ----

    def request(self, method, path, body=None, headers=None, timeout=30):
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=ssl._create_unverified_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
            return Response(resp.status, hdrs, data)
        finally:
            conn.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post_json(self, path, obj, **kw):
        body = obj if isinstance(obj, (bytes, str)) else json.dumps(obj)
        if isinstance(body, str):
            body = body.encode("utf-8")
        headers = {"Content-Type": "application/json"}
        headers.update(kw.pop("headers", {}))
        return self.request("POST", path, body=body, headers=headers, **kw)

    def raw_exchange(self, head, body=b"", timeout=30):
        """Sends head (the request line and headers, CRLF-terminated) and body on a plain socket
        and returns (status, headers, body) of the first non-1xx response."""
        with socket.create_connection((self.host, self.port), timeout=timeout) as s:
            s.sendall(head + body)
            f = s.makefile("rb")
            while True:
                status_line = f.readline()
                if not status_line:
                    raise RuntimeError("connection closed without a response")
                status = int(status_line.split()[1])
                hdrs = {}
                while True:
                    line = f.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = line.decode("latin-1").partition(":")
                    hdrs[k.strip().lower()] = v.strip()
                if status >= 200:
                    break
            n = int(hdrs.get("content-length", "0"))
            return status, hdrs, f.read(n)


def multipart(fields, boundary="dapodBoundary7MA4YWxkTrZu0gW"):
    """Builds a multipart/form-data body by hand. fields: list of (name, value) with value bytes
    or str, or (name, (filename, bytes, content_type)). Returns (body, content_type)."""
    out = []
    for name, value in fields:
        out.append(b"--" + boundary.encode() + b"\r\n")
        if isinstance(value, tuple):
            filename, data, ctype = value
            out.append(('Content-Disposition: form-data; name="%s"; filename="%s"\r\n'
                        % (name, filename)).encode())
            out.append(("Content-Type: %s\r\n\r\n" % ctype).encode())
            out.append(data)
        else:
            out.append(('Content-Disposition: form-data; name="%s"\r\n\r\n' % name).encode())
            out.append(value.encode() if isinstance(value, str) else value)
        out.append(b"\r\n")
    out.append(b"--" + boundary.encode() + b"--\r\n")
    return b"".join(out), "multipart/form-data; boundary=" + boundary


def readme_block(name):
    """The code between <!-- NAME:begin --> and <!-- NAME:end --> of the repository's README.md,
    fences cut."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "README.md"), encoding="utf-8") as f:
        text = f.read()
    body = text.split("<!-- %s:begin -->" % name)[1].split("<!-- %s:end -->" % name)[0]
    return "\n".join(l for l in body.strip().splitlines() if not l.startswith("```")) + "\n"
