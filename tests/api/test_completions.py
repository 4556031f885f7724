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
Nothing here depends on timing: states are read from /metrics (polled with a deadline), sizes
come from the daemon (the job's memory plan, the model's weights) and from the KV cache's own
arithmetic (see QueueAndMemory).

Run: /usr/bin/python3 tests/api/test_completions.py --dapod build/server/dapod
"""

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
        served = [(int(s), int(n)) for s, n in
                  re.findall(r"completion (\d+) \(tiny\): ok, n (\d+),", self.d.log())]
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


if __name__ == "__main__":
    sys.exit(test_jobs.main())
