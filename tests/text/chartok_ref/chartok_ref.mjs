// Replays cases.json (written by tests/chartok_dump) through the reference Hugging Face
// `tokenizers` library (Rust, via @anush008/tokenizers) loading our tokenizer.json files:
// ids must match chartok_encode, and decode (with and without skip_special_tokens) must match
// chartok_decode. Exits 1 on any mismatch. Usage: node chartok_ref.mjs DIR
import fs from "node:fs";
import path from "node:path";
import tk from "@anush008/tokenizers";

const { Tokenizer } = tk;
const dir = process.argv[2];
const cases = JSON.parse(fs.readFileSync(path.join(dir, "cases.json"), "utf8"));
const tokenizers = new Map();
let failures = 0, checks = 0;

function same(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function fail(c, what, got, want) {
  failures++;
  if (failures <= 20)
    console.error(`MISMATCH ${c.tokenizer} ${what} for ${JSON.stringify(c.text)}:\n  reference ` +
                  `${JSON.stringify(got)}\n  chartok   ${JSON.stringify(want)}`);
}

for (const c of cases) {
  if (!tokenizers.has(c.tokenizer)) {
    // fromFile throws if the file is not a valid tokenizer.json.
    tokenizers.set(c.tokenizer, Tokenizer.fromFile(path.join(dir, c.tokenizer)));
  }
  const t = tokenizers.get(c.tokenizer);
  const enc = await t.encode(c.text, null, { addSpecialTokens: true });
  const ids = Array.from(enc.getIds());
  checks++;
  if (!same(ids, c.ids)) fail(c, "ids", ids, c.ids);
  const dec = await t.decode(c.ids, false);
  checks++;
  if (dec !== c.decoded) fail(c, "decode", dec, c.decoded);
  const decSkip = await t.decode(c.ids, true);
  checks++;
  if (decSkip !== c.decoded_skip) fail(c, "decode(skip_special_tokens)", decSkip, c.decoded_skip);
}

// The vocabulary the reference sees is ours, id for id.
for (const [file, t] of tokenizers) {
  const doc = JSON.parse(fs.readFileSync(path.join(dir, file), "utf8"));
  const vocab = t.getVocab(true);
  checks++;
  const want = doc.model.vocab;
  const ok = Object.keys(want).length === Object.keys(vocab).length &&
             Object.entries(want).every(([k, v]) => vocab[k] === v);
  if (!ok) {
    failures++;
    console.error(`MISMATCH ${file}: vocabulary differs`);
  }
}

console.error(`chartok_ref: ${cases.length} cases, ${checks} checks over ${tokenizers.size} ` +
              `tokenizer.json files, ${failures} failed`);
process.exit(failures ? 1 : 0);
