#!/usr/bin/python3
"""RFT lines with their own tools through OpenAI's route (label api; docs/OPENAI.md, dapod's
extension method.reinforcement.episode; docs/AGENTS.md "A line's own tools").

The example tools (clients/tools/example_tools.py: lookup and calc) run on a free loopback port;
an RFT training file's lines list [lookup], [calc] or no tools:
- POST /v1/fine_tuning/jobs with method.reinforcement.episode (the native `episode`, tools with
  URLs) creates the job: the job object echoes the resolved episode under
  method.reinforcement.episode, the native view has it as `episode`; the job succeeds, and any
  call in its rollouts names a tool its line lists (a line without tools: the job's; that calls
  bind so is tests/rl/test_episodes.c's part, where a random model calls often enough);
- the extension's problems are refused in OpenAI's error shape with the field in OpenAI's words
  (method.reinforcement.episode.max_turns), and a line naming a tool the job lacks is refused at
  creation naming the line and tools[i].function.name.

Run: /usr/bin/python3 tests/api/test_rft_tools.py --dapod build/server/dapod
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_jobs  # noqa: E402

TOOLS_SCRIPT = os.path.join(HERE, "..", "..", "clients", "tools", "example_tools.py")
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
CALC = {"type": "function", "function": {"name": "calc", "description": "arithmetic",
                                         "parameters": {"type": "object"}}}
GRADER = {"type": "string_check", "name": "code", "operation": "eq",
          "input": "{{sample.output_text}}", "reference": "{{item.code}}"}


def line(k, tools):
    return {"messages": [{"role": "user", "content": "code %d?" % k}], "code": str(k % 10),
            "tools": tools}


class RftTools(test_jobs.DaemonCase):
    @classmethod
    def prepare(cls):
        cls.tools = subprocess.Popen(["/usr/bin/python3", TOOLS_SCRIPT, "--port", "0"],
                                     stdout=subprocess.PIPE)
        cls.port = int(cls.tools.stdout.readline())

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            cls.tools.terminate()
            cls.tools.wait()
            cls.tools.stdout.close()

    def episode(self):
        url = "http://127.0.0.1:%d/" % self.port
        return {"max_turns": 2, "max_new_tokens_per_turn": 2,
                "tools": [dict(LOOKUP, url=url + "lookup"), dict(CALC, url=url + "calc")]}

    def body(self, fid, episode):
        return {"model": "tiny", "training_file": fid, "seed": 4,
                "method": {"type": "reinforcement", "reinforcement": {
                    "grader": GRADER, "episode": episode,
                    "hyperparameters": {"total_steps": 2, "group_size": 8, "prompt_batch_size": 6,
                                        "max_new_tokens": 4, "dynamic_sampling": False}}}}

    def upload_lines(self, lines):
        return self.upload(("\n".join(json.dumps(x) for x in lines) + "\n").encode())["id"]

    def oai_error(self, r, param):
        self.assertEqual(r.status, 400, r)
        e = r.json()["error"]
        self.assertEqual(e["param"], param, e)
        return e

    def test_job_with_line_tools(self):
        kinds = [[LOOKUP], [CALC], None]
        fid = self.upload_lines([line(k, kinds[k % 3]) for k in range(12)])
        r = self.d.post_json("/v1/fine_tuning/jobs", self.body(fid, self.episode()))
        job = self.assertJson(r, 200)
        ep = job["method"]["reinforcement"]["episode"]
        self.assertEqual([t["function"]["name"] for t in ep["tools"]], ["lookup", "calc"], ep)
        self.assertEqual((ep["max_turns"], ep["max_new_tokens_per_turn"]), (2, 2), ep)
        native = self.assertJson(self.d.get("/v1/jobs/" + job["id"]), 200)
        self.assertEqual(native["episode"]["max_turns"], 2, native)
        done = self.wait_status(job["id"], ("succeeded", "failed"))
        self.assertEqual(done["status"], "succeeded", done)
        again = self.assertJson(self.d.get("/v1/fine_tuning/jobs/" + job["id"]), 200)
        self.assertEqual(again["method"]["reinforcement"]["episode"], ep)
        calls = episodes = 0
        for step in (1, 2):
            r = self.d.get("/v1/jobs/%s/rollouts?step=%d" % (job["id"], step))
            for row in (json.loads(x) for x in r.body.decode().splitlines() if x.strip()):
                k = int(row["messages"][0]["content"][5:-1])
                allowed = {t["function"]["name"] for t in (kinds[k % 3] or [LOOKUP, CALC])}
                episodes += 1
                for t in row["turns"]:
                    for c in t.get("tool_calls") or []:
                        self.assertIn(c["name"], allowed, (k, t))
                        calls += 1
        self.assertEqual(episodes, 2 * 6 * 8)
        print("rft tools: %d episodes, %d calls, each of its line's tools" % (episodes, calls),
              file=sys.stderr)

    def test_refusals(self):
        fid = self.upload_lines([line(k, [CALC]) for k in range(4)])
        bad = dict(self.episode(), max_turns=0)
        e = self.oai_error(self.d.post_json("/v1/fine_tuning/jobs", self.body(fid, bad)),
                           "method.reinforcement.episode.max_turns")
        self.assertIn("expected an integer from 1 to 64", e["message"])
        bad = dict(self.episode(), turns=2)
        self.oai_error(self.d.post_json("/v1/fine_tuning/jobs", self.body(fid, bad)),
                       "method.reinforcement.episode.turns")
        zz = {"type": "function", "function": {"name": "zz"}}
        fid = self.upload_lines([line(1, [CALC]), line(2, [LOOKUP, zz])])
        e = self.oai_error(self.d.post_json("/v1/fine_tuning/jobs", self.body(fid, self.episode())),
                           "training_file")
        self.assertIn("line 2: field 'tools[1].function.name': the job has no tool named 'zz'",
                      e["message"])


if __name__ == "__main__":
    sys.exit(test_jobs.main())
