#!/usr/bin/python3
"""Crash-consistency driver for dapod (Debian's /usr/bin/python3, standard library only).

Kills the daemon with SIGKILL at seeded random moments while it takes uploads, creates jobs,
trains and writes checkpoints, restarts it on the same data directory each time, and checks after
every restart (docs/RELIABILITY.md, "Crash consistency"):
  - every upload that got a 2xx is intact: metadata sha256 and the downloaded bytes' sha256 equal
    the sha256 of what was sent;
  - no checkpoint is half-written: every checkpoint the API lists downloads with the listed sizes
    and sha256, its config.json is JSON and its model.safetensors has a valid header whose tensors
    lie inside the file; every complete-looking step-N folder on disk (no temporary name) has all
    its files and valid safetensors;
  - each job's events have ids 1..n with no gap and no duplicate, and exactly one metrics event
    per training step (steps 1..step, no gap);
  - right after each kill, before the restart repairs anything, the index (the SQLite file as the
    killed daemon left it) lists no checkpoint without its checkpoint event and no training
    step's metrics row without its metrics event: each pair is written in one transaction;
and at the end that every job ended (succeeded) and its final model.safetensors tensors are
bit-identical to those of an uninterrupted run of the same spec and seed.

With --episodes the jobs run multi-turn episodes against the deterministic stand-in environment
of tests/rl/env_server.py (docs/AGENTS.md): the kills land in the middle of episodes, whose
environment calls are simply made again after the restart, and the final weights still equal
the uninterrupted run's.

Usage: crash.py --dapod PATH [--kills N] [--seed S] [--steps N] [--jobs N] [--episodes]
                [--keep DIR]
Exit 0 when everything held, 1 with the first violation otherwise. Prints a JSON summary.
"""

import argparse
import hashlib
import http.client
import json
import os
import random
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
from harness import Daemon  # noqa: E402

TERMINAL = ("succeeded", "failed", "cancelled")
DAEMON_ARGS = ["--workers", "1", "--blas-threads", "1", "--http-threads", "4",
               "--access-log", "false", "--log-level", "warn", "--shutdown-grace-s", "5"]
CKPT_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "trainer_state.json",
                 "optimizer.safetensors")


class Violation(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Violation(what)


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def st_tensors(blob, what):
    """Parses a safetensors blob; returns {name: (dtype, shape, bytes)}. Raises Violation."""
    check(len(blob) >= 8, "%s: %d bytes, shorter than a safetensors header" % (what, len(blob)))
    (n,) = struct.unpack("<Q", blob[:8])
    check(2 <= n <= len(blob) - 8, "%s: header length %d outside the file" % (what, n))
    try:
        hdr = json.loads(blob[8:8 + n].decode("utf-8"))
    except ValueError as e:
        raise Violation("%s: header is not JSON: %s" % (what, e))
    data = blob[8 + n:]
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        check(0 <= b <= e <= len(data), "%s: tensor %s [%d, %d) outside %d data bytes"
              % (what, name, b, e, len(data)))
        out[name] = (t["dtype"], tuple(t["shape"]), data[b:e])
    check(out, "%s: no tensors" % what)
    return out


def training_lines(rng, n):
    lines = []
    for i in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        lines.append(json.dumps({"id": "t%d" % i, "prompt": "What is %d+%d?" % (a, b),
                                 "answer": str(a + b)}))
    return ("\n".join(lines) + "\n").encode()


class Client:
    """Minimal HTTP on a fresh connection per request; errors become exceptions."""

    def __init__(self, port):
        self.port = port

    def req(self, method, path, body=None, headers=None, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def get_json(self, path):
        st, body = self.req("GET", path)
        check(st == 200, "GET %s: %d %r" % (path, st, body[:300]))
        return json.loads(body)

    def upload_streamed(self, data, chunk, on_first_chunk=None):
        """Sends data as a raw x-ndjson upload in chunks (so a kill lands mid-body)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.putrequest("POST", "/v1/files?purpose=fine-tune&filename=crash.jsonl")
            c.putheader("Content-Type", "application/x-ndjson")
            c.putheader("Content-Length", str(len(data)))
            c.endheaders()
            for off in range(0, len(data), chunk):
                c.send(data[off:off + chunk])
                if off == 0 and on_first_chunk:
                    on_first_chunk()
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()


class State:
    """What the clients were told (acknowledged) across all daemon lifetimes."""

    def __init__(self):
        self.uploads = {}  # file id -> sha256 of the bytes sent (2xx only)
        self.jobs = set()  # job ids answered 201/200
        self.uploads_checked = set()  # file ids whose bytes were compared at least once
        self.verified_ckpts = set()  # (job, step, sha of model.safetensors) checked already
        self.kills = []  # per kill: {mode, t, phases, uploads_in_flight}
        self.checks = 0


def check_daemon(cl, state, data_dir, full=False, rng=None):
    """Every invariant of the module docstring, against a freshly restarted daemon. The bytes of
    every upload are compared when full (the last check); otherwise those acknowledged since the
    previous check and a seeded sample of 5 older ones (metadata of all)."""
    older = [f for f in state.uploads if f in state.uploads_checked]
    sample = set((rng or random).sample(older, min(5, len(older))))
    for fid, sha in state.uploads.items():
        meta = cl.get_json("/v1/files/" + fid)
        check(meta["sha256"] == sha, "file %s: metadata sha256 %s, sent %s"
              % (fid, meta["sha256"], sha))
        if not full and fid in state.uploads_checked and fid not in sample:
            continue
        state.uploads_checked.add(fid)
        st, body = cl.req("GET", "/v1/files/%s/content" % fid)
        check(st == 200 and sha256(body) == sha, "file %s: content %d, sha256 %s, sent %s"
              % (fid, st, sha256(body), sha))
    jobs = {}
    after = None
    while True:
        page = cl.get_json("/v1/jobs?limit=100" + ("&after=" + after if after else ""))
        for j in page["data"]:
            jobs[j["id"]] = j
        if not page.get("has_more"):
            break
        after = page["data"][-1]["id"]
    for jid in state.jobs:
        check(jid in jobs, "job %s was acknowledged but is not listed" % jid)
    for jid, j in jobs.items():
        check_events(cl, jid, j)
        check_checkpoints(cl, state, jid, data_dir, full)
    state.checks += 1
    return jobs


def check_events(cl, jid, job):
    ids, steps = [], []
    after = 0
    while True:
        page = cl.get_json("/v1/jobs/%s/events?limit=100&after=%d" % (jid, after))
        for ev in page["data"]:
            ids.append(ev["id"])
            if ev["type"] == "metrics" and not any(k.startswith("eval/") for k in ev["data"]):
                steps.append(ev["data"]["step"])
        if not page.get("has_more") or not page["data"]:
            break
        after = page["data"][-1]["id"]
    check(ids == list(range(1, len(ids) + 1)),
          "job %s: event ids not 1..n without gap or duplicate: %s" % (jid, ids[:50]))
    check(steps == list(range(1, len(steps) + 1)),
          "job %s: metrics events of steps %s (expected 1..n once each)" % (jid, steps))
    check(len(steps) >= job.get("step", 0),
          "job %s: step %s but metrics events for %d steps" % (jid, job.get("step"), len(steps)))


def check_index_at_kill(data_dir):
    """The index as the killed daemon left it: every checkpoint row and every training metrics
    row has its event (SQLite replays its journal on opening, as the next start will)."""
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(data_dir, "dapod.sqlite3"), uri=True)
    try:
        told = {}
        for jid, typ, data in db.execute("SELECT job_id, type, data FROM events "
                                         "WHERE type IN ('checkpoint', 'metrics')"):
            d = json.loads(data)
            if typ == "checkpoint" or not any(k.startswith("eval/") for k in d):
                told.setdefault((jid, typ), set()).add(d.get("step"))
        for jid, step in db.execute("SELECT job_id, step FROM checkpoints"):
            check(step in told.get((jid, "checkpoint"), ()),
                  "job %s: the index lists the checkpoint of step %d with no checkpoint event "
                  "(at the kill)" % (jid, step))
        for jid, step in db.execute("SELECT job_id, step FROM metrics WHERE kind = 'train'"):
            check(step in told.get((jid, "metrics"), ()),
                  "job %s: a metrics row of step %d with no metrics event (at the kill)"
                  % (jid, step))
    finally:
        db.close()


def check_checkpoints(cl, state, jid, data_dir, full):
    listed = cl.get_json("/v1/jobs/%s/checkpoints" % jid)["data"]
    for ck in listed:
        files = {f["name"]: f for f in ck["files"]}
        for need in ("config.json", "model.safetensors", "tokenizer.json"):
            check(need in files, "job %s checkpoint %d: %s not listed" % (jid, ck["step"], need))
        key = (jid, ck["step"], files["model.safetensors"]["sha256"])
        if key in state.verified_ckpts and not full:
            continue
        for name, f in files.items():
            st, body = cl.req("GET", "/v1/jobs/%s/checkpoints/%d/%s" % (jid, ck["step"], name))
            check(st == 200, "job %s checkpoint %d %s: GET %d" % (jid, ck["step"], name, st))
            check(len(body) == f["bytes"] and sha256(body) == f["sha256"],
                  "job %s checkpoint %d %s: %d bytes sha256 %s, index says %d %s"
                  % (jid, ck["step"], name, len(body), sha256(body), f["bytes"], f["sha256"]))
            if name.endswith(".json"):
                try:
                    json.loads(body)
                except ValueError as e:
                    raise Violation("job %s checkpoint %d %s: not JSON: %s"
                                    % (jid, ck["step"], name, e))
            if name.endswith(".safetensors"):
                st_tensors(body, "job %s checkpoint %d %s" % (jid, ck["step"], name))
        state.verified_ckpts.add(key)
    # On disk: every folder with a final name is complete.
    root = os.path.join(data_dir, "jobs", jid, "checkpoints")
    if not os.path.isdir(root):
        return
    for name in os.listdir(root):
        if not (name.startswith("step-") and name[5:].isdigit()):
            continue
        d = os.path.join(root, name)
        present = set(os.listdir(d))
        need = set(CKPT_REQUIRED) if name != "step-0" else {"config.json", "model.safetensors"}
        check(need <= present, "%s: missing %s" % (d, sorted(need - present)))
        for f in present:
            if f.endswith(".safetensors"):
                with open(os.path.join(d, f), "rb") as fh:
                    st_tensors(fh.read(), os.path.join(d, f))
            elif f.endswith(".json"):
                with open(os.path.join(d, f), "rb") as fh:
                    try:
                        json.loads(fh.read())
                    except ValueError as e:
                        raise Violation("%s/%s: not JSON: %s" % (d, f, e))


def leftovers(data_dir):
    """What the kill interrupted, as seen on disk before the restart cleans up: temporary
    checkpoint folders/files and temporary uploads."""
    out = {"checkpoint_tmp": set(), "upload_tmp": set()}
    for root, dirs, files in os.walk(os.path.join(data_dir, "jobs")):
        out["checkpoint_tmp"] |= {os.path.join(root, n) for n in dirs + files if ".tmp" in n}
    files_dir = os.path.join(data_dir, "files")
    if os.path.isdir(files_dir):
        out["upload_tmp"] = {n for n in os.listdir(files_dir) if n.endswith(".tmp")}
    return out


EPISODE = None  # --episodes: the jobs' `episode`, on the stand-in environment


def job_body(train_id, steps, seed):
    body = {"model": "tiny", "training_file": train_id, "seed": seed,
            "hyperparameters": {"total_steps": steps, "checkpoint_every": 1, "max_new_tokens": 4,
                                "group_size": 4, "prompt_batch_size": 2}}
    if EPISODE:  # one generation round a step: the environment's game is rarely won
        body["episode"] = EPISODE
        body["hyperparameters"]["dynamic_sampling"] = False
    return body


def start_environment(work):
    """tests/rl/env_server.py on a free loopback port; its episodes as the jobs' `episode`."""
    global EPISODE
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "rl",
                          "env_server.py")
    p = subprocess.Popen(["/usr/bin/python3", script, os.path.join(work, "env.log")],
                         stdout=subprocess.PIPE, text=True)
    port = int(p.stdout.readline())
    EPISODE = {"max_turns": 3, "max_new_tokens_per_turn": 2, "max_answer_tokens": 8,
               "reward": "sum", "environment": {"type": "http",
                                                "url": "http://127.0.0.1:%d/guess" % port,
                                                "concurrency": 8}}
    return p


def final_weights(cl, jid, steps):
    st, body = cl.req("GET", "/v1/jobs/%s/checkpoints/%d/model.safetensors" % (jid, steps))
    check(st == 200, "job %s: final checkpoint %d: GET %d" % (jid, steps, st))
    return {k: v for k, v in st_tensors(body, "job %s final" % jid).items()}


def wait_all_ended(cl, deadline_s):
    t_end = time.monotonic() + deadline_s
    while True:
        jobs = cl.get_json("/v1/jobs?limit=100")["data"]
        if all(j["status"] in TERMINAL for j in jobs):
            return jobs
        check(time.monotonic() < t_end, "jobs not ended within %d s: %s"
              % (deadline_s, [(j["id"], j["status"], j.get("step")) for j in jobs]))
        time.sleep(0.2)


def reference_run(dapod, train, steps, seed, work):
    d = Daemon(dapod, DAEMON_ARGS, data_dir=os.path.join(work, "ref"))
    with d:
        cl = Client(d.port)
        st, body = cl.req("POST", "/v1/files?purpose=fine-tune&filename=train.jsonl", train,
                          {"Content-Type": "application/x-ndjson"})
        check(st == 201, "reference upload: %d %r" % (st, body[:200]))
        fid = json.loads(body)["id"]
        st, body = cl.req("POST", "/v1/jobs", json.dumps(job_body(fid, steps, seed)).encode(),
                          {"Content-Type": "application/json"})
        check(st == 201, "reference job: %d %r" % (st, body[:300]))
        jid = json.loads(body)["id"]
        t0 = time.monotonic()
        jobs = wait_all_ended(cl, 600)
        check(jobs[0]["status"] == "succeeded", "reference job ended %s" % jobs[0]["status"])
        w = final_weights(cl, jid, steps)
        return w, time.monotonic() - t0


def one_life(dapod, data_dir, state, rng, train_id, cfg, idx):
    """Starts the daemon, checks it, drives load and kills it at a random moment."""
    d = Daemon(dapod, DAEMON_ARGS, data_dir=data_dir)
    d.start()
    stale = leftovers(data_dir)  # temporaries the restart left in place
    try:
        cl = Client(d.port)
        check_daemon(cl, state, data_dir, rng=rng)
        stop = threading.Event()
        upload_started = threading.Event()
        phases = []  # phase (or status) of every live job at the last poll
        polled = [0]
        lock = threading.Lock()

        def first_chunk_sent():
            upload_started.set()
            if mode == "upload":  # hold the body open: the kill lands in the middle of it
                stop.wait(0.5)

        def uploader():
            urng = random.Random(useed)
            while not stop.is_set():
                data = training_lines(urng, urng.choice((50, 500, 5000)))
                try:
                    st, body = cl.upload_streamed(data, 8192, first_chunk_sent)
                except (OSError, http.client.HTTPException):
                    return
                if st in (200, 201):
                    with lock:
                        state.uploads[json.loads(body)["id"]] = sha256(data)
                stop.wait(urng.uniform(0.0, 1.0))

        def creator():
            """Creates a job when none is live (so that training goes on in most lives), up
            to --jobs in all, each with an Idempotency-Key."""
            crng = random.Random(cseed)
            stop.wait(0.1)
            while not stop.is_set() and len(state.jobs) < cfg.jobs:
                with lock:
                    idle = not phases and polled[0] > 0
                if idle:
                    key = "crash-%d-%d" % (idx, crng.randrange(1 << 30))
                    try:
                        st, body = cl.req("POST", "/v1/jobs", json.dumps(
                            job_body(train_id, cfg.steps, cfg.seed)).encode(),
                            {"Content-Type": "application/json", "Idempotency-Key": key})
                    except (OSError, http.client.HTTPException):
                        return
                    if st in (200, 201):
                        with lock:
                            state.jobs.add(json.loads(body)["id"])
                stop.wait(0.2)

        def poller():
            while not stop.is_set():
                try:
                    jobs = cl.get_json("/v1/jobs?limit=100")["data"]
                except (OSError, http.client.HTTPException, Violation, ValueError):
                    return
                with lock:
                    phases[:] = [j.get("phase") or j["status"] for j in jobs
                                 if j["status"] not in TERMINAL]
                    polled[0] += 1
                stop.wait(0.02)

        # every draw from the shared rng happens here, before the threads start: same seed, same
        # plan of kills
        mode = rng.choice(("uniform", "checkpoint", "upload"))
        delay = rng.uniform(0.05, cfg.max_delay)
        useed, cseed = rng.random(), rng.random()
        threads = [threading.Thread(target=f, daemon=True) for f in (uploader, creator, poller)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            with lock:
                ph = list(phases)
            if mode == "uniform" and time.monotonic() - t0 >= delay:
                break
            if mode == "checkpoint" and "checkpointing" in ph:
                break
            if mode == "upload" and upload_started.is_set():
                time.sleep(0.05)
                break
            time.sleep(0.005)
        d.proc.kill()
        d.proc.wait(timeout=30)
        check_index_at_kill(data_dir)
        after = leftovers(data_dir)
        left = {k: len(after[k] - stale[k]) for k in after}  # interrupted by this kill
        left["stale_after_restart"] = sum(len(v) for v in stale.values())
        stop.set()
        for t in threads:
            t.join(timeout=60)
        with lock:
            state.kills.append({"mode": mode, "t": round(time.monotonic() - t0, 3),
                                "phases": list(phases), "left": left})
    finally:
        d.cleanup()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=16, help="total_steps of each job")
    ap.add_argument("--jobs", type=int, default=2, help="jobs created over the run")
    ap.add_argument("--max-delay", type=float, default=3.0, help="longest wait before a kill (s)")
    ap.add_argument("--keep", help="work folder to keep (default: a temporary one, removed)")
    ap.add_argument("--episodes", action="store_true",
                    help="jobs of multi-turn episodes against tests/rl/env_server.py")
    cfg = ap.parse_args()
    rng = random.Random(cfg.seed)
    work = cfg.keep or tempfile.mkdtemp(prefix="dapod-crash-")
    os.makedirs(work, exist_ok=True)
    data_dir = os.path.join(work, "var")
    state = State()
    summary = {"seed": cfg.seed, "kills": cfg.kills, "steps": cfg.steps, "jobs": cfg.jobs,
               "episodes": cfg.episodes}
    t_start = time.monotonic()
    env = start_environment(work) if cfg.episodes else None
    try:
        train = training_lines(random.Random(cfg.seed), 64)
        ref, ref_s = reference_run(cfg.dapod, train, cfg.steps, cfg.seed, work)
        summary["reference_job_s"] = round(ref_s, 2)
        # first life: the training file
        d = Daemon(cfg.dapod, DAEMON_ARGS, data_dir=data_dir)
        with d:
            cl = Client(d.port)
            st, body = cl.req("POST", "/v1/files?purpose=fine-tune&filename=train.jsonl", train,
                              {"Content-Type": "application/x-ndjson"})
            check(st == 201, "upload: %d %r" % (st, body[:200]))
            train_id = json.loads(body)["id"]
            state.uploads[train_id] = sha256(train)
        for i in range(cfg.kills):
            one_life(cfg.dapod, data_dir, state, rng, train_id, cfg, i)
        # the last life: everything ends, the weights equal the reference
        d = Daemon(cfg.dapod, DAEMON_ARGS, data_dir=data_dir)
        with d:
            cl = Client(d.port)
            check_daemon(cl, state, data_dir)
            jobs = wait_all_ended(cl, 900)
            check_daemon(cl, state, data_dir, full=True)
            for j in jobs:
                check(j["status"] == "succeeded", "job %s ended %s: %s"
                      % (j["id"], j["status"], j.get("error")))
                w = final_weights(cl, j["id"], cfg.steps)
                check(w.keys() == ref.keys(), "job %s: tensor names differ" % j["id"])
                for name in ref:
                    check(w[name] == ref[name], "job %s: tensor %s differs from the "
                          "uninterrupted run" % (j["id"], name))
            rc = d.stop()
            check(rc == 0, "dapod exited %s after SIGTERM" % rc)
            summary["jobs_ended"] = len(jobs)
        # every interrupted job resumed, so nothing half-written is left behind
        left = leftovers(data_dir)
        check(not left["checkpoint_tmp"] and not left["upload_tmp"],
              "temporaries left after every job ended: %s"
              % sorted(left["checkpoint_tmp"] | left["upload_tmp"])[:5])
        summary["result"] = "ok"
    except Violation as v:
        summary["result"] = "violation"
        summary["violation"] = str(v)
    finally:
        modes = {}
        for k in state.kills:
            modes[k["mode"]] = modes.get(k["mode"], 0) + 1
        phase_counts = {}
        for k in state.kills:
            for p in set(k["phases"]) or {"idle"}:
                phase_counts[p] = phase_counts.get(p, 0) + 1
        summary.update({"kills_done": len(state.kills), "kill_modes": modes,
                        "kills_mid_checkpoint_write": sum(
                            1 for k in state.kills if k["left"]["checkpoint_tmp"]),
                        "kills_mid_upload": sum(1 for k in state.kills if k["left"]["upload_tmp"]),
                        "temporaries_left_after_restarts": sum(
                            k["left"]["stale_after_restart"] for k in state.kills),
                        "phases_at_kill": phase_counts, "uploads_acked": len(state.uploads),
                        "jobs_acked": len(state.jobs), "restarts_checked": state.checks,
                        "checkpoints_verified": len(state.verified_ckpts),
                        "wall_s": round(time.monotonic() - t_start, 1)})
        print(json.dumps(summary, indent=1))
        if env:
            env.kill()
            env.wait()
            env.stdout.close()
        if not cfg.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if summary.get("result") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
