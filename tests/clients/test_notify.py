#!/usr/bin/python3
"""Type=notify without systemd (label clients): dapod started with NOTIFY_SOCKET pointing at a
datagram socket this test listens on (a path, then an abstract '@' name) sends READY=1 once its
port accepts requests (GET /readyz answers 200 at once, no retry), and STOPPING=1 after SIGTERM,
then exits 0.

Run: /usr/bin/python3 tests/clients/test_notify.py --dapod DAPOD
"""

import argparse
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import harness  # noqa: E402

DAPOD = None
DEADLINE_S = 60.0


class NotifyTest(unittest.TestCase):
    def run_one(self, abstract):
        tmp = tempfile.mkdtemp(prefix="dapod-notify-")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = "dapod-notify-test-%d-%d" % (os.getpid(), time.monotonic_ns())
            sock.bind("\0" + name)
            env_value = "@" + name
        else:
            env_value = os.path.join(tmp, "notify.sock")
            sock.bind(env_value)
        sock.settimeout(DEADLINE_S)
        env = dict(os.environ, NOTIFY_SOCKET=env_value)
        p = subprocess.Popen([DAPOD, "serve", "--listen", "127.0.0.1:0", "--data-dir",
                              os.path.join(tmp, "var"), "--models-dir",
                              os.path.join(tmp, "models")],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=env, preexec_fn=harness._die_with_parent)
        try:
            msgs = []
            while not any("READY=1" in m.split("\n") for m in msgs):
                msgs.append(sock.recv(4096).decode())
            # READY=1 came: the port must answer now. Its line was written before READY=1.
            port = None
            while port is None:
                line = p.stderr.readline().decode()
                self.assertTrue(line, "dapod closed stderr before its listening line")
                if line.startswith("dapod: listening on http://127.0.0.1:"):
                    port = int(line.rsplit(":", 1)[1])
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/readyz")
            self.assertEqual(c.getresponse().status, 200)
            c.close()
            ready = [m for m in msgs if "READY=1" in m.split("\n")][0]
            self.assertIn("STATUS=", ready)
            self.assertIn(str(port), ready)
            p.send_signal(signal.SIGTERM)
            stopping = sock.recv(4096).decode()
            self.assertIn("STOPPING=1", stopping.split("\n"))
            rc = p.wait(timeout=DEADLINE_S)
            self.assertEqual(rc, 0, p.stderr.read().decode())
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stderr.close()
            sock.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def test_ready_after_port_open_path_socket(self):
        self.run_one(abstract=False)

    def test_ready_after_port_open_abstract_socket(self):
        self.run_one(abstract=True)


def main():
    global DAPOD
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    args, rest = ap.parse_known_args()
    DAPOD = os.path.abspath(args.dapod)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
