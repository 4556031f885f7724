"""What the tests' stand-in servers share (tests/reward/tool_server.py, tests/rl/env_server.py;
Python standard library only): a JSON handler that writes each reply at once, and a server
that accepts a burst of connections and prints its port as its first line of stdout.
"""
import json
import signal
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # a reply goes out as headers, then body: without TCP_NODELAY the body waits for the
        # client's delayed ACK of the headers (40 ms a call)
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        """body: bytes as they are, or a value written as JSON."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(ThreadingHTTPServer):
    # listen()'s backlog: socketserver's default of 5 drops the connections of a burst of calls
    # (dapod opens one a call, `concurrency` of them at once), whose SYNs are retried only after
    # a second: measured, 64 calls in flight took 1.5 s each instead of milliseconds
    request_queue_size = 1024
    daemon_threads = True

    def handle_error(self, request, address):
        pass  # clients that hung up (timeouts, stops)


def serve(handler):
    """Serves handler on 127.0.0.1, a free port printed first, until SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    server = Server(("127.0.0.1", 0), handler)
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
