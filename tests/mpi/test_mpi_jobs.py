#!/usr/bin/env python3
"""Multi-process jobs through the daemon (issue 15, part 2; server/launch.c, docs/SCALE.md).

A job with "resources": {"processes": N} runs as N ranks started by the configured launcher
(here `mpirun -np {processes}`, ranks oversubscribed on this machine), and the API is the same as
for a local job: events over SSE, the memory plan per process, checkpoint downloads, completions
on its checkpoints, pause / resume / cancel. A rank killed mid-step ends the attempt; the job
starts again from its last checkpoint and ends on the weights of an uninterrupted run, bit for
bit. A launcher that keeps failing ends the job with launch_failed after launch_retries. A daemon
stopped or killed mid-job finds the job after a restart and finishes it.
"""
import hashlib
import json
import os
import signal
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "api"))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import test_jobs  # noqa: E402
import test_model_graders  # noqa: E402
import test_mpi  # noqa: E402
from test_jobs import DaemonCase, long_hp, read  # noqa: E402

HP = {"total_steps": 3, "checkpoint_every": 1, "max_new_tokens": 4, "group_size": 4,
      "prompt_batch_size": 2}


def ranks_of(job_id):
    """PIDs of the job's `dapod train` processes (ranks), from /proc."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if (len(argv) > 2 and argv[0].endswith(b"dapod") and argv[1] == b"train"
                and any(job_id.encode() in a for a in argv)):
            out.append(int(pid))
    return out


def wait_no_ranks(job_id, deadline_s=60):
    end = time.monotonic() + deadline_s
    while ranks_of(job_id):
        if time.monotonic() > end:
            raise AssertionError("the ranks of %s still run %d s later" % (job_id, deadline_s))
        time.sleep(0.1)


def launcher_args(retries=2):
    return ("--launcher", test_mpi.MPIRUN + " -np {processes}", "--max-processes", "3",
            "--launch-retries", str(retries))


class Refusals(DaemonCase):
    """Without a launcher, a job asking for processes is refused by field."""

    def test_no_launcher(self):
        p = self.assertProblem(self.create(resources={"processes": 2}), 422, "validation_failed")
        self.assertFields(p, "resources.processes")
        self.assertIn("no launcher is configured", str(p["errors"]))
        p = self.assertProblem(self.create(resources={"processes": 0, "gpus": 1}), 422,
                               "validation_failed")
        self.assertFields(p, "resources.processes", "resources.gpus")
        p = self.assertProblem(self.create(resources=[2]), 422, "validation_failed")
        self.assertFields(p, "resources")
        # one process is this daemon's own: fine without a launcher
        j = self.create_ok(resources={"processes": 1})
        self.assertNotIn("processes", j["memory"])
        self.wait_status(j["id"], "succeeded")


class MultiProcess(DaemonCase):
    @classmethod
    def setUpClass(cls):
        cls.ARGS = ("--workers", "1", "--blas-threads", "1") + launcher_args()
        super().setUpClass()

    def data_dir_of(self, jid):
        return os.path.join(self.d.data_dir, "jobs", jid)

    def rollouts(self, jid, steps):
        out = []
        for s in range(1, steps + 1):
            r = self.d.get("/v1/jobs/%s/rollouts?step=%d" % (jid, s))
            self.assertEqual(r.status, 200, r)
            out.append(r.body)
        return out

    def test_1_end_to_end(self):
        p = self.assertProblem(self.create(HP, resources={"processes": 4}), 422,
                               "validation_failed")
        self.assertFields(p, "resources.processes")
        self.assertIn("max_processes", str(p["errors"]))
        j = self.create_ok(HP, seed=3, resources={"processes": 2})
        jid = j["id"]
        mem = j["memory"]
        self.assertEqual(mem["processes"], 2)
        self.assertEqual(mem["total_bytes"], 2 * mem["per_process_bytes"])
        evs = self.follow(jid)  # the live stream to its end
        self.assertEqual(evs[-1]["event"], "end")
        self.assertGapless(evs)
        self.assertOneMetricsPerStep([dict(e, type=e["event"]) for e in evs], 3)
        j = self.job(jid)
        self.assertEqual((j["status"], j["step"], j["checkpoints"]), ("succeeded", 3,
                                                                        [0, 1, 2, 3]))
        # downloads: the files the ranks wrote, as indexed
        ck = self.assertJson(self.d.get("/v1/jobs/%s/checkpoints" % jid), 200)["data"][-1]
        for f in ck["files"]:
            r = self.d.get("/v1/jobs/%s/checkpoints/3/%s" % (jid, f["name"]))
            self.assertEqual(r.status, 200, r)
            self.assertEqual(hashlib.sha256(r.body).hexdigest(), f["sha256"])
        # completions on its checkpoint
        r = self.d.post_json("/v1/completions", {"model": ck["model"], "prompt": "1+2=",
                                                 "max_tokens": 3, "seed": 1})
        self.assertEqual(r.status, 200, r)
        # the same job in one process: the same rollouts, byte for byte
        one = self.create_ok(HP, seed=3)["id"]
        self.wait_status(one, "succeeded")
        self.assertEqual(self.rollouts(jid, 3), self.rollouts(one, 3))
        with open(os.path.join(self.data_dir_of(jid), "launch.log")) as f:
            self.assertIn("data-parallel over 2 ranks", f.read())

    def test_2_pause_resume_cancel(self):
        jid = self.create_ok(long_hp(10000, every=0), resources={"processes": 2})["id"]
        self.wait_until(jid, lambda j: j["status"] == "running" and j["step"] >= 1, "a step")
        self.assertJson(self.d.post_json("/v1/jobs/%s/pause" % jid, {}), 200)
        j = self.wait_status(jid, "paused")
        paused_at = j["step"]
        self.assertIn(paused_at, j["checkpoints"])  # a pause stops on a checkpoint
        wait_no_ranks(jid)
        self.assertJson(self.d.post_json("/v1/jobs/%s/resume" % jid, {}), 200)
        self.wait_until(jid, lambda j: j["status"] == "running" and j["step"] > paused_at,
                        "a step after the resume")
        self.assertJson(self.d.post_json("/v1/jobs/%s/cancel" % jid, {}), 200)
        self.wait_status(jid, "cancelled")
        wait_no_ranks(jid)
        evs = self.all_events(jid)
        statuses = [e["data"]["status"] for e in evs if e["type"] == "status"]
        self.assertEqual(statuses, ["queued", "running", "pausing", "paused", "queued",
                                    "running", "cancelling", "cancelled"])
        logs = [e["data"]["message"] for e in evs if e["type"] == "log"]
        self.assertTrue(any("resumed from the checkpoint of step %d" % paused_at in m
                            for m in logs), logs)

    def test_3_rank_killed_mid_job(self):
        # jobs too long to finish: the kill certainly lands while the job runs, and the runs are
        # compared at a step reached after the restart
        hp = long_hp(10000, every=1)
        jid = self.create_ok(hp, seed=11, resources={"processes": 2})["id"]
        self.follow(jid, stop=lambda ev: ev["event"] == "metrics" and ev["data"]["step"] >= 2)
        ranks = ranks_of(jid)
        self.assertEqual(len(ranks), 2, ranks)
        os.kill(max(ranks), signal.SIGKILL)  # one rank dies; mpirun ends the attempt
        at = self.job(jid)["step"]
        target = at + 3  # a step the restarted ranks compute
        self.wait_until(jid, lambda j: j["status"] != "running" or j["step"] >= target,
                        "step %d after the restart" % target)
        self.assertJson(self.d.post_json("/v1/jobs/%s/cancel" % jid, {}), 200)
        self.assertEqual(self.wait_status(jid, ("cancelled", "failed"))["status"], "cancelled")
        evs = self.all_events(jid)
        self.assertGapless(evs)
        logs = [e["data"]["message"] for e in evs if e["type"] == "log"]
        self.assertTrue(any("starting again from the last checkpoint" in m for m in logs), logs)
        self.assertTrue(any("resumed from the checkpoint" in m for m in logs), logs)
        steps = [e["data"]["step"] for e in evs if e["type"] == "metrics"]
        self.assertEqual(steps[:target], list(range(1, target + 1)))  # each step told once
        # an uninterrupted run of the same job: the same rollouts and weights, bit for bit
        whole = self.create_ok(hp, seed=11, resources={"processes": 2})["id"]
        self.wait_until(whole, lambda j: j["step"] >= target, "step %d" % target)
        self.assertJson(self.d.post_json("/v1/jobs/%s/cancel" % whole, {}), 200)
        self.wait_status(whole, "cancelled")
        self.assertEqual(self.rollouts(jid, target), self.rollouts(whole, target))
        a = self.d.get("/v1/jobs/%s/checkpoints/%d/model.safetensors" % (jid, target)).body
        b = self.d.get("/v1/jobs/%s/checkpoints/%d/model.safetensors" % (whole, target)).body
        self.assertTrue(len(a) > 0 and a == b)

    def test_4_supervised_and_dpo(self):
        # supervised and DPO jobs through the launcher's ranks train as one process does (the
        # split itself: test_mpi_sft.py)
        sums = [(a, b) for a in range(4) for b in range(4)]
        files = {
            "supervised": [{"prompt": "%d+%d=" % s, "completion": str(sum(s))} for s in sums],
            "dpo": [{"prompt": "%d+%d=" % s, "chosen": str(sum(s)), "rejected": str(sum(s) + 1)}
                    for s in sums]}
        hp = {"batch_size": 5, "learning_rate": 0.003, "checkpoint_every": 0}
        for method, lines in files.items():
            fid = self.upload("".join(json.dumps(x) + "\n" for x in lines).encode())["id"]
            ids = [self.create_ok(hp, method=method, training_file=fid, seed=3,
                                  resources={"processes": n})["id"] for n in (2, 1)]
            two, one = [self.wait_status(i, ("succeeded", "failed")) for i in ids]
            self.assertEqual((two["status"], two["step"]), ("succeeded", 4), two)
            self.assertEqual((one["status"], one["step"]), ("succeeded", 4), one)
            for k, v in one["latest_metrics"].items():
                if k.startswith(("train/", "rewards/", "logps/")) and isinstance(v, float):
                    self.assertAlmostEqual(two["latest_metrics"][k], v, delta=1e-5 * abs(v) + 1e-6,
                                           msg="%s %s" % (method, k))
            with open(os.path.join(self.data_dir_of(ids[0]), "launch.log")) as f:
                self.assertIn("data-parallel over 2 ranks", f.read())


class JudgeModels(test_model_graders.StandinDaemon):
    """A multi-process job whose reward comes from a judge model (issue 26): the ranks read the
    daemon's judge settings (launch-judges.json, dapod train --server-config), so every rollout's
    reward is the stand-in judge model's verdict, as in one process; a judge model the daemon
    serves itself is refused for a multi-process job, naming the field, and fine in one."""

    @classmethod
    def daemon_args(cls, url):
        models = {"judge": {"url": url, "model": "standin-judge", "concurrency": 4},
                  "self": {"serve": "tiny", "timeout_ms": 120000}}
        return (("--workers", "1", "--blas-threads", "1", "--judge-models", json.dumps(models))
                + launcher_args())

    def judge(self, model):
        return {"type": "model", "judge_model": model, "system": "Grade the answer.",
                "prompt": "Answer: {{sample.output_text}}\nReference: {{item.answer}}",
                "scale": [0, 1]}

    def test_model_judge(self):
        hp = dict(HP, total_steps=2, dynamic_sampling=False)
        j = self.create_ok(hp, seed=3, judge=self.judge("judge"), resources={"processes": 2})
        done = self.wait_status(j["id"], ("succeeded", "failed"))
        self.assertEqual(done["status"], "succeeded", done)
        rows = []
        for step in (1, 2):
            r = self.d.get("/v1/jobs/%s/rollouts?step=%d" % (j["id"], step))
            rows += [json.loads(x) for x in r.body.decode().splitlines() if x.strip()]
        self.assertEqual(len(rows), 2 * 2 * 4)
        for row in rows:
            same = row["response"] == row["answer"]
            self.assertAlmostEqual(row["reward_raw"], 1.0 if same else 0.2, msg=row)
            self.assertEqual(row["info"]["errors"], {}, row)
        with open(os.path.join(self.d.data_dir, "jobs", j["id"], "launch-judges.json")) as f:
            self.assertEqual(sorted(json.load(f)["judge_models"]), ["judge"])

    def test_served_refused(self):
        p = self.assertProblem(self.create(HP, judge=self.judge("self"),
                                           resources={"processes": 2}), 422, "validation_failed")
        self.assertFields(p, "judge")
        self.assertIn("judge_models.self.serve: no completion service here", str(p["errors"]))
        self.create_ok(dict(HP, total_steps=1), judge=self.judge("self"))  # one process: fine


class RetriesRunOut(DaemonCase):
    """A launcher that always fails: the job fails with launch_failed after launch_retries."""
    ARGS = ("--workers", "1", "--blas-threads", "1", "--launcher", "false {processes}",
            "--launch-retries", "1")

    def test_fails_after_the_retries(self):
        jid = self.create_ok(HP, resources={"processes": 2})["id"]
        j = self.wait_status(jid, ("succeeded", "failed"))
        self.assertEqual(j["status"], "failed")
        self.assertEqual(j["error"]["code"], "launch_failed")
        self.assertIn("exited with status 1 before the job ended, 2 times", j["error"]["message"])
        logs = [e["data"]["message"] for e in self.all_events(jid) if e["type"] == "log"]
        self.assertEqual(sum("attempt 1 of 2" in m for m in logs), 1, logs)


class Restart(unittest.TestCase):
    """The daemon stopped (SIGTERM) or killed (SIGKILL) during a multi-process job: its ranks
    end with it, and the restarted daemon finishes the job."""

    def start(self, data_dir=None):
        d = harness.Daemon(test_jobs.DAPOD, ("--workers", "1", "--blas-threads", "1")
                           + launcher_args(), data_dir=data_dir)
        self.addCleanup(d.cleanup)
        d.start()
        return d

    def run_case(self, sig):
        d1 = self.start()
        h = DaemonCase()
        h.d = d1
        h.file_id = DaemonCase.upload(read("addition.jsonl"), d=d1)["id"]
        # a job too long to finish before the stop
        jid = h.create_ok(long_hp(10000, every=2), d=d1, resources={"processes": 2})["id"]
        h.follow(jid, d=d1, stop=lambda ev: ev["event"] == "metrics" and ev["data"]["step"] >= 3)
        if sig == signal.SIGKILL:
            d1.kill()
        else:
            self.assertEqual(d1.stop(sig), 0, d1.log())
        wait_no_ranks(jid)  # SIGTERM: paused with a checkpoint; SIGKILL: PR_SET_PDEATHSIG
        d2 = self.start(data_dir=d1.data_dir)
        h.d = d2
        at = h.job(jid, d=d2)["step"]
        j = h.wait_until(jid, lambda j: j["status"] == "running" and j["step"] >= at + 2,
                         "two steps after the restart", d=d2)
        h.assertJson(d2.post_json("/v1/jobs/%s/cancel" % jid, {}), 200)
        h.wait_status(jid, "cancelled", d=d2)
        evs = h.all_events(jid, d=d2)
        h.assertGapless(evs)
        steps = [e["data"]["step"] for e in evs if e["type"] == "metrics"]
        self.assertEqual(steps, list(range(1, len(steps) + 1)))  # each step told once
        logs = [e["data"]["message"] for e in evs if e["type"] == "log"]
        self.assertTrue(any("resumed from the checkpoint" in m for m in logs), logs)
        self.assertEqual(d2.stop(), 0, d2.log())

    def test_sigterm(self):
        self.run_case(signal.SIGTERM)

    def test_sigkill(self):
        self.run_case(signal.SIGKILL)


def main():
    rest = test_mpi.setup()
    test_jobs.DAPOD = test_mpi.DAPOD
    os.environ.update(test_mpi.mpi_env())  # the daemon and its launcher inherit it
    return test_mpi.run_tests(rest)


if __name__ == "__main__":
    sys.exit(main())
