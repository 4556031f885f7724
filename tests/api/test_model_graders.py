#!/usr/bin/python3
"""score_model and label_model graders through an OpenAI-compatible judge model (label api;
docs/OPENAI.md "Graders", the server config's judge_models).

A stand-in judge model (tests/reward/judge_model_server.py) runs on a free loopback port; the
daemon's judge_models name it three times ("judge": timeout 1 s, 2 retries; "strict": no
retries; "slow": timeout 300 ms, no retries), with a key file whose content must arrive as
Authorization: Bearer. Checked through the daemon:
- graders/run: score_model's reward is the stand-in's (1.0 for the reference answer, else 0.2),
  the request carries the rendered messages, the strict json_schema and the bearer key;
  metadata names the upstream model, its token usage (prompt words + 5) and no error;
- clamping to range (7 -> 1, -3 -> the range's low end), each error flag with reward 0
  (model_grader_parse_error for non-JSON content, a non-number result, a label not in labels;
  model_grader_refusal_error; model_grader_server_error after retries, with details; a timeout),
  a 500 followed by a success (retried: the reward of the success, two requests received); a
  2xx reply that is no chat completion (server error) and usage that is no count (0 tokens);
- label_model (passing label -> 1, other -> 0) alone and inside multi;
- validate and run refuse an unknown judge model naming `model`, passing_labels outside labels,
  a bad range, naming the field;
- a short RFT job through POST /v1/fine_tuning/jobs graded by score_model: every rollout's
  reward_raw equals the stand-in's score for its response, its judge info the tokens of its
  call (prompt words + 5), and the stand-in held 4 requests at
  once (the judge model's concurrency); a job whose judge model fails (HTTP 500, no retries)
  fails with on_judge_error "fail" quoting the error, and with "drop" succeeds with its groups
  dropped.

- a judge model dapod serves itself (judge_models.self: {"serve": "tiny"}): graders/run's score
  and a job's rewards equal the served model's answer to the same request on the chat route
  (structured outputs under the strict schema; clamped result, or 0 with
  model_grader_parse_error when max tokens cut it), with its token usage; a served model that
  names no model stops the daemon at start, naming judge_models.<name>.serve.

Run: /usr/bin/python3 tests/api/test_model_graders.py --dapod build/server/dapod
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reward"))
import harness  # noqa: E402
import judge_model_server  # noqa: E402
import test_jobs  # noqa: E402

STANDIN = os.path.join(HERE, "..", "reward", "judge_model_server.py")
KEY = "sk-standin-0123456789"
INPUT = [{"role": "system", "content": "Grade the answer."},
         {"role": "user", "content": "Answer: {{sample.output_text}}\nReference: {{item.answer}}"}]


# the strict schema score_model asks its judge model to answer in (docs/OPENAI.md "Graders")
SCORE_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "score_model_result", "strict": True, "schema": {
        "type": "object", "additionalProperties": False, "required": ["result", "steps"],
        "properties": {"result": {"type": "number"}, "steps": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["description", "conclusion"],
            "properties": {"description": {"type": "string"},
                           "conclusion": {"type": "string"}}}}}}}}


def score_grader(model="judge", **kw):
    return dict({"type": "score_model", "name": "judge", "model": model, "input": INPUT}, **kw)


def label_grader(**kw):
    return dict({"type": "label_model", "name": "lab", "model": "judge", "input": INPUT,
                 "labels": ["correct", "wrong"], "passing_labels": ["correct"]}, **kw)


class StandinDaemon(test_jobs.DaemonCase):
    """A daemon beside the stand-in judge model on a free loopback port (self.port); the daemon's
    arguments come from daemon_args(url of the stand-in's /v1)."""

    @classmethod
    def daemon_args(cls, url):
        raise NotImplementedError

    @classmethod
    def setUpClass(cls):
        cls.standin = subprocess.Popen(["/usr/bin/python3", STANDIN], stdout=subprocess.PIPE)
        cls.port = int(cls.standin.stdout.readline())
        try:
            cls.ARGS = cls.daemon_args("http://127.0.0.1:%d/v1" % cls.port)
            super().setUpClass()
        except BaseException:
            cls.stop_standin()
            raise

    @classmethod
    def stop_standin(cls):
        cls.standin.terminate()
        cls.standin.wait()
        cls.standin.stdout.close()

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            cls.stop_standin()


class ModelGraders(StandinDaemon):
    @classmethod
    def daemon_args(cls, url):
        cls.tmp = tempfile.mkdtemp(prefix="dapod-jm-")
        key_file = os.path.join(cls.tmp, "key")
        with open(key_file, "w") as f:
            f.write(KEY + "\n")
        models = {"judge": {"url": url, "model": "standin-judge", "api_key_file": key_file,
                            "timeout_ms": 1000, "max_retries": 2, "concurrency": 4},
                  "strict": {"url": url + "/", "model": "standin-strict", "max_retries": 0},
                  "slow": {"url": url, "model": "standin-slow", "timeout_ms": 300,
                           "max_retries": 0},
                  "self": {"serve": "tiny", "timeout_ms": 120000}}
        return test_jobs.DaemonCase.ARGS + ("--judge-models", json.dumps(models))

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            if getattr(cls, "tmp", None):
                shutil.rmtree(cls.tmp, ignore_errors=True)

    def standin_requests(self):
        return harness_get(self.port, "/requests")

    def reset(self):
        harness_post(self.port, "/reset")

    def run_grader(self, grader, sample, item):
        r = self.d.post_json("/v1/fine_tuning/alpha/graders/run",
                             {"grader": grader, "model_sample": sample, "item": item})
        return self.assertJson(r, 200)

    def refused(self, grader, param, has):
        for route in ("validate", "run"):
            body = {"grader": grader}
            if route == "run":
                body["model_sample"] = "x"
            r = self.d.post_json("/v1/fine_tuning/alpha/graders/" + route, body)
            self.assertEqual(r.status, 400, r)
            e = r.json()["error"]
            self.assertEqual(e["param"], param, e)
            self.assertIn(has, e["message"])
            self.assertNotIn(KEY, r.body.decode())

    def flags(self, out):
        errs = out["metadata"]["errors"]
        return sorted(k for k, v in errs.items() if v is True)

    def test_score_model_run(self):
        self.reset()
        out = self.run_grader(score_grader(), "42", {"answer": "42"})
        self.assertEqual(out["reward"], 1.0, out)
        md = out["metadata"]
        self.assertEqual((md["type"], md["name"]), ("score_model", "judge"))
        self.assertEqual(md["sampled_model_name"], "standin-judge", md)
        self.assertEqual(self.flags(out), [], md)
        reqs = self.standin_requests()
        self.assertEqual(len(reqs), 1, reqs)
        self.assertEqual(reqs[0]["authorization"], "Bearer " + KEY)
        body = reqs[0]["body"]
        self.assertEqual(body["model"], "standin-judge")
        self.assertEqual(body["messages"],
                         [{"role": "system", "content": "Grade the answer."},
                          {"role": "user", "content": "Answer: 42\nReference: 42"}])
        rf = body["response_format"]
        self.assertEqual(rf["type"], "json_schema")
        self.assertTrue(rf["json_schema"]["strict"])
        schema = rf["json_schema"]["schema"]
        self.assertEqual(schema["required"], ["result", "steps"])
        self.assertEqual(schema["properties"]["result"], {"type": "number"})
        self.assertEqual(schema["properties"]["steps"]["items"]["required"],
                         ["description", "conclusion"])
        self.assertFalse(schema["additionalProperties"])
        words = len("Grade the answer.\nAnswer: 42\nReference: 42".split())
        self.assertEqual(md["token_usage"], words + 5, md)
        self.assertEqual(out["model_grader_token_usage_per_model"],
                         {"standin-judge": {"prompt_tokens": words, "completion_tokens": 5,
                                            "total_tokens": words + 5}})
        out = self.run_grader(score_grader(), "41", {"answer": "42"})
        self.assertAlmostEqual(out["reward"], 0.2, out)
        # sampling_params reach the request (max_completions_tokens as OpenAI's chat name)
        self.reset()
        sp = {"seed": 3, "temperature": 0.5, "top_p": 0.9, "max_completions_tokens": 64,
              "reasoning_effort": "low"}
        self.run_grader(score_grader(sampling_params=sp, pass_threshold=0.5), "1", {"answer": "1"})
        body = self.standin_requests()[0]["body"]
        self.assertEqual((body["seed"], body["temperature"], body["top_p"],
                          body["max_completion_tokens"], body["reasoning_effort"]),
                         (3, 0.5, 0.9, 64, "low"), body)
        # the strict judge model has no key: no Authorization header at all
        self.reset()
        self.run_grader(score_grader("strict"), "1", {"answer": "1"})
        self.assertIsNone(self.standin_requests()[0]["authorization"])
        print("score_model: 1.0 / 0.2, %d prompt tokens + 5" % words, file=sys.stderr)

    def test_clamp_and_errors(self):
        out = self.run_grader(score_grader(), "CLAMP", {"answer": "x"})
        self.assertEqual((out["reward"], self.flags(out)), (1.0, []), out)
        out = self.run_grader(score_grader(range=[0, 5]), "CLAMP", {"answer": "x"})
        self.assertEqual(out["reward"], 5.0, out)
        out = self.run_grader(score_grader(range=[-1, 1]), "NEGATIVE", {"answer": "x"})
        self.assertEqual(out["reward"], -1.0, out)
        for marker, flag in (("NONJSON", "model_grader_parse_error"),
                             ("NONUMBER", "model_grader_parse_error"),
                             ("REFUSE", "model_grader_refusal_error")):
            out = self.run_grader(score_grader(), marker, {"answer": marker})
            self.assertEqual((out["reward"], self.flags(out)), (0, [flag]), (marker, out))
        self.reset()
        out = self.run_grader(score_grader(), "FAIL", {"answer": "FAIL"})
        self.assertEqual((out["reward"], self.flags(out)), (0, ["model_grader_server_error"]), out)
        self.assertIn("HTTP 500 after 3 attempts",
                      out["metadata"]["errors"]["model_grader_server_error_details"])
        self.assertEqual(len(self.standin_requests()), 3)  # 1 + max_retries 2
        self.reset()
        out = self.run_grader(score_grader(), "FLAKY", {"answer": "FLAKY"})
        self.assertEqual((out["reward"], self.flags(out)), (1.0, []), out)
        self.assertEqual(len(self.standin_requests()), 2)
        self.reset()
        out = self.run_grader(score_grader("strict"), "FLAKY", {"answer": "FLAKY"})
        self.assertEqual(self.flags(out), ["model_grader_server_error"], out)
        out = self.run_grader(score_grader("slow"), "SLOW", {"answer": "SLOW"})
        self.assertEqual((out["reward"], self.flags(out)), (0, ["model_grader_server_error"]), out)
        self.assertIn("timed out", out["metadata"]["errors"]["model_grader_server_error_details"])
        # a hostile upstream: a 2xx reply that is no chat completion, usage that is no count
        out = self.run_grader(score_grader(), "NOTCHAT", {"answer": "NOTCHAT"})
        self.assertEqual((out["reward"], self.flags(out)), (0, ["model_grader_server_error"]), out)
        self.assertIn("not a chat completion",
                      out["metadata"]["errors"]["model_grader_server_error_details"])
        out = self.run_grader(score_grader(), "BADUSAGE", {"answer": "BADUSAGE"})
        self.assertEqual((out["reward"], self.flags(out)), (1.0, []), out)
        self.assertEqual(out["metadata"]["token_usage"], 0, out)
        # a template naming what the item lacks: no request, invalid_variable_error
        self.reset()
        out = self.run_grader(score_grader(), "x", {"other": 1})
        self.assertEqual(self.flags(out), ["invalid_variable_error"], out)
        self.assertEqual(self.standin_requests(), [])

    def test_label_model(self):
        out = self.run_grader(label_grader(), "7", {"answer": "7"})
        self.assertEqual((out["reward"], out["metadata"]["type"]), (1.0, "label_model"), out)
        out = self.run_grader(label_grader(), "8", {"answer": "7"})
        self.assertEqual(out["reward"], 0, out)
        self.reset()
        out = self.run_grader(label_grader(), "BADLABEL", {"answer": "7"})
        self.assertEqual((out["reward"], self.flags(out)), (0, ["model_grader_parse_error"]), out)
        schema = self.standin_requests()[0]["body"]["response_format"]["json_schema"]
        self.assertEqual(schema["name"], "label_model_result")
        self.assertEqual(schema["schema"]["properties"]["label"],
                         {"type": "string", "enum": ["correct", "wrong"]})
        multi = {"type": "multi", "name": "m", "calculate_output": "0.5 * s + 0.5 * l",
                 "graders": {"s": score_grader(), "l": label_grader()}}
        out = self.run_grader(multi, "9", {"answer": "9"})
        self.assertEqual(out["reward"], 1.0, out)
        out = self.run_grader(multi, "8", {"answer": "9"})
        self.assertAlmostEqual(out["reward"], 0.1, out)
        self.assertAlmostEqual(out["sub_rewards"]["s"], 0.2)
        self.assertEqual(out["sub_rewards"]["l"], 0)
        r = self.d.post_json("/v1/fine_tuning/alpha/graders/validate", {"grader": multi})
        self.assertEqual(self.assertJson(r, 200)["grader"], multi)

    def test_refusals(self):
        self.refused(score_grader("gpt-4o"), "grader.model",
                     "'gpt-4o' is not one of the server's judge_models (judge, strict, slow, self)")
        self.refused(label_grader(passing_labels=["correct", "maybe"]),
                     "grader.passing_labels[1]", "'maybe' is not one of labels")
        self.refused(label_grader(passing_labels=[]), "grader.passing_labels", "non-empty")
        self.refused(score_grader(range=[1, 0]), "grader.range", "min < max")
        self.refused(score_grader(sampling_params={"temperature": 9}),
                     "grader.sampling_params.temperature", "[0, 2]")
        self.refused(score_grader(input=[{"role": "user", "content": "{{foo}}"}]),
                     "grader.input[0].content", "variables start with item. or sample.")
        self.refused(score_grader(input=[{"role": "user", "content": {
            "type": "input_image", "image_url": "x"}}]), "grader.input[0].content.type",
            "text only")
        multi = {"type": "multi", "name": "m", "calculate_output": "a",
                 "graders": {"a": score_grader("nope")}}
        self.refused(multi, "grader.graders.a.model", "'nope' is not one of")

    def rft_body(self, grader, **hp):
        lines = [{"messages": [{"role": "user", "content": "digit %d?" % k}],
                  "answer": str(k % 10)} for k in range(8)]
        fid = self.upload(("\n".join(json.dumps(x) for x in lines) + "\n").encode())["id"]
        return {"model": "tiny", "training_file": fid, "seed": 3,
                "method": {"type": "reinforcement", "reinforcement": {
                    "grader": grader,
                    "hyperparameters": dict({"total_steps": 2, "group_size": 4,
                                             "prompt_batch_size": 4, "max_new_tokens": 3,
                                             "dynamic_sampling": False}, **hp)}}}

    def test_rft_judge_errors(self):
        failing = score_grader("strict", input=[{"role": "user", "content": "FAIL {{item.answer}}"}])
        job = self.assertJson(self.d.post_json("/v1/fine_tuning/jobs", self.rft_body(failing)), 200)
        done = self.wait_status(job["id"], ("succeeded", "failed"))
        self.assertEqual(done["status"], "failed", done)
        self.assertIn("judge model 'strict': HTTP 500 after 1 attempt", done["error"]["message"])
        body = self.rft_body(failing, on_judge_error="drop")
        job = self.assertJson(self.d.post_json("/v1/fine_tuning/jobs", body), 200)
        done = self.wait_status(job["id"], ("succeeded", "failed"))
        self.assertEqual(done["status"], "succeeded", done)

    def test_rft_job(self):
        paused = [dict(INPUT[0], content="PAUSE " + INPUT[0]["content"]), INPUT[1]]
        grader = score_grader(input=paused)
        body = self.rft_body(grader)
        bad = json.loads(json.dumps(body))
        bad["method"]["reinforcement"]["grader"]["model"] = "gpt-4o"
        r = self.d.post_json("/v1/fine_tuning/jobs", bad)
        self.assertEqual(r.status, 400, r)
        self.assertEqual(r.json()["error"]["param"], "method.reinforcement.grader.model", r)
        self.reset()
        job = self.assertJson(self.d.post_json("/v1/fine_tuning/jobs", body), 200)
        done = self.wait_status(job["id"], ("succeeded", "failed"))
        self.assertEqual(done["status"], "succeeded", done)
        n = high = 0
        for step in (1, 2):
            r = self.d.get("/v1/jobs/%s/rollouts?step=%d" % (job["id"], step))
            for row in (json.loads(x) for x in r.body.decode().splitlines() if x.strip()):
                text = "Answer: %s\nReference: %s" % (row["response"], row["answer"])
                same = (judge_model_server.field(text, "Answer") ==
                        judge_model_server.field(text, "Reference"))
                self.assertAlmostEqual(row["reward_raw"], 1.0 if same else 0.2, msg=row)
                # the judge model's tokens for the sample, in the rollout's judge info
                words = len(("PAUSE Grade the answer.\n" + text).split())
                self.assertEqual(row["info"]["token_usage"],
                                 {"standin-judge": {"prompt_tokens": words,
                                                    "completion_tokens": 5}}, row)
                n += 1
                high += same
        self.assertEqual(n, 2 * 4 * 4)
        self.assertGreaterEqual(len(self.standin_requests()), n)
        in_flight = harness_get(self.port, "/stats")["max_in_flight"]
        self.assertEqual(in_flight, 4)  # the judge model's concurrency
        print("rft job: %d rollouts graded by the stand-in, %d scored 1.0, %d requests at once" %
              (n, high, in_flight), file=sys.stderr)


    # ---- a judge model dapod serves itself ----

    def replay(self, messages, seed, max_tokens):
        """What the served judge answers, asked on the chat route: the score a score_model grader
        takes from it (its result clamped to [0, 1], 0 when it is no complete JSON) and its
        tokens."""
        r = self.assertJson(self.d.post_json("/v1/chat/completions", {
            "model": "tiny", "messages": messages, "seed": seed, "temperature": 1,
            "max_completion_tokens": max_tokens, "response_format": SCORE_FORMAT}), 200)
        ch, u = r["choices"][0], r["usage"]
        if ch["finish_reason"] != "stop":
            return 0.0, u["total_tokens"], True
        result = json.loads(ch["message"]["content"])["result"]
        return min(1.0, max(0.0, result)), u["total_tokens"], False

    def test_served_judge_model(self):
        """judge_models.self serves the tiny preset: its grades are what the chat route answers to
        the same request (structured outputs under the strict schema), clamped to the range."""
        complete = 0
        for seed in range(1, 9):
            g = score_grader("self", input=[INPUT[1]],
                             sampling_params={"seed": seed, "temperature": 1,
                                              "max_completions_tokens": 200})
            out = self.run_grader(g, "5", {"answer": "5"})
            want, tokens, parse_error = self.replay(
                [{"role": "user", "content": "Answer: 5\nReference: 5"}], seed, 200)
            self.assertEqual(out["reward"], want, (seed, out))
            self.assertEqual(out["metadata"]["errors"]["model_grader_parse_error"], parse_error)
            self.assertEqual(out["metadata"]["token_usage"], tokens, out)
            self.assertEqual(out["metadata"]["sampled_model_name"], "tiny")
            complete += not parse_error
        self.assertGreaterEqual(complete, 2)  # some answers are whole JSON within 200 tokens
        # a job graded by it: every rollout's reward is the served judge's for its response
        grader = score_grader("self", input=[INPUT[1]],
                              sampling_params={"seed": 3, "temperature": 1,
                                               "max_completions_tokens": 120})
        job = self.assertJson(self.d.post_json("/v1/fine_tuning/jobs", self.rft_body(grader)), 200)
        done = self.wait_status(job["id"], ("succeeded", "failed"))
        self.assertEqual(done["status"], "succeeded", done)
        rows = self.rollouts(job["id"], 2)
        self.assertEqual(len(rows), 2 * 4 * 4)
        for row in rows[:6]:
            msg = "Answer: %s\nReference: %s" % (row["response"], row["answer"])
            want, tokens, _ = self.replay([{"role": "user", "content": msg}], 3, 120)
            self.assertEqual(row["reward_raw"], want, row)
            self.assertEqual(sum(row["info"]["token_usage"]["tiny"].values()), tokens, row)

    # ---- the native model judges of /v1/jobs ----

    def native_body(self, judge, **hp):
        lines = [{"prompt": "digit %d?" % k, "answer": str(k % 10)} for k in range(8)]
        fid = self.upload(("\n".join(json.dumps(x) for x in lines) + "\n").encode())["id"]
        return {"model": "tiny", "training_file": fid, "seed": 5, "judge": judge,
                "hyperparameters": dict({"total_steps": 2, "group_size": 4, "prompt_batch_size": 3,
                                         "max_new_tokens": 3, "dynamic_sampling": False}, **hp)}

    def rollouts(self, job_id, steps):
        rows = []
        for step in range(1, steps + 1):
            r = self.d.get("/v1/jobs/%s/rollouts?step=%d" % (job_id, step))
            rows += [json.loads(x) for x in r.body.decode().splitlines() if x.strip()]
        return rows

    def native_job(self, judge, steps=2):
        """Runs a native job judged by judge to success; its rollouts of every step."""
        job = self.assertJson(self.d.post_json("/v1/jobs", self.native_body(judge,
                                                                            total_steps=steps)),
                              201)
        done = self.wait_status(job["id"], ("succeeded", "failed"))
        self.assertEqual(done["status"], "succeeded", done)
        rows = self.rollouts(job["id"], steps)
        self.assertEqual(len(rows), steps * 3 * 4)
        return job, rows

    def test_native_model_judge(self):
        judge = {"type": "model", "judge_model": "judge", "system": "Grade the answer.",
                 "prompt": "Question: {{item.prompt}}\nAnswer: {{sample.output_text}}\n"
                           "Reference: {{item.answer}}",
                 "scale": [0, 1], "sampling_params": {"temperature": 0}}
        self.reset()
        job, rows = self.native_job(judge)
        for row in rows:
            same = row["response"] == row["answer"]
            self.assertAlmostEqual(row["reward_raw"], 1.0 if same else 0.2, msg=row)
            self.assertEqual(row["info"]["errors"], {}, row)
        reqs = self.standin_requests()
        self.assertEqual(len(reqs), len(rows))  # one call per sample
        msgs = reqs[0]["body"]["messages"]
        self.assertEqual(msgs[0], {"role": "system", "content": "Grade the answer."})
        self.assertTrue(msgs[1]["content"].startswith("Question: digit "), msgs)
        self.assertEqual(reqs[0]["body"]["temperature"], 0)
        self.assertEqual(reqs[0]["body"]["response_format"]["json_schema"]["name"],
                         "score_model_result")
        # the step metrics count OpenAI's grader errors for a model judge too
        steps = self.assertJson(self.d.get("/v1/jobs/%s/metrics" % job["id"]), 200)
        self.assertEqual(len(steps), 2)
        for m in steps:
            self.assertEqual(m["judge/errors/model_grader_parse_error"], 0, m)
            # and the tokens the judge model spent in the step: the sums of its rollouts' usage
            mine = [r["info"]["token_usage"]["standin-judge"] for r in rows if r["step"] == m["step"]]
            self.assertEqual(len(mine), 12)
            for w in ("prompt", "completion"):
                self.assertEqual(m["judge/tokens/standin-judge/" + w],
                                 sum(u[w + "_tokens"] for u in mine), m)

    def test_native_model_rank_judge(self):
        judge = {"type": "model_rank", "judge_model": "judge",
                 "prompt": "Rank the answers to {{item.prompt}}\nReference: {{item.answer}}\n"
                           "{{sample.responses}}",
                 "scale": [0, 1]}
        self.reset()
        # HASH: the stand-in scores each response by its text, so a score given to the wrong
        # response of its group shows
        _, rows = self.native_job(dict(judge, prompt="HASH " + judge["prompt"]))
        for row in rows:
            want = judge_model_server.rank_score(row["response"].rstrip("\n"), None, True)
            self.assertAlmostEqual(row["reward_raw"], want, msg=row)
        self.assertGreater(len(set(row["reward_raw"] for row in rows)), 2)
        reqs = self.standin_requests()
        self.assertEqual(len(reqs), 2 * 3)  # one call per group
        for q in reqs:
            fmt = q["body"]["response_format"]["json_schema"]
            self.assertEqual((fmt["name"], fmt["strict"]), ("model_rank_result", True))
            self.assertEqual(fmt["schema"]["properties"]["scores"]["minItems"], 4)
            self.assertEqual(len(judge_model_server.responses(q["body"]["messages"][0]["content"])), 4)
        # a group whose call fails: every sample of it scores 0 with the error counted
        for marker, err in (("SHORT", "model_grader_parse_error"),
                            ("NONUMBER", "model_grader_parse_error")):
            _, rows = self.native_job(dict(judge, prompt=marker + " " + judge["prompt"]), 1)
            for row in rows:
                self.assertEqual(row["reward_raw"], 0, row)
                self.assertEqual(row["info"]["errors"], {err: 1}, row)
        _, rows = self.native_job(dict(judge, prompt="CLAMP " + judge["prompt"], scale=[0, 2]), 1)
        firsts = [row["reward_raw"] for row in rows if row["reward_raw"] == 2]
        self.assertEqual(len(firsts), 3, "the first response of each group clamped to 2")

    def test_native_judges_teach(self):
        """A job rewarded by a judge model learns: the tiny preset learns to repeat the last digit
        of its prompt, scored 1.0 / 0.2 by the stand-in (model: one call a sample; model_rank:
        one call a group), greedy accuracy on the 100 prompts from <= 0.2 at step 0 to >= 0.7 at
        step 40."""
        lines = [{"prompt": "%d%d" % (a, b), "answer": str(b)} for a in range(10) for b in range(10)]
        fid = self.upload(("".join(json.dumps(x) + "\n" for x in lines)).encode())["id"]
        judges = [{"type": "model", "judge_model": "judge",
                   "prompt": "Answer: {{sample.output_text}}\nReference: {{item.answer}}"},
                  {"type": "model_rank", "judge_model": "judge",
                   "prompt": "Reference: {{item.answer}}\n{{sample.responses}}"}]
        for judge in judges:
            body = {"model": "tiny", "training_file": fid, "validation_file": fid, "seed": 1,
                    "judge": judge,
                    "hyperparameters": {"total_steps": 40, "group_size": 16, "prompt_batch_size": 8,
                                        "max_new_tokens": 1, "learning_rate": 3e-3,
                                        "eval_every": 10, "dynamic_sampling": False}}
            job = self.assertJson(self.d.post_json("/v1/jobs", body), 201)
            done = self.wait_status(job["id"], ("succeeded", "failed"))
            self.assertEqual(done["status"], "succeeded", done)
            rows = self.assertJson(self.d.get("/v1/jobs/%s/metrics" % job["id"]), 200)
            curve = [(m["step"], m["eval/accuracy"]) for m in rows if "eval/accuracy" in m]
            raw = [round(m["reward/raw_mean"], 3) for m in rows if "reward/raw_mean" in m]
            print("%s judge: eval accuracy %s; train raw reward %s" %
                  (judge["type"], curve, raw[::5] + raw[-1:]), file=sys.stderr)
            self.assertEqual([s for s, _ in curve], [0, 10, 20, 30, 40])
            self.assertLessEqual(curve[0][1], 0.2)
            self.assertGreaterEqual(curve[-1][1], 0.7)

    def test_native_refusals(self):
        ok = {"type": "model", "judge_model": "judge", "prompt": "A: {{sample.output_text}}"}
        cases = [(dict(ok, judge_model="gpt-4o"), "judge.judge_model",
                  "'gpt-4o' is not one of the server's judge_models (judge, strict, slow, self)"),
                 (dict(ok, prompt=""), "judge.prompt", "required"),
                 (dict(ok, prompt="{{sample.responses}}"), "judge.prompt",
                  "{{sample.responses}} is a model_rank judge's"),
                 (dict(ok, type="model_rank"), "judge.prompt", "a model_rank judge sees"),
                 (dict(ok, type="model_rank", prompt="{{item.answer}}"), "judge.prompt",
                  "with {{sample.responses}}"),
                 (dict(ok, scale=[1, 0]), "judge.scale", "expected [min, max]"),
                 (dict(ok, prompt="{{oops.x}}"), "judge.prompt", "variables start with item. or sample."),
                 (dict(ok, sampling_params={"temperature": 5}),
                  "judge.sampling_params.temperature", "[0, 2]"),
                 (dict(ok, extra=1), "judge.extra", "unknown field")]
        for judge, field, has in cases:
            r = self.d.post_json("/v1/jobs", self.native_body(judge))
            p = self.assertProblem(r, 422, "validation_failed")
            self.assertEqual(len(p["errors"]), 1, p)
            self.assertEqual(p["errors"][0]["field"], field, p)
            self.assertIn(has, p["errors"][0]["message"], p)

    def test_train_command(self):
        """dapod train --server-config: a job run from the command line names the judge models of
        a daemon config file; its rewards are the stand-in's verdicts, as in the daemon."""
        tmp = tempfile.mkdtemp(prefix="dapod-jm-train-")
        self.addCleanup(shutil.rmtree, tmp, True)
        lines = [{"prompt": "digit %d?" % k, "answer": str(k % 10)} for k in range(8)]
        with open(os.path.join(tmp, "train.jsonl"), "w") as f:
            f.write("".join(json.dumps(x) + "\n" for x in lines))
        judge = {"type": "model", "judge_model": "judge", "system": "Grade the answer.",
                 "prompt": "Answer: {{sample.output_text}}\nReference: {{item.answer}}",
                 "scale": [0, 1]}
        job = {"model": "tiny", "training_file": "train.jsonl", "seed": 5, "judge": judge,
               "hyperparameters": {"total_steps": 1, "group_size": 4, "prompt_batch_size": 3,
                                   "max_new_tokens": 3, "dynamic_sampling": False}}
        with open(os.path.join(tmp, "job.json"), "w") as f:
            json.dump(job, f)
        url = "http://127.0.0.1:%d/v1" % self.port
        config = {"judge_models": {"judge": {"url": url, "model": "standin-judge"},
                                   "self": {"serve": "tiny"}},
                  "workers": 1}  # a daemon's other keys are read and unused
        with open(os.path.join(tmp, "server.json"), "w") as f:
            json.dump(config, f)

        def train(out, *extra):
            return subprocess.run([test_jobs.DAPOD, "train", "--config",
                                   os.path.join(tmp, "job.json"), "--out",
                                   os.path.join(tmp, out), "--threads", "1"] + list(extra),
                                  capture_output=True, text=True, timeout=120)

        # without the daemon's config there are no judge models: refused by field
        p = train("none")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("judge.judge_model", p.stderr)
        self.assertIn("none configured", p.stderr)
        self.reset()
        p = train("out", "--server-config", os.path.join(tmp, "server.json"))
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(tmp, "out", "rollouts", "step-1.jsonl")) as f:
            rows = [json.loads(x) for x in f if x.strip()]
        self.assertEqual(len(rows), 12)
        for row in rows:
            same = row["response"] == row["answer"]
            self.assertAlmostEqual(row["reward_raw"], 1.0 if same else 0.2, msg=row)
        self.assertEqual(len(self.standin_requests()), 12)  # one call per sample
        # a model the daemon serves itself: no completion service in dapod train
        job["judge"]["judge_model"] = "self"
        with open(os.path.join(tmp, "job.json"), "w") as f:
            json.dump(job, f)
        p = train("self", "--server-config", os.path.join(tmp, "server.json"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("judge_models.self.serve: no completion service here", p.stderr)
        # the config file is checked as the daemon checks it, naming the file and the key
        with open(os.path.join(tmp, "bad.json"), "w") as f:
            json.dump({"judge_models": {"j": {"url": "http://example.com/v1", "model": "m"}}}, f)
        p = train("bad", "--server-config", os.path.join(tmp, "bad.json"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("bad.json", p.stderr)
        self.assertIn("judge_models.j.url: host 'example.com' is not in the judge host "
                      "allowlist", p.stderr)


class StartChecks(test_jobs.unittest.TestCase):
    """judge_models is checked at start, its errors naming the key; the key is never printed."""

    def start(self, models, *extra):
        return subprocess.run([test_jobs.DAPOD, "--judge-models", json.dumps(models)] +
                              list(extra) + ["--print-config"], capture_output=True, text=True,
                              timeout=60)

    def test_served_model_checked_at_start(self):
        """A served judge model that names no model stops the daemon at start, naming it."""
        tmp = tempfile.mkdtemp(prefix="dapod-jm-")
        self.addCleanup(shutil.rmtree, tmp, True)
        p = subprocess.run([test_jobs.DAPOD, "--listen", "127.0.0.1:0", "--data-dir",
                            os.path.join(tmp, "var"), "--models-dir", os.path.join(tmp, "models"),
                            "--judge-models", json.dumps({"j": {"serve": "nope"}})],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("judge_models.j.serve: no such model: 'nope'", p.stderr)

    def test_checks(self):
        tmp = tempfile.mkdtemp(prefix="dapod-jm-")
        self.addCleanup(shutil.rmtree, tmp, True)
        key = os.path.join(tmp, "key")
        with open(key, "w") as f:
            f.write(KEY + "\n")
        ok = {"url": "http://127.0.0.1:9/v1", "model": "m"}
        cases = [({"url": "http://example.com/v1", "model": "m"},
                  "judge_models.j.url: host 'example.com' is not in the judge host allowlist"),
                 (dict(ok, api_key_file=os.path.join(tmp, "none")),
                  "judge_models.j.api_key_file: cannot read"),
                 ({"serve": "tiny", "url": ok["url"]},
                  "judge_models.j.url: not a field of a served judge model"),
                 ({"serve": ""}, "judge_models.j.serve: expected a preset"),
                 ({"url": ok["url"]}, "judge_models.j.model: required"),
                 (dict(ok, concurrency=0), "judge_models.j.concurrency: expected an integer"),
                 (dict(ok, key="x"), "judge_models.j.key: unknown field"),
                 (dict(ok, url="ftp://127.0.0.1/v1"), "judge_models.j.url: scheme 'ftp'")]
        for spec, has in cases:
            p = self.start({"j": spec})
            self.assertNotEqual(p.returncode, 0, (spec, p.stdout))
            self.assertIn(has, p.stderr, spec)
        p = self.start({"j": dict(ok, api_key_file=key)})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(key, p.stdout)
        self.assertNotIn(KEY, p.stdout + p.stderr)
        # an allowed host name is fine under the host policy of judge_allowed_hosts
        p = self.start({"j": dict(ok, url="http://judge.internal:8000/v1")},
                       "--judge-allowed-hosts", "judge.internal")
        self.assertEqual(p.returncode, 0, p.stderr)


def harness_get(port, path):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    out = json.loads(c.getresponse().read())
    c.close()
    return out


def harness_post(port, path):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
    c.getresponse().read()
    c.close()


if __name__ == "__main__":
    sys.exit(test_jobs.main())
