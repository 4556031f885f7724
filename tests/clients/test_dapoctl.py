#!/usr/bin/python3
"""dapoctl against a real daemon (label clients): upload, submit --wait and its exit codes
(succeeded 0, failed 1, cancelled 3, timeout 4, usage 2, connection 5, API error 6), progress
lines checked against the metrics API, a stream cut mid-event by a proxy (reconnect with
Last-Event-ID: every step once), status/list/logs with --json, download with Range resume
checked by SHA-256 and by the daemon's 206 in its access log.

Run: /usr/bin/python3 tests/clients/test_dapoctl.py --dapod DAPOD --dapoctl DAPOCTL
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import harness  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
import dapod_client  # noqa: E402

DAPOD = DAPOCTL = None
PROGRESS = re.compile(r"^step (\d+)/\d+  reward ([-+]\d+\.\d{4})  accuracy (\d+\.\d{4})  "
                      r"entropy (-?\d+\.\d{4})  tokens/s (\d+)$")


class DapoctlCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = harness.Daemon(DAPOD, ("--workers", "2", "--blas-threads", "1"))
        cls.tmp = tempfile.mkdtemp(prefix="dapoctl-test-")
        try:
            cls.d.start()
            cls.url = "http://127.0.0.1:%d" % cls.d.port
            cls.file_id = common.upload(cls.d)
        except BaseException:
            cls.d.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            rc = cls.d.stop()
            if rc != 0:
                raise AssertionError("dapod exited %s:\n%s" % (rc, cls.d.log()))
        finally:
            cls.d.cleanup()
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def ctl(self, *args, url=None, stdin=None, timeout=common.DEADLINE_S, env=None):
        e = dict(os.environ)
        e.pop("DAPOD_API_KEY", None)
        e["DAPOD_URL"] = url or self.url
        e.update(env or {})
        p = subprocess.run([DAPOCTL] + list(args), input=stdin, capture_output=True,
                           timeout=timeout, env=e)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def write_job(self, spec, name="job.json"):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            json.dump(spec, f)
        return path

    def create_job(self, hp):
        r = self.d.post_json("/v1/jobs", common.job_spec(self.file_id, hp))
        self.assertEqual(r.status, 201, r)
        return r.json()["id"]

    # ---- upload ----

    def test_upload_prints_id_of_stored_file(self):
        rc, out, err = self.ctl("upload", common.ADDITION)
        self.assertEqual(rc, 0, err)
        fid = out.strip()
        self.assertTrue(fid.startswith("file-"), out)
        f = self.d.get("/v1/files/" + fid).json()
        self.assertEqual(f["sha256"], common.sha256_file(common.ADDITION))
        self.assertEqual(f["filename"], "addition.jsonl")
        self.assertEqual((f["status"], f["validation"]), ("processed", "valid"))
        self.assertTrue(err.rstrip().endswith(" bytes, valid"), err)  # dapod's check

    def test_upload_invalid_dataset_exits_1_with_lines(self):
        bad = os.path.join(self.tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"prompt": "a", "answer": "b"}\nnot json\n{"prompt": 3}\n')
        rc, out, err = self.ctl("--json", "upload", bad)
        self.assertEqual(rc, 1, err)
        obj = json.loads(out)
        self.assertEqual((obj["status"], obj["validation"]), ("error", "invalid"))
        self.assertIn("line 2:", err)
        self.assertIn("line 3:", err)

    def test_upload_missing_file_exits_7(self):
        rc, out, err = self.ctl("upload", os.path.join(self.tmp, "nope.jsonl"))
        self.assertEqual(rc, 7, err)
        self.assertIn("nope.jsonl", err)

    # ---- submit --wait ----

    def test_submit_wait_succeeds_with_one_progress_line_per_step(self):
        path = self.write_job(common.job_spec(self.file_id))
        rc, out, err = self.ctl("submit", "--wait", path)
        self.assertEqual(rc, 0, out + err)
        job_id = re.search(r"job (job-[0-9a-f-]+) succeeded", out).group(1)
        steps = [PROGRESS.match(line) for line in out.splitlines() if line.startswith("step ")]
        self.assertTrue(all(steps), out)
        metrics = [m for m in common.metrics_rows(self.d, job_id) if m["step"] > 0]
        self.assertEqual([int(m.group(1)) for m in steps], [1, 2, 3])
        for m, row in zip(steps, metrics):
            self.assertEqual(m.group(2), "%+.4f" % row["reward/mean"])
            self.assertEqual(m.group(3), "%.4f" % row["accuracy"])
            self.assertEqual(m.group(4), "%.4f" % row["entropy"])
            self.assertEqual(m.group(5), "%.0f" % row["throughput/gen_tokens_per_s"])
        self.assertEqual(self.d.get("/v1/jobs/" + job_id).json()["status"], "succeeded")

    def test_submit_wait_json_prints_final_job_on_stdout(self):
        spec = common.job_spec(self.file_id, dict(common.SMALL_HP, total_steps=2))
        rc, out, err = self.ctl("--json", "submit", "--wait", "-", stdin=json.dumps(spec).encode())
        self.assertEqual(rc, 0, out + err)
        job = json.loads(out)
        self.assertEqual(job["status"], "succeeded")
        self.assertEqual(job["step"], 2)
        self.assertEqual(len([l for l in err.splitlines() if PROGRESS.match(l)]), 2, err)

    def test_submit_wait_failed_job_exits_1_with_error(self):
        judge = {"type": "http", "url": "http://127.0.0.1:%d/score" % common.closed_port(),
                 "timeout_ms": 200, "max_retries": 0}
        path = self.write_job(common.job_spec(self.file_id, judge=judge), "fail.json")
        rc, out, err = self.ctl("submit", "--wait", path)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("failed: judge_error", err)
        jid = re.search(r"job (job-[0-9a-f-]+) failed", err).group(1)
        self.assertEqual(self.d.get("/v1/jobs/" + jid).json()["status"], "failed")

    def test_submit_wait_cancelled_exits_3(self):
        path = self.write_job(common.job_spec(self.file_id, common.LONG_HP), "long.json")
        env = dict(os.environ, DAPOD_URL=self.url)
        errf = tempfile.TemporaryFile()  # not a pipe: nobody reads it until the end
        p = subprocess.Popen([DAPOCTL, "submit", "--wait", path], stdout=subprocess.PIPE,
                             stderr=errf, env=env)
        try:
            first = p.stdout.readline().decode()  # "job ID queued (1048576 steps)"
            job_id = re.match(r"job (job-[0-9a-f-]+) ", first).group(1)
            while True:  # wait until a step has been reported: the job is running
                line = p.stdout.readline().decode()
                self.assertTrue(line, "dapoctl ended before a step")
                if line.startswith("step "):
                    break
            rc, out, err = self.ctl("cancel", job_id)
            self.assertEqual(rc, 0, err)
            self.assertIn(out.split()[1], ("cancelling", "cancelled"))
            rest = p.communicate(timeout=common.DEADLINE_S)[0].decode()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            errf.seek(0)
            err = errf.read().decode()
            errf.close()
        self.assertEqual(p.returncode, 3, rest + err)
        self.assertIn("was cancelled", err)
        self.assertEqual(self.d.get("/v1/jobs/" + job_id).json()["status"], "cancelled")

    def test_pause_and_resume(self):
        path = self.write_job(common.job_spec(self.file_id, common.LONG_HP), "pause.json")
        rc, out, err = self.ctl("submit", path)
        self.assertEqual(rc, 0, err)
        job_id = out.split()[0]
        deadline = time.monotonic() + common.DEADLINE_S
        while self.d.get("/v1/jobs/" + job_id).json()["step"] < 1:  # running, a step done
            self.assertLess(time.monotonic(), deadline, "no step")
            time.sleep(0.05)
        rc, out, err = self.ctl("pause", job_id)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), [job_id, out.split()[1]])
        self.assertIn(out.split()[1], ("pausing", "paused"))
        while self.d.get("/v1/jobs/" + job_id).json()["status"] != "paused":
            self.assertLess(time.monotonic(), deadline, "not paused")
            time.sleep(0.05)
        step = self.d.get("/v1/jobs/" + job_id).json()["step"]
        time.sleep(0.5)
        self.assertEqual(self.d.get("/v1/jobs/" + job_id).json()["step"], step, "steps while paused")
        # an unknown job: the daemon answers 404, dapoctl exits with its API error code (6)
        rc, out, err = self.ctl("resume", "job-00000000-0000-0000-0000-000000000000")
        self.assertEqual(rc, 6, out + err)
        rc, out, err = self.ctl("--json", "resume", job_id)
        self.assertEqual(rc, 0, err)
        self.assertIn(json.loads(out)["status"], ("queued", "running"))
        while self.d.get("/v1/jobs/" + job_id).json()["step"] <= step:  # it goes on
            self.assertLess(time.monotonic(), deadline, "no step after resume")
            time.sleep(0.05)
        rc, out, err = self.ctl("cancel", job_id)
        self.assertEqual(rc, 0, err)
        common.wait_terminal(self.d, job_id)

    def test_submit_wait_timeout_exits_4_and_job_goes_on(self):
        path = self.write_job(common.job_spec(self.file_id, common.LONG_HP), "long2.json")
        t0 = time.monotonic()
        rc, out, err = self.ctl("submit", "--wait", "--timeout", "1.5", path)
        self.assertEqual(rc, 4, out + err)
        self.assertGreaterEqual(time.monotonic() - t0, 1.5)
        job_id = re.match(r"job (job-[0-9a-f-]+) ", out).group(1)
        self.assertIn(self.d.get("/v1/jobs/" + job_id).json()["status"], ("queued", "running"))
        self.d.request("POST", "/v1/jobs/%s/cancel" % job_id)
        common.wait_terminal(self.d, job_id)

    def test_submit_wait_survives_cut_streams(self):
        proxy = common.CuttingProxy(self.d.port, cuts=3, cut_after=700)
        try:
            path = self.write_job(common.job_spec(self.file_id, dict(common.SMALL_HP,
                                                                     total_steps=4)), "cut.json")
            rc, out, err = self.ctl("submit", "--wait", path, url=proxy.url)
        finally:
            proxy.close()
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(proxy.cut_done, 3)
        self.assertGreaterEqual(proxy.streams, 4, "%s %s" % (proxy.last_event_ids, out + err))
        self.assertIsNone(proxy.last_event_ids[0])
        # A cut before the first whole event leaves nothing to resume from (seen on a fast
        # machine: [None, None, '2', '2']); from the first event on, every reconnect carries the
        # last id, and the ids never go back.
        ids = proxy.last_event_ids[1:]
        got = [i for i, x in enumerate(ids) if x is not None]
        self.assertTrue(got, proxy.last_event_ids)
        after = ids[got[0]:]
        self.assertTrue(all(x and x.isdigit() for x in after), proxy.last_event_ids)
        self.assertEqual([int(x) for x in after], sorted(int(x) for x in after),
                         proxy.last_event_ids)
        steps = [int(PROGRESS.match(l).group(1)) for l in out.splitlines() if PROGRESS.match(l)]
        self.assertEqual(steps, [1, 2, 3, 4], out)  # every step once, in order
        self.assertIn("reconnecting", err)

    def test_submit_wait_survives_a_daemon_restart(self):
        """SIGTERM the daemon while the job trains and start it again on the same port and
        data: dapoctl reconnects with Last-Event-ID and prints every step exactly once. The
        outage is said on stderr however the stream ended (a stopping daemon closes it cleanly,
        a reconnect may meet a 503, a refused or a cut connection: which comes first is timing)."""
        port = common.closed_port()
        data_dir = os.path.join(self.tmp, "restart-var")
        args = ("--workers", "1", "--blas-threads", "1")
        d1 = harness.Daemon(DAPOD, args, data_dir=data_dir, listen="127.0.0.1:%d" % port)
        d2 = None
        errf = tempfile.TemporaryFile()
        p = None
        try:
            d1.start()
            fid = common.upload(d1)
            hp = dict(common.SMALL_HP, total_steps=30, checkpoint_every=1)
            path = self.write_job(common.job_spec(fid, hp), "restart.json")
            p = subprocess.Popen([DAPOCTL, "submit", "--wait", path], stdout=subprocess.PIPE,
                                 stderr=errf,
                                 env=dict(os.environ, DAPOD_URL="http://127.0.0.1:%d" % port))
            lines = [p.stdout.readline().decode()]
            while not lines[-1].startswith("step "):
                self.assertTrue(lines[-1], "dapoctl ended before a step")
                lines.append(p.stdout.readline().decode())
            self.assertEqual(d1.stop(), 0, d1.log())
            d2 = harness.Daemon(DAPOD, args, data_dir=data_dir, listen="127.0.0.1:%d" % port)
            d2.start()
            rest = p.communicate(timeout=common.DEADLINE_S)[0].decode()
            errf.seek(0)
            err = errf.read().decode()
            out = "".join(lines) + rest
            self.assertEqual(p.returncode, 0, out + err)
            steps = [int(PROGRESS.match(l).group(1)) for l in out.splitlines()
                     if PROGRESS.match(l)]
            self.assertEqual(steps, list(range(1, 31)), out)
            job_id = re.match(r"job (job-[0-9a-f-]+) ", out).group(1)
            events = common.events_all(d2, job_id)
            running = [e for e in events if e["type"] == "status"
                       and e["data"]["status"] == "running"]
            self.assertGreaterEqual(len(running), 2, "the job did not run again after the restart")
            self.assertRegex(err, r"dapoctl: (the daemon closed the stream before the job ended"
                             r"|the daemon is unavailable \(HTTP 503[^)]*\)"
                             r"|the connection was cut \([^)]*\)"
                             r"|the daemon cannot be reached \([^)]*\))"
                             r"; reconnecting after event [1-9][0-9]*\n")
        finally:
            if p and p.poll() is None:
                p.kill()
                p.wait()
            errf.close()
            d1.cleanup()
            if d2:
                self.assertEqual(d2.stop(), 0)
                d2.cleanup()

    def test_submit_api_error_exits_6_with_problem_fields(self):
        spec = common.job_spec(self.file_id)
        spec["model"] = "no-such-model"
        spec["hyperparameters"]["group_size"] = 0
        path = self.write_job(spec, "bad.json")
        rc, out, err = self.ctl("--json", "submit", path)
        self.assertEqual(rc, 6, err)
        self.assertIn("HTTP 422 validation_failed", err)
        self.assertRegex(err, r"(?m)^  model: ")
        self.assertRegex(err, r"(?m)^  hyperparameters\.group_size: ")
        problem = json.loads(out)
        self.assertEqual(problem["status"], 422)
        self.assertEqual(problem["type"], "https://dapod.dev/problems/validation_failed")

    def test_submit_bad_json_file_exits_2(self):
        path = os.path.join(self.tmp, "broken.json")
        with open(path, "w") as f:
            f.write('{"model": "tiny",\n "seed": }\n')
        rc, out, err = self.ctl("submit", path)
        self.assertEqual(rc, 2, err)
        self.assertIn("line 2", err)

    # ---- usage and connection ----

    def test_usage_errors_exit_2(self):
        for args in ([], ["frobnicate"], ["status"], ["list", "--wait"], ["--bogus", "list"],
                     ["submit", "x.json", "--timeout", "abc", "--wait"], ["list", "--limit", "0"],
                     ["download", "job-x", "latest"], ["logs", "job-x", "--timeout", "3"]):
            rc, out, err = self.ctl(*args)
            self.assertEqual(rc, 2, "%s: %s" % (args, err))
            self.assertTrue(err.strip(), args)

    def test_help_per_command(self):
        for cmd in ("upload", "submit", "logs", "status", "list", "cancel", "pause", "resume",
                    "download"):
            rc, out, err = self.ctl(cmd, "--help")
            self.assertEqual(rc, 0, err)
            self.assertIn("usage: dapoctl", out)
            self.assertIn(cmd, out)
        rc, out, err = self.ctl("--help")
        self.assertEqual(rc, 0)
        self.assertIn("exit codes", out)

    def test_api_key_from_flag_or_environment(self):
        key = "dapoctl-ci-key"
        sha = hashlib.sha256(key.encode()).hexdigest()
        with harness.Daemon(DAPOD, ["--api-keys", "ci:%s" % sha]) as d:
            url = "http://127.0.0.1:%d" % d.port
            rc, out, err = self.ctl("list", url=url)
            self.assertEqual(rc, 6, err)
            self.assertIn("HTTP 401 unauthorized", err)
            rc, out, err = self.ctl("--api-key", "wrong", "list", url=url)
            self.assertEqual(rc, 6, err)
            rc, out, err = self.ctl("--json", "list", url=url, env={"DAPOD_API_KEY": key})
            self.assertEqual((rc, json.loads(out)["data"]), (0, []), err)
            rc, out, err = self.ctl("--api-key", key, "upload", common.ADDITION, url=url,
                                    env={"DAPOD_API_KEY": "wrong"})
            self.assertEqual(rc, 0, err)
            self.assertEqual(d.stop(), 0)

    def test_connection_error_exits_5(self):
        rc, out, err = self.ctl("list", url="http://127.0.0.1:%d" % common.closed_port())
        self.assertEqual(rc, 5, err)
        self.assertIn("connect", err.lower())

    def test_bad_url_exits_2(self):
        rc, out, err = self.ctl("list", url="ftp://example")
        self.assertEqual(rc, 2, err)

    def test_flags_win_over_environment(self):
        rc, out, err = self.ctl("--url", self.url, "list",
                                url="http://127.0.0.1:%d" % common.closed_port())
        self.assertEqual(rc, 0, err)

    # ---- status, list, logs, cancel ----

    def test_status_list_logs_json(self):
        job_id = self.create_job(dict(common.SMALL_HP, total_steps=2))
        common.wait_terminal(self.d, job_id)
        rc, out, err = self.ctl("--json", "status", job_id)
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out), self.d.get("/v1/jobs/" + job_id).json())
        rc, out, err = self.ctl("status", job_id)
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"status +succeeded")
        self.assertRegex(out, r"step +2/2")
        rc, out, err = self.ctl("--json", "list", "--status", "succeeded", "--limit", "100")
        self.assertEqual(rc, 0, err)
        page = json.loads(out)
        self.assertIn(job_id, [j["id"] for j in page["data"]])
        self.assertTrue(all(j["status"] == "succeeded" for j in page["data"]))
        rc, out, err = self.ctl("list")
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"(?m)^%s +succeeded +2/2 +tiny " % job_id)
        # logs --json: the event list exactly, one object a line; logs -f replays it too.
        events = common.events_all(self.d, job_id)
        rc, out, err = self.ctl("--json", "logs", job_id)
        self.assertEqual(rc, 0, err)
        got = [json.loads(l) for l in out.splitlines()]
        self.assertEqual(got, [{"id": e["id"], "type": e["type"], "data": e["data"]}
                               for e in events])
        rc, out, err = self.ctl("--json", "logs", "-f", job_id)
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual([json.loads(l) for l in lines[:len(events)]],
                         [{"id": e["id"], "type": e["type"], "data": e["data"]} for e in events])
        self.assertEqual(json.loads("\n".join(lines[len(events):]))["status"], "succeeded")

    def test_status_unknown_job_exits_6(self):
        rc, out, err = self.ctl("status", "job-00000000-0000-4000-8000-000000000000")
        self.assertEqual(rc, 6, err)
        self.assertIn("HTTP 404 not_found", err)

    def test_cancel_finished_job_exits_6_conflict(self):
        job_id = self.create_job(dict(common.SMALL_HP, total_steps=1))
        common.wait_terminal(self.d, job_id)
        rc, out, err = self.ctl("cancel", job_id)
        self.assertEqual(rc, 6, err)
        self.assertIn("HTTP 409 conflict", err)

    # ---- the CI example ----

    def test_ci_script_uploads_trains_and_keeps_the_checkpoint(self):
        out_dir = os.path.join(self.tmp, "ci-out")
        script = os.path.join(common.ROOT, "clients", "ci", "dapod-ci.sh")
        template = os.path.join(common.ROOT, "clients", "ci", "job.example.json")
        env = dict(os.environ, DAPOD_URL=self.url, DAPOCTL=DAPOCTL, DAPOD_CI_TIMEOUT="300")
        p = subprocess.run(["sh", script, common.ADDITION, template, out_dir], env=env,
                           capture_output=True, timeout=common.DEADLINE_S)
        log = p.stdout.decode() + p.stderr.decode()
        self.assertEqual(p.returncode, 0, log)
        with open(os.path.join(out_dir, "job.json")) as f:
            job = json.load(f)
        self.assertEqual((job["status"], job["step"]), ("succeeded", 5))
        self.assertEqual(len([l for l in log.splitlines() if PROGRESS.match(l)]), 5, log)
        ck = self.d.get("/v1/jobs/%s/checkpoints" % job["id"]).json()["data"][-1]
        self.assertEqual(ck["step"], 5)
        for f in ck["files"]:
            self.assertEqual(common.sha256_file(os.path.join(out_dir, f["name"])), f["sha256"])

    # ---- download ----

    # ---- rollouts ----

    def test_rollouts_show_a_step_and_an_agents_episodes(self):
        # a single-turn job: its latest step, each response with its reward
        job_id = self.create_job(dict(common.SMALL_HP, total_steps=2))
        common.wait_terminal(self.d, job_id)
        rows = [json.loads(x) for x in self.d.get("/v1/jobs/%s/rollouts?step=2" % job_id)
                .body.decode().splitlines() if x.strip()]
        rc, out, err = self.ctl("rollouts", job_id)
        self.assertEqual(rc, 0, err)
        shown = [line for line in out.splitlines() if line.startswith("  #")]
        self.assertEqual(len(shown), len(rows))
        for line, r in zip(shown, rows):
            self.assertTrue(line.startswith("  #%d reward %.4g  %s  " % (
                r["index"], r["reward"], "correct" if r["correct"] else "wrong")), line)
        rc, out, err = self.ctl("--json", "rollouts", job_id, "2")
        self.assertEqual([json.loads(x) for x in out.splitlines()], rows)
        # an agent's episodes against the stand-in environment: each as its conversation
        env = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "rl", "env_server.py"),
                                os.path.join(self.tmp, "env.log")], stdout=subprocess.PIPE)
        try:
            port = int(env.stdout.readline())
            spec = common.job_spec(self.file_id, dict(common.SMALL_HP, total_steps=1,
                                                      dynamic_sampling=False))
            spec["episode"] = {"max_turns": 3, "max_new_tokens_per_turn": 2,
                               "max_answer_tokens": 8, "reward": "environment",
                               "environment": {"type": "http",
                                               "url": "http://127.0.0.1:%d/guess" % port}}
            r = self.d.post_json("/v1/jobs", spec)
            self.assertEqual(r.status, 201, r)
            ep_id = r.json()["id"]
            common.wait_terminal(self.d, ep_id)
        finally:
            env.kill()
            env.wait()
            env.stdout.close()
        rows = [json.loads(x) for x in self.d.get("/v1/jobs/%s/rollouts?step=1" % ep_id)
                .body.decode().splitlines() if x.strip()]
        rc, out, err = self.ctl("rollouts", ep_id, "1", "--limit", "1")
        self.assertEqual(rc, 0, err)
        first = [x for x in rows if x["group"] == rows[0]["group"]]
        self.assertEqual(len([x for x in out.splitlines() if x.startswith("group ")]), 1, out)
        blocks = out.split("\n  #")[1:]
        self.assertEqual(len(blocks), len(first), out)
        for block, x in zip(blocks, first):
            lines = block.splitlines()
            want = []
            for t in x["turns"]:
                if t["role"] == "assistant":
                    want.append("      model: " + t["content"].replace("\n", "\\n"))
                else:
                    want += ["      world %s: %s" % (m["role"], m["content"].replace("\n", "\\n"))
                             for m in t["messages"]]
                    if t["reward"] is not None:
                        want.append("        (reward %.4g%s)" % (t["reward"],
                                                             ", done" if t["done"] else ""))
                    elif t["done"]:
                        want.append("        (done)")
                if t.get("fits") is False:
                    want.append("        (did not fit the episode)")
            want.append("      ended: " + x["finish_reason"])
            self.assertEqual(lines[1:], want, block)
            # the Python client writes an episode the same way
            self.assertEqual(lines[1:], dapod_client.format_episode(x).splitlines())

    def test_download_all_and_resume_with_range(self):
        job_id = self.create_job(dict(common.SMALL_HP, total_steps=2))
        common.wait_terminal(self.d, job_id)
        ck = self.d.get("/v1/jobs/%s/checkpoints" % job_id).json()["data"]
        final = [c for c in ck if c["step"] == 2][0]
        files = {f["name"]: f for f in final["files"]}
        out_dir = os.path.join(self.tmp, "ck-" + job_id)
        rc, out, err = self.ctl("download", job_id, "latest", "--all", out_dir)
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(os.listdir(out_dir)), sorted(files))
        for name, f in files.items():
            self.assertEqual(common.sha256_file(os.path.join(out_dir, name)), f["sha256"], name)
        # Truncate the weights to a third: the next run resumes there with a Range request.
        w = os.path.join(out_dir, "model.safetensors")
        size = files["model.safetensors"]["bytes"]
        cut = size // 3
        with open(w, "r+b") as f:
            f.truncate(cut)
        n206 = self.d.log().count("access GET /v1/jobs/%s/checkpoints/2/model.safetensors 206"
                                  % job_id)
        rc, out, err = self.ctl("download", job_id, "2", "--all", out_dir)
        self.assertEqual(rc, 0, err)
        self.assertIn("model.safetensors: %d bytes (resumed at byte %d), sha256 ok" % (size, cut),
                      out)
        self.assertIn("config.json: up to date", out)
        self.assertEqual(common.sha256_file(w), files["model.safetensors"]["sha256"])
        line = "access GET /v1/jobs/%s/checkpoints/2/model.safetensors 206" % job_id
        self.d.wait_log(lambda log: log.count(line) >= n206 + 1, "the ranged request's access line")
        self.assertEqual(self.d.log().count(line), n206 + 1)
        # A file of the right size but other bytes is downloaded again whole.
        with open(w, "r+b") as f:
            f.seek(size - 1)
            f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
        rc, out, err = self.ctl("--json", "download", job_id, "latest", "model.safetensors", "-o",
                                os.path.join(self.tmp, "one.safetensors"))
        self.assertEqual(rc, 0, err)
        summary = json.loads(out)
        self.assertEqual(summary["files"][0]["resumed_from"], 0)
        self.assertEqual(common.sha256_file(os.path.join(self.tmp, "one.safetensors")),
                         files["model.safetensors"]["sha256"])
        rc, out, err = self.ctl("download", job_id, "2", "model.safetensors", "-o", w)
        self.assertEqual(rc, 0, err)
        self.assertEqual(common.sha256_file(w), files["model.safetensors"]["sha256"])
        # Unknown step and file: API error.
        rc, out, err = self.ctl("download", job_id, "7", "config.json")
        self.assertEqual(rc, 6, err)
        rc, out, err = self.ctl("download", job_id, "2", "nope.bin")
        self.assertEqual(rc, 6, err)


def main():
    global DAPOD, DAPOCTL
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    ap.add_argument("--dapoctl", required=True)
    args, rest = ap.parse_known_args()
    DAPOD, DAPOCTL = os.path.abspath(args.dapod), os.path.abspath(args.dapoctl)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
