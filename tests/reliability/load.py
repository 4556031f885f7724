#!/usr/bin/python3
"""Load test of dapod's read side while a job trains (scripts/loadtest.sh; docs/RELIABILITY.md).

One daemon (1 worker, 1 compute thread), one training file, three runs of the same job (same
spec and seed, so every step does exactly the same work):
  A  baseline: nothing else runs;
  B  under load: N SSE subscribers (asyncio, HTTP/1.0 on loopback) follow B's event stream for the
     whole job, and `wrk` hits each read endpoint in turn for --wrk-seconds (GET /healthz,
     /v1/jobs, /v1/jobs/{id}, /v1/jobs/{id}/metrics, /metrics);
  C  baseline again (the machine is shared: A and C bracket its drift).
A fourth run S has only the SSE subscribers (no wrk), a fifth R the subscribers plus a paced poller
(--rate requests/s over the same endpoints, one keep-alive connection: a realistic dashboard load
rather than wrk's saturation). Reported: wrk's requests/s and p50/p99 per
endpoint, SSE connect time and delivery (every subscriber must receive every event of the job
through `end`), and the median time/step_s of the steps that ran while the load was on, against the
same steps of A and C, and the CPU seconds per step of the compute thread (from /proc, per
thread) with the share of a core it got, which separates "the load slowed the computation" from
"the load took CPU time from it" on a shared machine. Prints a JSON summary; exits 1 when a check fails (wrong event counts,
refused subscribers, wrk errors), never on timing.
Usage: load.py --dapod PATH [--sse 500] [--wrk-seconds 8] [--steps 60] [--wrk wrk]
"""

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
from harness import Daemon  # noqa: E402

TERMINAL = ("succeeded", "failed", "cancelled")


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def train_file(n=64):
    out = []
    for i in range(n):
        a, b = (i * 37) % 100, (i * 53) % 100
        out.append(json.dumps({"id": "l%d" % i, "prompt": "What is %d+%d?" % (a, b),
                               "answer": str(a + b)}))
    return ("\n".join(out) + "\n").encode()


def job_body(fid, steps):
    return {"model": "tiny", "training_file": fid, "seed": 11,
            "hyperparameters": {"total_steps": steps, "checkpoint_every": 10,
                                "max_new_tokens": 16, "group_size": 8,
                                "prompt_batch_size": 4}}


def create_job(d, fid, steps):
    r = d.post_json("/v1/jobs", job_body(fid, steps))
    if r.status != 201:
        fail("create job: %r" % r)
    return r.json()["id"]


def job(d, jid):
    return d.get("/v1/jobs/" + jid).json()


def wait_end(d, jid, deadline_s=1200):
    t_end = time.monotonic() + deadline_s
    while True:
        j = d.get("/v1/jobs/%s?wait=5" % jid, timeout=30).json()
        if j["status"] in TERMINAL:
            if j["status"] != "succeeded":
                fail("job %s ended %s: %s" % (jid, j["status"], j.get("error")))
            return j
        if time.monotonic() > t_end:
            fail("job %s did not end within %d s" % (jid, deadline_s))


def wait_step(d, jid, step, deadline_s=600):
    t_end = time.monotonic() + deadline_s
    while job(d, jid)["step"] < step:
        if time.monotonic() > t_end:
            fail("job %s did not reach step %d" % (jid, step))
        time.sleep(0.05)


def task_cpu(pid):
    """CPU seconds (user + system) of every thread of process pid, by thread id."""
    out, tck = {}, os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (int(rest[11]) + int(rest[12])) / tck  # utime, stime (fields 14, 15)
    return out


class CpuWindow:
    """CPU used by each thread of the daemon between start() and stop()."""

    def __init__(self, pid):
        self.pid = pid

    def start(self):
        self.c0, self.t0 = task_cpu(self.pid), time.monotonic()
        return self

    def stop(self):
        c1 = task_cpu(self.pid)
        self.wall = time.monotonic() - self.t0
        self.delta = {t: c1[t] - self.c0.get(t, 0.0) for t in c1}
        return self


def event_ids(d, jid):
    ids, page = [], {"has_more": True}
    while page.get("has_more"):
        page = d.get("/v1/jobs/%s/events?limit=100&after=%d" % (jid, ids[-1] if ids else 0)).json()
        ids += [e["id"] for e in page["data"]]
    return ids


def step_times(d, jid):
    rows = d.get("/v1/jobs/%s/metrics" % jid).json()
    return {r["step"]: r["time/step_s"] for r in rows if "time/step_s" in r}


def median_of(times, lo, hi):
    v = [times[s] for s in range(lo + 1, hi + 1) if s in times]
    return statistics.median(v) if v else float("nan"), len(v)


# ---- SSE subscribers ----

class SseFleet:
    """n asyncio subscribers of one job's event stream, in a thread with its own loop."""

    def __init__(self, port, jid, n):
        self.port, self.jid, self.n = port, jid, n
        self.connect_ms = []
        self.events = []  # per subscriber: ids received
        self.ended = 0
        self.errors = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.all_connected = threading.Event()

    async def _one(self, i, connected):
        t0 = time.monotonic()
        ids = []
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
            writer.write(("GET /v1/jobs/%s/events/stream HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                          "Accept: text/event-stream\r\n\r\n" % self.jid).encode())
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 60)
            if b" 200 " not in status:
                raise RuntimeError("status %r" % status)
            while (await asyncio.wait_for(reader.readline(), 60)) not in (b"\r\n", b"\n", b""):
                pass
            self.connect_ms.append((time.monotonic() - t0) * 1e3)
            connected.append(i)
            if len(connected) == self.n:
                self.all_connected.set()
            ended = False
            while True:
                line = await asyncio.wait_for(reader.readline(), 600)
                if not line:
                    break
                if line.startswith(b"id: "):
                    ids.append(int(line[4:]))
                elif line.startswith(b"event: end"):
                    ended = True
            if ended:
                self.ended += 1
            writer.close()
        except Exception as e:  # noqa: BLE001 - reported, the test fails on any
            self.errors.append("subscriber %d: %s: %s" % (i, type(e).__name__, e))
            self.all_connected.set()
        self.events.append(ids)

    async def _main(self):
        connected = []
        await asyncio.gather(*(self._one(i, connected) for i in range(self.n)))

    def start(self):
        self.thread.start()
        if not self.all_connected.wait(120):
            fail("only %d of %d SSE subscribers connected" % (len(self.connect_ms), self.n))
        if self.errors:
            fail("SSE: %s" % self.errors[:3])

    def join(self, expected_ids):
        self.thread.join(600)
        if self.errors:
            fail("SSE: %d errors, first %s" % (len(self.errors), self.errors[:3]))
        bad = [e for e in self.events if e != expected_ids]
        if bad or self.ended != self.n:
            fail("SSE: %d of %d subscribers got a different event sequence, %d saw end"
                 % (len(bad), self.n, self.ended))
        ms = sorted(self.connect_ms)
        return {"subscribers": self.n, "events_each": len(expected_ids), "all_saw_end": True,
                "connect_ms_p50": round(ms[len(ms) // 2], 1),
                "connect_ms_p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1)}


# ---- wrk ----

def wrk_run(wrk, url, seconds, conns, threads):
    cmd = [wrk, "-t%d" % threads, "-c%d" % conns, "-d%ds" % seconds, "--latency", url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    res = {"cmd": " ".join(cmd[:-1] + [re.sub(r"http://[^/]+", "", url)])}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    res["req_per_s"] = float(m.group(1)) if m else None
    for pct in ("50", "99"):
        m = re.search(r"^\s+%s%%\s+([\d.]+)(us|ms|s)\s*$" % pct, out, re.M)
        if m:
            v = float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]
            res["p%s_ms" % pct] = round(v, 3)
    m = re.search(r"(\d+) requests in", out)
    res["requests"] = int(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    res["non_2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: (.*)", out)
    res["socket_errors"] = m.group(1).strip() if m else ""
    if res["req_per_s"] is None:
        fail("wrk output not understood:\n" + out)
    return res


def paced_poll(d, endpoints, rate, jid):
    """GETs the endpoints in turn at `rate` requests/s (one keep-alive connection) until job jid
    ends; returns the achieved rate and latency percentiles."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    lat, i, t0, bad = [], 0, time.monotonic(), 0
    next_t = t0
    while True:
        ep = endpoints[i % len(endpoints)]
        i += 1
        t = time.monotonic()
        conn.request("GET", ep)
        r = conn.getresponse()
        body = r.read()
        lat.append((time.monotonic() - t) * 1e3)
        if r.status != 200:
            bad += 1
        if ep == "/v1/jobs/" + jid and json.loads(body)["status"] in TERMINAL:
            break
        next_t += 1.0 / rate
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    conn.close()
    if bad:
        fail("paced poller: %d non-200 replies" % bad)
    lat.sort()
    return {"rate_asked": rate, "requests": len(lat),
            "rate_achieved": round(len(lat) / (time.monotonic() - t0), 1),
            "p50_ms": round(lat[len(lat) // 2], 2),
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    ap.add_argument("--wrk", default="wrk")
    ap.add_argument("--sse", type=int, default=500)
    ap.add_argument("--wrk-seconds", type=int, default=8)
    ap.add_argument("--wrk-connections", type=int, default=32)
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rate", type=float, default=100.0,
                    help="requests/s of the paced poller of run R")
    ap.add_argument("--compute-cpus", default="",
                    help="the daemon's compute_cpus (e.g. 0); run this script on the other CPUs "
                         "(taskset) so that the load generators stay off the training core")
    cfg = ap.parse_args()
    args = ["--workers", "1", "--blas-threads", "1", "--http-threads", "4",
            "--max-connections", str(cfg.sse + 200),
            "--max-connections-per-ip", str(cfg.sse + 200),
            "--max-sse-subscribers", str(cfg.sse + 100), "--access-log", "false",
            "--log-level", "warn"]
    if cfg.compute_cpus:
        args += ["--compute-cpus", cfg.compute_cpus]
    summary = {"load_average_start": loadavg(), "cores": os.cpu_count(), "daemon_args": args,
               "job": job_body("<file>", cfg.steps)}
    with Daemon(cfg.dapod, args) as d:
        r = d.request("POST", "/v1/files?purpose=fine-tune&filename=load.jsonl",
                      body=train_file(), headers={"Content-Type": "application/x-ndjson"})
        if r.status != 201:
            fail("upload: %r" % r)
        fid = r.json()["id"]
        base = "http://127.0.0.1:%d" % d.port

        pid = d.proc.pid
        cpu = {}
        # A: baseline
        cpu["A"] = CpuWindow(pid).start()
        ja = create_job(d, fid, cfg.steps)
        wait_end(d, ja)
        cpu["A"].stop()

        # B: SSE subscribers for the whole job, wrk on each endpoint in turn
        cpu["B"] = CpuWindow(pid).start()
        jb = create_job(d, fid, cfg.steps)
        fleet = SseFleet(d.port, jb, cfg.sse)
        fleet.start()
        wait_step(d, jb, 2)
        s0 = job(d, jb)["step"]
        load_avg_during = loadavg()
        endpoints = ["/healthz", "/v1/jobs", "/v1/jobs/" + jb, "/v1/jobs/%s/metrics" % jb,
                     "/metrics"]
        wrk = []
        for ep in endpoints:
            res = wrk_run(cfg.wrk, base + ep, cfg.wrk_seconds, cfg.wrk_connections,
                          cfg.wrk_threads)
            res["endpoint"] = ep.replace(jb, "{id}")
            wrk.append(res)
        s1 = job(d, jb)["step"]
        if s1 >= cfg.steps:
            print("warning: job B ended before the load did; raise --steps", file=sys.stderr)
        wait_end(d, jb)
        cpu["B"].stop()
        sse = fleet.join(event_ids(d, jb))

        # C: baseline again
        cpu["C"] = CpuWindow(pid).start()
        jc = create_job(d, fid, cfg.steps)
        wait_end(d, jc)
        cpu["C"].stop()

        # S: SSE subscribers only
        cpu["S"] = CpuWindow(pid).start()
        js = create_job(d, fid, cfg.steps)
        fleet_s = SseFleet(d.port, js, cfg.sse)
        fleet_s.start()
        wait_end(d, js)
        cpu["S"].stop()
        fleet_s.join(event_ids(d, js))

        # R: SSE subscribers and a paced poller (--rate requests/s over the read endpoints)
        cpu["R"] = CpuWindow(pid).start()
        jr = create_job(d, fid, cfg.steps)
        fleet_r = SseFleet(d.port, jr, cfg.sse)
        fleet_r.start()
        paced = paced_poll(d, [ep.replace(jb, jr) for ep in endpoints], cfg.rate, jr)
        cpu["R"].stop()
        fleet_r.join(event_ids(d, jr))

        ta, tb, tc, ts, tr = (step_times(d, j) for j in (ja, jb, jc, js, jr))
        ma, n = median_of(ta, s0, s1)
        mb, _ = median_of(tb, s0, s1)
        mc, _ = median_of(tc, s0, s1)
        ms_all = [statistics.median(ts.values()), statistics.median(ta.values()),
                  statistics.median(tc.values()), statistics.median(tr.values())]
        base_ms = (ma + mc) / 2
        summary.update({
            "wrk": wrk,
            "sse": sse,
            "steps_under_wrk": [s0 + 1, s1],
            "step_s_median": {"A_baseline": round(ma, 4), "B_sse_and_wrk": round(mb, 4),
                              "C_baseline": round(mc, 4), "steps_compared": n},
            "step_time_change_under_wrk_pct": round(100 * (mb - base_ms) / base_ms, 1),
            "paced": paced,
            "step_time_change_sse_and_paced_pct": round(
                100 * (ms_all[3] - (ms_all[1] + ms_all[2]) / 2) / ((ms_all[1] + ms_all[2]) / 2), 1),
            "step_s_median_whole_job": {"S_sse_only": round(ms_all[0], 4),
                                        "R_sse_and_paced": round(ms_all[3], 4),
                                        "A_baseline": round(ms_all[1], 4),
                                        "C_baseline": round(ms_all[2], 4)},
            "step_time_change_sse_only_pct": round(
                100 * (ms_all[0] - (ms_all[1] + ms_all[2]) / 2) / ((ms_all[1] + ms_all[2]) / 2), 1),
            "load_average_during_wrk": load_avg_during,
            "load_average_end": loadavg(),
        })
        # The compute thread is the one that used the most CPU in the baseline run (1 worker, 1
        # compute thread, nothing else running); its CPU seconds per step show whether the load
        # slowed the computation itself or only took CPU time from it (wall time).
        tid = max(cpu["A"].delta, key=cpu["A"].delta.get)
        summary["cpu"] = {
            k: {"compute_thread_cpu_s_per_step": round(w.delta.get(tid, 0.0) / cfg.steps, 4),
                "wall_s_per_step": round(w.wall / cfg.steps, 4),
                "compute_thread_share_of_a_core": round(w.delta.get(tid, 0.0) / w.wall, 3),
                "other_threads_cpu_s": round(sum(v for t, v in w.delta.items() if t != tid), 2)}
            for k, w in cpu.items()}
        if d.stop() != 0:
            fail("dapod did not exit 0")
    print(json.dumps(summary, indent=1))
    for w in wrk:
        if w["non_2xx"] or w["socket_errors"]:
            fail("wrk %s: %d non-2xx, socket errors %s" % (w["endpoint"], w["non_2xx"],
                                                         w["socket_errors"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
