#!/usr/bin/python3
"""The text_similarity grader's BLEU, GLEU and METEOR (core/reward/similarity.c) against the reference
implementation, Debian's python3-nltk, on sentence pairs (label unit). Exit 77 (skipped) only
when nltk is not installed (scripts/setup.sh installs it).

Both sides get the same words: the C code's tokenizer (rouge_score's: ASCII letters lower-cased,
a word is a maximal run of ASCII letters, digits and non-ASCII characters). nltk's METEOR runs
with exact matching only, as ours: an identity stemmer and a WordNet without synsets (Debian's
nltk ships no corpora). BLEU is nltk's sentence_bleu without smoothing (4-grams, uniform
weights), GLEU nltk's sentence_gleu (1- to 4-grams).

Usage: grader_nltk.py SIM_DUMP"""
import re
import subprocess
import sys
import warnings

try:
    from nltk.translate.bleu_score import sentence_bleu
    from nltk.translate.gleu_score import sentence_gleu
    from nltk.translate.meteor_score import meteor_score
except ImportError:
    print("grader_nltk: python3-nltk is not installed: skipped")
    sys.exit(77)

PAIRS = [  # (output, reference)
    ("the cat sat on the mat", "the cat sat on the mat"),
    ("the cat sat on the mat today", "the cat sat on the mat"),
    ("the cat is on the mat", "the cat sat on the mat"),
    ("on the mat the cat sat", "the cat sat on the mat"),
    ("a cat was sitting on a mat", "the cat sat on the mat"),
    ("It is a guide to action which ensures that the military always obeys the commands of the party",
     "It is a guide to action that ensures that the military will forever heed Party commands"),
    ("It is to insure the troops forever hearing the activity guidebook that party direct",
     "It is a guide to action that ensures that the military will forever heed Party commands"),
    ("he read the book because he was interested in world history",
     "he was interested in world history because he read the book"),
    ("The answer is 42.", "42"),
    ("42", "The answer is 42."),
    ("the the the the the the the", "the cat is on the mat"),
    ("Paris is the capital of France", "The capital of France is Paris"),
    ("completely unrelated words here", "nothing in common at all"),
    ("yes", "yes"),
    ("yes no", "no yes"),
    ("one two three four five six seven eight", "one two three four five six seven eight nine ten"),
    ("x1 y2 z3, x1 y2!", "X1 y2 z3 x1"),
    ("café au lait, s'il vous plaît", "un café au lait s'il vous plaît"),
    ("München ist eine Stadt in Bayern", "München ist die Hauptstadt von Bayern"),
    ("a b c d a b c d", "a b c d"),
    ("the quick brown fox jumps over the lazy dog", "a quick brown dog jumps over the lazy fox"),
]


def words(text):
    low = "".join(c.lower() if c.isascii() else c for c in text)
    return re.findall(r"[a-z0-9\u0080-\U0010ffff]+", low)


class NoWordNet:
    @staticmethod
    def synsets(_word):
        return []


class SameStem:
    @staticmethod
    def stem(word):
        return word


def reference(metric, out, ref):
    o, r = words(out), words(ref)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if metric == "bleu":
            return sentence_bleu([r], o)
        if metric == "gleu":
            return sentence_gleu([r], o)
        return meteor_score([r], o, preprocess=str, stemmer=SameStem, wordnet=NoWordNet)


def main():
    cases = [(m, o, r) for m in ("bleu", "gleu", "meteor") for o, r in PAIRS]
    text = "".join("%s\t%s\t%s\n" % c for c in cases)
    got = subprocess.run([sys.argv[1]], input=text.encode(), capture_output=True,
                         check=True).stdout.decode().split()
    assert len(got) == len(cases), got
    failures, worst = 0, 0.0
    for (m, o, r), g in zip(cases, got):
        want = reference(m, o, r)
        diff = abs(float(g) - want)
        worst = max(worst, diff)
        if diff > 1e-9 * max(1.0, abs(want)):
            failures += 1
            print("FAIL %s(%r, %r): dapod %s, nltk %r" % (m, o, r, g, want))
    print("grader_nltk: %d cases (%d pairs x bleu, gleu, meteor) against nltk, max |diff| %.2g, "
          "%d failures" % (len(cases), len(PAIRS), worst, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
