#!/usr/bin/python3
"""Structured outputs through the daemon: response_format on /v1/chat/completions and
/v1/completions (label api), on the tiny preset (random weights: what it writes is the mask's).

- json_schema (strict): every choice that ends by "stop" parses, validates with
  python3-jsonschema and gives its keys in schema order, over seeds and n = 4; json_object gives a
  JSON object; the same on /v1/completions.
- A reply cut by max_tokens says finish_reason "length" (its text a prefix, not JSON).
- The log-probs are those of the constrained distribution: the first token of any JSON object is
  '{', the only one allowed, so its logprob is exactly 0 and top_logprobs lists it alone.
- Streamed: the deltas, joined, equal the whole reply for the same seed (both routes).
- A schema whose next character the tokenizer has no token for (the preset's ASCII and a key
  "é"): refused naming response_format (422), not sampled from a row of -inf.
- Refusals: a keyword outside the subset (400, OpenAI's error with param
  response_format.json_schema.schema.properties.x.foo), a fraction's multipleOf, a bad name, an
  unknown type,
  response_format beside tools; /v1/completions answers 422 naming the same field.

Run: /usr/bin/python3 tests/api/test_response_format.py --dapod build/server/dapod
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import jsonschema
except ImportError:
    print("test_response_format: python3-jsonschema is missing; skipped", file=sys.stderr)
    sys.exit(77)
import harness  # noqa: E402,F401
import test_jobs  # noqa: E402

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "pet": {"anyOf": [{"enum": ["cat", "dog"]}, {"type": "null"}]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                                  "maxItems": 2}},
          "required": ["name", "age", "pet", "tags"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
MESSAGES = [{"role": "user", "content": "Who?"}]


def key_order_ok(value):
    return list(value) == [k for k in PERSON["properties"] if k in value]


class ResponseFormat(test_jobs.DaemonCase):
    ARGS = ("--workers", "1", "--blas-threads", "1")

    def chat(self, status=200, **kw):
        body = dict({"model": "tiny", "messages": MESSAGES, "max_tokens": 120, "seed": 1,
                     "response_format": RF}, **kw)
        r = self.d.post_json("/v1/chat/completions", body)
        self.assertEqual(r.status, status, r.body[:500])
        return r.json()

    def complete(self, status=200, **kw):
        body = dict({"model": "tiny", "prompt": "Who?", "max_tokens": 120, "seed": 1,
                     "response_format": RF}, **kw)
        r = self.d.post_json("/v1/completions", body)
        self.assertEqual(r.status, status, r.body[:500])
        return r.json()

    def stream(self, path, body):
        r = self.d.post_json(path, dict(body, stream=True))
        self.assertEqual(r.status, 200, r.body[:300])
        return [json.loads(x[6:]) for x in r.body.decode().split("\n\n")
                if x.startswith("data: {")]

    def check_valid(self, text, schema=PERSON):
        value = json.loads(text)
        jsonschema.validate(value, schema)
        self.assertEqual(text, json.dumps(value, separators=(",", ":"), ensure_ascii=False))
        return value

    def test_1_chat_schema(self):
        done = 0
        for seed in range(1, 7):
            reply = self.chat(seed=seed, n=4, temperature=1.0)
            for ch in reply["choices"]:
                text = ch["message"]["content"]
                if ch["finish_reason"] == "stop":
                    self.assertTrue(key_order_ok(self.check_valid(text)), text)
                    done += 1
                else:
                    self.assertEqual(ch["finish_reason"], "length")
        print("chat: %d of 24 choices complete and valid" % done, file=sys.stderr)
        self.assertGreaterEqual(done, 12)

    def test_2_json_object_and_completions(self):
        reply = self.chat(response_format={"type": "json_object"}, n=4, max_tokens=200,
                          temperature=1.0)
        objects = 0
        for ch in reply["choices"]:
            if ch["finish_reason"] == "stop":
                self.assertIsInstance(json.loads(ch["message"]["content"]), dict)
                objects += 1
        self.assertGreater(objects, 0)
        done = 0
        for seed in (1, 2, 3):
            for ch in self.complete(seed=seed, n=4, temperature=1.0)["choices"]:
                if ch["finish_reason"] == "stop":
                    self.assertTrue(key_order_ok(self.check_valid(ch["text"])), ch["text"])
                    done += 1
        self.assertGreaterEqual(done, 6)
        # {"type": "text"} and null are free text, as without response_format
        free = self.chat(response_format=None, max_tokens=8)["choices"][0]["message"]["content"]
        self.assertEqual(free, self.chat(response_format={"type": "text"},
                                         max_tokens=8)["choices"][0]["message"]["content"])

    def test_3_length_and_constrained_logprobs(self):
        ch = self.chat(max_tokens=12, logprobs=True, top_logprobs=5)["choices"][0]
        self.assertEqual(ch["finish_reason"], "length")
        self.assertTrue(ch["message"]["content"].startswith('{"name":"'), ch)
        first = ch["logprobs"]["content"][0]
        # the mask leaves '{' alone: the constrained distribution gives it probability 1
        self.assertEqual((first["token"], first["logprob"]), ("{", 0.0))
        self.assertEqual([a["token"] for a in first["top_logprobs"]], ["{"])
        # after '{"name":"' any of the string's characters may come: several alternatives
        self.assertGreater(len(ch["logprobs"]["content"][-1]["top_logprobs"]), 1)
        leg = self.complete(max_tokens=3, logprobs=5)["choices"][0]
        self.assertEqual(leg["finish_reason"], "length")
        self.assertEqual(leg["logprobs"]["token_logprobs"][0], 0.0)
        self.assertEqual(list(leg["logprobs"]["top_logprobs"][0]), ["{"])

    def test_4_stream_equals_whole(self):
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 120, "seed": 5, "n": 2,
                "temperature": 1.0, "response_format": RF}
        whole = self.chat(**body)
        chunks = self.stream("/v1/chat/completions", body)
        for i, w in enumerate(whole["choices"]):
            text = "".join(ch["delta"].get("content") or "" for c in chunks
                           for ch in c["choices"] if ch["index"] == i)
            self.assertEqual(text, w["message"]["content"])
            fin = [ch["finish_reason"] for c in chunks for ch in c["choices"]
                   if ch["index"] == i and ch.get("finish_reason")]
            self.assertEqual(fin, [w["finish_reason"]])
        leg = {"model": "tiny", "prompt": "Who?", "max_tokens": 120, "seed": 5, "n": 2,
               "temperature": 1.0, "response_format": RF}
        whole = self.complete(**leg)
        chunks = self.stream("/v1/completions", leg)
        for i, w in enumerate(whole["choices"]):
            text = "".join(ch["text"] for c in chunks for ch in c["choices"] if ch["index"] == i)
            self.assertEqual(text, w["text"])

    def test_5_refusals(self):
        def schema(s):
            return {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                           "schema": s}}
        cases = [
            (schema({"type": "object", "properties": {"x": {"type": "string", "foo": 1}}}),
             "response_format.json_schema.schema.properties.x.foo"),
            (schema({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.5}}}),
             "response_format.json_schema.schema.properties.n.multipleOf"),
            (schema({"type": "object", "allOf": []}), "response_format.json_schema.schema.allOf"),
            ({"type": "json_schema", "json_schema": {"name": "bad name", "schema": PERSON}},
             "response_format.json_schema.name"),
            ({"type": "yaml"}, "response_format.type"),
        ]
        for rf, param in cases:
            err = self.chat(400, response_format=rf)["error"]
            self.assertEqual((err["param"], err["code"], err["type"]),
                             (param, "invalid_value", "invalid_request_error"), err)
            self.assertTrue(err["message"].startswith(param + ": "), err)
            r = self.d.post_json("/v1/completions", {"model": "tiny", "prompt": "x",
                                                     "response_format": rf})
            self.assertProblem(r, 422, "validation_failed")
            self.assertEqual([e["field"] for e in r.json()["errors"]], [param])
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        err = self.chat(400, tools=tools)["error"]
        self.assertEqual(err["param"], "response_format")

    def test_6_vocabulary_cannot_write_it(self):
        # the tiny preset's characters are ASCII: a required key "é" has no token; the reply is
        # refused naming response_format rather than sampled from a row of -inf
        rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"\u00e9": {"type": "null"}}, "required": ["\u00e9"],
            "additionalProperties": False}}}
        r = self.d.post_json("/v1/completions", {"model": "tiny", "prompt": "x",
                                                 "response_format": rf, "max_tokens": 8})
        self.assertProblem(r, 422, "validation_failed")
        self.assertEqual([e["field"] for e in r.json()["errors"]], ["response_format"])
        self.assertIn("no token for what the schema requires", r.json()["errors"][0]["message"])


if __name__ == "__main__":
    sys.exit(test_jobs.main())
