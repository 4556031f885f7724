#!/usr/bin/python3
"""The completion service behind POST /v1/completions (label api): completions are sampled on the
daemon's completion threads, in the order they came, within memory_limit_bytes beside the jobs,
from opened models kept between requests (server/completions.h).
- ModelCache: a second completion on the same model does not open it again
  (dapod_completion_model_loads_total), and gives the same samples for the same seed; a model
  folder changed on disk is opened again; beyond completion_cache_models the least recently used
  model is closed.
- NeverFits: a completion whose weights plus generation state exceed memory_limit_bytes is refused
  at once with a 422 naming max_tokens and n (or the model when its weights alone do not fit),
  while a small one on the same daemon is served.
- QueueAndMemory: with a job running under a limit that leaves room for the model and a small
  completion but not for a large one, the large one waits for memory at the head of the queue; a
  small one behind it is not served ahead of it; one more is answered 503 with Retry-After at
  once (completion_queue 2); when the job ends both are served, in order, and the model is still
  the one opened once.
- WaitBound: a completion that cannot get memory within completion_wait_s is answered 503 with
  Retry-After, and lets go of what it held.
- StopAndStream: a stop string ends its choice at the token that completed it (a two-token one
  through the text, a one-token one as a stop id of the sampler): the text is cut before it, the
  tokens, log-probs and usage are exactly the sampled ones up to that token, finish_reason stop;
  with stream: true, /v1/completions and /v1/chat/completions send one chunk per token, round by
  round and choice by choice (n > 1, logprobs, stop, max_tokens), whose concatenation is the
  non-streamed answer with the same seed, then the usage chunk and `data: [DONE]`.
Nothing here depends on timing: states are read from /metrics (polled with a deadline), sizes
come from the daemon (the job's memory plan, the model's weights) and from the KV cache's own
arithmetic (see QueueAndMemory).

Run: /usr/bin/python3 tests/api/test_completions.py --dapod build/server/dapod
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import test_jobs  # noqa: E402

DaemonCase = test_jobs.DaemonCase
MiB = 1 << 20
# A large completion: 8 samples of 300 new tokens. The tiny preset's KV cache alone takes
# 2 (K, V) * 2 layers * 2 KV heads * 16 dims * 4 bytes = 512 bytes per token and sample, so this
# needs at least 8 * 301 * 512 = 1,232,896 bytes beside the weights: more than 1 MiB.
LARGE = {"model": "tiny", "prompt": "1+1=", "max_tokens": 300, "n": 8, "seed": 1}
# A small one: 1 sample of 4 tokens, far less than 1 MiB beside the weights.
SMALL = {"model": "tiny", "prompt": "2+2=", "max_tokens": 4, "n": 1, "seed": 2}
DEADLINE_S = test_jobs.DEADLINE_S


def metrics(d):
    """Every sample of /metrics: {"name{labels}": value}."""
    out = {}
    for line in d.get("/metrics").body.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def wait_metrics(d, pred, what, deadline_s=DEADLINE_S):
    """Reads /metrics until pred(samples) holds; returns the samples (fails past the deadline)."""
    end = time.monotonic() + deadline_s
    while True:
        m = metrics(d)
        if pred(m):
            return m
        if time.monotonic() > end:
            raise AssertionError("%s did not happen within %.0f s: %s\n%s"
                                 % (what, deadline_s, {k: v for k, v in m.items()
                                                       if "completion" in k or "memory" in k},
                                    d.log()[-3000:]))
        time.sleep(0.02)


def ok(m):
    return m['dapod_completions_total{outcome="ok"}']


class Post(threading.Thread):
    """A completion posted on its own thread (the test goes on while it waits)."""

    def __init__(self, d, body):
        super().__init__(daemon=True)
        self.d, self.body, self.r = d, body, None

    def run(self):
        self.r = self.d.post_json("/v1/completions", self.body, timeout=DEADLINE_S)

    def result(self):
        self.join(DEADLINE_S)
        assert not self.is_alive(), "no answer to %r" % self.body
        return self.r


_plan = {}


def job_plan(file_data):
    """The memory plan total of a test_jobs.long_hp job on the tiny preset, learnt once from an
    unlimited daemon (as test_models.Admission does), and the tiny preset's weight bytes."""
    if not _plan:
        with harness.Daemon(test_jobs.DAPOD, ("--workers", "1", "--blas-threads", "1")) as d:
            r = d.request("POST", "/v1/files?purpose=fine-tune&filename=data.jsonl",
                          body=file_data, headers={"Content-Type": "application/x-ndjson"})
            assert r.status == 201, r
            j = d.post_json("/v1/jobs", {"model": "tiny", "training_file": r.json()["id"],
                                         "hyperparameters": test_jobs.long_hp(10000)}).json()
            _plan["job"] = j["memory"]["total_bytes"]
            d.post_json("/v1/jobs/%s/cancel" % j["id"], {})
            _plan["weights"] = d.get("/v1/models/tiny").json()["memory"]["weights_bytes"]
            assert d.stop() == 0, d.log()
    return _plan["job"], _plan["weights"]


class ModelCache(DaemonCase):
    ARGS = ("--workers", "1", "--blas-threads", "1", "--completion-cache-models", "2")

    def complete(self, body):
        return self.assertJson(self.d.post_json("/v1/completions", body), 200)

    def loads(self):
        return metrics(self.d)["dapod_completion_model_loads_total"]

    def test_1_opened_once(self):
        before = self.loads()
        body = dict(SMALL, n=3, max_tokens=8, logprobs=True)
        first = self.complete(body)
        self.assertEqual(self.loads(), before + 1)
        again = self.complete(body)
        self.assertEqual(again, first)  # the kept model samples what a fresh one did
        self.assertEqual(self.loads(), before + 1)  # and was not opened again
        m = metrics(self.d)
        self.assertEqual(m["dapod_memory_reserved_bytes"], 0)
        self.assertEqual(m["dapod_memory_cached_bytes"],
                         self.d.get("/v1/models/tiny").json()["memory"]["weights_bytes"])

    def test_2_changed_folder_is_opened_again(self):
        folder = os.path.join(self.d.models_dir, "m1")

        def save(seed):
            shutil.rmtree(folder, ignore_errors=True)
            r = subprocess.run([test_jobs.DAPOD, "save-preset", "tiny", folder, "--seed",
                                str(seed)], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)

        save(7)
        body = dict(SMALL, model="m1", max_tokens=8)
        before = self.loads()
        a = self.complete(body)
        self.assertEqual(self.loads(), before + 1)
        self.assertEqual(self.complete(body), a)
        self.assertEqual(self.loads(), before + 1)
        save(8)  # new files (other weights) under the same name
        self.complete(body)
        self.assertEqual(self.loads(), before + 2)

    def test_3_least_recently_used_goes(self):
        # tiny, then two other models: with room for two, tiny (the least recently used) is
        # closed; asking for it again opens it again
        self.complete(SMALL)
        m = metrics(self.d)
        loads, evictions = m["dapod_completion_model_loads_total"], \
            m["dapod_completion_model_evictions_total"]
        open0 = m["dapod_completion_models_open"]  # tiny, and m1 when test_2 ran
        folder = os.path.join(self.d.models_dir, "m2")
        if not os.path.isdir(folder):
            r = subprocess.run([test_jobs.DAPOD, "save-preset", "tiny", folder, "--seed", "9"],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
        self.complete(dict(SMALL, model="tiny-qwen2"))
        self.complete(dict(SMALL, model="m2"))
        m = metrics(self.d)
        self.assertEqual(m["dapod_completion_models_open"], 2)
        self.assertEqual(m["dapod_completion_model_evictions_total"], evictions + open0)
        self.assertEqual(m["dapod_completion_model_loads_total"], loads + 2)
        self.complete(SMALL)
        self.assertEqual(self.loads(), loads + 3)


class NeverFits(DaemonCase):
    ARGS = ("--workers", "1", "--blas-threads", "1", "--memory-limit-bytes", "1M")

    def test_too_large_is_refused_at_once(self):
        p = self.assertProblem(self.d.post_json("/v1/completions", dict(LARGE, max_tokens=400)),
                               422, "validation_failed")
        self.assertFields(p, "max_tokens", "n")
        msg = p["errors"][0]["message"]
        for part in ("memory_limit_bytes (1048576)", "max_tokens 400", "n 8",
                     "lower max_tokens or n"):
            self.assertIn(part, msg)
        # the weights of the small preset (9.5 M parameters) alone do not fit: the model is named
        p = self.assertProblem(self.d.post_json("/v1/completions", dict(SMALL, model="small")),
                               422, "validation_failed")
        self.assertFields(p, "model")
        self.assertIn("memory_limit_bytes", p["errors"][0]["message"])
        # a small completion fits
        self.assertJson(self.d.post_json("/v1/completions", SMALL), 200)
        m = metrics(self.d)
        self.assertEqual(m['dapod_completions_total{outcome="too_large"}'], 2)
        self.assertEqual(ok(m), 1)
        self.assertEqual(m["dapod_memory_limit_bytes"], MiB)
        self.assertEqual(m["dapod_memory_reserved_bytes"], 0)


class QueueAndMemory(DaemonCase):
    """One completion thread, a queue of 2, and memory for the running job, the tiny model and
    1 MiB: the small completion fits beside the job, the large one does not."""
    ARGS = ("--workers", "1", "--blas-threads", "1", "--completion-threads", "1",
            "--completion-queue", "2", "--log-level", "debug")

    @classmethod
    def prepare(cls):
        cls.plan, cls.weights = job_plan(test_jobs.read("addition.jsonl"))
        cls.limit = cls.plan + cls.weights + MiB
        cls.d.stop()
        cls.d.cleanup()
        cls.d = harness.Daemon(test_jobs.DAPOD, cls.ARGS + ("--memory-limit-bytes",
                                                            str(cls.limit)))
        cls.d.start()
        cls.file_id = cls.upload(test_jobs.read("addition.jsonl"))["id"]

    def test_waits_for_memory_in_order_and_refuses_beyond_the_queue(self):
        job = self.create_ok(test_jobs.long_hp(10000))
        self.assertEqual(job["memory"]["total_bytes"], self.plan)
        self.wait_status(job["id"], "running")
        m = metrics(self.d)
        self.assertEqual(m["dapod_memory_reserved_bytes"], self.plan)

        # the large completion opens the model, then waits for memory: the job holds it
        large = Post(self.d, LARGE)
        large.start()
        m = wait_metrics(self.d, lambda m: m["dapod_completions_waiting_memory"] == 1,
                         "the large completion waiting for memory")
        self.assertEqual(m["dapod_memory_reserved_bytes"], self.plan + self.weights)
        self.assertLessEqual(m["dapod_memory_reserved_bytes"] + m["dapod_memory_cached_bytes"],
                             self.limit)

        # the small one would fit, but waits behind it
        small = Post(self.d, SMALL)
        small.start()
        wait_metrics(self.d, lambda m: m["dapod_completions_waiting"] == 2,
                     "the small completion queued behind the large one")

        # one more than the queue holds: 503 at once, with Retry-After
        p = self.assertProblem(self.d.post_json("/v1/completions", SMALL, timeout=30), 503,
                               "unavailable", "completion_queue 2")
        self.assertRegex(self.d.post_json("/v1/completions", SMALL).header("Retry-After") or "",
                         r"^[1-9][0-9]*$")
        m = metrics(self.d)
        self.assertEqual(m['dapod_completions_total{outcome="busy"}'], 2)
        self.assertEqual(ok(m), 0)  # nothing was served ahead of the large one
        self.assertEqual((m["dapod_completions_waiting"], m["dapod_completions_waiting_memory"]),
                         (2, 1))
        self.assertEqual(m["dapod_memory_reserved_bytes"], self.plan + self.weights)

        # the job ends: both are served, the large one first
        self.assertEqual(self.d.post_json("/v1/jobs/%s/cancel" % job["id"], {}).status, 200)
        self.wait_status(job["id"], "cancelled")
        a = self.assertJson(large.result(), 200)
        b = self.assertJson(small.result(), 200)
        self.assertEqual(len(a["choices"]), 8)
        self.assertEqual(len(b["choices"]), 1)
        # each logs its end before its reply, but the log is read by a thread of its own
        pattern = r"completion (\d+) \(tiny\): ok, n (\d+),"
        self.d.wait_log(lambda log: len(re.findall(pattern, log)) >= 2, "both completions' ends")
        served = [(int(s), int(n)) for s, n in re.findall(pattern, self.d.log())]
        self.assertEqual([n for _, n in served], [8, 1], served)
        self.assertLess(served[0][0], served[1][0])

        # the model was opened once, and is kept
        again = self.assertJson(self.d.post_json("/v1/completions", SMALL), 200)
        self.assertEqual(again, b)
        m = metrics(self.d)
        self.assertEqual(m["dapod_completion_model_loads_total"], 1)
        self.assertEqual(ok(m), 3)
        self.assertEqual(m["dapod_memory_reserved_bytes"], 0)
        self.assertEqual(m["dapod_memory_cached_bytes"], self.weights)


class WaitBound(DaemonCase):
    """As QueueAndMemory, with completion_wait_s 1: the large completion gives up."""
    ARGS = ("--workers", "1", "--blas-threads", "1", "--completion-wait-s", "1")

    @classmethod
    def prepare(cls):
        QueueAndMemory.prepare.__func__(cls)

    def test_gives_up_after_completion_wait_s(self):
        job = self.create_ok(test_jobs.long_hp(10000))
        self.wait_status(job["id"], "running")
        r = self.d.post_json("/v1/completions", LARGE, timeout=DEADLINE_S)
        self.assertProblem(r, 503, "unavailable", "completion_wait_s (1 s)")
        self.assertRegex(r.header("Retry-After") or "", r"^[1-9][0-9]*$")
        # it let go of the model (kept, as cached memory) and of its place
        m = wait_metrics(self.d, lambda m: m["dapod_completions_waiting"] == 0,
                         "the timed-out completion leaving the queue")
        self.assertEqual(m['dapod_completions_total{outcome="timeout"}'], 1)
        self.assertEqual(m["dapod_memory_reserved_bytes"], self.plan)
        self.assertEqual(m["dapod_memory_cached_bytes"], self.weights)
        # a small one is served beside the job meanwhile, from the kept model
        self.assertJson(self.d.post_json("/v1/completions", SMALL), 200)
        self.assertEqual(metrics(self.d)["dapod_completion_model_loads_total"], 1)
        self.assertEqual(self.d.post_json("/v1/jobs/%s/cancel" % job["id"], {}).status, 200)
        self.wait_status(job["id"], "cancelled")


def sse(body):
    """The data of each event of a server-sent event stream (JSON chunks, the last "[DONE]")."""
    events = body.decode().split("\n\n")
    assert events[-1] == "", "the stream does not end with a blank line: %r" % events[-1:]
    out = []
    for e in events[:-1]:
        assert e.startswith("data: ") and "\n" not in e, "not one data line: %r" % e
        out.append(e[len("data: "):])
    return out


def rounds(lens):
    """The choices of the token chunks in order: round by round, each choice still running."""
    return [i for k in range(max(lens)) for i, n in enumerate(lens) if k < n]


class StopAndStream(DaemonCase):
    ARGS = ("--workers", "1", "--blas-threads", "1")
    BASE = {"model": "tiny", "prompt": "1+1=", "max_tokens": 40, "n": 3, "seed": 5,
            "logprobs": True}
    CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "What is 1+1?"}],
            "max_tokens": 30, "n": 3, "seed": 7, "logprobs": True, "top_logprobs": 1}

    def complete(self, **kw):
        return self.assertJson(self.d.post_json("/v1/completions", dict(self.BASE, **kw)), 200)

    def stream(self, path, body):
        r = self.d.post_json(path, dict(body, stream=True, stream_options={"include_usage": True}))
        self.assertEqual(r.status, 200, r.body[:500])
        self.assertTrue(r.header("Content-Type").startswith("text/event-stream"))
        data = sse(r.body)
        self.assertEqual(data[-1], "[DONE]")
        return [json.loads(x) for x in data[:-1]]

    def stops(self):
        """A two-token and a one-token stop string of the char-level preset, from choice 0."""
        text = self.complete()["choices"][0]["text"]
        self.assertGreaterEqual(len(text), 8, text)
        return [text[5:7], text[6]]

    def test_1_stop_ends_generation(self):
        full = self.complete()
        for stop in self.stops():
            got = self.complete(stop=[stop, "never there"])
            cut = 0
            for f, g in zip(full["choices"], got["choices"]):
                at = f["text"].find(stop)
                if at < 0:
                    self.assertEqual(g, f)
                    continue
                cut += 1
                lp, flp = g["logprobs"], f["logprobs"]
                m = len(lp["tokens"])
                # the sampled tokens up to the one that completed the stop string, no more
                for key in ("tokens", "token_ids", "token_logprobs"):
                    self.assertEqual(lp[key], flp[key][:m], key)
                self.assertIn(stop, "".join(lp["tokens"]))
                self.assertNotIn(stop, "".join(lp["tokens"][:-1]))
                self.assertEqual(g["text"], f["text"][:at])
                self.assertEqual(g["finish_reason"], "stop")
            self.assertGreaterEqual(cut, 1)
            n = sum(len(c["logprobs"]["tokens"]) for c in got["choices"])
            self.assertEqual(got["usage"]["completion_tokens"], n)
            self.assertLess(n, full["usage"]["completion_tokens"])

    def test_2_completions_stream(self):
        for kw in ({}, {"stop": self.stops()[:1]}, {"logprobs": False, "max_tokens": 3}):
            whole = self.complete(**kw)
            chunks = self.stream("/v1/completions", dict(self.BASE, **kw))
            self.assertEqual(chunks[-1]["choices"], [])
            self.assertEqual(chunks[-1]["usage"], whole["usage"])
            tokens = chunks[:-1]
            for c in tokens:
                self.assertEqual((c["object"], c["model"], c["usage"], len(c["choices"])),
                                 ("text_completion", "tiny", None, 1))
            lens = [len(c["logprobs"]["tokens"])  # (logprobs change no token)
                    for c in self.complete(**dict(kw, logprobs=True))["choices"]]
            self.assertEqual([c["choices"][0]["index"] for c in tokens], rounds(lens))
            for i, w in enumerate(whole["choices"]):
                mine = [c["choices"][0] for c in tokens if c["choices"][0]["index"] == i]
                self.assertEqual("".join(c["text"] for c in mine), w["text"])
                self.assertEqual([c["finish_reason"] for c in mine],
                                 [None] * (len(mine) - 1) + [w["finish_reason"]])
                if not w["logprobs"]:
                    self.assertEqual({c["logprobs"] for c in mine}, {None})
                    continue
                for key in ("tokens", "token_ids", "token_logprobs"):
                    self.assertEqual(sum((c["logprobs"][key] for c in mine), []),
                                     w["logprobs"][key], key)
                self.assertEqual(mine[0]["logprobs"]["prompt_token_ids"],
                                 w["logprobs"]["prompt_token_ids"])

    def chat(self, **kw):
        r = self.d.post_json("/v1/chat/completions", dict(self.CHAT, **kw))
        self.assertEqual(r.status, 200, r.body[:500])
        return r.json()

    def test_3_chat_stream(self):
        whole = self.chat()
        stop = whole["choices"][1]["message"]["content"][3:5]
        # (top_logprobs only beside logprobs: true, as OpenAI has it)
        for kw in ({}, {"stop": stop}, {"logprobs": False, "top_logprobs": None, "max_tokens": 2}):
            whole = self.chat(**kw)
            chunks = self.stream("/v1/chat/completions", dict(self.CHAT, **kw))
            self.assertEqual(len({c["id"] for c in chunks}), 1)
            self.assertEqual(chunks[-1]["choices"], [])
            self.assertEqual(chunks[-1]["usage"], whole["usage"])
            body = [c["choices"][0] for c in chunks[:-1]]
            n = len(whole["choices"])
            # the role chunks, then per round each running choice's content chunk and, after
            # its last token, its finish chunk
            self.assertEqual(body[:n], [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}
                                        for i in range(n)])
            lens = [len(c["logprobs"]["content"])  # (logprobs change no token)
                    for c in self.chat(**dict(kw, logprobs=True))["choices"]]
            expect = []
            for k in range(max(lens)):
                for i in range(n):
                    if k < lens[i]:
                        expect.append((i, "content"))
                    if k == lens[i] - 1:
                        expect.append((i, "finish"))
            self.assertEqual([(c["index"], "content" if c["delta"] else "finish")
                              for c in body[n:]], expect)
            for i, w in enumerate(whole["choices"]):
                mine = [c for c in body[n:] if c["index"] == i]
                self.assertEqual("".join(c["delta"].get("content", "") for c in mine),
                                 w["message"]["content"])
                self.assertEqual(mine[-1]["finish_reason"], w["finish_reason"])
                if w["logprobs"]:
                    self.assertEqual(sum((c["logprobs"]["content"] for c in mine[:-1]), []),
                                     w["logprobs"]["content"])
            if "stop" in kw:
                self.assertIn("stop", [c["finish_reason"] for c in whole["choices"]])

    def test_4_refusals(self):
        for stop in (["a", "b", "c", "d", "e"], 3, [""], ""):
            r = self.d.post_json("/v1/completions", dict(self.BASE, stop=stop))
            self.assertProblem(r, 422, "validation_failed", "")
            self.assertEqual([e["field"] for e in r.json()["errors"]], ["stop"])
        r = self.d.post_json("/v1/completions", dict(self.BASE, stream="yes"))
        self.assertEqual([e["field"] for e in r.json()["errors"]], ["stream"])
        r = self.d.post_json("/v1/chat/completions", dict(self.CHAT, stop=["a"] * 5))
        self.assertEqual((r.status, r.json()["error"]["param"]), (400, "stop"))


if __name__ == "__main__":
    sys.exit(test_jobs.main())
