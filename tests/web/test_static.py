#!/usr/bin/python3
"""The dashboard's static handler (api/static.c), label web: a daemon started by
tests/api/harness.py (127.0.0.1 port 0, scratch dirs, an API key configured) serving a scratch
copy of the built web folder plus files that must never be sent.

Checks: / and /ui redirect to /ui/; /ui/ and every file come back byte for byte with the right
Content-Type, ETag, Last-Modified, Cache-Control and (HTML) CSP; HEAD; If-None-Match and
If-Modified-Since -> 304;
no key is needed for the files while the API still answers 401; path traversal in every
spelling, hidden files, unknown extensions, folders, NUL bytes and nested paths are 404
problem+json without the file's bytes; /ui/hyperparameters.json agrees with the defaults a job
created without hyperparameters actually gets; web_dir "" turns the dashboard off; web_dir auto
finds BUILD/web from BUILD/server/dapod.

Run: /usr/bin/python3 tests/web/test_static.py --dapod BUILD/server/dapod --web BUILD/web
"""

import argparse
import datetime
import email.utils
import hashlib
import http.client
import json
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "api"))
import harness  # noqa: E402

KEY = "web-static-test-key"
DAPOD = WEB = None

TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def head(d, path, headers=None):
    conn = http.client.HTTPConnection(d.host, d.port, timeout=30)
    try:
        conn.request("HEAD", path, headers=headers or {})
        r = conn.getresponse()
        body = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body
    finally:
        conn.close()


class StaticFiles(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dapod-web-static-")
        cls.web = os.path.join(cls.tmp, "web")
        shutil.copytree(WEB, cls.web)
        # what must never be served: hidden files, unknown extensions, a folder, a file outside
        for name, data in ((".secret.js", b"hidden"), ("notes.bak", b"backup"),
                           ("key.pem", b"PRIVATE KEY")):
            with open(os.path.join(cls.web, name), "wb") as f:
                f.write(data)
        os.makedirs(os.path.join(cls.web, "sub.js"))
        with open(os.path.join(cls.web, "sub.js", "index.html"), "wb") as f:
            f.write(b"nested")
        with open(os.path.join(cls.tmp, "outside.html"), "wb") as f:
            f.write(b"OUTSIDE-THE-WEB-DIR")
        sha = hashlib.sha256(KEY.encode()).hexdigest()
        cls.d = harness.Daemon(DAPOD, args=["--api-keys", "web:" + sha, "--web-dir", cls.web,
                                            "--workers", "1"])
        cls.d.start()

    @classmethod
    def tearDownClass(cls):
        try:
            rc = cls.d.stop()
            assert rc == 0, "dapod exited with %r:\n%s" % (rc, cls.d.log())
        finally:
            cls.d.cleanup()
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def file_bytes(self, name):
        with open(os.path.join(self.web, name), "rb") as f:
            return f.read()

    def test_redirects(self):
        for path in ("/", "/ui"):
            r = self.d.get(path)
            self.assertEqual(r.status, 302, path)
            self.assertEqual(r.header("location"), "/ui/", path)

    def test_files_types_and_caching(self):
        for name, ctype in TYPES.items():
            path = "/ui/" + name
            r = self.d.get(path)
            self.assertEqual(r.status, 200, path)
            self.assertEqual(r.body, self.file_bytes(name), path)
            self.assertEqual(r.header("content-type"), ctype, path)
            self.assertEqual(r.header("cache-control"), "no-cache", path)
            self.assertEqual(r.header("x-content-type-options"), "nosniff", path)
            self.assertTrue(r.header("etag", ).startswith('"'), path)
            self.assertTrue(r.header("last-modified").endswith(" GMT"), path)
            self.assertEqual(("content-security-policy" in r.headers), name.endswith(".html"))
            # revalidation: the same ETag (also in a list, also weak) is 304 without a body
            for inm in (r.header("etag"), 'W/"nope", ' + r.header("etag"), "*"):
                r2 = self.d.get(path, headers={"If-None-Match": inm})
                self.assertEqual(r2.status, 304, (path, inm))
                self.assertEqual(r2.body, b"")
            self.assertEqual(self.d.get(path, headers={"If-None-Match": '"other"'}).status, 200)
        # /ui/ is index.html
        r = self.d.get("/ui/")
        self.assertEqual((r.status, r.body), (200, self.file_bytes("index.html")))
        self.assertIn("frame-ancestors 'none'", r.header("content-security-policy"))

    def test_etag_changes_with_the_file(self):
        p = os.path.join(self.web, "changing.txt")
        with open(p, "wb") as f:
            f.write(b"one")
        a = self.d.get("/ui/changing.txt")
        with open(p, "wb") as f:
            f.write(b"three")
        os.utime(p, ns=(1, 1))
        b = self.d.get("/ui/changing.txt")
        self.assertEqual((a.body, b.body), (b"one", b"three"))
        self.assertNotEqual(a.header("etag"), b.header("etag"))
        self.assertEqual(b.header("last-modified"), "Thu, 01 Jan 1970 00:00:00 GMT")

    def test_if_modified_since(self):
        r = self.d.get("/ui/style.css")
        lm = r.header("last-modified")
        t = email.utils.parsedate_to_datetime(lm)
        before = email.utils.format_datetime(t - datetime.timedelta(seconds=1), usegmt=True)
        later = email.utils.format_datetime(t + datetime.timedelta(days=1), usegmt=True)
        for ims, want in ((lm, 304), (later, 304), (before, 200), ("yesterday", 200),
                          (lm + " junk", 200)):
            r2 = self.d.get("/ui/style.css", headers={"If-Modified-Since": ims})
            self.assertEqual(r2.status, want, ims)
            self.assertEqual(r2.body, b"" if want == 304 else r.body, ims)
        # If-None-Match wins over If-Modified-Since (RFC 9110 13.1.3)
        r3 = self.d.get("/ui/style.css", headers={"If-Modified-Since": lm,
                                                  "If-None-Match": '"other"'})
        self.assertEqual(r3.status, 200)

    def test_head(self):
        size = len(self.file_bytes("app.js"))
        status, hdrs, body = head(self.d, "/ui/app.js")
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(int(hdrs["content-length"]), size)
        self.assertEqual(hdrs["content-type"], TYPES["app.js"])
        status, _, body = head(self.d, "/ui/missing.js")
        self.assertEqual((status, body), (404, b""))

    def test_no_key_for_files_but_for_the_api(self):
        self.assertEqual(self.d.get("/ui/app.js").status, 200)
        r = self.d.get("/v1/jobs")
        self.assertEqual(r.status, 401)
        r = self.d.get("/v1/jobs", headers={"Authorization": "Bearer " + KEY})
        self.assertEqual(r.status, 200)

    def test_refused_paths(self):
        index = self.file_bytes("index.html")
        bad = [
            "/ui/../outside.html", "/ui/%2e%2e/outside.html", "/ui/..%2foutside.html",
            "/ui/%2e%2e%2foutside.html", "/ui/%2E%2E%2Foutside.html", "/ui/....//outside.html",
            "/ui/..", "/ui/.", "/ui/%2e", "/ui/..%5coutside.html", "/ui/%5c..%5coutside.html",
            "/ui/../../../../etc/passwd", "/ui/%2fetc%2fpasswd", "/ui//etc/passwd",
            "/ui/.secret.js", "/ui/%2esecret.js", "/ui/notes.bak", "/ui/key.pem",
            "/ui/sub.js", "/ui/sub.js/index.html", "/ui/index.html/", "/ui/index.html%00",
            "/ui/index.html%00.js", "/ui/missing.html", "/ui/index", "/ui/INDEX.HTML",
            "/ui/index.html%20", "/ui/-x.js", "/ui/" + "a" * 200 + ".js", "/ui/.files-stamp",
            "/ui/.assets-stamp", "/ui/a%0ab.js",
        ]
        for path in bad:
            r = self.d.get(path)
            self.assertEqual(r.status, 404, (path, r))
            self.assertTrue(r.header("content-type").startswith("application/problem+json"), path)
            self.assertNotIn(b"OUTSIDE", r.body, path)
            self.assertNotIn(b"root:", r.body, path)
            self.assertNotIn(b"PRIVATE", r.body, path)
            self.assertNotEqual(r.body, index, path)
        # raw request lines, bytes exactly as sent (no client-side normalisation at all)
        for target in (b"/ui/../outside.html", b"/ui/./../outside.html", b"/ui/%2e%2e/outside.html"):
            status, _, body = self.d.raw_exchange(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n"
                                                  b"Connection: close\r\n\r\n")
            self.assertEqual(status, 404, target)
            self.assertNotIn(b"OUTSIDE", body, target)
        # not a dashboard path: the API's rules (a key first)
        self.assertEqual(self.d.get("/uiindex.html").status, 401)
        self.assertEqual(self.d.get("/uiindex.html", headers={"Authorization": "Bearer " + KEY})
                         .status, 404)
        # only GET and HEAD
        r = self.d.request("POST", "/ui/app.js", body=b"x", headers={"Content-Type": "text/plain"})
        self.assertEqual(r.status, 405)
        self.assertIn("GET", r.header("allow"))

    def test_hyperparameter_table_matches_a_job(self):
        r = self.d.get("/ui/hyperparameters.json")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.header("content-type"), "application/json; charset=utf-8")
        table = r.json()
        self.assertEqual(table["object"], "hyperparameters.table")
        knobs = {k["name"]: k for k in table["data"]}
        # an independent reference: the values a job without hyperparameters gets
        auth = {"Authorization": "Bearer " + KEY}
        with open(os.path.join(ROOT, "tests", "data", "addition.jsonl"), "rb") as f:
            up = self.d.request("POST", "/v1/files?purpose=fine-tune&filename=a.jsonl",
                                body=f.read(),
                                headers=dict(auth, **{"Content-Type": "application/x-ndjson"}))
        self.assertEqual(up.status, 201, up)
        job = self.d.post_json("/v1/jobs", {"model": "tiny", "training_file": up.json()["id"],
                                            "judge": {"type": "exact"}}, headers=auth)
        self.assertEqual(job.status, 201, job)
        used = job.json()["hyperparameters"]
        self.d.post_json("/v1/jobs/%s/cancel" % job.json()["id"], b"", headers=auth)
        self.assertEqual({n for n, k in knobs.items() if "dapo" in k["methods"]}, set(used))
        # each method's knobs are those its jobs show (the form offers a method's own)
        sft = b'{"prompt": "1+1=", "completion": "2"}\n'
        up_sft = self.d.request("POST", "/v1/files?purpose=fine-tune&filename=s.jsonl", body=sft,
                                headers=dict(auth, **{"Content-Type": "application/x-ndjson"}))
        self.assertEqual(up_sft.status, 201, up_sft)
        job_sft = self.d.post_json("/v1/jobs", {"model": "tiny", "method": "supervised",
                                                "training_file": up_sft.json()["id"]},
                                   headers=auth)
        self.assertEqual(job_sft.status, 201, job_sft)
        self.d.post_json("/v1/jobs/%s/cancel" % job_sft.json()["id"], b"", headers=auth)
        self.assertEqual({n for n, k in knobs.items() if "supervised" in k["methods"]},
                         set(job_sft.json()["hyperparameters"]))
        for name in job_sft.json()["hyperparameters"]:
            if knobs[name]["default"] is not None:
                self.assertEqual(knobs[name]["default"], job_sft.json()["hyperparameters"][name],
                                 name)
        self.assertEqual({m for k in knobs.values() for m in k["methods"]},
                         {"dapo", "supervised", "dpo"})
        knobs = {n: k for n, k in knobs.items() if "dapo" in k["methods"]}
        derived = [n for n, k in knobs.items() if k["default"] is None]
        self.assertEqual(sorted(derived), ["minibatch_size", "overlong_buffer"])
        for name, k in knobs.items():
            if k["default"] is not None:
                self.assertEqual(k["default"], used[name], name)
            if "minimum" in k:
                self.assertLessEqual(k["minimum"], used[name], name)
                self.assertGreaterEqual(k["maximum"], used[name], name)
            if "choices" in k:
                self.assertIn(used[name], k["choices"], name)
        # a value just past a published bound is refused by the daemon, naming the knob
        bad = self.d.post_json("/v1/jobs", {"model": "tiny", "training_file": up.json()["id"],
                                            "hyperparameters": {"group_size":
                                                                knobs["group_size"]["minimum"] - 1}},
                               headers=auth)
        self.assertEqual(bad.status, 422)
        self.assertIn("hyperparameters.group_size", [e["field"] for e in bad.json()["errors"]])


class Switches(unittest.TestCase):
    def test_off_and_auto(self):
        with harness.Daemon(DAPOD, args=["--web-dir", ""]) as d:
            for path in ("/", "/ui", "/ui/", "/ui/app.js"):
                r = d.get(path)
                self.assertEqual(r.status, 404, path)
                self.assertIn("web_dir", r.json()["detail"])
        # auto: BUILD/server/dapod finds BUILD/web (the folder the build copied)
        expect = os.path.realpath(os.path.join(os.path.dirname(DAPOD), "..", "web"))
        if os.path.isfile(os.path.join(expect, "index.html")):
            with harness.Daemon(DAPOD) as d:
                r = d.get("/ui/")
                self.assertEqual(r.status, 200)
                with open(os.path.join(expect, "index.html"), "rb") as f:
                    self.assertEqual(r.body, f.read())


def main():
    global DAPOD, WEB
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    ap.add_argument("--web", required=True)
    args, rest = ap.parse_known_args()
    DAPOD, WEB = os.path.abspath(args.dapod), os.path.abspath(args.web)
    if not os.path.isfile(os.path.join(WEB, "index.html")):
        print("test_static.py: %s has no index.html (build the dapod_web target)" % WEB)
        return 1
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
