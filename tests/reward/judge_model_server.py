#!/usr/bin/python3
"""A stand-in OpenAI-compatible judge model for the score_model and label_model graders' tests
(Python standard library only; tests/standin.py): POST /v1/chat/completions answers from the
rendered messages, deterministically; its port is printed first.

The user message's lines "Answer: X" and "Reference: Y" decide: score_model (response_format
name score_model_result) gives result 1.0 when X == Y, else 0.2; label_model
(label_model_result) gives label "correct" or "wrong". A marker anywhere in the messages changes
the answer: CLAMP (result 7), NEGATIVE (result -3), NONJSON (content not JSON), NONUMBER (result
"high"), BADLABEL (label "maybe"), REFUSE (message.refusal set), FLAKY (HTTP 500 for the first
attempt of each distinct body, then the answer), FAIL (HTTP 500 always), SLOW (answers after
3 s), PAUSE (answers after 0.2 s: overlapping requests show), NOTCHAT (a 2xx reply that is no
chat completion), BADUSAGE (usage of strings and negative numbers: counted as 0). usage: prompt_tokens = the words of the messages, completion_tokens = 5.

model_rank (response_format name model_rank_result): the blocks "Response k:\n<text>" (up to
the next such line) are the group's responses; each scores 1.0 when its text equals the
Reference line's, else 0.2 (with HASH: the sum of its code points mod 10, over 10, so each
response has its own score); CLAMP gives the first 7, SHORT one score fewer than asked,
NONUMBER a string first.

GET /requests gives every request received ([{"authorization", "body"}]), GET /stats
{"max_in_flight"} the most PAUSE requests it held at once; POST /reset clears them. Run: /usr/bin/python3 tests/reward/judge_model_server.py
"""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import standin  # noqa: E402

LOCK = threading.Lock()
REQUESTS = []
SEEN = {}
FLIGHT = {"now": 0, "max": 0}


def field(text, name):
    for line in text.splitlines():
        if line.startswith(name + ": "):
            return line[len(name) + 2:]
    return None


def responses(text):
    """The blocks "Response k:" of a model_rank request, in order."""
    out, cur = [], None
    for line in text.split("\n"):
        if line == "Response %d:" % (len(out) + 1):
            cur = []
            out.append(cur)
        elif cur is not None:
            cur.append(line)
    return ["\n".join(b).rstrip("\n") for b in out]


def rank_score(response, ref, hashed):
    """The score the stand-in ranks a response with."""
    if hashed:
        return sum(map(ord, response)) % 10 / 10
    return 1.0 if response == ref else 0.2


def rank(text, schema):
    """The scores of a model_rank request's responses."""
    want = schema["properties"]["scores"]["minItems"]
    ref = field(text, "Reference")
    scores = [rank_score(r, ref, "HASH" in text) for r in responses(text)][:want]
    if "CLAMP" in text:
        scores[0] = 7
    if "NONUMBER" in text:
        scores[0] = "high"
    if "SHORT" in text:
        scores = scores[:-1]
    return scores


class Handler(standin.JsonHandler):
    def do_GET(self):
        with LOCK:
            if self.path == "/stats":
                return self.reply(200, {"max_in_flight": FLIGHT["max"]})
            if self.path == "/requests":
                return self.reply(200, list(REQUESTS))
        return self.reply(404, {"error": "not found"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        if self.path == "/reset":
            with LOCK:
                REQUESTS.clear()
                SEEN.clear()
                FLIGHT["max"] = 0
            return self.reply(200, {})
        if self.path != "/v1/chat/completions":
            return self.reply(404, {"error": "not found"})
        paused = b"PAUSE" in raw  # counted: a SLOW request of an earlier test may still sleep
        with LOCK:
            FLIGHT["now"] += paused
            FLIGHT["max"] = max(FLIGHT["max"], FLIGHT["now"])
        try:
            status, reply = self.answer(raw)
        finally:
            with LOCK:  # before the reply goes out: the client may send its next request then
                FLIGHT["now"] -= paused
        self.reply(status, reply)

    def answer(self, raw):
        """The status and reply for the request body raw."""
        body = json.loads(raw)
        with LOCK:
            REQUESTS.append({"authorization": self.headers.get("Authorization"), "body": body})
            SEEN[raw] = SEEN.get(raw, 0) + 1
            attempt = SEEN[raw]
        text = "\n".join(m["content"] for m in body["messages"])
        if "FAIL" in text or ("FLAKY" in text and attempt == 1):
            return 500, {"error": {"message": "stand-in failure"}}
        if "SLOW" in text:
            time.sleep(3)
        if "PAUSE" in text:
            time.sleep(0.2)
        if "NOTCHAT" in text:
            return 200, {"result": 1}
        name = body["response_format"]["json_schema"]["name"]
        label = name == "label_model_result"
        same = field(text, "Answer") == field(text, "Reference")
        if name == "model_rank_result":
            answer = {"scores": rank(text, body["response_format"]["json_schema"]["schema"])}
        elif label:
            answer = {"label": "maybe" if "BADLABEL" in text else "correct" if same else "wrong"}
        else:
            result = 7 if "CLAMP" in text else -3 if "NEGATIVE" in text else 1.0 if same else 0.2
            if "NONUMBER" in text:
                result = "high"
            answer = {"result": result, "steps": [{"description": "compare",
                                                   "conclusion": "same" if same else "differs"}]}
        content = "this is not JSON" if "NONJSON" in text else json.dumps(answer)
        message = {"role": "assistant", "content": content, "refusal": None}
        if "REFUSE" in text:
            message = {"role": "assistant", "content": None, "refusal": "I cannot grade this."}
        words = len(text.split())
        if "BADUSAGE" in text:
            return 200, {"choices": [{"index": 0, "message": message}],
                         "usage": {"prompt_tokens": "many", "completion_tokens": -4}}
        return 200, {"id": "chatcmpl-standin", "object": "chat.completion", "model": body["model"],
                     "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": words, "completion_tokens": 5,
                               "total_tokens": words + 5}}


if __name__ == "__main__":
    standin.serve(Handler)
