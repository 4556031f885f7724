// Deterministic corpus for the BPE parity check (no data is committed, only this generator):
// hand-picked hard cases, then seeded random compositions of fragments from many scripts and
// kinds of text, then random code point soup. The strings are JS strings: lone surrogates stay in
// (the reference replaces them with U+FFFD; bpe_ref.mjs checks that and passes UTF-8 to C).
// Usage: import { corpus } from "./gen_corpus.mjs"; corpus(n) -> array of n strings.

function rng(seed) {
  // mulberry32
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const FIXED = [
  "", " ", "  ", "\n", "\t", "\r\n", "a", "hello world", "Hello World!", " leading space",
  "trailing space ", "  two leading", "multiple   spaces   inside", "tab\tseparated\tvalues",
  "line1\nline2\r\nline3\rline4", "\n\n\n\nfour newlines", "    indented\n        more\n",
  " \t \n \t\n  mixed whitespace \u00a0\u3000\u2028\u2029\u0085\u180e\u200b end",
  "I'm sure it's John's, they're here, we've won, I'll go, he'd say",
  "I'M SURE IT'S JOHN'S, THEY'RE HERE, WE'VE WON, I'LL GO, HE'D SAY", "It'S mIxEd'Re'Ll",
  "don\u2019t curly\u2019s", "'s 't 're 've 'm 'll 'd", "''s '''t", "ſ'ſ 'ſ 'K 'k \u212a",
  "1234567890", "3.14159265358979323846264338327950288419716939937510",
  "12,345,678.90 and 1e-10 and 0x1F and 1_000_000", "٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ ①②③ ¼½¾ Ⅻ",
  "The year 2024 had 366 days; 2025 has 365.",
  "x".repeat(300), "ab".repeat(200), "🙂".repeat(100), " ".repeat(257), "\n".repeat(100),
  "\t".repeat(50) + "x", "9".repeat(1000), "Supercalifragilisticexpialidocious".repeat(20),
  "a".repeat(5000), "-".repeat(2000), "=".repeat(80) + "\n" + "#".repeat(80),
  "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
  "<|endoftext|>", "text<|endoftext|>more<|endoftext|><|endoftext|>", "<|im_start", "im_start|>",
  "<|im_start|", "<<|im_start|>>", "< |im_start| >", "<|IM_START|>", "<|end_of_text|>x",
  "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>{\"a\":1}</tool_call>",
  "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|reserved_special_token_5|>",
  "<|begin_of_text|><|begin_of_text|>", " <|endoftext|> ", "\n<|im_end|>\n",
  "日本語のテキストです。東京は首都です。", "中文文本，包含标点符号！还有数字123。",
  "한국어 텍스트입니다. 안녕하세요!", "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
  "العربية نص من اليمين إلى اليسار، مع أرقام ١٢٣", "हिन्दी पाठ, देवनागरी लिपि में।",
  "עברית טקסט", "Русский текст с Ёё и цифрами 42.", "Ελληνικά κείμενα ΣΊΣΥΦΟΣ",
  "Tiếng Việt có dấu: Người, được, những", "ქართული ენა", "Հայերեն", "አማርኛ", "ᚠᛇᚻ᛫ᛒᛦᚦ",
  "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "🇺🇸🇬🇧🇯🇵🇩🇪", "👍🏽👍🏿👋🏻", "🧑‍💻 coder ❤️‍🔥", "😀😃😄😁😆",
  "\uac00\u11a7 \u1100\u1161\u11a7 \u1100\u1161\u11a8 \uac01\u11a7 \u11a7", "e\u0301 vs \u00e9", "n\u0303o vs \u00f1o", "A\u030a vs \u00c5 vs \u212b", "\u1100\u1161\u11a8 vs 각",
  "o\u0308\u0301 \u1e4f", "\u0301 leading combining", "a\u0300\u0301\u0302\u0303\u0304\u0305\u0306",
  "ﬁ ﬂ ﬃ Ｆｕｌｌｗｉｄｔｈ ｶﾀｶﾅ ㈱ ㎏ ™ ℌ ²³", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
  "lone \ud800 surrogate", "\udfff", "pair \ud83d\ude00 ok", "reversed \ude00\ud83d",
  "nul\u0000byte", "\u0001\u0002\u0003\u007f\u0080\u009f", "\ufeffBOM", "\uffff\ufffe\ufffd",
  "\u{10ffff}\u{e0001}\u{1f9ff}", "\u202eRTL override\u202c", "zero\u200bwidth\u200djoiner\u200c",
  "def main():\n    print(\"hello\")\n    return 0\n",
  "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
  "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![1, 2, 3];\n    Ok(())\n}",
  "const f = async (x) => { await g(x?.y ?? 0); };\nexport default f;",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
  "<div class=\"a\"><p>Hello &amp; welcome</p></div>", "func (s *Server) Run(ctx context.Context) error {\n\treturn nil\n}",
  "$$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$$",
  "\\begin{align} a^2 + b^2 &= c^2 \\\\ \\sum_{i=1}^{n} i &= \\frac{n(n+1)}{2} \\end{align}",
  "Let $f: \\mathbb{R} \\to \\mathbb{R}$, $\\forall \\epsilon > 0 \\exists \\delta$.",
  "∀x∈ℝ: x² ≥ 0 ∧ ∑ᵢ aᵢ ≤ ∞ ⇒ √2 ≈ 1.414", "http://example.com/path?q=1&r=2#frag",
  "user@example.com", "C:\\Windows\\System32\\drivers", "~/.config/app/settings.json",
  "JSON: {\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}", "!!!???...,,,;;;:::",
  "¡Hola! ¿Qué tal?", "«quotes» „German“ ‚single‘ 「Japanese」", "—–-‐‑‒―", "…‥",
  // SentencePiece-style files (Llama 2): special tokens in text, characters outside the
  // vocabulary (byte fallback / unk: emoji, rare CJK, control characters), spaces at the ends
  "<s>", "</s>", "<unk>", "<s>Hello</s>", "<s> leading space", " <s>x", "x<s>", "<s><s>",
  "hello<unk>world", "[UNK] and <UNK>", "<s>\u2581already\u2581metaspace", "\u2581", "\u2581\u2581 x",
  "\u{1f600}", "a\u{1f600}b", "\u{1f600}\u{1f600} \u{1f9ff}", "\u9f98\u9f49\u{20000}\u{2a6d6}\u3400",
  "\u0001\u0002 \u001f\u007f\u0085\u0000", "ok\u0007bell", "   three leading", "three trailing   ",
  "  both  ends  ", " ", "     ", "a  b   c    d", "\t lead tab", "end tab\t", "\u3000ideographic\u3000",
];

const POOLS = {
  english: ["the quick brown fox", "jumps over the lazy dog", "It's a truth universally acknowledged",
    "DON'T PANIC", "they'll've", "Rock'n'Roll", "O'Reilly's book", "naïve café résumé", "cooperate"],
  code: ["for (int i = 0; i < n; ++i) {", "    x += y[i] * z[i];", "}", "if __name__ == '__main__':",
    "import numpy as np", "return a && b || !c;", "std::vector<std::string> v;", "let mut x = 0u64;",
    "#define MAX(a, b) ((a) > (b) ? (a) : (b))", "console.log(`${a}+${b}`);", "SELECT * FROM t;",
    "x = [i**2 for i in range(10) if i % 2]", "    \treturn self._cache[key]", "@decorator\ndef f(): pass"],
  math: ["\\frac{a}{b}", "\\alpha + \\beta = \\gamma", "e^{i\\pi} + 1 = 0", "x_{n+1} = x_n - f(x_n)/f'(x_n)",
    "\\mathcal{O}(n \\log n)", "∫∮∑∏√∞≠≤≥±×÷", "2^{10} = 1024", "\\left( \\right)", "$x$"],
  cjk: ["我爱自然语言处理", "東京タワー", "ひらがなカタカナ", "한국어", "漢字かな交じり文", "繁體中文測試", "ｈａｌｆ"],
  rtl: ["مرحبا بالعالم", "السلام عليكم", "שלום עולם", "اردو زبان"],
  indic: ["नमस्ते दुनिया", "ক্ষমা", "தமிழ்", "తెలుగు", "ಕನ್ನಡ", "മലയാളം", "ਪੰਜਾਬੀ", "ગુજરાતી"],
  emoji: ["😀", "👨‍👩‍👧", "🏳️‍⚧️", "🇫🇷", "👍🏾", "❤️", "🤷‍♀️", "🧑🏽‍🚀", "©️", "1️⃣", "🫠",
    "\u{1f9ff}", "\u9f98", "\u{20b9f}", "\u0003"],
  specials: ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
    "<s>", "</s>", "<unk>", "[UNK]",
    "<|end_of_text|>", "<think>", "</think>", "<|im_start", "|>", "<|", "<|endoftext", "<tool_call>"],
  digits: ["0", "42", "007", "123456789012345678901234567890", "3.5", "-17", "1,000", "٣", "१२"],
  space: [" ", "  ", "\t", "\n", "\r\n", " \n ", "\n\n", "   \t  ", "\u00a0", "\u3000", "\u2009", "\u200b"],
  marks: ["e\u0301", "a\u0308", "o\u0302\u0323", "\u0915\u094d\u0937", "\u0301", "Å", "Å", "ḍ̇", "ḍ̇"],
  weird: ["\ud800", "\udc00", "\u0000", "\u001b[31m", "\ufffd", "\u{1d400}\u{1d401}", "\u{20000}", "ẞß", "İı"],
};
const POOL_NAMES = Object.keys(POOLS);
const SEPS = ["", " ", "  ", "\n", "\t", ", ", ". ", "\n\n", " \n", "'s ", "'T ", "   "];
const BLOCKS = [[0x20, 0x7e], [0xa0, 0x24f], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff],
  [0x590, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x1100, 0x11ff], [0x2000, 0x206f],
  [0x2100, 0x22ff], [0x3000, 0x30ff], [0x4e00, 0x4fff], [0xac00, 0xad00], [0xff00, 0xffef],
  [0x1f300, 0x1f6ff], [0x1f900, 0x1f9ff], [0x10000, 0x1007f], [0xd800, 0xdfff], [0x0, 0x1f]];

export function corpus(n) {
  const r = rng(20261129);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const out = FIXED.slice();
  while (out.length < Math.floor(n * 0.8)) {
    let s = "";
    const k = 1 + Math.floor(r() * 6);
    for (let i = 0; i < k; i++) s += pick(POOLS[pick(POOL_NAMES)]) + pick(SEPS);
    const m = r();
    if (m < 0.1) s = s.toUpperCase();
    else if (m < 0.2) s = s.normalize("NFD");
    else if (m < 0.25) s = s.normalize("NFKC");
    else if (m < 0.3) s = s.repeat(1 + Math.floor(r() * 20));
    else if (m < 0.35) s = " ".repeat(Math.floor(r() * 40)) + s + "\n".repeat(Math.floor(r() * 5));
    else if (m < 0.4) s = s.split("").reverse().join(""); // also splits surrogate pairs
    else if (m < 0.45) s = String(Math.floor(r() * 1e15)) + s + String(r()).slice(2);
    out.push(s);
  }
  while (out.length < n) {
    let s = "";
    const k = 1 + Math.floor(r() * 40);
    const [lo, hi] = pick(BLOCKS);
    for (let i = 0; i < k; i++) {
      const cp = r() < 0.7 ? lo + Math.floor(r() * (hi - lo + 1)) : pick(BLOCKS)[0];
      s += cp >= 0xd800 && cp <= 0xdfff ? String.fromCharCode(cp) : String.fromCodePoint(cp);
      if (r() < 0.15) s += pick(SEPS);
    }
    out.push(s);
  }
  return out;
}
