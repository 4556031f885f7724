#!/usr/bin/python3
"""Tools on POST /v1/chat/completions (label api; docs/AGENTS.md "Serving what was trained").

The model that calls: the tiny preset trained here, through the daemon, against the stand-in
environment's /ask route (tests/rl/env_server.py: a step is rewarded when the model's turn starts
with '@', the dapod format's call), until its greedy first token is '@'. Its checkpoint is then
served with tools:
- tool_choice auto (the default with tools): the reply's message has tool_calls (the one tool,
  its arguments "{}", an id), content null, finish_reason "tool_calls"; without tools, or with
  tool_choice "none", the same text is plain content;
- parallel_tool_calls false keeps the first call only; a request carrying the assistant's
  tool_calls and the tool's answer (the SDK's loop) is rendered and answered again;
- stream: true: the role chunk, then nothing of the call as content, then one chunk whose
  delta.tool_calls holds the call (index 0, id, type, function name and arguments), then the
  finish chunk "tool_calls"; the accumulated stream equals the non-streamed reply;
- tool_choice "required" and a named function write the call's opening after the prompt: on the
  untrained preset the reply (not a well-formed call) starts with that opening;
- bad tools, tool_choice and parallel_tool_calls are refused with OpenAI's error shape naming the
  parameter.

Run: /usr/bin/python3 tests/api/test_chat_tools.py --dapod build/server/dapod
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_completions  # noqa: E402
import test_jobs  # noqa: E402

LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "the code of a key",
                                           "parameters": {"type": "object", "properties": {}}}}
CALC = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}


class ChatTools(test_jobs.DaemonCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="dapod-chat-tools-")
        env = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "..", "rl", "env_server.py"),
                                os.path.join(cls.tmp, "env.log")], stdout=subprocess.PIPE)
        try:
            port = int(env.stdout.readline())
            lines = "".join(json.dumps({"prompt": "code %d?" % k, "answer": str(k % 10)}) + "\n"
                            for k in range(40))
            fid = cls.upload(lines.encode())["id"]
            body = {"model": "tiny", "training_file": fid, "judge": {"type": "exact"}, "seed": 3,
                    "hyperparameters": {"total_steps": 60, "group_size": 32,
                                        "prompt_batch_size": 4, "max_new_tokens": 1,
                                        "learning_rate": 3e-3, "dynamic_sampling": False,
                                        "checkpoint_every": 60},
                    "episode": {"max_turns": 1, "reward": "environment",
                                "environment": {"type": "http",
                                                "url": "http://127.0.0.1:%d/ask" % port}}}
            r = cls.d.post_json("/v1/jobs", body)
            assert r.status == 201, r
            job = cls.wait_terminal(r.json()["id"])
            assert job["status"] == "succeeded", job
            cls.model = "%s:step-60" % job["id"]
        finally:
            env.kill()
            env.wait()
            env.stdout.close()

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def wait_terminal(cls, job_id):
        """Long polls of 10 s (within the harness's socket timeout) until the job ends."""
        end = time.monotonic() + 600
        while True:
            job = cls.d.get("/v1/jobs/%s?wait=10" % job_id).json()
            if job["status"] in ("succeeded", "failed", "cancelled") or time.monotonic() > end:
                return job

    def chat(self, status=200, **over):
        body = {"model": self.model, "messages": [{"role": "user", "content": "code 12?"}],
                "max_tokens": 1, "temperature": 0, "seed": 3}
        body.update(over)
        r = self.d.post_json("/v1/chat/completions", body)
        self.assertEqual(r.status, status, r)
        return r.json()

    def test_a_call(self):
        plain = self.chat()
        self.assertEqual(plain["choices"][0]["message"]["content"], "@")  # it learned to call
        self.assertNotIn("tool_calls", plain["choices"][0]["message"])
        c = self.chat(tools=[LOOKUP])["choices"][0]
        self.assertEqual(c["finish_reason"], "tool_calls", c)
        self.assertIsNone(c["message"]["content"])
        calls = c["message"]["tool_calls"]
        self.assertEqual(len(calls), 1)
        self.assertEqual((calls[0]["type"], calls[0]["function"]["name"],
                          json.loads(calls[0]["function"]["arguments"])), ("function", "lookup", {}))
        self.assertTrue(calls[0]["id"].startswith("call"))
        none = self.chat(tools=[LOOKUP], tool_choice="none")["choices"][0]
        self.assertEqual((none["message"]["content"], none["finish_reason"]), ("@", "length"))
        self.assertNotIn("tool_calls", none["message"])
        # with two tools a bare '@' names none of them: not a call, plain content
        two = self.chat(tools=[LOOKUP, CALC])["choices"][0]
        self.assertNotEqual(two["finish_reason"], "tool_calls")
        self.assertEqual(two["message"]["content"], "@")
        # the SDK's loop: the call and its answer sent back
        again = self.chat(tools=[LOOKUP], parallel_tool_calls=False, messages=[
            {"role": "user", "content": "code 12?"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "7"}])["choices"][0]
        self.assertEqual(again["finish_reason"], "tool_calls", again)

    def test_stream(self):
        whole = self.chat(tools=[LOOKUP])["choices"][0]
        r = self.d.post_json("/v1/chat/completions", {
            "model": self.model, "messages": [{"role": "user", "content": "code 12?"}],
            "max_tokens": 1, "temperature": 0, "seed": 3, "stream": True, "tools": [LOOKUP]})
        self.assertEqual(r.status, 200, r)
        frames = test_completions.sse(r.body)
        self.assertEqual(frames[-1], "[DONE]")
        chunks = [json.loads(f) for f in frames[:-1]]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        self.assertEqual(deltas[0].get("role"), "assistant")
        content = "".join(d.get("content") or "" for d in deltas)
        self.assertEqual(content, "")  # the call never goes out as text
        tool_deltas = [d["tool_calls"] for d in deltas if "tool_calls" in d]
        self.assertEqual(len(tool_deltas), 1)
        call = tool_deltas[0][0]
        self.assertEqual((call["index"], call["type"], call["function"]["name"],
                          call["function"]["arguments"]),
                         (0, "function", "lookup", whole["message"]["tool_calls"][0]["function"]
                          ["arguments"]))
        self.assertTrue(call["id"])
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        self.assertEqual(finish[-1], "tool_calls")

    def test_forced_opening(self):
        # the untrained preset: the call's opening is written, the model continues from it
        for choice, opening in (("required", "@"),
                                ({"type": "function", "function": {"name": "calc"}}, "@calc ")):
            c = self.chat(model="tiny", max_tokens=3, temperature=1.0, tools=[LOOKUP, CALC],
                          tool_choice=choice)["choices"][0]
            if c["finish_reason"] == "tool_calls":  # a well-formed call after all
                name = c["message"]["tool_calls"][0]["function"]["name"]
                self.assertIn(name, ("lookup", "calc") if opening == "@" else ("calc",))
            else:
                self.assertTrue(c["message"]["content"].startswith(opening), (choice, c))

    def test_refusals(self):
        bad = [({"tools": [{"type": "web_search"}]}, "tools[0].type"),
               ({"tools": [{"type": "function", "function": {"name": "a b"}}]},
                "tools[0].function.name"),
               ({"tools": [LOOKUP, LOOKUP]}, "tools[1].function.name"),
               ({"tools": [{"type": "function", "function": {"name": "x", "parameters": 3}}]},
                "tools[0].function.parameters"),
               ({"tool_choice": "auto"}, "tool_choice"),
               ({"tools": [LOOKUP], "tool_choice": {"type": "function",
                                                    "function": {"name": "calc"}}},
                "tool_choice"),
               ({"tools": [LOOKUP], "tool_choice": "sometimes"}, "tool_choice"),
               ({"tools": [LOOKUP], "parallel_tool_calls": "yes"}, "parallel_tool_calls")]
        for over, param in bad:
            e = self.chat(status=400, **over)["error"]
            self.assertEqual(e["param"], param, (over, e))
            self.assertIn(param, e["message"])


if __name__ == "__main__":
    sys.exit(test_jobs.main())
