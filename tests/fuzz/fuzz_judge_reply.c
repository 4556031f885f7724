/* libFuzzer target: the http judge's reply parser (judge_http_parse_reply). The first byte picks
 * the wire format and the number of items in the request (1..8, ids "0".."7"); the rest is the
 * reply body. A reply judged fine has a finite reward within +-1e6 for every item; every other
 * outcome carries a message. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fuzz.h"
#include "judge_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static const char *const ids[] = {"0", "1", "2", "3", "4", "5", "6", "7"};
  int openrlhf = data[0] & 1;
  int n = 1 + ((data[0] >> 1) & 7);
  double rewards[8];
  char what[800];
  int rc = judge_http_parse_reply((const char *)data + 1, size - 1, openrlhf, ids, n, rewards, what,
                                  sizeof what);
  FUZZ_CHECK(rc >= 0 && rc <= 3);
  if (rc == 0) {
    FUZZ_CHECK(what[0] == '\0');
    for (int i = 0; i < n; i++) FUZZ_CHECK(isfinite(rewards[i]) && fabs(rewards[i]) <= 1e6);
  } else {
    FUZZ_CHECK(what[0] != '\0' && strlen(what) < sizeof what);
  }
  return 0;
}
