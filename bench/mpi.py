#!/usr/bin/env python3
"""Data-parallel DAPO on this machine: one job's steps alone and under `mpirun -np N`.

Runs the same job (the `small` preset by default, 9.5M parameters) with N = 1 (dapod train alone,
every core) and N = 2, 3, ... (mpirun, the cores shared out), and prints each configuration's
step time and its parts from the job's own metrics (averaged over the steps after the first):
sampling (time/generation_s), judging (judge/seconds), the update's passes, the gradient
all-reduce (time/allreduce_s) and the wait for the slowest rank before it (time/rank_wait_s),
and the bytes
all-reduced per step (dist/allreduce_bytes), with the rate they moved at. The speed-up is against
N = 1 measured in the same run. On one machine the ranks share its cores, so this shows the
overhead of splitting a step, not the speed-up of more machines: docs/SCALE.md projects that from
these figures. Reports, never fails on a time.

Usage: bench/mpi.sh [--ranks 1,2] [--model small] [--steps 4] [--responses 32] [--tokens 32]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def dataset(path, n=200):
    with open(path, "w") as f:
        for i in range(n):
            a, b = i % 10, (i // 10) % 10
            f.write(json.dumps({"prompt": "%d+%d=" % (a, b), "answer": str((a + b) % 10)}) + "\n")


def run(args, n, tmp):
    job = {"model": args.model, "training_file": os.path.join(tmp, "data.jsonl"), "seed": 1,
           "judge": {"type": "math"},
           "hyperparameters": {"total_steps": args.steps, "group_size": 8,
                               "prompt_batch_size": args.responses // 8,
                               "dynamic_sampling": False, "max_new_tokens": args.tokens,
                               "overlong_buffer": 0, "learning_rate": 1e-5}}
    path = os.path.join(tmp, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    out = os.path.join(tmp, "out-%d" % n)
    shutil.rmtree(out, ignore_errors=True)
    cores = os.cpu_count() or 1
    threads = max(1, cores // n)
    cmd = [args.dapod, "train", "--config", path, "--out", out, "--threads", str(threads)]
    env = dict(os.environ)
    if n > 1:
        cmd = [args.mpirun, "-np", str(n)] + cmd
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(cmd), p.stderr[-3000:]))
    steps = [json.loads(l) for l in p.stdout.splitlines()]
    steps = [m for m in steps if "time/step_s" in m][1:] or steps  # the first warms up
    avg = lambda k: sum(m.get(k, 0) for m in steps) / len(steps)
    return {"ranks": n, "threads": threads, "step": avg("time/step_s"),
            "sampling": avg("time/generation_s"), "judging": avg("judge/seconds"),
            "allreduce": avg("time/allreduce_s"), "wait": avg("time/rank_wait_s"),
            "update": avg("time/training_s") - avg("time/allreduce_s") - avg("time/rank_wait_s"),
            "bytes": avg("dist/allreduce_bytes"), "tokens": avg("tokens/generated")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--responses", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    args.dapod = os.path.abspath(os.path.join(args.build, "server", "dapod"))
    tmp = tempfile.mkdtemp(prefix="dapod-bench-mpi-")
    try:
        dataset(os.path.join(tmp, "data.jsonl"))
        rows = [run(args, int(n), tmp) for n in args.ranks.split(",")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = rows[0]["step"]
    print("== %s, %d responses of up to %d tokens a step, %d steps (the first not counted), "
          "%d cores" % (args.model, args.responses, args.tokens, args.steps, os.cpu_count()))
    print("%5s %7s %8s %9s %8s %8s %10s %8s %14s %7s %8s" % (
        "ranks", "threads", "step s", "sampling", "judging", "update", "allreduce", "wait",
        "bytes reduced", "GB/s", "vs N=1"))
    for r in rows:
        rate = r["bytes"] / r["allreduce"] / 1e9 if r["allreduce"] > 0 else 0
        print("%5d %7d %8.3f %9.3f %8.4f %8.3f %10.3f %8.3f %14.0f %7.2f %7.2fx" % (
            r["ranks"], r["threads"], r["step"], r["sampling"], r["judging"], r["update"],
            r["allreduce"], r["wait"], r["bytes"], rate,
            base / r["step"] if r["step"] > 0 else 0))
    print("update: forward and backward passes; allreduce: the gradient sums (GB/s: bytes each "
          "rank summed / their time); wait: for the slowest rank before them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
