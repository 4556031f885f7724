#!/usr/bin/python3
"""clients/python/dapod_client.py against a real daemon (label clients): every endpoint of
openapi.yaml through the client, compared with what the daemon answers to plain requests (the
harness's own http.client calls); the SSE iterator through a proxy that cuts the stream three
times mid-event (the events equal the stored event list: no gap, no duplicate, and each
reconnect sent Last-Event-ID); typed errors with the problem+json fields; timeouts; API keys.

Run: /usr/bin/python3 tests/clients/test_python_client.py --dapod DAPOD
"""

import argparse
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import harness  # noqa: E402
import dapod_client as dc  # noqa: E402

DAPOD = None
CALLED = set()  # (METHOD, path) of every request the client sent


def _recording(open_):
    def wrapped(self, method, path, *a, **kw):
        CALLED.add((method, path.split("?", 1)[0]))
        return open_(self, method, path, *a, **kw)
    return wrapped


dc.Client._open = _recording(dc.Client._open)


def openapi_operations():
    """(METHOD, path regex) of every native operation in openapi.yaml (its paths are the
    two-space indented keys, its methods the four-space ones). Operations tagged `openai` are
    OpenAI's surface, which the official `openai` SDK drives (tests/openai), not this client."""
    import re
    ops, path, pending = [], None, None
    with open(os.path.join(common.ROOT, "openapi.yaml")) as f:
        for line in f:
            m = re.match(r"^  (/[^ ]*):\s*$", line)
            if m:
                path = m.group(1)
                continue
            m = re.match(r"^    (get|post|put|patch|delete):\s*$", line)
            if m and path:
                rx = "^" + re.sub(r"\\{[a-z_]+\\}", "[^/]+", re.escape(path)) + "$"
                pending = (m.group(1).upper(), path, re.compile(rx))
                ops.append(pending)
                continue
            if pending and re.match(r"^      tags: \[.*\bopenai\b.*\]", line):
                ops.remove(pending)
            if not line.startswith("      "):
                pending = None
    return ops


class ClientCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = harness.Daemon(DAPOD, ("--workers", "2", "--blas-threads", "1"))
        cls.tmp = tempfile.mkdtemp(prefix="dapod-pyclient-")
        try:
            cls.d.start()
            cls.c = dc.Client("http://127.0.0.1:%d" % cls.d.port, timeout=30)
            cls.file = cls.c.upload_file(common.ADDITION)
            spec = common.job_spec(cls.file["id"], dict(common.SMALL_HP, total_steps=2))
            cls.job = cls.c.create_job(spec)
            cls.done = cls.c.wait_job(cls.job["id"], timeout=common.DEADLINE_S)
        except BaseException:
            cls.d.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            rc = cls.d.stop()
            assert rc == 0, "dapod exited %s:\n%s" % (rc, cls.d.log())
        finally:
            cls.d.cleanup()
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def raw(self, path):
        r = self.d.get(path)
        self.assertEqual(r.status, 200, r)
        return r.json()

    # ---- health, metrics ----

    def test_health_and_prometheus(self):
        self.assertEqual(self.c.healthz(), self.raw("/healthz"))
        self.assertEqual(self.c.readyz(), self.raw("/readyz"))
        text = self.c.prometheus_metrics()
        self.assertIn("dapod_ready 1", text)

    # ---- files ----

    def test_files(self):
        with open(common.ADDITION, "rb") as f:
            data = f.read()
        f = self.file
        self.assertEqual((f["object"], f["status"], f["validation"], f["filename"]),
                         ("file", "processed", "valid", "addition.jsonl"))
        self.assertEqual(f["sha256"], hashlib.sha256(data).hexdigest())
        self.assertEqual(self.c.get_file(f["id"]), self.raw("/v1/files/" + f["id"]))
        self.assertEqual(self.c.file_content(f["id"]), data)
        g = self.c.upload_file(b'{"prompt": "1+1", "answer": "2"}\n', filename="one.jsonl",
                               purpose="eval")
        self.assertEqual((g["filename"], g["purpose"], g["n_items"]), ("one.jsonl", "eval", 1))
        with open(common.ADDITION, "rb") as fobj:
            h = self.c.upload_file(fobj, filename="fobj.jsonl")
        self.assertEqual(h["sha256"], f["sha256"])
        ids = [x["id"] for x in self.c.iter_files()]
        self.assertTrue({f["id"], g["id"], h["id"]} <= set(ids))
        page = self.c.list_files(limit=1)
        self.assertEqual(page, self.raw("/v1/files?limit=1"))
        bad = self.c.upload_file(b'{"prompt": "x"}\nnope\n')
        self.assertEqual((bad["status"], bad["validation"]), ("error", "invalid"))
        self.assertEqual([e.get("line") for e in bad["errors"]], [1, 2])
        v = self.c.validate_file(b'{"prompt": "a", "answer": "b"}\n')
        self.assertEqual((v["object"], v["status"]), ("file.validation", "valid"))
        self.assertEqual(self.c.delete_file(g["id"]), {"id": g["id"], "object": "file",
                                                       "deleted": True})
        with self.assertRaises(dc.NotFoundError) as cm:
            self.c.get_file(g["id"])
        self.assertEqual((cm.exception.status, cm.exception.name), (404, "not_found"))

    # ---- models, judges, completions ----

    def test_models_judges_completions(self):
        models = list(self.c.iter_models())
        self.assertIn("tiny", [m["id"] for m in models])
        ck = "%s:step-2" % self.job["id"]
        self.assertIn(ck, [m["id"] for m in models])
        self.assertEqual(self.c.get_model("tiny"), self.raw("/v1/models/tiny"))
        self.assertEqual(self.c.list_models(limit=2), self.raw("/v1/models?limit=2"))
        self.assertEqual(self.c.get_model(ck)["kind"], "checkpoint")
        t = self.c.test_judge({"type": "math"}, [{"response": "so \\boxed{5}", "answer": "5"},
                                                 {"response": "4", "answer": "5"}])
        self.assertEqual([r["reward"] for r in t["results"]], [1.0, -1.0])
        out = self.c.completions(ck, "What is 2+3?", max_tokens=4, seed=3, n=2, logprobs=True)
        self.assertEqual(len(out["choices"]), 2)
        lp = [c["logprobs"] for c in out["choices"]]
        self.assertTrue(all(len(x["token_ids"]) == len(x["token_logprobs"]) <= 4 for x in lp))
        self.assertEqual(out["usage"]["completion_tokens"], sum(len(x["token_ids"]) for x in lp))
        again = self.c.completions(ck, "What is 2+3?", max_tokens=4, seed=3, n=2, logprobs=True)
        self.assertEqual(out["choices"], again["choices"])  # seeded: reproducible

    # ---- jobs ----

    def test_job_object_list_and_idempotency(self):
        self.assertEqual(self.done["status"], "succeeded")
        self.assertEqual(self.c.get_job(self.job["id"]), self.raw("/v1/jobs/" + self.job["id"]))
        self.assertIn(self.job["id"], [j["id"] for j in self.c.iter_jobs(status="succeeded")])
        self.assertEqual(self.c.list_jobs(limit=1)["object"], "list")
        spec = common.job_spec(self.file["id"], dict(common.SMALL_HP, total_steps=1), seed=9)
        a = self.c.create_job(spec, idempotency_key="key-123")
        b = self.c.create_job(spec, idempotency_key="key-123")
        self.assertEqual(a["id"], b["id"])
        with self.assertRaises(dc.ConflictError):
            self.c.create_job(dict(spec, seed=10), idempotency_key="key-123")
        self.assertNotEqual(self.c.create_job(spec, idempotency_key=True)["id"], a["id"])
        done = self.c.wait_job(a["id"], timeout=common.DEADLINE_S)
        self.assertEqual(done["status"], "succeeded")
        self.assertEqual(self.c.delete_job(a["id"]), {"id": a["id"], "object": "job",
                                                      "deleted": True})
        with self.assertRaises(dc.NotFoundError):
            self.c.get_job(a["id"])

    def test_pause_resume_cancel(self):
        job = self.c.create_job(common.job_spec(self.file["id"], common.LONG_HP))
        for ev in self.c.stream_events(job["id"]):  # wait for a first step
            if ev.type == "metrics":
                break
        self.assertIn(self.c.pause_job(job["id"])["status"], ("pausing", "paused"))
        while self.c.get_job(job["id"], wait=10)["status"] != "paused":
            pass
        self.assertEqual(self.c.resume_job(job["id"])["status"], "queued")
        self.assertIn(self.c.cancel_job(job["id"])["status"], ("cancelling", "cancelled"))
        self.assertEqual(self.c.wait_job(job["id"], timeout=common.DEADLINE_S)["status"],
                         "cancelled")
        with self.assertRaises(dc.ConflictError) as cm:
            self.c.cancel_job(job["id"])
        self.assertEqual(cm.exception.job_status, "cancelled")
        self.assertEqual(cm.exception.status, 409)

    # ---- events ----

    def test_events_list_and_stream(self):
        stored = [dc.Event(e["id"], e["type"], e["data"])
                  for e in common.events_all(self.d, self.job["id"])]
        self.assertEqual(list(self.c.iter_events(self.job["id"])), stored)
        self.assertEqual(list(self.c.stream_events(self.job["id"])), stored)
        self.assertEqual(list(self.c.stream_events(self.job["id"], last_event_id=stored[2].id)),
                         stored[3:])
        page = self.c.list_events(self.job["id"], limit=2)
        self.assertEqual(page, self.raw("/v1/jobs/%s/events?limit=2" % self.job["id"]))
        self.assertEqual(stored[-1].type, "end")

    def test_stream_reconnects_without_gap_or_duplicate(self):
        proxy = common.CuttingProxy(self.d.port, cuts=3, cut_after=600)
        try:
            pc = dc.Client(proxy.url, timeout=30)
            spec = common.job_spec(self.file["id"], dict(common.SMALL_HP, total_steps=4))
            job = pc.create_job(spec)
            got = list(pc.stream_events(job["id"]))
        finally:
            proxy.close()
        stored = [dc.Event(e["id"], e["type"], e["data"])
                  for e in common.events_all(self.d, job["id"])]
        self.assertEqual(proxy.cut_done, 3)
        self.assertEqual([e.id for e in got], [e.id for e in stored])
        self.assertEqual(got, stored)
        self.assertEqual([e.type for e in got].count("metrics"), 4)
        self.assertIsNone(proxy.last_event_ids[0])
        self.assertTrue(all(x is not None and x.isdigit() for x in proxy.last_event_ids[1:]),
                        proxy.last_event_ids)

    def test_stream_without_reconnect_raises(self):
        proxy = common.CuttingProxy(self.d.port, cuts=1, cut_after=300)
        try:
            pc = dc.Client(proxy.url, timeout=30)
            job = pc.create_job(common.job_spec(self.file["id"],
                                                dict(common.SMALL_HP, total_steps=1)))
            with self.assertRaises(dc.ConnectionError_):
                list(pc.stream_events(job["id"], reconnect=False))
        finally:
            proxy.close()
        self.c.wait_job(job["id"], timeout=common.DEADLINE_S)

    # ---- metrics, checkpoints, rollouts ----

    def test_metrics_checkpoints_rollouts(self):
        jid = self.job["id"]
        m = self.c.job_metrics(jid)
        self.assertEqual(m, self.d.get("/v1/jobs/%s/metrics" % jid).json())
        self.assertEqual([x["step"] for x in m if x["step"] > 0], [1, 2])
        csv = self.c.job_metrics_csv(jid)
        self.assertTrue(csv.startswith("step,"))
        self.assertEqual(len(csv.strip().split("\r\n")), len(m) + 1)
        cks = self.c.list_checkpoints(jid)
        self.assertEqual([c["step"] for c in cks], [0, 1, 2])
        files = {f["name"]: f for f in cks[-1]["files"]}
        cfg = self.c.checkpoint_file(jid, 2, "config.json")
        self.assertEqual(hashlib.sha256(cfg).hexdigest(), files["config.json"]["sha256"])
        dest = os.path.join(self.tmp, "model.safetensors")
        want = files["model.safetensors"]
        self.assertEqual(self.c.download_checkpoint(jid, 2, "model.safetensors", dest,
                                                    sha256=want["sha256"]), 0)
        cut = want["bytes"] // 2
        with open(dest, "r+b") as f:
            f.truncate(cut)
        self.assertEqual(self.c.download_checkpoint(jid, 2, "model.safetensors", dest,
                                                    sha256=want["sha256"]), cut)
        self.assertEqual(common.sha256_file(dest), want["sha256"])
        with open(dest, "ab") as f:  # longer than the server's: 416, then a whole download
            f.write(b"junk")
        self.assertEqual(self.c.download_checkpoint(jid, 2, "model.safetensors", dest,
                                                    sha256=want["sha256"]), 0)
        self.assertEqual(common.sha256_file(dest), want["sha256"])
        with self.assertRaises(dc.DapodError):  # a wrong digest is noticed
            self.c.download_checkpoint(jid, 2, "config.json", os.path.join(self.tmp, "c.json"),
                                       sha256="0" * 64)
        rows = self.c.rollouts(jid, 1)
        self.assertEqual(rows[0]["step"], 1)
        self.assertEqual(len(rows), int(self.d.get("/v1/jobs/%s/rollouts?step=1" % jid)
                                        .body.count(b"\n")))

    def test_episode_messages_and_text(self):
        """An agent's rollouts line (tools: a call, its answer, a malformed turn; then an
        environment's observation) as chat messages and as text."""
        row = {"finish_reason": "stop", "turns": [
            {"role": "assistant", "content": "@lookup {\"k\": 1}", "trained": True,
             "tool_calls": [{"name": "lookup", "arguments": {"k": 1}}]},
            {"role": "tool", "content": "=7\n", "trained": False,
             "answers": [{"name": "lookup", "content": "7", "status": "ok"}]},
            {"role": "assistant", "content": "@x", "trained": True,
             "malformed": "there is no tool 'x'"},
            {"role": "tool", "content": "=error\n", "trained": False,
             "answers": [{"name": "", "content": "error: there is no tool 'x'",
                          "status": "unknown_tool"}]},
            {"role": "environment", "content": ">more\n", "trained": False, "reward": 0.5,
             "done": False, "messages": [{"role": "user", "content": "more"}]},
            {"role": "assistant", "content": "7", "trained": True}]}
        m = dc.episode_messages(row)
        self.assertEqual([x["role"] for x in m],
                         ["assistant", "tool", "assistant", "tool", "user", "assistant"])
        call = m[0]["tool_calls"][0]
        self.assertEqual((call["id"], call["type"], call["function"]["name"],
                          json.loads(call["function"]["arguments"])),
                         ("call_0_0", "function", "lookup", {"k": 1}))
        self.assertEqual(m[1], {"role": "tool", "content": "7", "tool_call_id": "call_0_0"})
        self.assertNotIn("tool_calls", m[2])
        self.assertNotIn("tool_call_id", m[3])  # the malformed turn's answer answers no call
        self.assertEqual(dc.format_episode(row).splitlines(), [
            "      model: @lookup {\"k\": 1}", "        -> lookup({\"k\":1})",
            "      tool lookup: 7", "      model: @x", "        (not a call: there is no tool 'x')",
            "      tool : error: there is no tool 'x' [unknown_tool]", "      world user: more",
            "        (reward 0.5)", "      model: 7", "      ended: stop"])

    # ---- errors ----

    def test_typed_errors_carry_problem_fields(self):
        spec = common.job_spec(self.file["id"])
        spec["model"] = "nope"
        spec["hyperparameters"]["group_size"] = 0
        with self.assertRaises(dc.ValidationError) as cm:
            self.c.create_job(spec)
        e = cm.exception
        self.assertEqual((e.status, e.name, e.type), (422, "validation_failed",
                                                      dc.PROBLEM_BASE + "validation_failed"))
        self.assertTrue(e.title and e.detail)
        fields = {x["field"] for x in e.errors}
        self.assertTrue({"model", "hyperparameters.group_size"} <= fields, fields)
        self.assertIn("hyperparameters.group_size", str(e))
        with self.assertRaises(dc.BadRequestError) as cm:
            self.c.list_jobs(status="bogus")
        self.assertEqual(cm.exception.name, "invalid_request")
        with self.assertRaises(dc.NotFoundError):
            self.c.get_job("job-00000000-0000-4000-8000-000000000000")
        with self.assertRaises(dc.NotFoundError):
            list(self.c.stream_events("job-00000000-0000-4000-8000-000000000000"))
        with self.assertRaises(dc.RangeNotSatisfiableError) as cm:
            self.c._request("GET", "/v1/jobs/%s/checkpoints/2/config.json" % self.job["id"],
                            headers={"Range": "bytes=999999-"})
        self.assertTrue(cm.exception.headers["content-range"].startswith("bytes */"))
        self.assertTrue(issubclass(dc.ValidationError, dc.ApiError))
        self.assertTrue(issubclass(dc.ApiError, dc.DapodError))

    def test_connection_error_and_timeout(self):
        with self.assertRaises(dc.ConnectionError_):
            dc.Client("http://127.0.0.1:%d" % common.closed_port(), timeout=5).healthz()
        s = socket.socket()  # accepts (backlog) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        try:
            with self.assertRaises(dc.Timeout):
                dc.Client("http://127.0.0.1:%d" % s.getsockname()[1], timeout=0.5).healthz()
        finally:
            s.close()
        with self.assertRaises(ValueError):
            dc.Client("ftp://x")


class ZCoverage(unittest.TestCase):
    """Runs after ClientCase (unittest orders classes by name): every operation of
    openapi.yaml was called through the client by the tests above."""

    def test_every_openapi_operation_was_called(self):
        ops = openapi_operations()
        self.assertGreaterEqual(len(ops), 26)
        missing = ["%s %s" % (m, p) for m, p, rx in ops
                   if not any(cm == m and rx.match(cp) for cm, cp in CALLED)]
        self.assertEqual(missing, [], "operations the client tests never called")


class RestartCase(unittest.TestCase):
    def test_stream_survives_a_daemon_restart(self):
        """The daemon is stopped (SIGTERM) while the job trains and started again on the same
        port and data: the stream goes on after the restart, every event once."""
        tmp = tempfile.mkdtemp(prefix="dapod-pyclient-restart-")
        port = common.closed_port()
        data_dir = os.path.join(tmp, "var")
        args = ("--workers", "1", "--blas-threads", "1")
        d1 = harness.Daemon(DAPOD, args, data_dir=data_dir, listen="127.0.0.1:%d" % port)
        d2 = None
        try:
            d1.start()
            c = dc.Client("http://127.0.0.1:%d" % port, timeout=30)
            fid = c.upload_file(common.ADDITION)["id"]
            job = c.create_job(common.job_spec(fid, dict(common.SMALL_HP, total_steps=30)))
            got = []
            for ev in c.stream_events(job["id"]):
                got.append(ev)
                if ev.type == "metrics" and d2 is None:
                    self.assertEqual(d1.stop(), 0, d1.log())
                    d2 = harness.Daemon(DAPOD, args, data_dir=data_dir,
                                        listen="127.0.0.1:%d" % port)
                    d2.start()
            stored = [dc.Event(e["id"], e["type"], e["data"])
                      for e in common.events_all(d2, job["id"])]
            self.assertEqual(got, stored)
            self.assertEqual([e.data["step"] for e in got if e.type == "metrics"],
                             list(range(1, 31)))
            running = [e for e in got if e.type == "status" and e.data["status"] == "running"]
            self.assertGreaterEqual(len(running), 2, "the job did not run again")
            self.assertEqual(got[-1].type, "end")
        finally:
            d1.cleanup()
            if d2:
                self.assertEqual(d2.stop(), 0)
                d2.cleanup()
            shutil.rmtree(tmp, ignore_errors=True)


class ApiKeyCase(unittest.TestCase):
    KEY = "ci-secret-key"

    def test_api_key_is_sent_and_401_is_typed(self):
        sha = hashlib.sha256(self.KEY.encode()).hexdigest()
        with harness.Daemon(DAPOD, ["--api-keys", "ci:%s" % sha]) as d:
            url = "http://127.0.0.1:%d" % d.port
            with self.assertRaises(dc.AuthenticationError) as cm:
                dc.Client(url, api_key="").list_jobs()
            self.assertEqual((cm.exception.status, cm.exception.name), (401, "unauthorized"))
            with self.assertRaises(dc.AuthenticationError):
                dc.Client(url, api_key="wrong").list_jobs()
            self.assertEqual(dc.Client(url, api_key=self.KEY).list_jobs()["data"], [])
            os.environ["DAPOD_API_KEY"] = self.KEY
            try:
                self.assertEqual(dc.Client(url).list_files()["object"], "list")
            finally:
                del os.environ["DAPOD_API_KEY"]
            self.assertEqual(d.stop(), 0)


def main():
    global DAPOD
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    args, rest = ap.parse_known_args()
    DAPOD = os.path.abspath(args.dapod)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
