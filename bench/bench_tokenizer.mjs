// Tokenizer speed, ours vs the reference Hugging Face `tokenizers` (Rust, @anush008/tokenizers):
// writes a corpus of N strings from tests/text/bpe_ref/gen_corpus.mjs, runs bench_tokenizer (C) on it,
// encodes the same strings with the reference: encodeBatch on one thread (TOKENIZERS_PARALLELISM
// =false, which the library reads at each call), encodeBatch on its own thread pool, and one
// awaited encode() per string (the Node binding's per-call cost included); best of three each.
// Prints MB/s side by side with the ratios ours / reference.
// Usage: node bench_tokenizer.mjs BENCH_TOKENIZER WORKDIR N TOKENIZER.json...
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import os from "node:os";
import tk from "@anush008/tokenizers";
import { corpus } from "./gen_corpus.mjs";

const [bench, dir, nArg, ...files] = process.argv.slice(2);
const texts = corpus(Number(nArg)).map((s) => Buffer.from(s, "utf8").toString("utf8"));
const corpusFile = path.join(dir, "bench_corpus.json");
fs.writeFileSync(corpusFile, JSON.stringify(texts));
const bytes = texts.reduce((a, s) => a + Buffer.byteLength(s), 0);
const threads = os.availableParallelism ? os.availableParallelism() : os.cpus().length;
console.log(`corpus: ${texts.length} strings, ${(bytes / 1e6).toFixed(2)} MB; ${threads} threads for batch`);
console.log("MB/s             ours 1 thr  ref 1 thr  ratio | ours batch  ref batch  ratio | ref per call");
for (const file of files) {
  const ours = JSON.parse(execFileSync(bench, [file, corpusFile, String(threads)], { encoding: "utf8" }));
  const t = tk.Tokenizer.fromFile(file);
  let single = Infinity, batch = Infinity, percall = Infinity, ids = 0;
  for (let rep = 0; rep < 3; rep++) {
    process.env.TOKENIZERS_PARALLELISM = "false";
    let t0 = performance.now();
    const encs = await t.encodeBatch(texts, { addSpecialTokens: false });
    single = Math.min(single, (performance.now() - t0) / 1e3);
    ids = encs.reduce((a, e) => a + e.getIds().length, 0);
    process.env.TOKENIZERS_PARALLELISM = "true";
    t0 = performance.now();
    await t.encodeBatch(texts, { addSpecialTokens: false });
    batch = Math.min(batch, (performance.now() - t0) / 1e3);
    if (rep === 0) {
      t0 = performance.now();
      for (const s of texts) await t.encode(s, null, { addSpecialTokens: false });
      percall = (performance.now() - t0) / 1e3;
    }
  }
  const rs = bytes / single / 1e6, rb = bytes / batch / 1e6, rp = bytes / percall / 1e6;
  const name = path.basename(path.dirname(path.dirname(file))).replace("tokenizer-", "");
  console.log(`${name.padEnd(16)} ${ours.single_mbps.toFixed(2).padStart(11)} ${rs.toFixed(2).padStart(11)}` +
              ` ${(ours.single_mbps / rs).toFixed(2).padStart(6)} | ${ours.batch_mbps.toFixed(2).padStart(10)}` +
              ` ${rb.toFixed(2).padStart(10)} ${(ours.batch_mbps / rb).toFixed(2).padStart(6)} |` +
              ` ${rp.toFixed(2).padStart(12)}` +
              (ours.ids === ids ? "" : `  (ids differ: ${ours.ids} vs ${ids})`));
}
