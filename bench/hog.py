"""The "busy machine" modes' neighbour (bench/README.md, "Busy machine"): one process spinning on
an integer loop, pinned to the last online CPU, at the default priority. bench_engine.c's
start_hog is the same neighbour in C (a forked child)."""

import os
import subprocess


def start_hog():
    """Starts the hog; returns its Popen (stop_hog ends it)."""
    cpu = (os.cpu_count() or 1) - 1
    return subprocess.Popen(["/usr/bin/python3", "-c",
                             "import os\nos.sched_setaffinity(0, {%d})\nwhile True: pass" % cpu])


def stop_hog(p):
    if p:
        p.kill()
        p.wait()
