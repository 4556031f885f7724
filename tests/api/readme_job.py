"""What the README sections' tests (test_quickstart.sh, test_agents_quickstart.sh) read back
after running the commands: the daemon's JSON, a check that exits 1 with a message, and the one
job the commands ran, which must have succeeded with the followed stream printing
`end succeeded`. Standard library only."""

import json
import sys
import urllib.request


class Readme:
    def __init__(self, test, url, out):
        self.test, self.url = test, url
        self.text = open(out, encoding="utf-8").read()
        self.lines = self.text.splitlines()
        self.check("end succeeded" in self.lines,
                   "the followed stream did not print `end succeeded`:\n" + self.text[-2000:])
        jobs = self.get("/v1/jobs")["data"]
        self.check(len(jobs) == 1, "expected one job, found %d" % len(jobs))
        self.job = jobs[0]
        self.check(self.job["status"] == "succeeded",
                   "the job is %s: %s" % (self.job["status"], self.job.get("error")))

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.load(r)

    def check(self, cond, what):
        if not cond:
            print("%s: %s" % (self.test, what), file=sys.stderr)
            sys.exit(1)
