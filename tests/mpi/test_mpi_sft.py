#!/usr/bin/env python3
"""Data-parallel supervised and DPO jobs on MPI (issue 27; docs/SCALE.md).

The same supervised (or DPO) job is trained alone and under `mpirun -np N` for N = 1, 2, 3, and
the runs must agree (as test_mpi.py's DAPO jobs): every metric within METRIC_BOUND, or SLACK
times its difference in the one process packed otherwise where that is larger (grad_norm, of
float32 gradients: up to 1.4e-6 relative), validation included (each step's sums are over the
same examples or pairs, split over the ranks and summed in another order); the final weights within SLACK times the job's own float-order difference
(the one process with another micro-batch packing) or the floors; N = 1 under mpirun is the
one-process run bit for bit; a supervised job with a LoRA adapter too. A step's examples (pairs) split as 6 = 2 + 2 + 2 or 3 + 3, its last
as 4 = 1 + 1 + 2; the DPO validation's 2 pairs leave one of 3 ranks nothing to evaluate. A DPO
job paused under N = 2 resumes under N = 3 (reading the reference's log-probs the first run
wrote) and ends on the uninterrupted run's weights. Were a rank's gradient not summed with the
others', the ranks' weights would differ after step 1 and the job fail (checked once by hand).
"""
import json
import os
import shutil
import sys
import tempfile

import test_mpi
from test_mpi import SLACK, METRIC_BOUND, Runs

TEMPLATE = {"user": "U{content}|", "assistant": "A{content}|", "generation_prompt": "A",
            "stop": "|"}


def write_lines(path, lines):
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def sums(n, k=0):
    for i in range(n):
        a, b = (i * 7 + k) % 10, (i * 3 + 2 * k) % 10
        yield "%d+%d=" % (a, b), str(a + b), str((a + b + 1) % 19)


class MpiSupervised(Runs):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dapod-mpi-sft-")
        cls.runs = 0
        p = lambda name: os.path.join(cls.tmp, name)
        write_lines(p("sft.jsonl"), [{"prompt": q, "completion": a} for q, a, _ in sums(21)] +
                    [{"messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "yo"}]}])
        write_lines(p("sft-val.jsonl"), [{"prompt": q, "completion": a} for q, a, _ in sums(3, 1)])
        write_lines(p("dpo.jsonl"), [{"prompt": q, "chosen": a, "rejected": r}
                                     for q, a, r in sums(22)])
        write_lines(p("dpo-val.jsonl"), [{"prompt": q, "chosen": a, "rejected": r}
                                         for q, a, r in sums(2, 1)])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def job(self, method, adapter=None, **hp_over):
        # 22 lines, 6 a step: 4 steps an epoch (6, 6, 6, 4)
        hp = {"batch_size": 6, "epochs": 1, "learning_rate": 3e-3, "lr_schedule": "cosine",
              "micro_batch_tokens": 24, "checkpoint_every": 2, "eval_every": 2}
        if method == "dpo":
            # each pair alone (two pairs hold more than 16 tokens, their prompt once each): the
            # reference's pass, one process and every rank hold the same micro-batches, so step
            # 1's rewards are exactly 0 everywhere (the engine's bits of a sequence depend on the
            # rows packed beside it, and rewards/accuracy counts strict wins)
            hp.update(beta=0.5, label_smoothing=0.1, micro_batch_tokens=16)
        hp.update(hp_over)
        name = "sft" if method == "supervised" else method
        body = {"method": method, "model": "tiny", "seed": 3, "chat_template": TEMPLATE,
                "training_file": os.path.join(self.tmp, name + ".jsonl"),
                "validation_file": os.path.join(self.tmp, name + "-val.jsonl"),
                "hyperparameters": hp}
        if adapter:
            body["adapter"] = adapter
        type(self).runs += 1
        path = os.path.join(self.tmp, "job-%d.json" % self.runs)
        with open(path, "w") as f:
            json.dump(body, f)
        return path

    def check_ranks(self, method, packing, tag=None, adapter=None):
        tag = tag or method
        weights = "adapter_model.safetensors" if adapter else "model.safetensors"
        alone = self.out(tag + "-alone")
        m0, _ = self.train(self.job(method, adapter), alone)
        self.assertEqual([m["step"] for m in m0 if "learning_rate" in m], [1, 2, 3, 4])
        self.assertTrue(any("full_valid/loss" in m for m in m0), m0)
        if not adapter:
            self.assertGreater(self.moved(alone), 1e-4)
        other = self.out(tag + "-packing")
        mp, _ = self.train(self.job(method, adapter, micro_batch_tokens=packing), other)
        base, bounds = self.weight_diff(alone, other, 4, weights), self.float_order(m0, mp)
        worst = {}
        for n in (1, 2, 3):
            out = self.out("%s-np%d" % (tag, n))
            mn, err = self.train(self.job(method, adapter), out, n)
            if n > 1:
                self.assertIn("data-parallel over %d ranks" % n, err)
            self.assertSameMetrics(m0, mn, bounds)
            worst[n] = self.weight_diff(alone, out, 4, weights)
            if n == 1:
                self.assertEqual(worst[n], (0.0, 0.0),
                                 "mpirun -np 1 is the one-process run, bit for bit")
            self.assertClose(worst[n], base, "%s: N = %d" % (tag, n))
        print("%s: weights after 4 steps against one process: N=2 %.2e (norm) %.2e (element), "
              "N=3 %.2e %.2e; one process packed otherwise %.2e %.2e"
              % ((tag,) + worst[2] + worst[3] + base), file=sys.stderr)

    def float_order(self, ma, mb):
        """SLACK times the largest relative difference of each float metric between runs ma
        and mb of one process packed otherwise (the same sums in another order): the bound of
        a metric the ranks sum in another order (a step's grad_norm, of float32 gradients, moves
        by up to 1.4e-6 so; the rest stay within METRIC_BOUND)."""
        bounds = {}
        for x, y in zip(ma, mb):
            for k, v in x.items():
                if isinstance(v, float) and v:
                    d = SLACK * abs(v - y[k]) / abs(v)
                    bounds[k] = max(bounds.get(k, METRIC_BOUND), d)
        return bounds

    def test_supervised(self):
        self.check_ranks("supervised", 16)

    def test_supervised_lora(self):
        # the adapter's gradient is what the ranks sum
        self.check_ranks("supervised", 16, "supervised-lora",
                         {"type": "lora", "r": 4, "alpha": 8,
                          "target_modules": ["q_proj", "v_proj", "down_proj"]})

    def test_dpo(self):
        self.check_ranks("dpo", 48)

    def test_dpo_pause_under_2_resume_under_3(self):
        job = self.job("dpo", checkpoint_every=0)
        whole, split = self.out("dpo-whole"), self.out("dpo-split")
        m_whole, _ = self.train(job, whole)
        m1, err = self.train(job, split, 2, ["--stop-after-step", "2"], expect=3)
        self.assertIn("paused after step 2", err)
        self.assertEqual([m["step"] for m in m1 if "learning_rate" in m], [1, 2])
        m2, _ = self.train(job, split, 3)
        self.assertEqual([m["step"] for m in m2 if "learning_rate" in m], [3, 4])
        other = self.out("dpo-whole-packing")
        mp, _ = self.train(self.job("dpo", checkpoint_every=0, micro_batch_tokens=48), other)
        self.assertSameMetrics(m_whole, m1 + m2, self.float_order(m_whole, mp))
        self.assertClose(self.weight_diff(whole, split, 4), self.weight_diff(whole, other, 4),
                         "paused under 2, resumed under 3")


def main():
    return test_mpi.run_tests(test_mpi.setup())


if __name__ == "__main__":
    sys.exit(main())
