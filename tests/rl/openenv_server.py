"""A stand-in OpenEnv server for tests/rl/test_openenv.c (Python standard library only): OpenEnv's
WebSocket session protocol (docs/AGENTS.md "Environments"), RFC 6455 written by hand: the
handshake (Sec-WebSocket-Accept), masked client frames (fragmented ones assembled), unmasked
server text frames, pings and the closing handshake. One environment a connection, as OpenEnv's
server does. Every message received is written to the log file given as its argument, a JSON
line {"base", "conn", "type", "data", "host", "token"} each ("type": "connect" for a handshake;
"pong" for a pong; "gone" when the client hangs up).

The game is tests/rl/env_server.py's: guess the dataset line's answer (a digit). reset observes
{"text": "guess", "turn": 0}; each step reads the action's "message" first character: the
answer ends the episode with reward 1 ("right"), another digit gets 0.25 and "higher" or
"lower", anything else no reward (null) and "a digit?". Every reply goes out in two fragments and
is followed by a ping (the client must assemble the one and answer the other).

The path before /ws chooses how it behaves:
  /ws           as above
  /garbage/ws   reset answers, step replies with text that is not JSON
  /error/ws     reset answers, step replies {"type": "error", "data": {"message", "code"}}
  /drop/ws      reset answers, step closes the socket without a reply
  /slow/ws      reset answers, step answers after 1.5 s
  /huge/ws      reset answers, step's observation is 20,000 bytes long
  /flaky/ws     each episode's first reset closes the socket (the retry, on a new socket, works)
  /refuse/ws    the handshake is answered 503

Run: python3 openenv_server.py LOG  (prints the port it listens on, on 127.0.0.1, first)
"""
import base64
import hashlib
import json
import os
import socket
import socketserver
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import standin  # noqa: E402

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
LOCK = threading.Lock()
LOG = None
RESETS = {}  # (base, episode_id) -> resets seen
CONNS = [0]


def log(entry):
    with LOCK:
        LOG.write(json.dumps(entry) + "\n")
        LOG.flush()


class Closed(Exception):
    pass


class Handler(socketserver.BaseRequestHandler):
    def setup(self):
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def read(self, n):
        while len(self.buf) < n:
            chunk = self.request.recv(65536)
            if not chunk:
                raise Closed()
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self, opcode, payload, fin=True):
        head = bytes([(0x80 if fin else 0) | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([n])
        elif n < 65536:
            head += bytes([126]) + struct.pack(">H", n)
        else:
            head += bytes([127]) + struct.pack(">Q", n)
        self.request.sendall(head + payload)

    def send(self, value):
        data = value if isinstance(value, bytes) else json.dumps(value).encode()
        half = len(data) // 2
        self.frame(0x1, data[:half], fin=False)
        self.frame(0x0, data[half:])
        self.frame(0x9, b"still there?")

    def message(self):
        """The next whole text message (pings answered, pongs logged); None on a close."""
        parts = []
        while True:
            b0, b1 = self.read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if not b1 & 0x80:
                raise Closed()  # a client's frames are masked (RFC 6455 5.1)
            if n == 126:
                n = struct.unpack(">H", self.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.read(8))[0]
            mask = self.read(4)
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(self.read(n)))
            if opcode == 0x8:
                self.frame(0x8, payload[:2])
                return None
            if opcode == 0x9:
                self.frame(0xA, payload)
                continue
            if opcode == 0xA:
                log({"base": self.base, "conn": self.conn, "type": "pong"})
                continue
            parts.append(payload)
            if b0 & 0x80:
                return b"".join(parts).decode()

    def handshake(self):
        while b"\r\n\r\n" not in self.buf:
            chunk = self.request.recv(65536)
            if not chunk:
                raise Closed()
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        self.base = path[: -len("/ws")] if path.endswith("/ws") else path
        with LOCK:
            CONNS[0] += 1
            self.conn = CONNS[0]
        log({"base": self.base, "conn": self.conn, "type": "connect", "path": path,
             "host": headers.get("host"), "token": headers.get("x-token")})
        if self.base == "/refuse":
            self.request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            raise Closed()
        key = headers.get("sec-websocket-key", "").encode()
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        self.request.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept +
                             b"\r\n\r\n")

    def handle(self):
        self.base, self.conn = None, 0
        try:
            self.handshake()
            state = None
            while True:
                text = self.message()
                if text is None:
                    break
                msg = json.loads(text)
                log({"base": self.base, "conn": self.conn, "type": msg.get("type"),
                     "data": msg.get("data")})
                kind = msg.get("type")
                if kind == "close":
                    self.frame(0x8, struct.pack(">H", 1000))
                    break
                if kind == "reset":
                    data = msg["data"]
                    key = (self.base, data["episode_id"])
                    with LOCK:
                        RESETS[key] = RESETS.get(key, 0) + 1
                        first = RESETS[key] == 1
                    if self.base == "/flaky" and first:
                        break
                    state = {"answer": str(data["item"]["answer"]), "turn": 0}
                    self.send({"type": "observation", "data": {
                        "observation": {"text": "guess", "turn": 0}, "reward": None,
                        "done": False}})
                    continue
                if kind != "step":
                    self.send({"type": "error", "data": {"message": "Unknown message type: %s"
                                                         % kind, "code": "UNKNOWN_TYPE"}})
                    continue
                if self.base == "/garbage":
                    self.send(b"<html>not json</html>")
                    continue
                if self.base == "/error":
                    self.send({"type": "error", "data": {"message": "the action has no move",
                                                         "code": "EXECUTION_ERROR"}})
                    continue
                if self.base == "/drop":
                    break
                if self.base == "/slow":
                    time.sleep(1.5)
                if state is None:
                    self.send({"type": "error", "data": {"message": "reset first",
                                                         "code": "EXECUTION_ERROR"}})
                    continue
                state["turn"] += 1
                first = msg["data"].get("message", "")[:1]
                obs = {"text": "a digit?", "turn": state["turn"]}
                reward, done = None, False
                if first == state["answer"]:
                    obs["text"], reward, done = "right", 1.0, True
                elif first.isdigit():
                    obs["text"] = "higher" if first < state["answer"] else "lower"
                    reward = 0.25
                if self.base == "/huge":
                    obs["text"] = "x" * 20000
                self.send({"type": "observation", "data": {"observation": obs,
                                                           "reward": reward, "done": done}})
        except (Closed, OSError, ValueError, KeyError):
            pass
        if self.conn:
            log({"base": self.base, "conn": self.conn, "type": "gone"})


def main():
    global LOG
    LOG = open(sys.argv[1], "a")
    standin.serve(Handler)


if __name__ == "__main__":
    main()
