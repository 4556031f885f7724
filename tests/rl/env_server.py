"""A stand-in environment for tests/rl/test_episodes.c (Python standard library only): dapod's
HTTP environment protocol (docs/AGENTS.md), POST {base}/reset, {base}/step, {base}/close, with
an episode's state kept by its episode_id; every call is written to the log file given as its
argument, a JSON line {"base", "route", "attempt", "body"} each.

The game: guess the dataset line's answer (a digit). /reset observes {"messages": [a system
message "digits", a user message "guess"]}; each /step reads the action's first character: the
answer ends the episode with reward 1 ("right"), another digit gets 0.25 and "higher" or
"lower", anything else no reward (null) and "a digit?". The replies depend on the calls alone, so
the environment is deterministic.

The base path chooses how it behaves:
  /guess         as above
  /flaky         each call fails (HTTP 500) on its first attempt, then answers as /guess: retries
                 must leave no trace in what the model sees
  /down          every call fails with HTTP 500
  /garbage       /reset answers, /step replies with a body that is not JSON
  /badobs        /step's observation is a number (not a string, messages or null)
  /done          /reset already says done (the episode has no turn)
  /slow          as /guess, 30 ms a call
  /ask           no observation; one step, rewarded 1 when the action starts with '@' (a dapod
                 call), else 0: trains a model that always calls (tests/api/test_chat_tools.py)

Run: python3 env_server.py LOG  (prints the port it listens on, on 127.0.0.1, as its first line)
"""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import standin  # noqa: E402

LOCK = threading.Lock()
LOG = None  # the log file
STATE = {}  # (base, episode_id) -> {"answer", "turns"}
ATTEMPTS = {}  # (base, route, body) -> attempts seen


class Handler(standin.JsonHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n) or b"{}"
        body = json.loads(raw)
        base, _, route = self.path.rpartition("/")
        with LOCK:
            key = (base, route, raw)
            ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
            attempt = ATTEMPTS[key]
            LOG.write(json.dumps({"base": base, "route": route, "attempt": attempt,
                                  "body": body}) + "\n")
            LOG.flush()
        status, answer = self.answer(base, route, body, attempt)
        self.reply(status, answer)

    def answer(self, base, route, body, attempt):
        if base == "/down" or (base == "/flaky" and attempt == 1):
            return 500, {"error": "try again"}
        if base == "/slow":
            time.sleep(0.03)
        key = (base, body.get("episode_id"))
        if base == "/ask":
            if route == "reset":
                return 200, {"observation": None, "reward": None, "done": False}
            if route == "step":
                hit = body["action"]["content"].startswith("@")
                return 200, {"observation": None, "reward": 1.0 if hit else 0.0, "done": True}
            return 200, {}
        if route == "reset":
            with LOCK:
                STATE[key] = {"answer": str(body["item"]["answer"]), "turns": 0}
            if base == "/done":
                return 200, {"observation": None, "reward": 0.5, "done": True}
            return 200, {"observation": {"messages": [{"role": "system", "content": "digits"},
                                                      {"role": "user", "content": "guess"}]},
                         "reward": None, "done": False}
        if route == "step":
            if base == "/garbage":
                return 200, b"<html>not json</html>"
            if base == "/badobs":
                return 200, {"observation": 7, "done": False}
            with LOCK:
                st = STATE.get(key)
            if st is None:
                return 404, {"error": "no such episode"}
            text = body["action"]["content"]
            first = text[:1]
            if first == st["answer"]:
                return 200, {"observation": "right", "reward": 1.0, "done": True,
                             "info": {"turn": body["turn"]}}
            if first.isdigit():
                word = "higher" if first < st["answer"] else "lower"
                return 200, {"observation": word, "reward": 0.25, "done": False}
            return 200, {"observation": "a digit?", "reward": None, "done": False}
        if route == "close":
            with LOCK:
                STATE.pop(key, None)
            return 200, {}
        return 404, {}


def main():
    global LOG
    LOG = open(sys.argv[1], "a")
    standin.serve(Handler)


if __name__ == "__main__":
    main()
