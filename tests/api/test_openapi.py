#!/usr/bin/python3
"""Contract test of openapi.yaml (label api): calls every operation of the document on a running
daemon, including error cases, and validates every response against the document.

Run: /usr/bin/python3 tests/api/test_openapi.py --dapod build/server/dapod --node-dir DIR

1. tests/openapi/install.sh DIR installs the pinned validator packages (Ajv, ajv-formats, yaml)
   under the build dir; exit 77 (skipped) when node or npm is missing.
2. A daemon (harness.Daemon: 127.0.0.1 port 0, scratch data dir) with one worker, a queue of one
   and small body limits is driven through a scenario: health, files (raw and multipart uploads,
   validation, list/get/content/delete), models, judge tests, a tiny job (tiny preset,
   tests/data/addition.jsonl, 2 steps) followed over SSE to `end` with its events, metrics (JSON
   and CSV), checkpoints, downloads (whole, Range, If-None-Match, HEAD), rollouts and
   completions, then a longer job paused, resumed, cancelled and deleted, the queue limit, and
   error cases of each kind. Each exchange is recorded (status, headers, body) and the scenario
   asserts the status it meant to provoke. The document's hyperparameters table is probed too:
   every knob just outside its documented bounds (or choices) is refused by name, every
   documented bound, choice and default is accepted, and an omitted knob takes its documented
   default.
3. tests/openapi/validate.mjs checks every recorded exchange against openapi.yaml: documented
   operation and status, media type, required headers, the body against its schema (JSON Lines
   and SSE line by line / event by event), the accepted request's parameters and body against
   theirs, and that every operation was called.
"""

import argparse
import base64
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import harness  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data")
SPEC = os.path.join(ROOT, "openapi.yaml")
DEADLINE_S = 120.0
TERMINAL = ("succeeded", "failed", "cancelled")

TINY_HP = {"total_steps": 2, "max_new_tokens": 4, "group_size": 4, "prompt_batch_size": 2}
# long enough to be caught running, paused and resumed (it is cancelled long before its end)
LONG_HP = {"total_steps": 1 << 20, "max_new_tokens": 16, "group_size": 8, "prompt_batch_size": 4,
           "max_gen_batches": 2}


def read(name):
    with open(os.path.join(DATA, name), "rb") as f:
        return f.read()


class Recorder:
    """Sends requests to the daemon and records each exchange for the validator."""

    def __init__(self, d, out, hyperparameters):
        self.d = d
        self.out = out
        self.n = 0
        self.hyperparameters = hyperparameters  # the document's Hyperparameters properties

    def call(self, tag, method, target, expect, body=None, headers=None, json_body=None,
             generic=False, timeout=60):
        headers = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers.setdefault("Content-Type", "application/json")
        r = self.d.request(method, target, body=body, headers=headers, timeout=timeout)
        ex = {"tag": tag, "method": method, "target": target, "status": r.status,
              "headers": r.headers, "body_b64": base64.b64encode(r.body).decode()}
        if json_body is not None:
            ex["request_json"] = json_body
        elif body is not None:
            ex["request_content_type"] = headers.get("Content-Type", "")
            ex["request_b64"] = base64.b64encode(body).decode()
        if generic:
            ex["generic"] = True
        self.out.write(json.dumps(ex) + "\n")
        self.n += 1
        if isinstance(expect, int):
            expect = (expect,)
        if r.status not in expect:
            raise AssertionError("[%s] %s %s: status %d, expected %s: %r\n--- daemon log ---\n%s"
                                 % (tag, method, target, r.status, expect, r.body[:600],
                                    self.d.log()[-4000:]))
        return r

    def stream_until_heartbeat(self, tag, target, headers=None):
        """Reads an event stream until its first heartbeat, then hangs up; records what came."""
        conn = http.client.HTTPConnection(self.d.host, self.d.port, timeout=DEADLINE_S)
        try:
            conn.request("GET", target, headers=headers or {})
            resp = conn.getresponse()
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
            got = b""
            while resp.status == 200 and not got.endswith(b"event: heartbeat\ndata: {}\n\n"):
                line = resp.readline()
                if not line:
                    raise AssertionError("[%s] the stream ended without a heartbeat: %r"
                                         % (tag, got[-500:]))
                got += line
        finally:
            conn.close()
        self.out.write(json.dumps({"tag": tag, "method": "GET", "target": target,
                                   "status": resp.status, "headers": hdrs,
                                   "body_b64": base64.b64encode(got).decode()}) + "\n")
        self.n += 1
        if resp.status != 200:
            raise AssertionError("[%s] status %d" % (tag, resp.status))
        return got.decode()

    def wait_status(self, job_id, pred, what):
        """Long-polls GET /v1/jobs/{id}?wait=N until pred(job); returns the job."""
        end = time.monotonic() + DEADLINE_S
        j = self.call("wait", "GET", "/v1/jobs/" + job_id, 200).json()
        while not pred(j):
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError("job %s: %s did not happen (status %s)\n%s"
                                     % (job_id, what, j["status"], self.d.log()[-4000:]))
            j = self.call("wait", "GET", "/v1/jobs/%s?wait=%d" % (job_id, max(1, min(10, int(left)))),
                          200).json()
        return j


def problem(r, name):
    p = json.loads(r.body)
    if p.get("type") != "https://dapod.dev/problems/" + name:
        raise AssertionError("expected problem %s, got %r" % (name, p))
    return p


def scenario(c):
    ndjson = {"Content-Type": "application/x-ndjson"}
    data = read("addition.jsonl")

    # ---- health ----
    c.call("live", "GET", "/healthz", 200)
    c.call("ready", "GET", "/readyz", 200)
    c.call("prometheus", "GET", "/metrics", 200)

    # ---- files ----
    f = c.call("upload raw", "POST", "/v1/files?purpose=fine-tune&filename=addition.jsonl", 201,
               body=data, headers=ndjson).json()
    assert (f["status"], f["validation"]) == ("processed", "valid"), f
    fid = f["id"]
    body, ctype = harness.multipart([("purpose", "fine-tune"),
                                     ("file", ("addition.jsonl", data, "application/x-ndjson"))])
    f2 = c.call("upload multipart", "POST", "/v1/files", 201, body=body,
                headers={"Content-Type": ctype}).json()
    bad = c.call("upload invalid", "POST", "/v1/files", 201, body=read("invalid.jsonl"),
                 headers={"Content-Type": "application/jsonl"}).json()
    assert (bad["status"], bad["validation"]) == ("error", "invalid") and bad["errors"], bad
    c.call("validate raw", "POST", "/v1/files/validate?filename=a.jsonl", 200, body=data,
           headers=ndjson)
    c.call("validate multipart", "POST", "/v1/files/validate", 200, body=body,
           headers={"Content-Type": ctype})
    v = c.call("validate invalid", "POST", "/v1/files/validate", 200, body=read("invalid.jsonl"),
               headers=ndjson).json()
    assert v["status"] == "invalid", v
    problem(c.call("upload text/plain", "POST", "/v1/files", 415, body=data,
                   headers={"Content-Type": "text/plain"}), "unsupported_media_type")
    problem(c.call("upload bad purpose", "POST", "/v1/files?purpose=no%20spaces", 400, body=data,
                   headers=ndjson), "invalid_request")
    problem(c.call("upload too large", "POST", "/v1/files", 413, body=data * 6, headers=ndjson),
            "payload_too_large")
    form, fctype = harness.multipart([("file", ("a.jsonl", data, "application/x-ndjson")),
                                      ("colour", "blue")])
    problem(c.call("validate unknown form field", "POST", "/v1/files/validate", 400, body=form,
                   headers={"Content-Type": fctype}), "invalid_request")
    problem(c.call("validate text/plain", "POST", "/v1/files/validate", 415, body=data,
                   headers={"Content-Type": "text/plain"}), "unsupported_media_type")
    page = c.call("list files", "GET", "/v1/files", 200).json()
    assert len(page["data"]) == 3 and not page["has_more"], page
    page = c.call("list files page", "GET", "/v1/files?limit=1", 200).json()
    assert page["has_more"] and page["next_after"], page
    c.call("list files next", "GET", "/v1/files?limit=2&after=" + page["next_after"], 200)
    problem(c.call("list files limit 0", "GET", "/v1/files?limit=0", 400), "invalid_request")
    problem(c.call("list files bad after", "GET", "/v1/files?after=file-nope", 400),
            "invalid_request")
    c.call("get file", "GET", "/v1/files/" + fid, 200)
    c.call("get invalid file", "GET", "/v1/files/" + bad["id"], 200)
    problem(c.call("get no file", "GET", "/v1/files/file-nope", 404), "not_found")
    r = c.call("file content", "GET", "/v1/files/%s/content" % fid, 200)
    assert r.body == data
    c.call("file content invalid", "GET", "/v1/files/%s/content" % bad["id"], 200)
    c.call("file content head", "HEAD", "/v1/files/%s/content" % fid, 200)
    problem(c.call("file content none", "GET", "/v1/files/file-nope/content", 404), "not_found")
    c.call("file content head none", "HEAD", "/v1/files/file-nope/content", 404)
    c.call("delete file", "DELETE", "/v1/files/" + f2["id"], 200)
    problem(c.call("delete file again", "DELETE", "/v1/files/" + f2["id"], 404), "not_found")

    # ---- models ----
    c.call("list models", "GET", "/v1/models", 200)
    page = c.call("list models page", "GET", "/v1/models?limit=1", 200).json()
    c.call("list models next", "GET", "/v1/models?limit=100&after=" + page["next_after"], 200)
    problem(c.call("list models bad after", "GET", "/v1/models?after=nope", 400),
            "invalid_request")
    problem(c.call("list models limit 101", "GET", "/v1/models?limit=101", 400),
            "invalid_request")
    c.call("get model", "GET", "/v1/models/tiny", 200)
    c.call("get model lora plan", "GET", "/v1/models/tiny?max_prompt_tokens=64&adapter=lora&r=4"
           "&alpha=16&target_modules=q_proj,v_proj,down_proj&use_rslora=true", 200)
    c.call("get model lora plan all-linear", "GET",
           "/v1/models/tiny?adapter=lora&target_modules=all-linear", 200)
    problem(c.call("get model lora bad r", "GET", "/v1/models/tiny?adapter=lora&r=x", 400),
            "invalid_request")
    problem(c.call("get model lora r too large", "GET", "/v1/models/tiny?adapter=lora&r=4096",
                   400), "invalid_request")
    problem(c.call("get model unknown adapter", "GET", "/v1/models/tiny?adapter=ia3", 400),
            "invalid_request")
    problem(c.call("get no model", "GET", "/v1/models/nope", 404), "not_found")

    # ---- judges ----
    items = [{"response": "The answer is 5", "answer": "5"},
             {"id": "b", "response": "\\boxed{7}", "answer": "6", "prompt": "3+3?", "group": 1,
              "metadata": {"k": 1}, "response_tokens": 3, "truncated": False}]
    c.call("judge math", "POST", "/v1/judges/test", 200,
           json_body={"judge": {"type": "math"}, "items": items})
    c.call("judge exact", "POST", "/v1/judges/test", 200,
           json_body={"judge": {"type": "exact"}, "items": items})
    c.call("judge regex", "POST", "/v1/judges/test", 200,
           json_body={"judge": {"type": "regex", "pattern": "answer is ([0-9]+)"},
                      "items": items})
    # a judge nobody listens to: still 200, with each item's error (no retries: quick)
    j = c.call("judge http down", "POST", "/v1/judges/test", 200,
               json_body={"judge": {"type": "http", "url": "http://127.0.0.1:9/judge",
                                    "timeout_ms": 2000, "max_retries": 0, "max_batch": 8,
                                    "concurrency": 1, "headers": {"X-Test": "1"},
                                    "format": "dapod"},
                          "items": items}).json()
    assert j["error"] and all(x["error"] for x in j["results"]), j
    p = problem(c.call("judge invalid", "POST", "/v1/judges/test", 422,
                       json_body={"judge": {"type": "regex"}, "items": [{"answer": 1}],
                                  "colour": 1}), "validation_failed")
    assert len(p["errors"]) >= 3, p
    problem(c.call("judge bad json", "POST", "/v1/judges/test", 400, body=b'{"judge": ',
                   headers={"Content-Type": "application/json"}), "invalid_json")
    problem(c.call("judge text/plain", "POST", "/v1/judges/test", 415, body=b"{}",
                   headers={"Content-Type": "text/plain"}), "unsupported_media_type")
    problem(c.call("judge body too large", "POST", "/v1/judges/test", 413,
                   json_body={"judge": {"type": "exact"},
                              "items": [{"response": "x" * 20000, "answer": "x"}]}),
            "payload_too_large")

    # ---- a tiny job, followed to its end ----
    tiny = {"model": "tiny", "training_file": fid, "judge": {"type": "math"}, "seed": 3,
            "metadata": {"run": "contract"}, "suffix": "add", "hyperparameters": TINY_HP}
    key = {"Idempotency-Key": "contract-tiny-1"}
    r = c.call("create tiny", "POST", "/v1/jobs", 201, json_body=tiny, headers=key)
    job = r.json()
    jid = job["id"]
    assert r.header("Location") == "/v1/jobs/" + jid, r
    s = c.call("stream to end", "GET", "/v1/jobs/%s/events/stream" % jid, 200, timeout=DEADLINE_S)
    text = s.body.decode()
    assert "event: end" in text, text[-500:]
    job = c.wait_status(jid, lambda j: j["status"] in TERMINAL, "the end")
    assert job["status"] == "succeeded", job
    c.call("get job wait", "GET", "/v1/jobs/%s?wait=5" % jid, 200)
    again = c.call("create tiny again", "POST", "/v1/jobs", 200, json_body=tiny, headers=key)
    assert again.json()["id"] == jid
    problem(c.call("create idempotency conflict", "POST", "/v1/jobs", 409,
                   json_body=dict(tiny, seed=4), headers=key), "conflict")
    problem(c.call("create empty idempotency key", "POST", "/v1/jobs", 400, json_body=tiny,
                   headers={"Idempotency-Key": ""}), "invalid_request")
    c.call("list jobs", "GET", "/v1/jobs", 200)
    c.call("list jobs succeeded", "GET", "/v1/jobs?status=succeeded&limit=5", 200)
    problem(c.call("list jobs bad status", "GET", "/v1/jobs?status=done", 400), "invalid_request")
    problem(c.call("list jobs bad after", "GET", "/v1/jobs?after=job-nope", 400),
            "invalid_request")
    problem(c.call("get job bad wait", "GET", "/v1/jobs/%s?wait=601" % jid, 400),
            "invalid_request")
    problem(c.call("get no job", "GET", "/v1/jobs/job-nope", 404), "not_found")

    # events
    ev = c.call("events", "GET", "/v1/jobs/%s/events" % jid, 200).json()
    page = c.call("events page", "GET", "/v1/jobs/%s/events?limit=2" % jid, 200).json()
    assert page["has_more"] and page["next_after"] == 2, page
    c.call("events next", "GET", "/v1/jobs/%s/events?limit=100&after=2" % jid, 200)
    problem(c.call("events bad after", "GET", "/v1/jobs/%s/events?after=x" % jid, 400),
            "invalid_request")
    problem(c.call("events bad limit", "GET", "/v1/jobs/%s/events?limit=500" % jid, 400),
            "invalid_request")
    problem(c.call("events no job", "GET", "/v1/jobs/job-nope/events", 404), "not_found")
    last = ev
    while last["has_more"]:  # progress events make the log long: its last page ends it
        last = c.call("events to the end", "GET", "/v1/jobs/%s/events?limit=100&after=%d"
                      % (jid, last["next_after"]), 200).json()
    assert last["data"][-1]["type"] == "end", last
    c.call("stream replay header", "GET", "/v1/jobs/%s/events/stream" % jid, 200,
           headers={"Last-Event-ID": "2"})
    c.call("stream replay query", "GET", "/v1/jobs/%s/events/stream?last_event_id=1" % jid, 200)
    problem(c.call("stream bad id", "GET", "/v1/jobs/%s/events/stream" % jid, 400,
                   headers={"Last-Event-ID": "abc"}), "invalid_request")
    problem(c.call("stream no job", "GET", "/v1/jobs/job-nope/events/stream", 404), "not_found")

    # metrics
    rows = c.call("metrics", "GET", "/v1/jobs/%s/metrics" % jid, 200).json()
    assert [m["step"] for m in rows] == [1, 2], rows
    csv = c.call("metrics csv", "GET", "/v1/jobs/%s/metrics?format=csv" % jid, 200)
    assert csv.header("Content-Type").startswith("text/csv"), csv
    assert csv.body.decode().split("\r\n")[0].startswith("step,"), csv
    c.call("metrics json", "GET", "/v1/jobs/%s/metrics?format=json" % jid, 200)
    problem(c.call("metrics bad format", "GET", "/v1/jobs/%s/metrics?format=xml" % jid, 400),
            "invalid_request")
    problem(c.call("metrics no job", "GET", "/v1/jobs/job-nope/metrics", 404), "not_found")

    # checkpoints and downloads
    cks = c.call("checkpoints", "GET", "/v1/jobs/%s/checkpoints" % jid, 200).json()
    last = cks["data"][-1]
    assert last["step"] == 2, cks
    problem(c.call("checkpoints no job", "GET", "/v1/jobs/job-nope/checkpoints", 404),
            "not_found")
    base = "/v1/jobs/%s/checkpoints/2/" % jid
    files = {x["name"]: x for x in last["files"]}
    r = c.call("download config", "GET", base + "config.json", 200)
    assert len(r.body) == files["config.json"]["bytes"] and json.loads(r.body)
    whole = c.call("download weights", "GET", base + "model.safetensors", 200).body
    size = files["model.safetensors"]["bytes"]
    assert len(whole) == size
    r = c.call("download range", "GET", base + "model.safetensors", 206,
               headers={"Range": "bytes=0-99"})
    assert r.body == whole[:100] and r.header("Content-Range") == "bytes 0-99/%d" % size, r
    r = c.call("download suffix range", "GET", base + "model.safetensors", 206,
               headers={"Range": "bytes=-16"})
    assert r.body == whole[-16:]
    etag = '"%s"' % files["model.safetensors"]["sha256"]
    c.call("download range if-range", "GET", base + "model.safetensors", 206,
           headers={"Range": "bytes=8-", "If-Range": etag})
    c.call("download multi range", "GET", base + "model.safetensors", 200,
           headers={"Range": "bytes=0-1,4-5"})
    c.call("download not modified", "GET", base + "model.safetensors", 304,
           headers={"If-None-Match": etag})
    problem(c.call("download past end", "GET", base + "model.safetensors", 416,
                   headers={"Range": "bytes=%d-" % size}), "range_not_satisfiable")
    c.call("download head", "HEAD", base + "model.safetensors", 200)
    c.call("download head range", "HEAD", base + "model.safetensors", 206,
           headers={"Range": "bytes=0-9"})
    c.call("download head not modified", "HEAD", base + "model.safetensors", 304,
           headers={"If-None-Match": "*"})
    c.call("download head past end", "HEAD", base + "model.safetensors", 416,
           headers={"Range": "bytes=-0"})
    c.call("download head none", "HEAD", base + "nope.bin", 404)
    problem(c.call("download no name", "GET", base + "nope.bin", 404), "not_found")
    problem(c.call("download dotdot", "GET", base + "..%2Fstep-0%2Fconfig.json", 404),
            "not_found")
    problem(c.call("download no step", "GET", "/v1/jobs/%s/checkpoints/9/config.json" % jid, 404),
            "not_found")

    # rollouts
    r = c.call("rollouts", "GET", "/v1/jobs/%s/rollouts?step=1" % jid, 200)
    assert r.body.strip(), r
    problem(c.call("rollouts no step", "GET", "/v1/jobs/%s/rollouts" % jid, 400),
            "invalid_request")
    problem(c.call("rollouts step 0", "GET", "/v1/jobs/%s/rollouts?step=0" % jid, 400),
            "invalid_request")
    problem(c.call("rollouts missing step", "GET", "/v1/jobs/%s/rollouts?step=99" % jid, 404),
            "not_found")

    # an agent job: episodes that call the example lookup tool, their rollouts and metrics
    agent_job(c, fid)

    # checkpoints are models
    model = "%s:step-2" % jid
    c.call("get checkpoint model", "GET", "/v1/models/" + model, 200)
    ids = [m["id"] for m in c.call("list models with checkpoints", "GET", "/v1/models?limit=100",
                                   200).json()["data"]]
    assert model in ids, ids

    # completions
    c.call("complete preset", "POST", "/v1/completions", 200,
           json_body={"model": "tiny", "prompt": "What is 2+3?", "max_tokens": 4, "n": 2,
                      "temperature": 0.8, "top_p": 0.9, "seed": 5, "logprobs": True})
    c.call("complete checkpoint", "POST", "/v1/completions", 200,
           json_body={"model": model, "prompt": "What is 1+1?", "max_tokens": 3,
                      "temperature": 0})
    s = c.call("complete stream", "POST", "/v1/completions", 200,
               json_body={"model": "tiny", "prompt": "What is 2+3?", "max_tokens": 4, "n": 2,
                          "seed": 5, "logprobs": True, "stop": ["3+", "?"], "stream": True,
                          "stream_options": {"include_usage": True}})
    assert s.body.endswith(b"data: [DONE]\n\n"), s.body[-200:]
    # OpenAI's integer logprobs: top_logprobs, whole and streamed
    c.call("complete top logprobs", "POST", "/v1/completions", 200,
           json_body={"model": "tiny", "prompt": "What is 2+3?", "max_tokens": 3, "seed": 5,
                      "logprobs": 5})
    c.call("complete top logprobs stream", "POST", "/v1/completions", 200,
           json_body={"model": "tiny", "prompt": "What is 2+3?", "max_tokens": 3, "seed": 5,
                      "logprobs": 2, "stream": True})
    c.call("complete empty prompt", "POST", "/v1/completions", 200,
           json_body={"model": "tiny", "prompt": ""})
    p = problem(c.call("complete invalid", "POST", "/v1/completions", 422,
                       json_body={"model": "nope", "prompt": 1, "n": 99, "colour": "red"}),
                "validation_failed")
    assert len(p["errors"]) >= 4, p
    problem(c.call("complete too long", "POST", "/v1/completions", 422,
                   json_body={"model": "tiny", "prompt": "x" * 600, "max_tokens": 16}),
            "validation_failed")
    problem(c.call("complete not an object", "POST", "/v1/completions", 422, json_body=[1]),
            "validation_failed")
    problem(c.call("complete bad json", "POST", "/v1/completions", 400, body=b"{,}",
                   headers={"Content-Type": "application/json"}), "invalid_json")
    problem(c.call("complete text/plain", "POST", "/v1/completions", 415, body=b"{}",
                   headers={"Content-Type": "text/plain"}), "unsupported_media_type")

    # the status machine refuses these on a finished job
    for action in ("cancel", "pause", "resume"):
        p = problem(c.call(action + " finished", "POST", "/v1/jobs/%s/%s" % (jid, action), 409),
                    "conflict")
        assert p["job_status"] == "succeeded", p
        problem(c.call(action + " no job", "POST", "/v1/jobs/job-nope/" + action, 404),
                "not_found")

    # job creation problems
    p = problem(c.call("create invalid", "POST", "/v1/jobs", 422,
                       json_body={"model": "nope", "training_file": bad["id"],
                                  "judge": {"type": "http", "url": "http://example.com/"},
                                  "hyperparameters": {"group_size": 1, "colour": 2},
                                  "job_id": "mine"}), "validation_failed")
    assert len(p["errors"]) >= 5, p
    problem(c.call("create not an object", "POST", "/v1/jobs", 422, json_body=["job"]),
            "validation_failed")
    problem(c.call("create bad json", "POST", "/v1/jobs", 400, body=b'{"model": tiny}',
                   headers={"Content-Type": "application/json"}), "invalid_json")
    problem(c.call("create text/plain", "POST", "/v1/jobs", 415, body=b"{}",
                   headers={"Content-Type": "text/plain"}), "unsupported_media_type")
    problem(c.call("create too large", "POST", "/v1/jobs", 413,
                   json_body=dict(tiny, metadata={"pad": "x" * 20000})), "payload_too_large")

    # ---- the hyperparameters table of the document against the daemon's ----
    hp_doc = c.hyperparameters
    outside = {"above": {}, "below": {}}
    for k, sch in hp_doc.items():
        t = sch.get("type")
        if t in ("integer", "number"):
            step = 1 if t == "integer" else (abs(sch["maximum"]) * 1e-3 or 1e-3)
            outside["above"][k] = sch["maximum"] + step
            step = 1 if t == "integer" else (abs(sch["minimum"]) * 1e-3 or 1e-3)
            outside["below"][k] = sch["minimum"] - step
        elif t == "boolean":
            outside["above"][k] = outside["below"][k] = "yes"
        else:
            outside["above"][k] = outside["below"][k] = "no-such-" + k
        if t == "integer":  # integer knobs take JSON integers only
            outside["below"][k] = sch["minimum"] + 0.5
    for side, hp in outside.items():
        p = problem(c.call("create hyperparameters " + side, "POST", "/v1/jobs", 422,
                           json_body={"model": "tiny", "training_file": fid,
                                      "hyperparameters": hp}), "validation_failed")
        named = {e.get("field") for e in p["errors"]}
        missed = sorted(k for k in hp_doc if "hyperparameters." + k not in named)
        assert not missed, "%s their documented bounds, not refused: %s\n%r" % (side, missed, p)
    # ... and every documented bound and choice is taken (training_file is missing: no job)
    for i, side in enumerate(("maximum", "minimum", "default")):
        hp = {}
        for k, sch in hp_doc.items():
            if "enum" in sch:
                hp[k] = sch["enum"][i % len(sch["enum"])]
            elif sch.get("type") == "boolean":
                hp[k] = bool(i % 2)
            elif side in sch:
                hp[k] = sch[side]
        p = problem(c.call("create hyperparameters at " + side, "POST", "/v1/jobs", 422,
                           json_body={"model": "tiny", "hyperparameters": hp}),
                    "validation_failed")
        wrong = [e for e in p["errors"] if e["field"] != "training_file"]
        assert not wrong, "documented values refused: %r" % wrong
    # omitted knobs take the documented defaults (those without one are derived: described)
    shown = c.call("get tiny job", "GET", "/v1/jobs/" + jid, 200).json()["hyperparameters"]
    assert set(shown) == set(hp_doc), sorted(set(shown) ^ set(hp_doc))
    for k, sch in hp_doc.items():
        if k in TINY_HP or "default" not in sch:
            continue
        assert shown[k] == sch["default"], "%s: the job uses %r, the document says %r" % (
            k, shown[k], sch["default"])

    # ---- the OpenAI-compatible surface (docs/OPENAI.md): errors are OpenAI's {"error": ...} ----
    oai_scenario(c)

    # ---- a longer job: pause, resume, cancel; the queue limit; files in use ----
    long_job = c.call("create long", "POST", "/v1/jobs", 201,
                      json_body={"model": "tiny", "training_file": fid,
                                 "hyperparameters": LONG_HP}).json()
    lid = long_job["id"]
    c.wait_status(lid, lambda j: j["status"] != "queued", "the start")
    problem(c.call("delete file in use", "DELETE", "/v1/files/" + fid, 409), "file_in_use")
    problem(c.call("delete live job", "DELETE", "/v1/jobs/" + lid, 409), "conflict")
    queued = c.call("create queued", "POST", "/v1/jobs", 201,
                    json_body={"model": "tiny", "training_file": fid,
                               "hyperparameters": TINY_HP}).json()
    assert queued["status"] == "queued" and queued["queue_position"] == 1, queued
    r = c.call("create over the queue limit", "POST", "/v1/jobs", 429,
               json_body={"model": "tiny", "training_file": fid, "hyperparameters": TINY_HP})
    problem(r, "too_many_requests")
    r = c.call("ft create over the queue limit", "POST", "/v1/fine_tuning/jobs", 429,
               json_body=FT_BODY(fid))
    oai_error(r, "rate_limit_error")
    c.call("list jobs queued", "GET", "/v1/jobs?status=queued", 200)
    j = c.call("cancel queued", "POST", "/v1/jobs/%s/cancel" % queued["id"], 200).json()
    assert j["status"] == "cancelled", j
    ftq = c.call("ft create queued", "POST", "/v1/fine_tuning/jobs", 200,
                 json_body=FT_BODY(fid)).json()
    assert ftq["status"] == "queued", ftq
    j = c.call("ft cancel queued", "POST", "/v1/fine_tuning/jobs/%s/cancel" % ftq["id"], 200).json()
    assert j["status"] == "cancelled", j
    j = c.call("pause long", "POST", "/v1/jobs/%s/pause" % lid, 200).json()
    assert j["status"] in ("pausing", "paused"), j
    c.call("get pausing", "GET", "/v1/jobs/" + lid, 200)
    c.wait_status(lid, lambda j: j["status"] == "paused", "the pause")
    c.call("pause paused", "POST", "/v1/jobs/%s/pause" % lid, 200)
    # nothing happens to a paused job: its stream (from its last event on) sends heartbeats
    last = 0
    while True:
        page = c.call("events paused", "GET", "/v1/jobs/%s/events?limit=100&after=%d"
                      % (lid, last), 200).json()
        last = page["data"][-1]["id"] if page["data"] else last
        if not page["has_more"]:
            break
    c.stream_until_heartbeat("stream heartbeat", "/v1/jobs/%s/events/stream" % lid,
                             headers={"Last-Event-ID": str(last)})
    c.call("checkpoints paused", "GET", "/v1/jobs/%s/checkpoints" % lid, 200)
    j = c.call("ft pause paused", "POST", "/v1/fine_tuning/jobs/%s/pause" % lid, 200).json()
    assert j["status"] == "paused", j
    j = c.call("ft resume paused", "POST", "/v1/fine_tuning/jobs/%s/resume" % lid, 200).json()
    assert j["status"] in ("queued", "running"), j
    # native resume of the job the OpenAI route resumed: no change while queued, 409 once running
    r = c.call("resume long", "POST", "/v1/jobs/%s/resume" % lid, (200, 409))
    assert r.status == 409 or r.json()["status"] in ("queued", "running"), r
    j = c.call("cancel long", "POST", "/v1/jobs/%s/cancel" % lid, 200).json()
    assert j["status"] in ("cancelling", "cancelled"), j
    c.wait_status(lid, lambda j: j["status"] in TERMINAL, "the cancel")
    c.call("events cancelled", "GET", "/v1/jobs/%s/events?limit=100" % lid, 200)
    c.call("stream cancelled", "GET", "/v1/jobs/%s/events/stream" % lid, 200)
    c.call("delete long", "DELETE", "/v1/jobs/" + lid, 200)
    c.call("delete queued", "DELETE", "/v1/jobs/" + queued["id"], 200)
    c.call("delete ft queued", "DELETE", "/v1/jobs/" + ftq["id"], 200)
    problem(c.call("delete long again", "DELETE", "/v1/jobs/" + lid, 404), "not_found")
    c.call("delete tiny", "DELETE", "/v1/jobs/" + jid, 200)
    c.call("delete file", "DELETE", "/v1/files/" + fid, 200)

    # ---- generic answers (no operation of their own) ----
    problem(c.call("unknown path", "GET", "/v1/nope", 404, generic=True), "not_found")
    r = c.call("method not allowed", "PUT", "/v1/jobs", 405, generic=True)
    problem(r, "method_not_allowed")
    assert r.header("Allow") == "GET, HEAD, POST", r
    r = c.call("options", "OPTIONS", "/v1/jobs/%s/checkpoints" % jid, 204, generic=True)
    assert r.header("Allow") == "GET, HEAD", r
    # the OpenAI-compatible routes answer their generic errors in OpenAI's shape too
    oai_error(c.call("ft unknown path", "GET", "/v1/fine_tuning/nope", 404, generic=True),
              "invalid_request_error")
    r = c.call("ft method not allowed", "DELETE", "/v1/fine_tuning/jobs", 405, generic=True)
    oai_error(r, "invalid_request_error")
    assert r.header("Allow") == "GET, HEAD, POST", r


# ---- the OpenAI-compatible surface ----

FT_GRADER = {"type": "multi", "name": "sum",
             "graders": {"exact": {"type": "string_check", "name": "exact",
                                   "input": "{{sample.output_text}}", "reference": "{{item.sum}}",
                                   "operation": "eq"},
                         "close": {"type": "text_similarity", "name": "close",
                                   "input": "{{sample.output_text}}", "reference": "{{item.sum}}",
                                   "evaluation_metric": "fuzzy_match"}},
             "calculate_output": "0.9 * exact + 0.1 * close"}


def FT_BODY(training_file, **extra):
    body = {"model": "tiny", "training_file": training_file,
            "method": {"type": "reinforcement",
                       "reinforcement": {"grader": FT_GRADER,
                                         "hyperparameters": {"total_steps": 2}}}}
    body.update(extra)
    return body


def oai_error(r, type_):
    """Checks OpenAI's error shape ({"error": {message, type, param, code}}, application/json)."""
    ct = r.header("Content-Type") or ""
    if not ct.startswith("application/json"):
        raise AssertionError("expected OpenAI's error as application/json, got %s: %r"
                             % (ct, r.body[:300]))
    e = json.loads(r.body).get("error")
    if not isinstance(e, dict) or e.get("type") != type_ or not e.get("message"):
        raise AssertionError("expected an OpenAI error of type %s, got %r" % (type_, r.body[:300]))
    return e


def rft_lines():
    out = []
    for a in range(4):
        for b in range(3):
            out.append(json.dumps({"messages": [{"role": "user", "content": "What is %d+%d?"
                                                 % (a, b)}], "sum": str(a + b)}))
    return ("\n".join(out) + "\n").encode()


def oai_scenario(c):
    ndjson = {"Content-Type": "application/x-ndjson"}
    f = c.call("upload rft", "POST", "/v1/files?purpose=fine-tune&filename=rft.jsonl", 201,
               body=rft_lines(), headers=ndjson).json()
    fid = f["id"]
    # graders
    c.call("ft grader validate", "POST", "/v1/fine_tuning/alpha/graders/validate", 200,
           json_body={"grader": FT_GRADER})
    e = oai_error(c.call("ft grader validate bad", "POST", "/v1/fine_tuning/alpha/graders/validate",
                         400, json_body={"grader": {"type": "string_check", "input": "a",
                                                    "reference": "b", "operation": "is"}}),
                  "invalid_request_error")
    assert e["param"] == "grader.operation", e
    e = oai_error(c.call("ft grader score_model", "POST", "/v1/fine_tuning/alpha/graders/validate",
                         400, json_body={"grader": {"type": "score_model", "model": "m",
                                                    "input": []}}), "invalid_request_error")
    assert e["param"] == "grader.model" and "judge_models" in e["message"], e
    run = c.call("ft grader run", "POST", "/v1/fine_tuning/alpha/graders/run", 200,
                 json_body={"grader": FT_GRADER, "model_sample": "5", "item": {"sum": "5"}}).json()
    assert abs(run["reward"] - 1) < 1e-9 and run["sub_rewards"] == {"exact": 1, "close": 1}, run
    run = c.call("ft grader run invalid variable", "POST", "/v1/fine_tuning/alpha/graders/run", 200,
                 json_body={"grader": FT_GRADER, "model_sample": "5"}).json()
    assert run["reward"] == 0 and run["metadata"]["errors"]["invalid_variable_error"], run
    oai_error(c.call("ft grader run no sample", "POST", "/v1/fine_tuning/alpha/graders/run", 400,
                     json_body={"grader": FT_GRADER}), "invalid_request_error")
    e = oai_error(c.call("ft grader run bad json", "POST", "/v1/fine_tuning/alpha/graders/run", 400,
                         body=b'{"grader": ', headers={"Content-Type": "application/json"}),
                  "invalid_request_error")
    assert e["code"] == "invalid_json", e
    oai_error(c.call("ft grader run text/plain", "POST", "/v1/fine_tuning/alpha/graders/run", 415,
                     body=b"{}", headers={"Content-Type": "text/plain"}), "invalid_request_error")
    oai_error(c.call("ft grader validate too large", "POST",
                     "/v1/fine_tuning/alpha/graders/validate", 413,
                     json_body={"grader": dict(FT_GRADER, name="x" * 20000)}),
              "invalid_request_error")

    # a job: 2 steps, evaluated and checkpointed at each
    body = FT_BODY(fid, validation_file=fid, seed=2, suffix="sums", metadata={"team": "oai"})
    body["method"]["reinforcement"]["hyperparameters"] = {
        "n_epochs": "auto", "batch_size": 2, "learning_rate_multiplier": 2, "eval_interval": 1,
        "eval_samples": 4, "compute_multiplier": 0.5, "reasoning_effort": "default",
        "total_steps": 2, "max_new_tokens": 2}
    job = c.call("ft create", "POST", "/v1/fine_tuning/jobs", 200, json_body=body).json()
    jid = job["id"]
    hp = c.call("ft native view", "GET", "/v1/jobs/" + jid, 200).json()["hyperparameters"]
    assert (hp["prompt_batch_size"], hp["group_size"], hp["eval_every"], hp["eval_samples"]) == \
        (2, 4, 1, 4) and abs(hp["learning_rate"] - 2e-5) < 1e-12, hp
    again = c.call("ft create retried", "POST", "/v1/fine_tuning/jobs", 200, json_body=body,
                   headers={"X-Stainless-Retry-Count": "1"}).json()
    assert again["id"] == jid, (again["id"], jid)
    e = oai_error(c.call("ft create ppo", "POST", "/v1/fine_tuning/jobs", 400,
                         json_body={"model": "tiny", "training_file": fid,
                                    "method": {"type": "ppo", "ppo": {}}}),
                  "invalid_request_error")
    assert e["param"] == "method.type", e
    e = oai_error(c.call("ft create invalid", "POST", "/v1/fine_tuning/jobs", 400,
                         json_body=FT_BODY("file-nope", colour=1)), "invalid_request_error")
    e = oai_error(c.call("ft create bad json", "POST", "/v1/fine_tuning/jobs", 400,
                         body=b"{,}", headers={"Content-Type": "application/json"}),
                  "invalid_request_error")
    oai_error(c.call("ft create text/plain", "POST", "/v1/fine_tuning/jobs", 415, body=b"{}",
                     headers={"Content-Type": "text/plain"}), "invalid_request_error")
    oai_error(c.call("ft create too large", "POST", "/v1/fine_tuning/jobs", 413,
                     json_body=FT_BODY(fid, metadata={"pad": "x" * 20000})),
              "invalid_request_error")
    job = c.wait_status(jid, lambda j: j["status"] in TERMINAL, "the end of the ft job")
    assert job["status"] == "succeeded", job
    job = c.call("ft get", "GET", "/v1/fine_tuning/jobs/" + jid, 200).json()
    assert job["fine_tuned_model"] == "ft:tiny:dapod:sums:" + jid, job
    oai_error(c.call("ft get none", "GET", "/v1/fine_tuning/jobs/job-nope", 404),
              "invalid_request_error")
    page = c.call("ft list", "GET", "/v1/fine_tuning/jobs?limit=1", 200).json()
    assert page["data"][0]["id"] == jid and page["has_more"], page
    c.call("ft list next", "GET", "/v1/fine_tuning/jobs?limit=100&after=" + jid, 200)
    page = c.call("ft list metadata", "GET", "/v1/fine_tuning/jobs?metadata%5Bteam%5D=oai", 200).json()
    assert [j["id"] for j in page["data"]] == [jid], page
    oai_error(c.call("ft list bad limit", "GET", "/v1/fine_tuning/jobs?limit=0", 400),
              "invalid_request_error")
    oai_error(c.call("ft list bad after", "GET", "/v1/fine_tuning/jobs?after=job-nope", 400),
              "invalid_request_error")
    # events and checkpoints, newest first
    ev = c.call("ft events", "GET", "/v1/fine_tuning/jobs/%s/events?limit=100" % jid, 200).json()
    kinds = {e["type"] for e in ev["data"]}
    assert kinds == {"message", "metrics"}, kinds
    page = c.call("ft events page", "GET", "/v1/fine_tuning/jobs/%s/events?limit=2" % jid,
                  200).json()
    assert page["has_more"], page
    c.call("ft events next", "GET", "/v1/fine_tuning/jobs/%s/events?limit=2&after=%s"
           % (jid, page["data"][-1]["id"]), 200)
    oai_error(c.call("ft events bad after", "GET", "/v1/fine_tuning/jobs/%s/events?after=x" % jid,
                     400), "invalid_request_error")
    oai_error(c.call("ft events none", "GET", "/v1/fine_tuning/jobs/job-nope/events", 404),
              "invalid_request_error")
    ck = c.call("ft checkpoints", "GET", "/v1/fine_tuning/jobs/%s/checkpoints" % jid, 200).json()
    steps = [x["step_number"] for x in ck["data"]]
    assert steps == sorted(steps, reverse=True) and steps[0] == 2, ck
    c.call("ft checkpoints page", "GET", "/v1/fine_tuning/jobs/%s/checkpoints?limit=1&after=%s"
           % (jid, ck["data"][0]["id"]), 200)
    oai_error(c.call("ft checkpoints bad after", "GET",
                     "/v1/fine_tuning/jobs/%s/checkpoints?after=x" % jid, 400),
              "invalid_request_error")
    oai_error(c.call("ft checkpoints none", "GET", "/v1/fine_tuning/jobs/job-nope/checkpoints", 404),
              "invalid_request_error")
    # the status machine: 409 on a finished job, 404 on none
    for action in ("cancel", "pause", "resume"):
        e = oai_error(c.call("ft %s finished" % action, "POST",
                             "/v1/fine_tuning/jobs/%s/%s" % (jid, action), 409),
                      "invalid_request_error")
        assert e["code"] == "invalid_state", e
        oai_error(c.call("ft %s none" % action, "POST", "/v1/fine_tuning/jobs/job-nope/" + action,
                         404), "invalid_request_error")

    # chat completions: a base model, the fine-tuned model, a checkpoint, streamed
    msgs = [{"role": "developer", "content": "Add."},
            {"role": "user", "content": [{"type": "text", "text": "What is 2+1?"}]}]
    c.call("chat preset", "POST", "/v1/chat/completions", 200,
           json_body={"model": "tiny", "messages": msgs, "n": 2, "seed": 3, "temperature": 0.7,
                      "top_p": 0.9, "max_tokens": 3, "stop": ["\n"], "logprobs": True,
                      "top_logprobs": 20, "user": "ignored"})
    r = c.call("chat fine-tuned", "POST", "/v1/chat/completions", 200,
               json_body={"model": job["fine_tuned_model"], "messages": msgs,
                          "max_completion_tokens": 2, "temperature": 0}).json()
    assert r["choices"][0]["finish_reason"] in ("stop", "length"), r
    s = c.call("chat stream", "POST", "/v1/chat/completions", 200,
               json_body={"model": ck["data"][0]["fine_tuned_model_checkpoint"], "messages": msgs,
                          "max_tokens": 2, "temperature": 0, "stream": True,
                          "stream_options": {"include_usage": True}})
    assert s.header("Content-Type").startswith("text/event-stream"), s
    assert s.body.endswith(b"data: [DONE]\n\n"), s.body[-200:]
    e = oai_error(c.call("chat no model", "POST", "/v1/chat/completions", 404,
                         json_body={"model": "nope", "messages": msgs}), "invalid_request_error")
    assert e["param"] == "model", e
    oai_error(c.call("chat bad n", "POST", "/v1/chat/completions", 400,
                     json_body={"model": "tiny", "messages": msgs, "n": 99}),
              "invalid_request_error")
    oai_error(c.call("chat too long", "POST", "/v1/chat/completions", 422,
                     json_body={"model": "tiny", "max_tokens": 500,
                                "messages": [{"role": "user", "content": "x" * 400}]}),
              "invalid_request_error")
    oai_error(c.call("chat bad json", "POST", "/v1/chat/completions", 400, body=b"{",
                     headers={"Content-Type": "application/json"}), "invalid_request_error")
    oai_error(c.call("chat text/plain", "POST", "/v1/chat/completions", 415, body=b"{}",
                     headers={"Content-Type": "text/plain"}), "invalid_request_error")
    oai_error(c.call("chat too large", "POST", "/v1/chat/completions", 413,
                     json_body={"model": "tiny", "messages": [{"role": "user",
                                                               "content": "x" * 20000}]}),
              "invalid_request_error")
    c.call("ft delete", "DELETE", "/v1/jobs/" + jid, 200)
    c.call("delete rft file", "DELETE", "/v1/files/" + fid, 200)
    sft_scenario(c)
    dpo_scenario(c)


def sft_scenario(c):
    """A supervised job through /v1/fine_tuning/jobs: its object, events, checkpoints and result
    file validated against the document."""
    lines = "".join(json.dumps({"messages": [{"role": "user", "content": "%d+1=" % k},
                                             {"role": "assistant", "content": str(k + 1)}]})
                    + "\n" for k in range(6)).encode()
    fid = c.call("upload sft", "POST", "/v1/files?purpose=fine-tune&filename=sft.jsonl", 201,
                 body=lines, headers={"Content-Type": "application/x-ndjson"}).json()["id"]
    body = {"model": "tiny", "training_file": fid, "validation_file": fid,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {
                "batch_size": 3, "n_epochs": 2, "learning_rate_multiplier": "auto"}}}}
    jid = c.call("ft create supervised", "POST", "/v1/fine_tuning/jobs", 200,
                 json_body=body).json()["id"]
    oai_error(c.call("ft create supervised n_epochs 0", "POST", "/v1/fine_tuning/jobs", 400,
                     json_body=dict(body, method={"type": "supervised", "supervised": {
                         "hyperparameters": {"n_epochs": 0}}})), "invalid_request_error")
    c.wait_status(jid, lambda j: j["status"] in TERMINAL, "the end of the supervised job")
    job = c.call("ft get supervised", "GET", "/v1/fine_tuning/jobs/" + jid, 200).json()
    assert job["status"] == "succeeded" and len(job["result_files"]) == 1, job
    c.call("ft events supervised", "GET", "/v1/fine_tuning/jobs/%s/events?limit=100" % jid, 200)
    c.call("ft checkpoints supervised", "GET", "/v1/fine_tuning/jobs/%s/checkpoints" % jid, 200)
    c.call("ft result file", "GET", "/v1/files/" + job["result_files"][0], 200)
    c.call("ft delete supervised", "DELETE", "/v1/jobs/" + jid, 200)


def dpo_scenario(c):
    """A DPO job through /v1/fine_tuning/jobs and a native one: their objects, events,
    checkpoints, the result file and the upload's methods validated against the document."""
    pair = lambda k: {"input": {"messages": [{"role": "user", "content": "%d?" % k}]},  # noqa
                      "preferred_output": [{"role": "assistant", "content": str(k + 1)}],
                      "non_preferred_output": [{"role": "assistant", "content": str(k)}]}
    lines = "".join(json.dumps(pair(k)) + "\n" for k in range(6)).encode()
    f = c.call("upload dpo", "POST", "/v1/files?purpose=fine-tune&filename=dpo.jsonl", 201,
               body=lines, headers={"Content-Type": "application/x-ndjson"}).json()
    assert f["methods"] == ["dpo"], f
    fid = f["id"]
    body = {"model": "tiny", "training_file": fid, "validation_file": fid,
            "method": {"type": "dpo", "dpo": {"hyperparameters": {
                "batch_size": 3, "n_epochs": 2, "beta": "auto"}}}}
    jid = c.call("ft create dpo", "POST", "/v1/fine_tuning/jobs", 200,
                 json_body=body).json()["id"]
    oai_error(c.call("ft create dpo beta 3", "POST", "/v1/fine_tuning/jobs", 400,
                     json_body=dict(body, method={"type": "dpo", "dpo": {
                         "hyperparameters": {"beta": 3}}})), "invalid_request_error")
    c.wait_status(jid, lambda j: j["status"] in TERMINAL, "the end of the dpo job")
    c.call("native get dpo", "GET", "/v1/jobs/" + jid, 200)
    job = c.call("ft get dpo", "GET", "/v1/fine_tuning/jobs/" + jid, 200).json()
    assert job["status"] == "succeeded" and len(job["result_files"]) == 1, job
    c.call("ft events dpo", "GET", "/v1/fine_tuning/jobs/%s/events?limit=100" % jid, 200)
    c.call("ft checkpoints dpo", "GET", "/v1/fine_tuning/jobs/%s/checkpoints" % jid, 200)
    c.call("ft delete dpo", "DELETE", "/v1/jobs/" + jid, 200)


def agent_job(c, fid):
    """A multi-turn job with a tool (clients/tools/example_tools.py on a free port): created,
    followed to its end, its resolved episode in the job object, its rollouts episodes with
    turns, its metrics the episode ones; a tool whose host the policy refuses, refused by
    field."""
    tools = subprocess.Popen([sys.executable, os.path.join(ROOT, "clients", "tools",
                                                            "example_tools.py")],
                             stdout=subprocess.PIPE, preexec_fn=harness._die_with_parent)
    try:
        port = int(tools.stdout.readline())
        episode = {"max_turns": 2, "max_new_tokens_per_turn": 2,
                   "tools": [{"type": "function", "url": "http://127.0.0.1:%d/lookup" % port,
                              "function": {"name": "lookup", "description": "the stored value",
                                           "parameters": {"type": "object"}}}]}
        body = {"model": "tiny", "training_file": fid, "judge": {"type": "math"}, "seed": 5,
                "hyperparameters": dict(TINY_HP, group_size=16), "episode": episode}
        job = c.call("create agent job", "POST", "/v1/jobs", 201, json_body=body).json()
        ep = job["episode"]
        assert ep["max_turns"] == 2 and ep["max_episode_tokens"] == 4 + 64, ep
        assert ep["reward"] == "judge" and ep["tools"][0]["function"]["name"] == "lookup", ep
        job = c.wait_status(job["id"], lambda j: j["status"] in TERMINAL, "the agent job's end")
        assert job["status"] == "succeeded", job
        m = job["latest_metrics"]
        assert "episode/turns_mean" in m and "tool/errors/unknown_tool" in m, m
        r = c.call("agent rollouts", "GET", "/v1/jobs/%s/rollouts?step=1" % job["id"], 200)
        lines = [json.loads(x) for x in r.body.decode().splitlines() if x.strip()]
        assert lines and all(len(x["token_ids"]) == len(x["loss_mask"]) and x["turns"]
                             for x in lines), lines[:1]
        bad = dict(body, episode=dict(episode, tools=[dict(episode["tools"][0],
                                                           url="http://example.com/lookup")]))
        p = problem(c.call("create agent job bad tool host", "POST", "/v1/jobs", 422,
                           json_body=bad), "validation_failed")
        assert any(e["field"] == "episode.tools[0].url" for e in p["errors"]), p
    finally:
        tools.terminate()
        tools.wait(10)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    ap.add_argument("--node-dir", required=True, help="where install.sh puts the npm packages")
    args = ap.parse_args()

    rc = subprocess.call(["sh", os.path.join(ROOT, "tests", "openapi", "install.sh"),
                          args.node_dir])
    if rc != 0:
        sys.exit(rc)  # 77: node or npm missing (skipped)

    t0 = time.monotonic()
    d = harness.Daemon(args.dapod, ("--workers", "1", "--blas-threads", "1",
                                    "--max-queued-jobs", "1", "--max-body-bytes", "16K",
                                    "--max-upload-bytes", "16K", "--sse-heartbeat-s", "1",
                                    # progress events of every pass, checked like the others
                                    "--progress-every-pass", "true"))
    with tempfile.TemporaryDirectory(prefix="dapod-openapi-") as tmp:
        path = os.path.join(tmp, "exchanges.jsonl")
        try:
            d.start()
            hp = json.loads(subprocess.check_output(
                ["node", os.path.join(args.node_dir, "validate.mjs"), "--hyperparameters", SPEC]))
            # JobError.code enumerates the daemon's registry of failure codes, no more, no less
            documented = json.loads(subprocess.check_output(
                ["node", os.path.join(args.node_dir, "validate.mjs"), "--enum", "JobError", "code",
                 SPEC]))
            registry = [f["code"] for f in json.loads(subprocess.check_output(
                [args.dapod, "failures", "--json"]))]
            if sorted(documented or []) != sorted(registry):
                raise AssertionError("openapi.yaml JobError.code %s != `dapod failures` %s"
                                     % (documented, registry))
            with open(path, "w") as out:
                c = Recorder(d, out, hp)
                scenario(c)
            rc = d.stop()
            if rc != 0:
                raise AssertionError("dapod exited %s after SIGTERM:\n%s" % (rc, d.log()[-4000:]))
        finally:
            d.cleanup()
        print("test_openapi: %d exchanges recorded in %.1f s" % (c.n, time.monotonic() - t0))
        sys.stdout.flush()
        rc = subprocess.call(["node", os.path.join(args.node_dir, "validate.mjs"), SPEC, path])
    sys.exit(1 if rc else 0)


if __name__ == "__main__":
    main()
