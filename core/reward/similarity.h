/* The text_similarity grader's metrics (OpenAI graders' evaluation_metric), each a score in
 * [0, 1] of an output against a reference, pure functions (thread-safe):
 *   fuzzy_match   rapidfuzz's fuzz.WRatio / 100 over Unicode code points, no preprocessing,
 *                 on the first 256 code points of each text (its alignments are quadratic and
 *                 their scratch space is fixed on the stack: bounded work per sample;
 *                 docs/OPENAI.md)
 *   bleu          sentence BLEU-4 as nltk's sentence_bleu (uniform weights, brevity penalty,
 *                 no smoothing: an order without a match contributes sys.float_info.min)
 *   gleu          sentence GLEU as nltk's sentence_gleu (1- to 4-grams)
 *   meteor        METEOR as nltk's meteor_score with exact matching only (alpha 0.9, beta 3,
 *                 gamma 0.5; no stemmer, no WordNet synonyms: Debian's nltk ships no corpora)
 *   rouge_1..5    ROUGE-N F-measure, rouge_l the LCS F-measure, as Google's rouge_score without
 *                 stemming
 * Words (every metric but fuzzy_match): ASCII letters are lower-cased, and a word is a maximal
 * run of letters, digits and non-ASCII characters; everything else separates words (the
 * tokenizer of rouge_score, also used for BLEU, GLEU and METEOR instead of nltk's punkt). */
#ifndef DAPO_SIMILARITY_H
#define DAPO_SIMILARITY_H

enum sim_metric {
  SIM_FUZZY_MATCH,
  SIM_BLEU,
  SIM_GLEU,
  SIM_METEOR,
  SIM_ROUGE_1,
  SIM_ROUGE_2,
  SIM_ROUGE_3,
  SIM_ROUGE_4,
  SIM_ROUGE_5,
  SIM_ROUGE_L,
  SIM_COUNT
};

#define SIM_MAX_BYTES 65536 /* longer texts are cut here before scoring (bounded work) */

/* The metric called name (OpenAI's spelling) or -1. */
int sim_metric_find(const char *name);
/* Its name, a static string. */
const char *sim_metric_name(enum sim_metric m);

/* The score of output against reference (NUL-terminated UTF-8; invalid bytes count as
 * characters) in [0, 1]; -1 when out of memory. */
double sim_score(enum sim_metric m, const char *output, const char *reference);

#endif
