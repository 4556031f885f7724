"""The OpenBLAS kernel chosen by measuring (main/blas_choice.c, docs/ENGINE.md).

Checks, with a cache folder of the test's own (XDG_CACHE_HOME):
- `dapod kernels --json` measures OpenBLAS's own pick and the candidates, chooses the fastest
  sound one only when it beats the library's pick by 10%, and writes the cache;
- a start reads the cache and runs the cached kernel (OpenBLAS says which core it loaded when
  OPENBLAS_VERBOSE=2): a kernel planted in the cache is the one that runs, after one
  re-execution;
- OPENBLAS_CORETYPE set by the environment is left as it is (no measuring, no re-execution), and
  DAPOD_BLAS_KERNEL=library keeps OpenBLAS's own pick;
- a cache of another machine (another key) or a damaged file is measured again and rewritten;
- concurrent first starts measure once and agree;
- a probe rates a kernel by its threads' CPU time: threads put to sleep mid-probe (as a
  neighbour would deschedule them) rate it as undisturbed ones do;
- DAPOD_KERNELS_ISA: a name it does not know is refused with exit 2; portable, baseline and the
  processor's best generate the same tokens; `dapod kernels` says which decoding kernels run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading

ap = argparse.ArgumentParser()
ap.add_argument("--dapod", required=True)
args = ap.parse_args()

failures = 0
checks = 0


def check(cond, what):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL:", what, flush=True)


def env_with(cache, **kw):
    e = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "DAPOD_BLAS_KERNEL", "DAPOD_BLAS_KERNEL_CHOSEN",
              "OPENBLAS_VERBOSE", "CACHE_DIRECTORY"):
        e.pop(k, None)
    e["XDG_CACHE_HOME"] = cache
    e.update(kw)
    return e


def cores_loaded(cache, **kw):
    """The cores OpenBLAS reports loading, in order, for one `dapod generate` (a re-execution
    loads the library twice), and the generate's stderr."""
    p = subprocess.run([args.dapod, "generate", "tiny", "--prompt", "hi", "--max-tokens", "2"],
                       env=env_with(cache, OPENBLAS_VERBOSE="2", **kw), capture_output=True,
                       text=True, timeout=120)
    check(p.returncode == 0, f"generate exits 0 ({p.returncode}): {p.stderr[-400:]}")
    return [l.split(":", 1)[1].strip() for l in p.stderr.splitlines()
            if l.startswith("Core: ")], p.stderr


with tempfile.TemporaryDirectory() as tmp:
    cache = os.path.join(tmp, "cache")
    path = os.path.join(cache, "dapod", "openblas-kernel.json")

    # 1. kernels --json: the table, the rule, the cache
    p = subprocess.run([args.dapod, "kernels", "--json"], env=env_with(cache),
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"kernels exits 0: {p.stderr[-400:]}")
    t = json.loads(p.stdout)
    m = t["measured"]
    lib = m[0]
    check(lib["kernel"] == "library", "the first row is OpenBLAS's own pick")
    check(t["cache"] == path, f"the cache is under XDG_CACHE_HOME ({t['cache']})")
    ok = [r for r in m if r["ok"]]
    check(len(ok) >= 1, "at least one kernel runs soundly")
    for r in ok:
        check(r["error"] < 1e-5 and r["gflops"] > 0, f"{r['kernel']}: sound and timed")
    cores = [r["core"] for r in m if r["core"]]
    check(len(cores) == len(set(c.lower() for c in cores)), f"each core once: {cores}")
    chosen = [r for r in m if r["kernel"] == (t["kernel"] or "library")]
    check(len(chosen) == 1 and chosen[0]["ok"], f"the choice {t['kernel']!r} is a sound row")
    if t["kernel"]:
        check(not lib["ok"] or chosen[0]["gflops"] >= 1.10 * lib["gflops"],
              "a named kernel beats the library's pick by 10%")
    else:
        best = max(ok, key=lambda r: r["gflops"])
        check(best is lib or best["gflops"] < 1.10 * lib["gflops"],
              "the library's pick is kept only when nothing beats it by 10%")
    with open(path) as f:
        kept = json.load(f)
    check(kept["key"] == t["key"] and kept["kernel"] == t["kernel"], "the cache holds the choice")
    print(f"machine: {t['key']}\nchoice: {t['chosen']}")
    for r in m:
        print(f"  {r['kernel']:<16} {r['core']:<16} {r.get('gflops', 0):8.1f} GFLOP/s "
              f"{r.get('why', '')}")

    # 2. a start runs the cached kernel: plant one that is not OpenBLAS's own pick
    lib_core = lib["core"]
    planted = next((r for r in ok if r["core"].lower() != lib_core.lower()), None)
    if planted:
        kept["kernel"] = planted["kernel"]
        kept["chosen"] = f"{planted['core']}, planted by the test"
        with open(path, "w") as f:
            json.dump(kept, f)
        loaded, err = cores_loaded(cache)
        check(loaded == [lib_core, planted["core"]],
              f"the library's pick, then the planted kernel after re-execution: {loaded}")
        check(json.load(open(path))["kernel"] == planted["kernel"], "a cache that matches is kept")
    else:
        print("only OpenBLAS's own pick runs here: the planted-kernel check has nothing to plant")

    # 3. the environment's choice is left alone; DAPOD_BLAS_KERNEL=library keeps the pick
    other = planted["kernel"] if planted else lib_core
    loaded, _ = cores_loaded(cache, OPENBLAS_CORETYPE=other)
    check(len(loaded) == 1, f"OPENBLAS_CORETYPE set: no re-execution ({loaded})")
    loaded, _ = cores_loaded(cache, DAPOD_BLAS_KERNEL="library")
    check(loaded == [lib_core], f"DAPOD_BLAS_KERNEL=library: OpenBLAS's own pick ({loaded})")

    # 4. another machine's cache, and a damaged file, are measured again
    kept["key"] = "another machine"
    with open(path, "w") as f:
        json.dump(kept, f)
    cores_loaded(cache)
    again = json.load(open(path))
    check(again["key"] == t["key"], "another machine's cache is replaced by this machine's")
    with open(path, "w") as f:
        f.write("{not json")
    cores_loaded(cache)
    check(json.load(open(path))["key"] == t["key"], "a damaged cache is rewritten")

    # 5. concurrent first starts: one measures, all run the same kernel
    cache2 = os.path.join(tmp, "cache2")
    results = [None] * 3

    def start(i):
        results[i] = cores_loaded(cache2)[0][-1:]

    th = [threading.Thread(target=start, args=(i,)) for i in range(3)]
    for x in th:
        x.start()
    for x in th:
        x.join()
    check(all(r == results[0] and r for r in results), f"concurrent starts agree: {results}")
    choice2 = json.load(open(os.path.join(cache2, "dapod", "openblas-kernel.json")))
    want = choice2["chosen"].split(",")[0]
    check(results[0] == [want], f"they run the cached choice {want}: {results[0]}")

    # 6. DAPOD_KERNELS_ISA names the decoding kernels' instruction set; each gives the same bits,
    # so the same tokens (16 sequences sampled together, and a lone one)
    def generate(isa, n):
        return subprocess.run([args.dapod, "generate", "tiny", "--prompt", "hi", "--max-tokens",
                               "24", "--n", str(n), "--seed", "7"],
                              env=env_with(cache, DAPOD_KERNELS_ISA=isa), capture_output=True,
                              text=True, timeout=120)

    p = generate("avx1024", 1)
    check(p.returncode == 2 and "DAPOD_KERNELS_ISA=avx1024" in p.stderr and not p.stdout,
          f"an unknown instruction set is refused by name ({p.returncode}): {p.stderr[-300:]}")
    for n in (16, 1):
        outs = {isa: generate(isa, n) for isa in ("", "portable", "baseline")}
        for isa, q in outs.items():
            check(q.returncode == 0 and q.stdout.strip(),
                  f"generate --n {n} with DAPOD_KERNELS_ISA={isa!r}: {q.stderr[-300:]}")
        check(len({q.stdout for q in outs.values()}) == 1,
              f"--n {n}: the same tokens on every instruction set: "
              + " | ".join(f"{k!r}: {v.stdout[:80]!r}" for k, v in outs.items()))
    p = subprocess.run([args.dapod, "kernels"], env=env_with(cache, DAPOD_KERNELS_ISA="portable"),
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0 and
          "decoding kernels: portable, set by DAPOD_KERNELS_ISA" in p.stdout.splitlines(),
          f"`dapod kernels` says which decoding kernels run: {p.stdout[-300:]}")

# A kernel is rated by its threads' CPU time, not by the share of the clock they got: a probe
# whose threads each sleep 1 s after their first timed product (as when a neighbour takes their
# cores) rates the kernel as an undisturbed probe does. Rated by the clock, the stall dilutes
# the rate to a few GFLOP/s (each thread's loop ends at its first product after it); 2.5x
# leaves the machine's own noise between the runs room. Best of two rounds each, in turns.
with tempfile.TemporaryDirectory() as cache:
    rates = {0: [], 1000: []}
    for _ in range(2):
        for stall in (0, 1000):
            p = subprocess.run([args.dapod, "__blas-probe", "2"],
                               env=env_with(cache, DAPOD_BLAS_PROBE_STALL_MS=str(stall)),
                               capture_output=True, text=True, timeout=60)
            check(p.returncode == 0, f"probe with a stall of {stall} ms: exit {p.returncode}")
            if p.returncode == 0:
                rates[stall].append(json.loads(p.stdout)["gflops"])
    if rates[0] and rates[1000]:
        quiet, stalled = max(rates[0]), max(rates[1000])
        print(f"probe: {quiet:.1f} GFLOP/s undisturbed, {stalled:.1f} with its threads asleep "
              f"1 s each", flush=True)
        check(stalled * 2.5 >= quiet,
              f"a stalled probe rates the kernel by its CPU time: {stalled:.1f} GFLOP/s against "
              f"{quiet:.1f} undisturbed")

print(f"{checks - failures} of {checks} checks passed")
sys.exit(1 if failures else 0)
