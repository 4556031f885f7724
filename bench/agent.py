#!/usr/bin/env python3
"""Agent episodes' scheduling (docs/AGENTS.md "Scheduling"), measured with `dapod train` on a
preset (standard library only; prints a table and writes JSON lines under bench/out/):

1. a world that answers each turn after SLEEP ms against one that answers at once: the same
   episode job (the model's turns, then the world's observation, max_turns times) trained
   alternately with each (A B A B), the generation seconds per step compared with what the
   sleeps would add if the episodes waited one after another, and if they waited all at once
   (the ideal of `concurrency` calls in flight: an episode that waits leaves the decoding batch);
2. multi-turn generation against a single-turn job of the same model tokens per sample
   (max_turns x max_new_tokens_per_turn): tokens per second of generation, alternately.

The world is an environment served here (POST {url}/reset, /step, /close): it is what makes
every episode run all its turns whatever a random model writes (a tool is called only when the
model writes a call). Tools go through the same scheduler: their calls wait on the same threads.

usage: bench/agent.py [--dapod build/server/dapod] [--model small] [--steps 3] [--sleep-ms 100]
                      [--pairs 2] [--threads N]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
CALLS = {"n": 0}
LOCK = threading.Lock()


class World(BaseHTTPRequestHandler):
    """/w{ms}/reset, /w{ms}/step, /w{ms}/close: a short observation after ms milliseconds."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def setup(self):
        super().setup()
        # a reply goes out as headers, then body: without TCP_NODELAY the body waits for the
        # client's delayed ACK (40 ms a call), which would be the world's latency
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        base, _, route = self.path.rpartition("/")
        time.sleep(int(base.lstrip("/w") or "0") / 1000.0)
        with LOCK:
            CALLS["n"] += 1
        body = b"{}" if route == "close" else json.dumps(
            {"observation": "next", "reward": None, "done": False}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    # listen()'s backlog: socketserver's default of 5 drops the connections of a burst of calls
    # (dapod opens one a call, `concurrency` of them at once), whose SYNs are retried only after
    # a second: measured, 64 calls in flight took 1.5 s each instead of milliseconds
    request_queue_size = 1024


def serve():
    srv = Server(("127.0.0.1", 0), World)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1]


def job(data, model, steps, episode=None, max_new=48):
    hp = {"total_steps": steps, "checkpoint_every": 0, "group_size": 8, "prompt_batch_size": 8,
          "dynamic_sampling": False, "max_new_tokens": max_new, "gen_batch_size": 64,
          "learning_rate": 1e-4}
    body = {"model": model, "training_file": data, "seed": 3, "judge": {"type": "exact"},
            "hyperparameters": hp}
    if episode:
        body["episode"] = episode
    return body


def run(dapod, body, work, tag, threads):
    path = os.path.join(work, tag + ".json")
    with open(path, "w") as f:
        json.dump(body, f)
    out = os.path.join(work, tag + "-out")
    with LOCK:
        calls0 = CALLS["n"]
    p = subprocess.run([dapod, "train", "--config", path, "--out", out, "--threads", str(threads)],
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit("bench/agent.py: dapod train failed:\n" + p.stderr[-3000:])
    metrics = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    steps = [m for m in metrics if "time/generation_s" in m]
    with LOCK:
        calls = CALLS["n"] - calls0
    return steps, calls


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", default=os.path.join(HERE, "..", "build", "server", "dapod"))
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--sleep-ms", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    port = serve()
    work = tempfile.mkdtemp(prefix="dapod-bench-agent-")
    data = os.path.join(work, "data.jsonl")
    with open(data, "w") as f:
        for i in range(64):
            f.write(json.dumps({"prompt": "task %d:" % i, "answer": str(i % 10)}) + "\n")
    turns, per_turn, concurrency = 3, 16, 64

    def episode(ms):
        return {"max_turns": turns, "max_new_tokens_per_turn": per_turn, "max_answer_tokens": 8,
                "environment": {"type": "http", "url": "http://127.0.0.1:%d/w%d" % (port, ms),
                                "concurrency": concurrency}}

    # 1. a sleeping world against an instant one, A B A B
    gen = {0: [], a.sleep_ms: []}
    step_s = {0: [], a.sleep_ms: []}
    calls = {0: [], a.sleep_ms: []}
    episodes = 0
    for k in range(a.pairs):
        for ms in (0, a.sleep_ms):
            steps, n = run(a.dapod, job(data, a.model, a.steps, episode(ms)), work,
                           "world-%d-%d" % (ms, k), a.threads)
            gen[ms] += [m["time/generation_s"] for m in steps]
            step_s[ms] += [m["time/step_s"] for m in steps]
            calls[ms].append(n / len(steps))
            episodes = int(steps[0]["groups/sampled"]) * 8
    added = med(gen[a.sleep_ms]) - med(gen[0])
    calls_per_step = med(calls[a.sleep_ms])
    serial = calls_per_step * a.sleep_ms / 1000.0
    waves = calls_per_step / episodes  # calls an episode makes: /reset, a /step a turn, /close
    ideal = (waves - 1) * a.sleep_ms / 1000.0  # every episode waits at once (closes unwaited)

    # 2. multi-turn against single-turn generation of the same model tokens per sample
    tps = {"multi": [], "single": []}
    for k in range(a.pairs):
        steps, _ = run(a.dapod, job(data, a.model, a.steps, episode(0)), work, "multi-%d" % k,
                       a.threads)
        tps["multi"] += [m["throughput/gen_tokens_per_s"] for m in steps]
        steps, _ = run(a.dapod, job(data, a.model, a.steps, None, turns * per_turn), work,
                       "single-%d" % k, a.threads)
        tps["single"] += [m["throughput/gen_tokens_per_s"] for m in steps]

    print("dapod agent scheduling: model %s, %d threads, %d episodes a step (%d turns of up to "
          "%d tokens), environment concurrency %d, %d steps x %d pairs"
          % (a.model, a.threads, episodes, turns, per_turn, concurrency, a.steps, a.pairs))
    print("%-44s %10s %10s" % ("", "instant", "%d ms" % a.sleep_ms))
    print("%-44s %10.2f %10.2f" % ("generation s/step (median)", med(gen[0]),
                                   med(gen[a.sleep_ms])))
    print("%-44s %10.2f %10.2f" % ("step s (median)", med(step_s[0]), med(step_s[a.sleep_ms])))
    print("%-44s %10.0f %10.0f" % ("world calls a step", med(calls[0]), calls_per_step))
    print("added by the sleeping world: %.2f s a step; if every call waited in turn: %.1f s; "
          "if every episode waited at once: %.2f s" % (added, serial, ideal))
    print("multi-turn generation %.0f tok/s, single-turn (%d tokens) %.0f tok/s: %.2fx"
          % (med(tps["multi"]), turns * per_turn, med(tps["single"]),
             med(tps["multi"]) / med(tps["single"])))
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    with open(os.path.join(HERE, "out", "agent.jsonl"), "a") as f:
        f.write(json.dumps({"time": time.time(), "model": a.model, "threads": a.threads,
                            "episodes": episodes, "sleep_ms": a.sleep_ms,
                            "gen_s_instant": med(gen[0]), "gen_s_sleeping": med(gen[a.sleep_ms]),
                            "added_s": added, "serial_s": serial, "ideal_s": ideal,
                            "multi_tok_s": med(tps["multi"]),
                            "single_tok_s": med(tps["single"])}) + "\n")
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
