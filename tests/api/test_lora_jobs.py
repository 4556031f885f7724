#!/usr/bin/python3
"""LoRA jobs through the daemon (label api):
- a job with an `adapter` object shows the resolved adapter (PEFT's defaults filled in) and a
  memory plan whose trainable parameters are the adapter's;
- its checkpoints list PEFT's adapter files and base_model.json, no config.json or
  model.safetensors (the base is not copied); adapter_model.safetensors downloads with PEFT's
  tensor names and shapes ([r, in] for lora_A, [out, r] for lora_B) and adapter_config.json
  with PEFT's keys;
- GET /v1/models lists the checkpoint, and POST /v1/completions samples from it;
- a job on an adapter checkpoint continues its adapter (shown and planned with it, started from
  its weights, its checkpoints naming the real base); another adapter on it is refused by name;
- refusals name the field: r 0, r larger than a layer, an unknown layer, dropout, an unknown key.

Run: /usr/bin/python3 tests/api/test_lora_jobs.py --dapod build/server/dapod
"""

import argparse
import json
import os
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_jobs  # noqa: E402

ADAPTER = {"type": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def safetensors_header(blob):
    (n,) = struct.unpack("<Q", blob[:8])
    h = json.loads(blob[8:8 + n])
    h.pop("__metadata__", None)
    return h


class LoraJobs(test_jobs.DaemonCase):
    def test_lora_job_end_to_end(self):
        hp = dict(test_jobs.SMALL_HP, total_steps=2, checkpoint_every=1)
        j = self.create_ok(hp, adapter=ADAPTER)
        self.assertEqual(j["adapter"], {"type": "lora", "r": 4, "alpha": 8.0, "dropout": 0.0,
                                        "target_modules": ["q_proj", "v_proj", "down_proj"],
                                        "use_rslora": False})
        mem = j["memory"]
        self.assertLess(mem["trainable_parameters"], mem["parameters"] // 10)
        self.assertEqual(mem["gradients_bytes"], 4 * mem["trainable_parameters"])
        self.assertEqual(mem["optimizer_bytes"], 8 * mem["trainable_parameters"])
        j = self.wait_status(j["id"], ("succeeded", "failed"))
        self.assertEqual(j["status"], "succeeded", j)

        cks = self.assertJson(self.d.get("/v1/jobs/%s/checkpoints" % j["id"]), 200)["data"]
        ck = cks[-1]
        names = [f["name"] for f in ck["files"]]
        for n in ("adapter_config.json", "adapter_model.safetensors", "base_model.json",
                  "tokenizer.json", "trainer_state.json", "optimizer.safetensors"):
            self.assertIn(n, names)
        for n in ("config.json", "model.safetensors"):
            self.assertNotIn(n, names)

        def get(name):
            r = self.d.get("/v1/jobs/%s/checkpoints/%d/%s" % (j["id"], ck["step"], name))
            self.assertEqual(r.status, 200, r)
            return r.body

        ac = json.loads(get("adapter_config.json"))
        self.assertEqual((ac["peft_type"], ac["task_type"], ac["r"], ac["lora_alpha"]),
                         ("LORA", "CAUSAL_LM", 4, 8.0))
        self.assertEqual(ac["base_model_name_or_path"], "tiny")
        self.assertEqual(sorted(ac["target_modules"]), ["down_proj", "q_proj", "v_proj"])
        for k in ("lora_dropout", "bias", "fan_in_fan_out", "use_rslora", "use_dora",
                  "modules_to_save", "init_lora_weights", "inference_mode"):
            self.assertIn(k, ac)
        self.assertEqual(json.loads(get("base_model.json")), {"model": "tiny", "seed": 0})

        model = self.assertJson(self.d.get("/v1/models/tiny"), 200)["config"]
        C, L = model["hidden_size"], model["num_hidden_layers"]
        CQ = model["num_attention_heads"] * model["head_dim"]
        CKV = model["num_key_value_heads"] * model["head_dim"]
        FF = model["intermediate_size"]
        h = safetensors_header(get("adapter_model.safetensors"))
        want = {}
        for i in range(L):
            for mod, out, inp in (("self_attn.q_proj", CQ, C), ("self_attn.v_proj", CKV, C),
                                  ("mlp.down_proj", C, FF)):
                p = "base_model.model.model.layers.%d.%s" % (i, mod)
                want[p + ".lora_A.weight"] = [4, inp]
                want[p + ".lora_B.weight"] = [out, 4]
        self.assertEqual({k: v["shape"] for k, v in h.items()}, want)
        self.assertTrue(all(v["dtype"] == "F32" for v in h.values()))

        mid = "%s:step-%d" % (j["id"], ck["step"])
        m = self.assertJson(self.d.get("/v1/models/" + mid), 200)
        self.assertEqual((m["status"], m["weights"]), ("ready", "adapter_model.safetensors"), m)
        c = self.assertJson(self.d.post_json("/v1/completions", {
            "model": mid, "prompt": "1+2=", "max_tokens": 4, "seed": 1, "logprobs": True}), 200)
        self.assertEqual(len(c["choices"][0]["logprobs"]["token_ids"]),
                         len(c["choices"][0]["logprobs"]["token_logprobs"]))

        # a job on the adapter checkpoint continues its adapter: shown and planned with it,
        # started from its weights, and its checkpoints name the real base
        p = self.assertProblem(self.create(model=mid, adapter=dict(ADAPTER, r=8)), 422,
                               "validation_failed")
        self.assertFields(p, "adapter")
        self.assertIn("dapod merge", json.dumps(p))
        hp2 = dict(test_jobs.SMALL_HP, total_steps=1, checkpoint_every=1, learning_rate=0.0)
        c2 = self.create_ok(hp2, model=mid)
        self.assertEqual(c2["adapter"], j["adapter"])
        self.assertEqual(c2["memory"]["trainable_parameters"], mem["trainable_parameters"])
        self.assertEqual(c2["memory"]["total_bytes"], mem["total_bytes"])
        c3 = self.create_ok(hp2, model=mid, adapter=ADAPTER)  # the same adapter, given again
        self.assertEqual(c3["adapter"], j["adapter"])
        for c in (c2, c3):
            c = self.wait_status(c["id"], ("succeeded", "failed"))
            self.assertEqual(c["status"], "succeeded", c)
            ck2 = self.assertJson(self.d.get("/v1/jobs/%s/checkpoints" % c["id"]), 200)["data"]
            last = ck2[-1]["step"]

            def get2(name):
                r = self.d.get("/v1/jobs/%s/checkpoints/%d/%s" % (c["id"], last, name))
                self.assertEqual(r.status, 200, r)
                return r.body

            self.assertEqual(json.loads(get2("base_model.json")), {"model": "tiny", "seed": 0})
            # learning rate 0: the continued adapter is the source's, tensor for tensor
            a, b = get2("adapter_model.safetensors"), get("adapter_model.safetensors")
            ha, hb = safetensors_header(a), safetensors_header(b)
            self.assertEqual({k: v["shape"] for k, v in ha.items()},
                             {k: v["shape"] for k, v in hb.items()})
            oa, ob = 8 + struct.unpack("<Q", a[:8])[0], 8 + struct.unpack("<Q", b[:8])[0]
            for k in ha:
                x0, x1 = ha[k]["data_offsets"]
                y0, y1 = hb[k]["data_offsets"]
                self.assertEqual(a[oa + x0:oa + x1], b[ob + y0:ob + y1], k)

    def test_refusals_name_the_field(self):
        cases = [({"type": "lora", "r": 0}, "adapter.r"),
                 ({"type": "lora", "r": 4096}, "adapter.r"),  # larger than tiny's layers
                 ({"type": "lora", "target_modules": ["q_proj", "qkv"]},
                  "adapter.target_modules[1]"),
                 ({"type": "lora", "dropout": 0.1}, "adapter.dropout"),
                 ({"type": "lora", "rank": 4}, "adapter.rank"),
                 ({"r": 4}, "adapter.type")]
        for adapter, field in cases:
            p = self.assertProblem(self.create(adapter=adapter), 422, "validation_failed")
            self.assertFields(p, field)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dapod", required=True)
    args, rest = ap.parse_known_args()
    test_jobs.DAPOD = os.path.abspath(args.dapod)
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
