#!/usr/bin/python3
"""API integration tests of the HTTP layer, health, files and models (label api).

Run: /usr/bin/python3 tests/api/test_http.py --dapod build/server/dapod [unittest args]
Each test class starts its own daemon (harness.Daemon) on 127.0.0.1 port 0 with a scratch data
directory and stops it with SIGTERM, checking that it exits 0.
"""

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

DATA = os.path.join(HERE, "..", "data")
DAPOD = None
PROBLEM_BASE = "https://dapod.dev/problems/"


def read(name):
    with open(os.path.join(DATA, name), "rb") as f:
        return f.read()


class DaemonCase(unittest.TestCase):
    """A test class with one daemon for all its tests."""
    ARGS = ()

    @classmethod
    def setUpClass(cls):
        cls.d = harness.Daemon(DAPOD, cls.ARGS)
        try:
            cls.d.start()
        except Exception:
            cls.d.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            rc = cls.d.stop()
            if rc != 0:
                raise AssertionError("dapod exited %s after SIGTERM:\n%s" % (rc, cls.d.log()))
        finally:
            cls.d.cleanup()

    def assertProblem(self, r, status, name, detail_has=None):
        """r is an RFC 9457 problem of registry row `name` with HTTP status `status`."""
        self.assertEqual(r.status, status, r)
        self.assertEqual(r.header("Content-Type"), "application/problem+json", r)
        p = r.json()
        self.assertEqual(p["type"], PROBLEM_BASE + name, p)
        self.assertEqual(p["status"], status, p)
        self.assertIsInstance(p["title"], str)
        self.assertTrue(p["title"])
        self.assertIsInstance(p["detail"], str)
        self.assertTrue(p["detail"])
        if detail_has:
            self.assertIn(detail_has, p["detail"], p)
        return p

    def assertJson(self, r, status):
        self.assertEqual(r.status, status, r)
        self.assertEqual(r.header("Content-Type"), "application/json; charset=utf-8", r)
        return r.json()

    def upload_raw(self, data, purpose="fine-tune", filename="data.jsonl", path="/v1/files",
                   ctype="application/x-ndjson"):
        q = "?purpose=%s&filename=%s" % (purpose, filename)
        return self.d.request("POST", path + q, body=data, headers={"Content-Type": ctype})

    def upload_multipart(self, data, purpose="fine-tune", filename="data.jsonl",
                         path="/v1/files"):
        fields = []
        if purpose is not None:
            fields.append(("purpose", purpose))
        fields.append(("file", (filename, data, "application/x-ndjson")))
        body, ctype = harness.multipart(fields)
        return self.d.request("POST", path, body=body, headers={"Content-Type": ctype})


class TestRouting(DaemonCase):
    def test_unknown_path_is_404_problem(self):
        self.assertProblem(self.d.get("/nope"), 404, "not_found", "/nope")
        self.assertProblem(self.d.get("/v1/files/x/y/z"), 404, "not_found")
        self.assertProblem(self.d.get("/v1/files/"), 404, "not_found")

    def test_known_path_other_method_is_405_with_allow(self):
        r = self.d.request("DELETE", "/healthz")
        self.assertProblem(r, 405, "method_not_allowed")
        self.assertEqual(r.header("Allow"), "GET, HEAD")
        r = self.d.request("PUT", "/v1/files")
        self.assertProblem(r, 405, "method_not_allowed")
        self.assertEqual(r.header("Allow"), "GET, HEAD, POST")
        r = self.d.request("POST", "/v1/files/file-123")
        self.assertProblem(r, 405, "method_not_allowed")
        self.assertEqual(r.header("Allow"), "GET, HEAD, DELETE")

    def test_options_lists_methods(self):
        r = self.d.request("OPTIONS", "/v1/files")
        self.assertEqual(r.status, 204)
        self.assertEqual(r.header("Allow"), "GET, HEAD, POST")

    def test_head(self):
        r = self.d.request("HEAD", "/healthz")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, b"")

    def test_health(self):
        self.assertEqual(self.assertJson(self.d.get("/healthz"), 200), {"status": "ok"})
        self.assertEqual(self.assertJson(self.d.get("/readyz"), 200)["status"], "ready")

    def test_metrics(self):
        self.d.get("/healthz")
        self.d.get("/no-such-path")
        r = self.d.get("/metrics")
        self.assertEqual(r.status, 200)
        self.assertTrue(r.header("Content-Type").startswith("text/plain; version=0.0.4"), r)
        text = r.body.decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        self.assertGreaterEqual(samples['dapod_http_requests_total{method="GET",status="200"}'], 1)
        self.assertGreaterEqual(samples['dapod_http_requests_total{method="GET",status="404"}'], 1)
        self.assertGreater(samples["dapod_uptime_seconds"], 0)
        self.assertEqual(samples["dapod_ready"], 1)
        for s in ("queued", "running", "succeeded", "failed", "cancelled", "paused"):
            self.assertEqual(samples['dapod_jobs{status="%s"}' % s], 0)
        self.assertEqual(samples['dapod_http_request_duration_seconds_bucket{le="+Inf"}'],
                         samples["dapod_http_request_duration_seconds_count"])
        self.assertIn("# TYPE dapod_http_requests_total counter", text)

    def test_keepalive_after_error(self):
        """A 404 does not close the connection: two requests on one connection."""
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.d.port, timeout=10)
        try:
            c.request("GET", "/nope")
            r = c.getresponse()
            r.read()
            self.assertEqual(r.status, 404)
            c.request("GET", "/healthz")
            r = c.getresponse()
            r.read()
            self.assertEqual(r.status, 200)
        finally:
            c.close()


class TestJsonBodies(DaemonCase):
    """Central JSON handling, seen through POST /v1/judges/test (a JSON endpoint)."""
    ARGS = ("--max-body-bytes", "2K", "--max-json-depth", "8")

    def test_too_big_json_is_413(self):
        big = {"judge": {"type": "exact"},
               "items": [{"response": "x" * 100, "answer": "y"} for _ in range(40)]}
        self.assertProblem(self.d.post_json("/v1/judges/test", big), 413, "payload_too_large",
                           "max_body_bytes")

    def test_too_big_chunked_json_is_413(self):
        body = b'{"judge": {"type": "exact"}, "items": ["' + b"x" * 5000 + b'"]}'
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        head = (b"POST /v1/judges/test HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        status, hdrs, data = self.d.raw_exchange(head, chunked)
        self.assertEqual(status, 413)
        self.assertEqual(json.loads(data)["type"], PROBLEM_BASE + "payload_too_large")

    def test_huge_announced_body_is_refused_before_it_is_sent(self):
        head = (b"POST /v1/judges/test HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 10000000000\r\nExpect: 100-continue\r\n\r\n")
        status, hdrs, data = self.d.raw_exchange(head)
        self.assertEqual(status, 413)
        self.assertEqual(json.loads(data)["type"], PROBLEM_BASE + "payload_too_large")

    def test_malformed_json_is_400_with_position(self):
        r = self.d.post_json("/v1/judges/test", b'{"judge": {"type": "exact"},\n "items": [1,]}')
        p = self.assertProblem(r, 400, "invalid_json")
        self.assertIn("line 2", p["detail"])
        self.assertIn("column", p["detail"])
        self.assertIn("byte", p["detail"])

    def test_duplicate_keys_are_400(self):
        r = self.d.post_json("/v1/judges/test", b'{"items": [], "items": []}')
        self.assertProblem(r, 400, "invalid_json", "duplicate")

    def test_too_deep_json_is_400_naming_the_limit(self):
        r = self.d.post_json("/v1/judges/test", b"[" * 9 + b"]" * 9)
        self.assertProblem(r, 400, "invalid_json", "max_json_depth (8)")
        # brackets inside strings do not count
        r = self.d.post_json("/v1/judges/test",
                             {"judge": {"type": "exact"},
                              "items": [{"response": "[[[[[[[[[[[[", "answer": "{{{{{{{{{{"}]})
        self.assertEqual(r.status, 200, r)

    def test_json_endpoint_wants_json_content_type(self):
        r = self.d.request("POST", "/v1/judges/test", body=b"{}",
                           headers={"Content-Type": "text/plain"})
        self.assertProblem(r, 415, "unsupported_media_type")

    def test_judge_test_runs_a_builtin_judge(self):
        r = self.d.post_json("/v1/judges/test", {
            "judge": {"type": "math"},
            "items": [{"id": "a", "response": "so the answer is \\boxed{4}", "answer": "4"},
                      {"id": "b", "response": "5", "answer": "4"}]})
        o = self.assertJson(r, 200)
        self.assertEqual(o["type"], "math")
        self.assertEqual([x["reward"] for x in o["results"]], [1.0, -1.0])
        self.assertEqual([x["correct"] for x in o["results"]], [True, False])
        self.assertIsNone(o["error"])

    def test_judge_test_validation_lists_every_problem(self):
        r = self.d.post_json("/v1/judges/test", {
            "judge": {"type": "exact", "bogus": 1},
            "items": [{"answer": "4"}, {"response": 5, "answer": "4"}], "extra": True})
        p = self.assertProblem(r, 422, "validation_failed")
        fields = {e["field"] for e in p["errors"]}
        self.assertIn("extra", fields)
        self.assertIn("items[0].response", fields)
        self.assertIn("items[1].response", fields)
        self.assertTrue(any(f.startswith("judge") for f in fields), fields)
        for e in p["errors"]:
            self.assertTrue(e["message"])

    def test_judge_test_refuses_hosts_outside_the_allowlist(self):
        r = self.d.post_json("/v1/judges/test", {
            "judge": {"type": "http", "url": "http://example.com/score"},
            "items": [{"response": "1", "answer": "1"}]})
        p = self.assertProblem(r, 422, "validation_failed")
        self.assertTrue(any("allowlist" in e["message"] for e in p["errors"]), p)


class TestFiles(DaemonCase):
    def test_raw_upload_valid(self):
        data = read("addition.jsonl")
        r = self.upload_raw(data, filename="addition.jsonl")
        f = self.assertJson(r, 201)
        self.assertTrue(f["id"].startswith("file-"))
        self.assertEqual(r.header("Location"), "/v1/files/" + f["id"])
        self.assertEqual(f["object"], "file")
        # OpenAI's status, dapod's check beside it
        self.assertEqual((f["status"], f["status_details"]), ("processed", None))
        self.assertEqual(f["validation"], "valid")
        self.assertEqual(f["n_items"], 64)
        self.assertEqual(f["bytes"], len(data))
        self.assertEqual(f["sha256"], hashlib.sha256(data).hexdigest())
        self.assertEqual(f["filename"], "addition.jsonl")
        self.assertEqual(f["purpose"], "fine-tune")
        self.assertIsInstance(f["created_at"], int)
        self.assertNotIn("errors", f)
        self.assertEqual(self.assertJson(self.d.get("/v1/files/" + f["id"]), 200), f)
        # on disk under its id, no temporary file left
        names = os.listdir(os.path.join(self.d.data_dir, "files"))
        self.assertIn(f["id"] + ".jsonl", names)
        self.assertFalse([n for n in names if n.endswith(".tmp")], names)

    def test_multipart_upload_valid(self):
        data = read("addition.jsonl")
        f = self.assertJson(self.upload_multipart(data, filename="C:\\Users\\me\\add.jsonl"), 201)
        self.assertEqual((f["status"], f["validation"]), ("processed", "valid"))
        self.assertEqual(f["n_items"], 64)
        self.assertEqual(f["bytes"], len(data))
        self.assertEqual(f["sha256"], hashlib.sha256(data).hexdigest())
        self.assertEqual(f["filename"], "add.jsonl")  # a client's path is cut to its base name

    def test_invalid_upload_is_stored_invalid_with_line_errors(self):
        data = read("invalid.jsonl")
        for r in (self.upload_raw(data), self.upload_multipart(data)):
            f = self.assertJson(r, 201)
            self.assertEqual((f["status"], f["validation"]), ("error", "invalid"))
            # OpenAI's status_details: the first problem, and how many errors lists
            first = f["errors"][0]
            self.assertEqual(f["status_details"], "invalid dataset: line %d: %s (the first of %d "
                             "problems listed in errors)" % (first["line"], first["message"],
                                                             len(f["errors"])))
            lines = [e["line"] for e in f["errors"]]
            self.assertEqual(lines, sorted(lines))
            self.assertIn(2, lines)  # "answer": 4
            self.assertIn(4, lines)  # unterminated object
            self.assertNotIn(1, lines)
            self.assertNotIn(3, lines)  # blank lines are allowed
            for e in f["errors"]:
                self.assertTrue(e["message"])
                self.assertNotIn("line ", e["message"][:5])
            self.assertIn("answer", f["errors"][0]["message"])
            g = self.assertJson(self.d.get("/v1/files/" + f["id"]), 200)
            self.assertEqual(g["errors"], f["errors"])

    def test_empty_upload_is_invalid_with_a_file_level_error(self):
        f = self.assertJson(self.upload_raw(b"\n\n"), 201)
        self.assertEqual((f["status"], f["validation"]), ("error", "invalid"))
        self.assertEqual(f["n_items"], 0)
        self.assertTrue(f["errors"])
        self.assertNotIn("line", f["errors"][-1])
        self.assertIn("no items", f["errors"][-1]["message"])
        if len(f["errors"]) == 1:  # a problem of the whole file has no line
            self.assertEqual(f["status_details"], "invalid dataset: " + f["errors"][0]["message"])

    def test_upload_content_type_and_fields(self):
        self.assertProblem(self.upload_raw(b"{}", ctype="text/csv"), 415,
                           "unsupported_media_type")
        self.assertProblem(self.upload_raw(b"{}", purpose="a%20b"), 400, "invalid_request",
                           "purpose")
        body, ctype = harness.multipart([("purpose", "fine-tune")])
        self.assertProblem(self.d.request("POST", "/v1/files", body=body,
                                          headers={"Content-Type": ctype}),
                           400, "invalid_request", "'file'")
        body, ctype = harness.multipart([("file", ("a.jsonl", b"{}", "text/plain")),
                                         ("colour", "red")])
        self.assertProblem(self.d.request("POST", "/v1/files", body=body,
                                          headers={"Content-Type": ctype}),
                           400, "invalid_request", "colour")

    def test_content_download_is_byte_identical(self):
        data = read("invalid.jsonl").replace(b"\n", b"\r\n", 2)  # CRLF kept as sent
        f = self.assertJson(self.upload_raw(data), 201)
        r = self.d.get("/v1/files/%s/content" % f["id"])
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, data)
        self.assertEqual(int(r.header("Content-Length")), len(data))
        self.assertEqual(r.header("Content-Type"), "application/x-ndjson")
        self.assertEqual(r.header("ETag"), '"%s"' % hashlib.sha256(data).hexdigest())
        self.assertIn("attachment", r.header("Content-Disposition"))

    def test_delete(self):
        f = self.assertJson(self.upload_raw(read("addition.jsonl")), 201)
        path = os.path.join(self.d.data_dir, "files", f["id"] + ".jsonl")
        self.assertTrue(os.path.exists(path))
        o = self.assertJson(self.d.request("DELETE", "/v1/files/" + f["id"]), 200)
        self.assertEqual(o, {"id": f["id"], "object": "file", "deleted": True})
        self.assertFalse(os.path.exists(path))
        self.assertProblem(self.d.get("/v1/files/" + f["id"]), 404, "not_found")
        self.assertProblem(self.d.get("/v1/files/%s/content" % f["id"]), 404, "not_found")
        self.assertProblem(self.d.request("DELETE", "/v1/files/" + f["id"]), 404, "not_found")

    def test_unknown_file_is_404(self):
        self.assertProblem(self.d.get("/v1/files/file-00000000-0000-4000-8000-000000000000"),
                           404, "not_found")

    def test_validate_stores_nothing(self):
        before = self.assertJson(self.d.get("/v1/files?limit=100"), 200)["data"]
        names = sorted(os.listdir(os.path.join(self.d.data_dir, "files")))
        r = self.upload_raw(read("invalid.jsonl"), path="/v1/files/validate")
        v = self.assertJson(r, 200)
        self.assertEqual(v["object"], "file.validation")
        self.assertEqual(v["status"], "invalid")
        self.assertGreaterEqual(v["n_errors"], len(v["errors"]))
        self.assertIn(2, [e["line"] for e in v["errors"]])
        v = self.assertJson(self.upload_multipart(read("addition.jsonl"),
                                                  path="/v1/files/validate"), 200)
        self.assertEqual(v["status"], "valid")
        self.assertEqual(v["n_items"], 64)
        self.assertEqual(v["errors"], [])
        self.assertEqual(self.assertJson(self.d.get("/v1/files?limit=100"), 200)["data"], before)
        self.assertEqual(sorted(os.listdir(os.path.join(self.d.data_dir, "files"))), names)
        self.assertProblem(self.d.get("/v1/files/validate"), 404, "not_found")


class TestFileList(DaemonCase):
    def test_pagination(self):
        ids = []
        for i in range(5):
            f = self.assertJson(self.upload_raw(read("addition.jsonl"),
                                                filename="f%d.jsonl" % i), 201)
            ids.append(f["id"])
        seen, after, pages = [], None, 0
        while True:
            q = "/v1/files?limit=2" + ("&after=" + after if after else "")
            page = self.assertJson(self.d.get(q), 200)
            self.assertEqual(page["object"], "list")
            pages += 1
            seen += [f["id"] for f in page["data"]]
            if not page["has_more"]:
                self.assertIsNone(page["next_after"])
                break
            self.assertEqual(len(page["data"]), 2)
            self.assertEqual(page["next_after"], page["data"][-1]["id"])
            after = page["next_after"]
        self.assertEqual(pages, 3)
        self.assertEqual(seen, ids)  # oldest first, no gap, no duplicate
        all_ = self.assertJson(self.d.get("/v1/files"), 200)
        self.assertEqual([f["id"] for f in all_["data"]], ids)
        self.assertFalse(all_["has_more"])

    def test_bad_list_parameters(self):
        for q in ("limit=0", "limit=101", "limit=abc", "limit=2x", "after="):
            self.assertProblem(self.d.get("/v1/files?" + q), 400, "invalid_request")
        self.assertProblem(self.d.get("/v1/files?after=file-nope"), 400, "invalid_request",
                           "after")


class TestUploadLimit(DaemonCase):
    ARGS = ("--max-upload-bytes", "1K")

    def files_on_disk(self):
        return os.listdir(os.path.join(self.d.data_dir, "files"))

    def test_too_large_upload_is_413_and_nothing_is_stored(self):
        data = read("addition.jsonl")
        self.assertGreater(len(data), 1024)
        self.assertProblem(self.upload_raw(data), 413, "payload_too_large", "max_upload_bytes")
        self.assertProblem(self.upload_multipart(data), 413, "payload_too_large",
                           "max_upload_bytes")
        # a chunked body has no Content-Length: refused as it crosses the limit
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
        head = (b"POST /v1/files?purpose=fine-tune HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
        status, _, body = self.d.raw_exchange(head, chunked)
        self.assertEqual(status, 413, body)
        self.assertEqual(self.assertJson(self.d.get("/v1/files"), 200)["data"], [])
        self.assertEqual(self.files_on_disk(), [])
        # a small one still fits
        f = self.assertJson(self.upload_raw(data[:500].rsplit(b"\n", 1)[0] + b"\n"), 201)
        self.assertEqual(f["validation"], "valid")

    def test_huge_announced_upload_is_refused_before_it_is_sent(self):
        head = (b"POST /v1/files?purpose=fine-tune HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/x-ndjson\r\nContent-Length: 50000000000\r\n"
                b"Expect: 100-continue\r\n\r\n")
        status, _, body = self.d.raw_exchange(head)
        self.assertEqual(status, 413, body)
        self.assertFalse([n for n in self.files_on_disk() if n.endswith(".tmp")])


class TestModels(DaemonCase):
    @classmethod
    def setUpClass(cls):
        # The model folders exist before the daemon starts (they are read on each request anyway).
        cls.d = harness.Daemon(DAPOD)
        models = cls.d.models_dir
        subprocess.run([DAPOD, "save-preset", "tiny", os.path.join(models, "mytiny")], check=True,
                       stdout=subprocess.DEVNULL, timeout=120)
        os.makedirs(os.path.join(models, "broken"))
        with open(os.path.join(models, "broken", "config.json"), "w") as f:
            json.dump({"model_type": "gpt2", "n_layer": 2}, f)
        os.makedirs(os.path.join(models, "noweights"))
        with open(os.path.join(models, "mytiny", "config.json")) as src, \
                open(os.path.join(models, "noweights", "config.json"), "w") as dst:
            dst.write(src.read())
        os.makedirs(os.path.join(models, ".hidden"))
        # a folder whose name is not UTF-8 cannot be a model id, and must not break the list
        os.makedirs(os.path.join(os.fsencode(models), b"bad\xffname"))
        try:
            cls.d.start()
        except Exception:
            cls.d.cleanup()
            raise

    def test_list_has_presets_and_folders(self):
        page = self.assertJson(self.d.get("/v1/models"), 200)
        self.assertEqual(page["object"], "list")
        by_id = {m["id"]: m for m in page["data"]}
        for p in ("tiny", "small", "tiny-qwen2"):
            self.assertEqual(by_id[p]["kind"], "preset")
            self.assertEqual(by_id[p]["object"], "model")
            self.assertEqual(by_id[p]["owned_by"], "dapod")
            self.assertEqual(by_id[p]["status"], "ready")
        # parameters agree with `dapod presets`
        out = subprocess.run([DAPOD, "presets"], check=True, capture_output=True, text=True,
                             timeout=120).stdout
        for line in out.splitlines():
            name, n = line.split()[:2]
            self.assertEqual(by_id[name]["parameters"], int(n), name)
        mine = by_id["mytiny"]
        self.assertEqual(mine["kind"], "folder")
        self.assertEqual(mine["status"], "ready")
        self.assertEqual(mine["parameters"], by_id["tiny"]["parameters"])
        self.assertEqual(mine["config"], by_id["tiny"]["config"])
        self.assertEqual(mine["weights"], "model.safetensors")
        self.assertNotIn(".hidden", by_id)
        self.assertEqual(len(by_id), 3 + 3)  # presets; mytiny, broken, noweights

    def test_broken_folders_are_reported(self):
        by_id = {m["id"]: m for m in self.assertJson(self.d.get("/v1/models"), 200)["data"]}
        self.assertEqual(by_id["broken"]["status"], "invalid")
        self.assertIn("gpt2", by_id["broken"]["error"])
        self.assertIn("model_type", by_id["broken"]["error"])
        self.assertEqual(by_id["noweights"]["status"], "invalid")
        self.assertIn("model.safetensors", by_id["noweights"]["error"])

    def test_get(self):
        self.assertEqual(self.assertJson(self.d.get("/v1/models/tiny"), 200)["kind"], "preset")
        self.assertEqual(self.assertJson(self.d.get("/v1/models/mytiny"), 200)["status"], "ready")
        self.assertEqual(self.assertJson(self.d.get("/v1/models/broken"), 200)["status"],
                         "invalid")
        self.assertProblem(self.d.get("/v1/models/nope"), 404, "not_found")
        self.assertProblem(self.d.get("/v1/models/.hidden"), 404, "not_found")
        self.assertProblem(self.d.get("/v1/models/.."), 404, "not_found")

    def test_pagination(self):
        page = self.assertJson(self.d.get("/v1/models?limit=2"), 200)
        self.assertEqual([m["id"] for m in page["data"]], ["tiny", "small"])
        self.assertTrue(page["has_more"])
        page = self.assertJson(self.d.get("/v1/models?limit=100&after=" + page["next_after"]), 200)
        self.assertEqual(page["data"][0]["id"], "tiny-qwen2")
        self.assertFalse(page["has_more"])
        self.assertProblem(self.d.get("/v1/models?after=zzz"), 400, "invalid_request")


class TestLifecycle(unittest.TestCase):
    def test_sigint_also_stops_cleanly(self):
        import signal
        d = harness.Daemon(DAPOD)
        try:
            d.start()
            self.assertEqual(d.stop(signal.SIGINT), 0, d.log())
            self.assertIn("stopped", d.log())
        finally:
            d.cleanup()

    def test_ipv6_loopback(self):
        try:
            socket.socket(socket.AF_INET6).close()
        except OSError:
            self.skipTest("no IPv6")
        d = harness.Daemon(DAPOD, listen="[::1]:0")
        try:
            d.start()
            self.assertEqual(d.host, "::1")
            self.assertEqual(d.get("/healthz").status, 200)
            self.assertEqual(d.stop(), 0, d.log())
        finally:
            d.cleanup()

    def test_tls(self):
        if not shutil.which("openssl"):
            self.skipTest("no openssl command to make a certificate")
        d = harness.Daemon(DAPOD)
        try:
            cert, key = os.path.join(d.tmp, "cert.pem"), os.path.join(d.tmp, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                            key, "-out", cert, "-days", "1", "-subj", "/CN=localhost"],
                           check=True, capture_output=True, timeout=120)
            d.args += ["--tls-cert", cert, "--tls-key", key]
            d.start()
            self.assertEqual(d.scheme, "https")
            self.assertEqual(d.get("/healthz").json(), {"status": "ok"})
            self.assertEqual(d.stop(), 0, d.log())
        finally:
            d.cleanup()

    def test_bad_flag_exits_2_naming_it(self):
        r = subprocess.run([DAPOD, "serve", "--workers", "0"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--workers", r.stderr)

    def test_port_in_use_fails_to_start(self):
        d = harness.Daemon(DAPOD)
        try:
            d.start()
            r = subprocess.run([DAPOD, "serve", "--listen", "127.0.0.1:%d" % d.port,
                                "--data-dir", os.path.join(d.tmp, "other")],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("127.0.0.1:%d" % d.port, r.stderr)
            self.assertEqual(d.stop(), 0)
        finally:
            d.cleanup()

    def test_help_lists_flags_and_subcommands(self):
        out = subprocess.run([DAPOD, "--help"], capture_output=True, text=True, timeout=60,
                             check=True).stdout
        for flag in ("--listen", "--data-dir", "--models-dir", "--max-body-bytes",
                     "--max-upload-bytes", "--http-threads", "--print-config"):
            self.assertIn(flag, out)
        for sub in ("train", "presets", "save-preset", "generate"):
            self.assertIn("dapod " + sub, out)

    def test_print_config(self):
        r = subprocess.run([DAPOD, "serve", "--listen", "127.0.0.1:0", "--print-config"],
                           capture_output=True, text=True, timeout=60, check=True)
        self.assertEqual(json.loads(r.stdout)["listen"], "127.0.0.1:0")
        r = subprocess.run([DAPOD, "--print-example-config"], capture_output=True, text=True,
                           timeout=60, check=True)
        self.assertIn("max_upload_bytes", json.loads(r.stdout))


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
