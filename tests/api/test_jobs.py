#!/usr/bin/python3
"""API integration tests of jobs, events (list and SSE), metrics, checkpoints, rollouts, models of
checkpoints and completions (label api).

Run: /usr/bin/python3 tests/api/test_jobs.py --dapod build/server/dapod [unittest args]
Every job trains the tiny preset on tests/data/addition.jsonl with a few small steps, so the
whole file stays well under two minutes (also under ASan). Each test class starts its own daemon
(harness.Daemon) on 127.0.0.1 port 0 with a scratch data directory; waits use deadlines
(GET /v1/jobs/{id}?wait=N long-polls, SSE reads with socket timeouts), never bare sleeps.
"""

import argparse
import collections
import hashlib
import http.client
import json
import os
import signal
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

DATA = os.path.join(HERE, "..", "data")
DAPOD = None
PROBLEM_BASE = "https://dapod.dev/problems/"
DEADLINE_S = 120.0  # any single wait of a test (generous: the ASan build is slower)

# Small jobs: a few tiny steps each.
SMALL_HP = {"total_steps": 3, "checkpoint_every": 1, "max_new_tokens": 4, "group_size": 4,
            "prompt_batch_size": 2}
ROLLOUT_FIELDS = ("step", "group", "index", "prompt", "response", "answer", "prompt_token_ids",
                  "response_token_ids", "reward_raw", "reward", "correct", "advantage", "length",
                  "truncated", "kept")
CKPT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
              "optimizer.safetensors", "trainer_state.json")


def read(name):
    with open(os.path.join(DATA, name), "rb") as f:
        return f.read()


# total_steps of a job that only a cancel or a pause ends: a test that must catch a job running
# (to pause, cancel or watch it) gives it this many steps, never a count it could finish on a
# fast machine (300 steps of the tiny model take 6 s on a 2-vCPU EPYC: api_jobs once saw such a
# job queued, then succeeded)
UNENDING = 1 << 20


def long_hp(steps, every=0):
    """A job that runs long enough to be caught running (a few seconds; UNENDING: until stopped)."""
    return {"total_steps": steps, "checkpoint_every": every, "max_new_tokens": 16,
            "group_size": 8, "prompt_batch_size": 4, "max_gen_batches": 2}


def metric_value(d, name, labels=None):
    """A sample of the daemon's /metrics (Prometheus text), as a number."""
    want = name + ("{%s}" % labels if labels else "")
    for line in d.get("/metrics").body.decode().splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    raise AssertionError("%s not in /metrics" % want)


def burst(d, path, n):
    """n concurrent GETs of path, each on its own connection: their bodies (all must be 200)."""
    out = [None] * n
    gate = threading.Barrier(n)

    def one(i):
        gate.wait()
        r = d.get(path, timeout=60)
        out[i] = (r.status, r.body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(s == 200 for s, _ in out), [s for s, _ in out]
    return [b for _, b in out]


class SSE:
    """A Server-Sent Events reader over http.client (chunked decoding included)."""

    def __init__(self, d, path, headers=None, timeout=60):
        self.conn = http.client.HTTPConnection(d.host, d.port, timeout=timeout)
        self.conn.request("GET", path, headers=headers or {})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}

    def __iter__(self):
        """Yields {"id", "event", "data"} (id None for heartbeats) until the server closes."""
        ev = {}
        while True:
            line = self.resp.readline()
            if not line:
                return
            line = line.decode("utf-8").rstrip("\r\n")
            if line == "":
                if ev:
                    yield {"id": int(ev["id"]) if "id" in ev else None,
                           "event": ev.get("event"), "data": json.loads(ev.get("data", "null"))}
                    ev = {}
                continue
            if line.startswith(":"):
                continue
            k, _, v = line.partition(":")
            ev[k] = v[1:] if v.startswith(" ") else v

    def close(self):
        self.conn.close()


class DaemonCase(unittest.TestCase):
    """A test class with one daemon for all its tests."""
    ARGS = ("--workers", "2", "--blas-threads", "1")

    @classmethod
    def setUpClass(cls):
        cls.d = harness.Daemon(DAPOD, cls.ARGS)
        try:
            cls.d.start()
            cls.file_id = cls.upload(read("addition.jsonl"))["id"]
            cls.prepare()
        except BaseException:
            cls.d.cleanup()  # tearDownClass does not run when setUpClass fails
            raise

    @classmethod
    def prepare(cls):
        """What a class sets up on its daemon (runs inside setUpClass's cleanup guard)."""

    @classmethod
    def tearDownClass(cls):
        try:
            rc = cls.d.stop()
            if rc != 0:
                raise AssertionError("dapod exited %s after SIGTERM:\n%s" % (rc, cls.d.log()))
        finally:
            cls.d.cleanup()

    @classmethod
    def upload(cls, data, d=None):
        d = d or cls.d
        r = d.request("POST", "/v1/files?purpose=fine-tune&filename=data.jsonl", body=data,
                      headers={"Content-Type": "application/x-ndjson"})
        assert r.status == 201, r
        return r.json()

    # ---- assertions ----

    def assertProblem(self, r, status, name, detail_has=None):
        self.assertEqual(r.status, status, r)
        self.assertEqual(r.header("Content-Type"), "application/problem+json", r)
        p = r.json()
        self.assertEqual(p["type"], PROBLEM_BASE + name, p)
        self.assertEqual(p["status"], status, p)
        self.assertTrue(p["title"] and p["detail"], p)
        if detail_has:
            self.assertIn(detail_has, p["detail"], p)
        return p

    def assertJson(self, r, status):
        self.assertEqual(r.status, status, r)
        self.assertEqual(r.header("Content-Type"), "application/json; charset=utf-8", r)
        return r.json()

    def assertFields(self, p, *fields):
        named = [e.get("field") for e in p.get("errors", [])]
        for f in fields:
            self.assertIn(f, named, p)

    # ---- helpers ----

    def create(self, hp=None, d=None, headers=None, **body):
        d = d or self.d
        b = {"model": "tiny", "training_file": self.file_id,
             "hyperparameters": dict(SMALL_HP if hp is None else hp)}
        b.update(body)
        return d.post_json("/v1/jobs", b, headers=headers or {})

    def create_ok(self, hp=None, d=None, **body):
        r = self.create(hp, d, **body)
        self.assertEqual(r.status, 201, r)
        return r.json()

    def job(self, job_id, d=None):
        return self.assertJson((d or self.d).get("/v1/jobs/" + job_id), 200)

    def wait_status(self, job_id, statuses, d=None, deadline_s=DEADLINE_S):
        """Long-polls until the job's status is one of statuses; returns the job object."""
        d = d or self.d
        if isinstance(statuses, str):
            statuses = (statuses,)
        end = time.monotonic() + deadline_s
        while True:
            j = self.job(job_id, d)
            if j["status"] in statuses:
                return j
            left = end - time.monotonic()
            if left <= 0:
                self.fail("job %s still %s after %.0f s (wanted %s):\n%s"
                          % (job_id, j["status"], deadline_s, statuses, d.log()[-3000:]))
            r = d.get("/v1/jobs/%s?wait=%d" % (job_id, max(1, min(10, int(left)))),
                      timeout=30)
            self.assertEqual(r.status, 200, r)

    def wait_until(self, job_id, pred, what, d=None, deadline_s=DEADLINE_S):
        """Follows the job's event stream until pred(job) holds; returns the job object."""
        d = d or self.d
        end = time.monotonic() + deadline_s
        j = self.job(job_id, d)
        if pred(j):
            return j
        s = SSE(d, "/v1/jobs/%s/events/stream" % job_id, timeout=30)
        try:
            for _ in s:
                j = self.job(job_id, d)
                if pred(j):
                    return j
                if time.monotonic() > end:
                    break
        finally:
            s.close()
        j = self.job(job_id, d)
        if not pred(j):
            self.fail("job %s: %s did not happen (status %s, step %s)"
                      % (job_id, what, j["status"], j["step"]))
        return j

    def all_events(self, job_id, d=None):
        d = d or self.d
        out, after = [], 0
        while True:
            p = self.assertJson(d.get("/v1/jobs/%s/events?limit=100&after=%d" % (job_id, after)),
                                200)
            out += p["data"]
            if not p["has_more"]:
                return out
            after = p["next_after"]

    def follow(self, job_id, headers=None, d=None, stop=None, query=""):
        """Reads the job's stream to `end` (or until stop(event) is true); returns the events."""
        s = SSE(d or self.d, "/v1/jobs/%s/events/stream%s" % (job_id, query), headers=headers)
        self.assertEqual(s.status, 200)
        evs = []
        try:
            for ev in s:
                if ev["id"] is None:
                    continue
                evs.append(ev)
                if ev["event"] == "end" or (stop and stop(ev)):
                    break
        finally:
            s.close()
        return evs

    def assertGapless(self, events):
        ids = [e["id"] for e in events]
        self.assertEqual(ids, list(range(1, len(ids) + 1)), ids)

    def assertOneMetricsPerStep(self, events, total):
        steps = collections.Counter(e["data"]["step"] for e in events
                                    if e["type" if "type" in e else "event"] == "metrics"
                                    and not any(k.startswith("eval/") for k in e["data"]))
        self.assertEqual(sorted(steps), list(range(1, total + 1)), steps)
        self.assertTrue(all(c == 1 for c in steps.values()), steps)


class TestFlow(DaemonCase):
    """The whole quick start on one small job, then everything that reads its results."""

    @classmethod
    def prepare(cls):
        r = cls.d.post_json("/v1/jobs", {"model": "tiny", "training_file": cls.file_id,
                                         "hyperparameters": SMALL_HP, "seed": 7,
                                         "metadata": {"run": "flow"}, "suffix": "add"})
        assert r.status == 201, r
        cls.created = r.json()
        cls.location = r.header("Location")

    def test_1_create_and_follow_to_the_end(self):
        j = self.created
        self.assertTrue(j["id"].startswith("job-"))
        self.assertEqual(self.location, "/v1/jobs/" + j["id"])
        self.assertEqual(j["object"], "job")
        self.assertIn(j["status"], ("queued", "running"))
        self.assertEqual(j["model"], "tiny")
        self.assertEqual(j["training_file"], self.file_id)
        self.assertEqual(j["hyperparameters"]["total_steps"], 3)
        self.assertEqual(j["hyperparameters"]["group_size"], 4)
        self.assertIn("learning_rate", j["hyperparameters"])  # resolved defaults shown
        self.assertEqual(j["judge"], {"type": "exact"})
        self.assertEqual((j["seed"], j["metadata"], j["suffix"]), (7, {"run": "flow"}, "add"))
        self.assertEqual(j["total_steps"], 3)
        evs = self.follow(j["id"])
        self.assertGapless(evs)
        self.assertEqual(evs[0]["event"], "status")
        self.assertEqual(evs[0]["data"]["status"], "queued")
        self.assertEqual([e["event"] for e in evs[-2:]], ["status", "end"])
        self.assertEqual(evs[-1]["data"]["status"], "succeeded")
        self.assertOneMetricsPerStep([{"type": e["event"], "data": e["data"]} for e in evs], 3)
        ck = [e["data"]["step"] for e in evs if e["event"] == "checkpoint"]
        self.assertEqual(ck, [0, 1, 2, 3])
        # the tiny model's passes are far below the work that reports progress by default
        self.assertNotIn("progress", [e["event"] for e in evs])
        j = self.job(j["id"])
        self.assertEqual(j["status"], "succeeded")
        self.assertEqual(j["step"], 3)
        self.assertIsNone(j["phase"])
        self.assertIsNone(j["progress"])
        self.assertIsNone(j["queue_position"])
        self.assertEqual(j["checkpoints"], [0, 1, 2, 3])
        self.assertEqual(j["fine_tuned_model"], j["id"] + ":step-3")
        self.assertEqual(j["latest_metrics"]["step"], 3)
        self.assertTrue(j["started_at"] and j["finished_at"] >= j["started_at"])
        # the paginated list is the same log
        self.assertEqual([(e["id"], e["type"]) for e in self.all_events(j["id"])],
                         [(e["id"], e["event"]) for e in evs])

    def test_2_metrics(self):
        jid = self.wait_status(self.created["id"], "succeeded")["id"]
        rows = self.assertJson(self.d.get("/v1/jobs/%s/metrics" % jid), 200)
        self.assertEqual([m["step"] for m in rows], [1, 2, 3])
        # the second answer comes from the daemon's rendered copy: the same bytes
        first = self.d.get("/v1/jobs/%s/metrics" % jid)
        again = self.d.get("/v1/jobs/%s/metrics" % jid)
        self.assertEqual((again.status, again.body), (200, first.body))
        self.assertTrue(again.header("Content-Type").startswith("application/json"))
        for m in rows:
            for k in ("reward/mean", "accuracy", "policy/loss", "tokens/generated"):
                self.assertIn(k, m)
        r = self.d.get("/v1/jobs/%s/metrics?format=csv" % jid)
        self.assertEqual(r.status, 200)
        self.assertTrue(r.header("Content-Type").startswith("text/csv"))
        lines = r.body.decode().strip().split("\r\n")
        header = lines[0].split(",")
        self.assertEqual(header[0], "step")
        self.assertEqual(set(header), set().union(*[m.keys() for m in rows]))
        self.assertEqual(len(lines), 4)
        self.assertEqual([ln.split(",")[0] for ln in lines[1:]], ["1", "2", "3"])
        self.assertProblem(self.d.get("/v1/jobs/%s/metrics?format=xml" % jid), 400,
                           "invalid_request")

    def test_3_checkpoints_and_downloads(self):
        jid = self.wait_status(self.created["id"], "succeeded")["id"]
        p = self.assertJson(self.d.get("/v1/jobs/%s/checkpoints" % jid), 200)
        self.assertEqual(p["object"], "list")
        self.assertEqual([c["step"] for c in p["data"]], [0, 1, 2, 3])
        last = p["data"][-1]
        self.assertEqual(last["model"], jid + ":step-3")
        self.assertEqual(last["metrics"]["step"], 3)
        self.assertIsNone(p["data"][0]["metrics"])
        self.assertEqual(sorted(f["name"] for f in last["files"]), sorted(CKPT_FILES))
        for f in last["files"]:
            r = self.d.get("/v1/jobs/%s/checkpoints/3/%s" % (jid, f["name"]))
            self.assertEqual(r.status, 200, r)
            self.assertEqual(len(r.body), f["bytes"])
            self.assertEqual(int(r.header("Content-Length")), f["bytes"])
            self.assertEqual(hashlib.sha256(r.body).hexdigest(), f["sha256"])
            self.assertEqual(r.header("ETag"), '"%s"' % f["sha256"])
            self.assertEqual(r.header("Accept-Ranges"), "bytes")
        st = next(f for f in last["files"] if f["name"] == "model.safetensors")
        url = "/v1/jobs/%s/checkpoints/3/model.safetensors" % jid
        whole = self.d.get(url).body
        size = len(whole)
        for rng, a, b in (("bytes=0-99", 0, 99), ("bytes=100-", 100, size - 1),
                          ("bytes=-64", size - 64, size - 1),
                          ("bytes=%d-%d" % (size - 10, size + 50), size - 10, size - 1)):
            r = self.d.get(url, headers={"Range": rng})
            self.assertEqual(r.status, 206, (rng, r))
            self.assertEqual(r.body, whole[a:b + 1], rng)
            self.assertEqual(r.header("Content-Range"), "bytes %d-%d/%d" % (a, b, size))
            self.assertEqual(int(r.header("Content-Length")), b - a + 1)
        r = self.d.get(url, headers={"Range": "bytes=%d-" % size})
        self.assertProblem(r, 416, "range_not_satisfiable")
        self.assertEqual(r.header("Content-Range"), "bytes */%d" % size)
        r = self.d.get(url, headers={"If-None-Match": '"%s"' % st["sha256"]})
        self.assertEqual(r.status, 304)
        self.assertEqual(r.body, b"")
        r = self.d.request("HEAD", url)
        self.assertEqual((r.status, int(r.header("Content-Length")), r.body), (200, size, b""))
        # nothing outside the checkpoint folder is reachable by any name
        for name in ("..%2F..%2Fdapod.sqlite3", "..", "%2E%2E", ".%2Ftrainer_state.json",
                     "..%2Fstep-2%2Fconfig.json", "trainer_state.json%00.png", "nope.json",
                     "%2Fetc%2Fpasswd"):
            r = self.d.get("/v1/jobs/%s/checkpoints/3/%s" % (jid, name))
            self.assertIn(r.status, (400, 404), (name, r))
        self.assertEqual(self.d.get("/v1/jobs/%s/checkpoints/3/../../x" % jid).status, 404)
        self.assertProblem(self.d.get("/v1/jobs/%s/checkpoints/9/config.json" % jid), 404,
                           "not_found")
        self.assertProblem(self.d.get("/v1/jobs/job-nope/checkpoints/1/config.json"), 404,
                           "not_found")

    def test_4_rollouts(self):
        jid = self.wait_status(self.created["id"], "succeeded")["id"]
        r = self.d.get("/v1/jobs/%s/rollouts?step=1" % jid)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.header("Content-Type"), "application/x-ndjson")
        lines = [json.loads(x) for x in r.body.decode().splitlines() if x.strip()]
        self.assertGreaterEqual(len(lines), 8)  # at least prompt_batch_size x group_size
        for x in lines:
            for k in ROLLOUT_FIELDS:
                self.assertIn(k, x)
            self.assertEqual(x["step"], 1)
            self.assertEqual(x["length"], len(x["response_token_ids"]))
        self.assertProblem(self.d.get("/v1/jobs/%s/rollouts?step=99" % jid), 404, "not_found")
        self.assertProblem(self.d.get("/v1/jobs/%s/rollouts" % jid), 400, "invalid_request")
        self.assertProblem(self.d.get("/v1/jobs/%s/rollouts?step=x" % jid), 400,
                           "invalid_request")

    def test_5_checkpoints_are_models(self):
        jid = self.wait_status(self.created["id"], "succeeded")["id"]
        ids, after = [], None
        while True:
            p = self.assertJson(self.d.get("/v1/models?limit=3" + ("&after=" + after
                                                                    if after else "")), 200)
            ids += [m["id"] for m in p["data"]]
            if not p["has_more"]:
                break
            after = p["next_after"]
        for s in range(4):
            self.assertIn("%s:step-%d" % (jid, s), ids)
        m = self.assertJson(self.d.get("/v1/models/%s:step-3" % jid), 200)
        self.assertEqual((m["kind"], m["status"], m["job_id"], m["step"]),
                         ("checkpoint", "ready", jid, 3))
        self.assertEqual(m["config"]["architecture"], "llama")
        self.assertProblem(self.d.get("/v1/models/%s:step-77" % jid), 404, "not_found")

    def test_6_completions(self):
        jid = self.wait_status(self.created["id"], "succeeded")["id"]
        for model in ("tiny", jid + ":step-3"):
            body = {"model": model, "prompt": "What is 2+3?", "max_tokens": 6, "n": 2,
                    "temperature": 1.0, "seed": 5, "logprobs": True}
            c = self.assertJson(self.d.post_json("/v1/completions", body), 200)
            self.assertEqual((c["object"], c["model"]), ("text_completion", model))
            self.assertEqual(len(c["choices"]), 2)
            for i, ch in enumerate(c["choices"]):
                self.assertEqual(ch["index"], i)
                self.assertIn(ch["finish_reason"], ("stop", "length"))
                lp = ch["logprobs"]
                n = len(lp["token_ids"])
                self.assertTrue(1 <= n <= 6)
                self.assertEqual(len(lp["tokens"]), n)
                self.assertEqual(len(lp["token_logprobs"]), n)
                self.assertTrue(all(x <= 0 for x in lp["token_logprobs"]))
            self.assertEqual(c["usage"]["total_tokens"],
                             c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"])
            again = self.assertJson(self.d.post_json("/v1/completions", body), 200)
            self.assertEqual(again["choices"], c["choices"])  # seeded: reproducible
        c = self.assertJson(self.d.post_json("/v1/completions", {"model": "tiny", "prompt": "1+1",
                                                                 "max_tokens": 3}), 200)
        self.assertIsNone(c["choices"][0]["logprobs"])
        p = self.assertProblem(self.d.post_json("/v1/completions", {
            "model": "nope", "max_tokens": 0, "top_p": 0, "n": 99, "logprobs": 6, "x": 1}),
            422, "validation_failed")
        self.assertFields(p, "model", "prompt", "max_tokens", "top_p", "n", "logprobs", "x")

    def test_7_delete(self):
        jid = self.wait_status(self.created["id"], "succeeded")["id"]
        # a job that has not finished cannot be deleted
        live = self.create_ok(long_hp(UNENDING))["id"]
        p = self.assertProblem(self.d.request("DELETE", "/v1/jobs/" + live), 409, "conflict")
        self.assertIn(p["job_status"], ("queued", "running"))
        self.assertJson(self.d.post_json("/v1/jobs/%s/cancel" % live, {}), 200)
        self.wait_status(live, "cancelled")
        folder = os.path.join(self.d.data_dir, "jobs", jid)
        self.assertTrue(os.path.isdir(folder))
        # The kept metrics list: once deleting another job has moved the store's metrics
        # generation, a burst of concurrent requests renders it again (once when the requests
        # overlap a render, which this 3-row list is too quick for the test to count on), and
        # the next burst renders nothing; every reply is the same list.
        self.assertJson(self.d.get("/v1/jobs/%s/metrics" % jid), 200)
        self.assertJson(self.d.request("DELETE", "/v1/jobs/" + live), 200)
        if metric_value(self.d, "dapod_jobs", 'status="running"') == 0:
            before = metric_value(self.d, "dapod_metrics_list_renders_total")
            bodies = burst(self.d, "/v1/jobs/%s/metrics" % jid, 16)
            self.assertEqual(len(set(bodies)), 1)
            mid = metric_value(self.d, "dapod_metrics_list_renders_total")
            self.assertGreaterEqual(mid - before, 1, "no render after a change")
            self.assertEqual(set(burst(self.d, "/v1/jobs/%s/metrics" % jid, 16)), set(bodies))
            self.assertEqual(metric_value(self.d, "dapod_metrics_list_renders_total"), mid,
                             "a current kept list was rendered again")
        self.assertJson(self.d.get("/v1/jobs/%s/metrics" % jid), 200)  # rendered and kept
        r = self.assertJson(self.d.request("DELETE", "/v1/jobs/" + jid), 200)
        self.assertEqual(r, {"id": jid, "object": "job", "deleted": True})
        self.assertFalse(os.path.exists(folder))
        self.assertProblem(self.d.get("/v1/jobs/" + jid), 404, "not_found")
        self.assertProblem(self.d.get("/v1/jobs/%s/metrics" % jid), 404, "not_found")
        self.assertProblem(self.d.get("/v1/models/%s:step-3" % jid), 404, "not_found")
        self.assertProblem(self.d.request("DELETE", "/v1/jobs/" + jid), 404, "not_found")


class TestCreate(DaemonCase):
    """Validation, idempotency and lists; the jobs here are tiny or never run long."""

    def test_validation_lists_every_problem(self):
        bad = self.upload(read("invalid.jsonl"))
        self.assertEqual((bad["validation"], bad["status"]), ("invalid", "error"))
        p = self.assertProblem(self.d.post_json("/v1/jobs", {}), 422, "validation_failed")
        self.assertFields(p, "model", "training_file")
        p = self.assertProblem(self.d.post_json("/v1/jobs", {
            "model": "no-such-model", "training_file": "file-nope",
            "validation_file": bad["id"], "job_id": "mine", "colour": "red", "seed": -1,
            "metadata": {"a": 1}, "suffix": 5, "judge": {"type": "psychic"},
            "hyperparameters": {"group_size": 0, "learning_rate": "fast", "warp": 9}}),
            422, "validation_failed")
        self.assertFields(p, "model", "training_file", "validation_file", "job_id", "colour",
                          "seed", "metadata.a", "suffix", "hyperparameters.group_size",
                          "hyperparameters.learning_rate", "hyperparameters.warp")
        self.assertTrue(any(e["field"].startswith("judge") for e in p["errors"]), p)
        msgs = {e["field"]: e["message"] for e in p["errors"]}
        self.assertIn("no-such-model", msgs["model"])
        self.assertIn("file-nope", msgs["training_file"])
        self.assertIn("invalid", msgs["validation_file"])
        p = self.assertProblem(self.create(training_file=bad["id"]), 422, "validation_failed")
        self.assertFields(p, "training_file")
        p = self.assertProblem(self.d.post_json("/v1/jobs", [1, 2]), 422, "validation_failed")
        self.assertProblem(self.d.post_json("/v1/jobs", b"{nope"), 400, "invalid_json")
        self.assertProblem(self.d.request("POST", "/v1/jobs", body=b"{}",
                                          headers={"Content-Type": "text/plain"}),
                           415, "unsupported_media_type")
        r = self.d.get("/v1/jobs?status=queued")
        self.assertEqual(self.assertJson(r, 200)["data"], [])  # nothing was stored

    def test_idempotency_key(self):
        h = {"Idempotency-Key": "key-1"}
        hp = dict(SMALL_HP, total_steps=1)
        r1 = self.create(hp, headers=h)
        self.assertEqual(r1.status, 201, r1)
        r2 = self.create(hp, headers=h)
        self.assertEqual(r2.status, 200, r2)
        self.assertEqual(r2.json()["id"], r1.json()["id"])
        self.assertProblem(self.create(dict(hp, group_size=2), headers=h), 409, "conflict")
        r3 = self.create(hp, headers={"Idempotency-Key": "key-2"})
        self.assertEqual(r3.status, 201)
        self.assertNotEqual(r3.json()["id"], r1.json()["id"])
        self.assertProblem(self.create(hp, headers={"Idempotency-Key": "k" * 300}), 400,
                           "invalid_request")
        for r in (r1, r3):
            self.wait_status(r.json()["id"], "succeeded")

    def test_list_pagination_and_filter(self):
        hp = dict(SMALL_HP, total_steps=1)
        made = [self.create_ok(hp, metadata={"n": str(i)})["id"] for i in range(5)]
        for jid in made:
            self.wait_status(jid, "succeeded")
        seen, after = [], None
        while True:
            q = "/v1/jobs?limit=2" + ("&after=" + after if after else "")
            p = self.assertJson(self.d.get(q), 200)
            self.assertEqual(p["object"], "list")
            self.assertLessEqual(len(p["data"]), 2)
            seen += [j["id"] for j in p["data"]]
            if not p["has_more"]:
                self.assertIsNone(p["next_after"])
                break
            self.assertEqual(p["next_after"], p["data"][-1]["id"])
            after = p["next_after"]
        self.assertEqual(len(seen), len(set(seen)))
        pos = [seen.index(j) for j in made]
        self.assertEqual(pos, sorted(pos, reverse=True))  # newest first
        ok = self.assertJson(self.d.get("/v1/jobs?status=succeeded&limit=100"), 200)["data"]
        self.assertTrue(set(made) <= {j["id"] for j in ok})
        self.assertTrue(all(j["status"] == "succeeded" for j in ok))
        self.assertEqual(self.assertJson(self.d.get("/v1/jobs?status=failed"), 200)["data"], [])
        self.assertProblem(self.d.get("/v1/jobs?status=sleeping"), 400, "invalid_request")
        self.assertProblem(self.d.get("/v1/jobs?after=job-nope"), 400, "invalid_request")
        self.assertProblem(self.d.get("/v1/jobs?limit=0"), 400, "invalid_request")
        self.assertProblem(self.d.get("/v1/jobs?limit=101"), 400, "invalid_request")
        # events paginate by event id
        evs, after = [], 0
        while True:
            p = self.assertJson(self.d.get("/v1/jobs/%s/events?limit=3&after=%d"
                                           % (made[0], after)), 200)
            evs += p["data"]
            if not p["has_more"]:
                break
            after = p["next_after"]
        self.assertGapless(evs)
        self.assertEqual(evs[-1]["type"], "end")
        self.assertTrue(all(e["object"] == "event" and e["created_at"] > 0 for e in evs))
        self.assertProblem(self.d.get("/v1/jobs/%s/events?after=x" % made[0]), 400,
                           "invalid_request")
        self.assertProblem(self.d.get("/v1/jobs/job-nope/events"), 404, "not_found")

    def test_wait_returns_on_a_change_or_at_once_when_finished(self):
        jid = self.create_ok(dict(SMALL_HP, total_steps=1))["id"]
        j = self.wait_status(jid, "succeeded")
        t0 = time.monotonic()
        self.assertEqual(self.job(jid)["status"], "succeeded")
        r = self.d.get("/v1/jobs/%s?wait=30" % jid)  # finished: no waiting
        self.assertEqual(r.json()["status"], "succeeded")
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(r.json()["id"], j["id"])
        self.assertProblem(self.d.get("/v1/jobs/%s?wait=x" % jid), 400, "invalid_request")
        self.assertProblem(self.d.get("/v1/jobs/%s?wait=100000" % jid), 400, "invalid_request")


class TestLifecycle(DaemonCase):
    """Cancel, pause/resume, two jobs at once, stream replay, heartbeats and the stream limit."""
    ARGS = ("--workers", "2", "--blas-threads", "1", "--sse-heartbeat-s", "1",
            "--max-sse-subscribers", "3")

    def test_cancel_running_and_queued(self):
        a = self.create_ok(long_hp(UNENDING))["id"]
        b = self.create_ok(long_hp(UNENDING))["id"]
        c = self.create_ok(long_hp(UNENDING))["id"]  # both workers busy: c waits in the queue
        self.wait_status(a, "running")
        self.wait_status(b, "running")
        q = self.job(c)
        self.assertEqual((q["status"], q["queue_position"]), ("queued", 1))
        j = self.assertJson(self.d.post_json("/v1/jobs/%s/cancel" % c, {}), 200)
        self.assertEqual(j["status"], "cancelled")  # queued -> cancelled at once
        for jid in (a, b):
            j = self.assertJson(self.d.post_json("/v1/jobs/%s/cancel" % jid, {}), 200)
            self.assertIn(j["status"], ("cancelling", "cancelled"))
        for jid in (a, b):
            j = self.wait_status(jid, "cancelled")
            self.assertIsNotNone(j["finished_at"])
            self.assertLess(j["step"], UNENDING)
            evs = self.follow(jid)
            self.assertGapless(evs)
            self.assertEqual(evs[-1]["data"]["status"], "cancelled")
        p = self.assertProblem(self.d.post_json("/v1/jobs/%s/cancel" % a, {}), 409, "conflict")
        self.assertEqual(p["job_status"], "cancelled")
        p = self.assertProblem(self.d.post_json("/v1/jobs/%s/resume" % a, {}), 409, "conflict")
        self.assertProblem(self.d.post_json("/v1/jobs/job-nope/cancel", {}), 404, "not_found")

    def test_pause_then_resume_to_completion(self):
        total = 30  # 8 took 0.16 s on a 2-vCPU EPYC: the pause could come after the end
        jid = self.create_ok(long_hp(total))["id"]
        self.wait_until(jid, lambda j: j["status"] == "running" and j["step"] >= 1,
                        "a first step")
        j = self.job(jid)
        if j["status"] == "running":  # what it does now (the workers keep it in memory)
            self.assertIn(j["phase"], ("sampling", "judging", "updating", "evaluating",
                                       "checkpointing"))
        j = self.assertJson(self.d.post_json("/v1/jobs/%s/pause" % jid, {}), 200)
        self.assertIn(j["status"], ("pausing", "paused", "succeeded"))
        j = self.wait_status(jid, ("paused", "succeeded"))
        if j["status"] == "succeeded":
            self.skipTest("the job finished before the pause took effect")
        paused_at = j["step"]
        self.assertIsNone(j["phase"])
        self.assertLess(paused_at, total)
        self.assertIn(paused_at, j["checkpoints"])  # pause takes a checkpoint
        self.assertJson(self.d.post_json("/v1/jobs/%s/pause" % jid, {}), 200)  # no-op
        self.assertProblem(self.d.post_json("/v1/jobs/%sx/resume" % jid, {}), 404, "not_found")
        j = self.assertJson(self.d.post_json("/v1/jobs/%s/resume" % jid, {}), 200)
        self.assertIn(j["status"], ("queued", "running"))
        j = self.wait_status(jid, "succeeded")
        self.assertEqual(j["step"], total)
        evs = self.all_events(jid)
        self.assertGapless(evs)
        self.assertOneMetricsPerStep(evs, total)
        statuses = [e["data"]["status"] for e in evs if e["type"] == "status"]
        self.assertEqual(statuses, ["queued", "running", "pausing", "paused", "queued",
                                    "running", "succeeded"])
        self.assertTrue(any(e["type"] == "log" and "resumed" in e["data"]["message"]
                            for e in evs))
        p = self.assertProblem(self.d.post_json("/v1/jobs/%s/pause" % jid, {}), 409, "conflict")
        self.assertEqual(p["job_status"], "succeeded")

    def test_two_jobs_at_once(self):
        total = 30  # both still running when the list is read, on a fast machine too
        a = self.create_ok(long_hp(total))["id"]
        b = self.create_ok(long_hp(total))["id"]
        self.wait_until(a, lambda j: j["status"] == "running" and j["step"] >= 1, "a first step")
        running = {j["id"] for j in self.assertJson(
            self.d.get("/v1/jobs?status=running"), 200)["data"]}
        self.assertEqual(running, {a, b}, "the two jobs do not run at the same time")
        r = self.d.get("/metrics").body.decode()
        self.assertIn("dapod_workers 2", r)
        self.assertIn("dapod_workers_busy 2", r)
        for jid in (a, b):
            self.assertEqual(self.wait_status(jid, "succeeded")["step"], total)

    def test_sse_replay_after_reconnect(self):
        jid = self.create_ok(long_hp(5, every=2))["id"]
        first = self.follow(jid, stop=lambda ev: ev["event"] == "metrics")
        self.assertEqual(first[-1]["event"], "metrics")
        last = first[-1]["id"]
        rest = self.follow(jid, headers={"Last-Event-ID": str(last)})
        self.assertEqual(rest[0]["id"], last + 1)
        allev = first + rest
        self.assertGapless(allev)
        self.assertEqual(allev[-1]["event"], "end")
        # the same through ?last_event_id=, and a replay after `end` closes at once
        again = self.follow(jid, query="?last_event_id=%d" % last)
        self.assertEqual([e["id"] for e in again], [e["id"] for e in rest])
        s = SSE(self.d, "/v1/jobs/%s/events/stream?last_event_id=%d" % (jid, allev[-1]["id"]),
                timeout=10)
        self.assertEqual(s.status, 200)
        self.assertEqual(s.headers.get("cache-control"), "no-cache")
        self.assertEqual(s.headers.get("x-accel-buffering"), "no")
        self.assertTrue(s.headers.get("content-type").startswith("text/event-stream"))
        self.assertEqual(list(s), [])
        s.close()
        self.assertProblem(self.d.get("/v1/jobs/%s/events/stream" % jid,
                                      headers={"Last-Event-ID": "abc"}), 400, "invalid_request")
        self.assertProblem(self.d.get("/v1/jobs/job-nope/events/stream"), 404, "not_found")

    def test_heartbeats_and_the_stream_limit(self):
        jid = self.create_ok(long_hp(UNENDING))["id"]
        self.wait_status(jid, "running")
        self.assertJson(self.d.post_json("/v1/jobs/%s/pause" % jid, {}), 200)
        self.wait_status(jid, "paused")
        last = self.all_events(jid)[-1]["id"]
        streams = [SSE(self.d, "/v1/jobs/%s/events/stream" % jid,
                       headers={"Last-Event-ID": str(last)}, timeout=20) for _ in range(3)]
        try:
            t0 = time.monotonic()
            ev = next(iter(streams[0]))
            self.assertEqual((ev["id"], ev["event"]), (None, "heartbeat"))
            self.assertLess(time.monotonic() - t0, 5)
            r = self.d.get("/v1/jobs/%s/events/stream" % jid)
            self.assertProblem(r, 503, "unavailable")
            self.assertTrue(r.header("Retry-After"))
            # a live event wakes a suspended stream at once
            self.assertJson(self.d.post_json("/v1/jobs/%s/cancel" % jid, {}), 200)
            got = [e for e in streams[1] if e["id"] is not None]
            self.assertEqual([e["event"] for e in got], ["status", "end"])
            self.assertEqual(got[0]["id"], last + 1)
        finally:
            for s in streams:
                s.close()


class TestProgress(DaemonCase):
    """With progress_every_pass, every pass of a step tells its progress as stored events: each
    pass's reports start at 0, never go back, keep their total and end at it, at most 21 of them;
    the stream and the list are the same log; the tokens add up to the step's metrics."""
    ARGS = ("--workers", "1", "--blas-threads", "1", "--progress-every-pass", "true")

    def test_progress_events(self):
        hp = dict(SMALL_HP, total_steps=2, max_new_tokens=8, kl_coef=0.01, epochs=2,
                  micro_batch_tokens=64)
        jid = self.create_ok(hp)["id"]
        evs = self.follow(jid)
        self.assertEqual(evs[-1]["data"]["status"], "succeeded")
        self.assertGapless(evs)
        self.assertEqual([(e["id"], e["type"], e["data"]) for e in self.all_events(jid)],
                         [(e["id"], e["event"], e["data"]) for e in evs])
        prog = [e["data"] for e in evs if e["event"] == "progress"]
        passes, cur = [], None
        for p in prog:
            self.assertEqual(set(p), {"step", "pass", "round", "done", "total", "unit", "tokens"})
            self.assertEqual(p["unit"], "sequences" if p["pass"] in ("generation", "evaluation")
                             else "micro_batches")
            key = (p["step"], p["pass"], p["round"])
            if cur is None or cur[-1]["done"] == cur[-1]["total"]:
                self.assertEqual((p["done"], p["tokens"]), (0, 0), p)  # a pass starts
                cur = [p]
                passes.append(cur)
                continue
            last = cur[-1]
            self.assertEqual(key, (last["step"], last["pass"], last["round"]), p)
            self.assertEqual(p["total"], last["total"])
            self.assertGreaterEqual(p["done"], last["done"])
            self.assertGreaterEqual(p["tokens"], last["tokens"])
            cur.append(p)
        self.assertEqual(cur[-1]["done"], cur[-1]["total"])
        self.assertTrue(all(len(ps) <= 21 for ps in passes), [len(ps) for ps in passes])
        metrics = {e["data"]["step"]: e["data"] for e in evs if e["event"] == "metrics"
                   and "accuracy" in e["data"]}
        for step in (1, 2):
            ended = [ps[-1] for ps in passes if ps[-1]["step"] == step]
            by = collections.defaultdict(int)
            for p in ended:
                by[p["pass"]] += p["tokens"]
            m = metrics[step]
            self.assertEqual(sum(1 for p in ended if p["pass"] == "generation"), m["gen/rounds"])
            self.assertEqual(by["generation"], m["tokens/generated"])
            self.assertEqual(by["old_logprob"], m["tokens/old_logprob"])
            self.assertEqual(by["update"], m["tokens/trained"])
            self.assertIn("update", by)
        # the reports of a step come before its metrics event
        ids = {e["id"]: e for e in evs}
        first_metrics = min(i for i, e in ids.items() if e["event"] == "metrics"
                            and e["data"]["step"] == 1 and "accuracy" in e["data"])
        self.assertTrue(all(e["data"]["step"] == 1 for i, e in ids.items()
                            if e["event"] == "progress" and i < first_metrics
                            and e["data"]["pass"] != "evaluation"))

    def test_job_object_progress(self):
        """A running job's object shows its latest report (an event already in the list, of the
        step under way); null once it has finished, and for a job that never reported."""
        jid = self.create_ok(long_hp(UNENDING))["id"]
        j = self.wait_until(jid, lambda j: j["progress"] is not None, "a progress report in "
                            "the job object")
        p = j["progress"]
        self.assertIn(p, [e["data"] for e in self.all_events(jid) if e["type"] == "progress"])
        self.assertGreater(p["step"], j["step"] - (p["pass"] == "evaluation"))
        self.assertLessEqual(p["done"], p["total"])
        j = self.assertJson(self.d.post_json("/v1/jobs/%s/cancel" % jid, {}), 200)
        j = self.wait_status(jid, "cancelled")
        self.assertIsNone(j["progress"])
        self.assertIsNone(j["phase"])
        self.assertTrue(all(x["progress"] is None for x in self.assertJson(
            self.d.get("/v1/jobs"), 200)["data"]))


class TestBacklog(DaemonCase):
    """With a backlog of one event, a live reader is let go whenever it falls behind a burst; it
    reconnects with its Last-Event-ID and still sees every event exactly once."""
    ARGS = ("--workers", "1", "--blas-threads", "1", "--sse-backlog-events", "1")

    def test_disconnected_reader_resumes_without_gap(self):
        jid = self.create_ok(long_hp(6, every=1))["id"]
        evs, connects = [], 0
        end = time.monotonic() + DEADLINE_S
        while not evs or evs[-1]["event"] != "end":
            self.assertLess(time.monotonic(), end, "no `end` within the deadline")
            h = {"Last-Event-ID": str(evs[-1]["id"])} if evs else {}
            evs += self.follow(jid, headers=h)
            connects += 1
        self.assertGapless(evs)
        self.assertOneMetricsPerStep([{"type": e["event"], "data": e["data"]} for e in evs], 6)
        self.assertGreaterEqual(connects, 1)


class TestRestart(unittest.TestCase):
    """A daemon killed mid-job (SIGKILL) or stopped (SIGTERM): the job finishes after a restart
    with nothing lost and nothing told twice."""

    def start(self, data_dir=None):
        d = harness.Daemon(DAPOD, ("--workers", "1", "--blas-threads", "1"), data_dir=data_dir)
        self.addCleanup(d.cleanup)
        d.start()
        return d

    def run_case(self, sig):
        total = 40  # far from over at step 4 when the daemon stops (10 steps take 0.2 s on EPYC)
        d1 = self.start()
        h = DaemonCase()
        h.d = d1
        h.file_id = DaemonCase.upload(read("addition.jsonl"), d=d1)["id"]
        jid = h.create_ok(long_hp(total, every=3), d=d1)["id"]
        seen = h.follow(jid, d=d1, stop=lambda ev: ev["event"] == "metrics"
                        and ev["data"]["step"] >= 4)
        self.assertEqual(seen[-1]["data"]["step"], 4)
        if sig == signal.SIGKILL:
            d1.kill()
        else:
            # a stream open during the stop ends cleanly (no `end`: the job is not over)
            s = SSE(d1, "/v1/jobs/%s/events/stream" % jid,
                    headers={"Last-Event-ID": str(seen[-1]["id"])}, timeout=30)
            self.assertEqual(d1.stop(sig), 0, d1.log())
            rest = list(s)
            s.close()
            self.assertNotIn("end", [e["event"] for e in rest])
        d2 = self.start(data_dir=d1.data_dir)
        h.d = d2
        j = h.wait_status(jid, "succeeded", d=d2)
        self.assertEqual(j["step"], total)
        evs = h.all_events(jid, d=d2)
        h.assertGapless(evs)
        self.assertEqual([e["id"] for e in evs[:len(seen)]], [e["id"] for e in seen])
        h.assertOneMetricsPerStep(evs, total)
        ck = [e["data"]["step"] for e in evs if e["type"] == "checkpoint"]
        self.assertEqual(ck, sorted(set(ck)))
        self.assertEqual(ck[-1], total)
        logs = [e["data"]["message"] for e in evs if e["type"] == "log"]
        self.assertTrue(any("resumed from the checkpoint" in m for m in logs), logs)
        statuses = [e["data"]["status"] for e in evs if e["type"] == "status"]
        self.assertEqual(statuses[-1], "succeeded")
        self.assertIn("queued", statuses[2:])
        rows = h.assertJson(d2.get("/v1/jobs/%s/metrics" % jid), 200)
        self.assertEqual([m["step"] for m in rows], list(range(1, total + 1)))
        self.assertEqual(d2.stop(), 0, d2.log())
        return logs

    def test_sigkill_mid_job(self):
        logs = self.run_case(signal.SIGKILL)
        self.assertTrue(any("the daemon stopped while the job was running" in m for m in logs),
                        logs)

    def test_sigterm_mid_job(self):
        logs = self.run_case(signal.SIGTERM)
        self.assertTrue(any("the daemon is stopping" in m for m in logs), logs)


def main():
    global DAPOD
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True, help="the built dapod binary")
    args, rest = ap.parse_known_args()
    DAPOD = os.path.abspath(args.dapod)
    if not os.access(DAPOD, os.X_OK):
        print("api tests: %s is not an executable" % DAPOD, file=sys.stderr)
        return 1
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
