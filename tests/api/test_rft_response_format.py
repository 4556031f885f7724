#!/usr/bin/python3
"""Structured outputs in a training job's sampling (label api; docs/TRAINING.md "Structured
outputs", docs/OPENAI.md), on the tiny preset (random weights: what it writes is the mask's).

- An RFT job through OpenAI's route with method.reinforcement.response_format (json_schema)
  trains: every response of every step that ended by itself parses and validates against the
  schema (python3-jsonschema), the grader reads {{sample.output_json.pet}} (no
  sample_parse_error), and policy/logp_mismatch (the mean |sampler logp - trainer logp_old|) stays
  under 1e-4 at temperature 0.7: the update's log-probs are the constrained distribution's (a
  trainer that does not mask gave 3.9 here). The job object echoes the response_format under
  method.reinforcement, the native view as `response_format`.
- The native /v1/jobs job takes `response_format` at the top level; the resolved grader judge
  holds it too (its output_json parses by it); its memory plan counts the update's masks (more
  buffer bytes than the same job without).
- Refusals at submission, naming the field: a keyword outside the subset
  (response_format.json_schema.schema.properties.x.foo; OpenAI's route:
  method.reinforcement.response_format.json_schema.schema.properties.x.foo), a judge whose own
  response_format differs (judge.response_format), a supervised job (response_format), a
  multi-turn episode (response_format).

Run: /usr/bin/python3 tests/api/test_rft_response_format.py --dapod build/server/dapod
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import jsonschema
except ImportError:
    print("test_rft_response_format: python3-jsonschema is missing; skipped", file=sys.stderr)
    sys.exit(77)
import test_jobs  # noqa: E402

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 5},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99},
                         "pet": {"enum": ["cat", "dog", None]}},
          "required": ["name", "age", "pet"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": SCHEMA}}
GRADER = {"type": "string_check", "name": "pet", "operation": "eq",
          "input": "{{sample.output_json.pet}}", "reference": "cat"}
HP = {"total_steps": 2, "group_size": 4, "prompt_batch_size": 2, "max_new_tokens": 40,
      "dynamic_sampling": False, "temperature": 0.7}
TEMPLATE = {"system": "{content}\n", "user": "{content}", "assistant": "{content}\n"}
BAD_RF = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
    "type": "object", "properties": {"x": {"type": "string", "foo": 1}}}}}
BAD_FIELD = "response_format.json_schema.schema.properties.x.foo"


class RftResponseFormat(test_jobs.DaemonCase):
    @classmethod
    def prepare(cls):
        lines = [{"messages": [{"role": "user", "content": "Who is %d?" % k}], "k": k}
                 for k in range(6)]
        cls.fid = cls.upload(("\n".join(json.dumps(x) for x in lines) + "\n").encode())["id"]

    def oai_body(self, rf):
        return {"model": "tiny", "training_file": self.fid, "seed": 3,
                "method": {"type": "reinforcement", "reinforcement": {
                    "grader": GRADER, "response_format": rf, "hyperparameters": HP}}}

    def native_body(self, **kw):
        b = {"model": "tiny", "training_file": self.fid, "seed": 3, "hyperparameters": HP,
             "judge": {"type": "grader", "grader": GRADER}, "response_format": RF,
             "chat_template": TEMPLATE}
        b.update(kw)
        return b

    def check_rollouts(self, job_id):
        complete = 0
        for step in (1, 2):
            r = self.d.get("/v1/jobs/%s/rollouts?step=%d" % (job_id, step))
            rows = [json.loads(x) for x in r.body.decode().splitlines() if x.strip()]
            self.assertEqual(len(rows), 8, rows)
            for row in rows:
                self.assertNotIn("judge_error", row)
                if row["truncated"]:
                    continue  # cut by max_new_tokens: a prefix, not JSON
                value = json.loads(row["response"])
                jsonschema.validate(value, SCHEMA)
                self.assertEqual(list(value), ["name", "age", "pet"], value)
                self.assertEqual(row["reward_raw"], 1.0 if value["pet"] == "cat" else 0.0, row)
                complete += 1
        self.assertGreater(complete, 8)
        metrics = self.assertJson(self.d.get("/v1/jobs/%s/metrics" % job_id), 200)
        mism = [s["policy/logp_mismatch"] for s in metrics if "policy/logp_mismatch" in s]
        self.assertTrue(mism, metrics)
        print("response_format job: %d of 16 responses complete and valid, logp_mismatch %s"
              % (complete, ["%.2g" % x for x in mism]), file=sys.stderr)
        self.assertLess(max(mism), 1e-4, mism)

    def test_openai_rft_job(self):
        r = self.d.post_json("/v1/fine_tuning/jobs", self.oai_body(RF))
        job = self.assertJson(r, 200)
        self.assertEqual(job["method"]["reinforcement"]["response_format"], RF)
        native = self.job(job["id"])
        self.assertEqual(native["response_format"], RF)
        self.assertEqual(native["judge"]["response_format"], RF)
        done = self.wait_status(job["id"], ("succeeded", "failed"))
        self.assertEqual(done["status"], "succeeded", done)
        self.check_rollouts(job["id"])

    def test_native_job(self):
        r = self.d.post_json("/v1/jobs", self.native_body())
        self.assertEqual(r.status, 201, r)
        job = r.json()
        self.assertEqual(job["response_format"], RF)
        self.assertEqual(job["judge"]["response_format"], RF)
        # the memory plan counts the update's allowed ids: a bitset of the vocabulary per
        # response token of a micro-batch (the same job without them plans fewer buffer bytes)
        body = self.native_body()
        del body["response_format"]
        r = self.d.post_json("/v1/jobs", body)
        self.assertEqual(r.status, 201, r)
        free = r.json()
        self.assertIsNone(free["response_format"])
        self.assertEqual(self.d.post_json("/v1/jobs/%s/cancel" % free["id"], {}).status, 200)
        extra = job["memory"]["buffers_bytes"] - free["memory"]["buffers_bytes"]
        print("response_format: %d more buffer bytes planned" % extra, file=sys.stderr)
        self.assertGreater(extra, 0)
        self.assertEqual(job["memory"]["total_bytes"] - free["memory"]["total_bytes"], extra)
        done = self.wait_status(job["id"], ("succeeded", "failed"))
        self.assertEqual(done["status"], "succeeded", done)
        self.check_rollouts(job["id"])

    def test_refusals(self):
        r = self.d.post_json("/v1/fine_tuning/jobs", self.oai_body(BAD_RF))
        self.assertEqual(r.status, 400, r)
        err = r.json()["error"]
        self.assertEqual(err["param"], "method.reinforcement." + BAD_FIELD, err)
        cases = [(self.native_body(response_format=BAD_RF), BAD_FIELD),
                 (self.native_body(judge={"type": "grader", "grader": GRADER,
                                          "response_format": {"type": "json_object"}}),
                  "judge.response_format"),
                 (self.native_body(method="supervised", judge=None), "response_format"),
                 (self.native_body(episode={"max_turns": 2, "tools": [{
                     "type": "function", "function": {"name": "f"}, "url": "http://127.0.0.1:9/"}
                 ]}), "response_format")]
        for body, field in cases:
            body = {k: v for k, v in body.items() if v is not None}
            p = self.assertProblem(self.d.post_json("/v1/jobs", body), 422, "validation_failed")
            self.assertFields(p, field)


if __name__ == "__main__":
    sys.exit(test_jobs.main())
