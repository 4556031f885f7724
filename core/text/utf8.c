/* utf8.h over utf8proc's decoder (utf8proc_iterate): the same checks the hand-written decoders
 * of chartok, the judges and the dataset messages made, for every input of up to 4 bytes. */
#include "utf8.h"

#include <utf8proc.h>

size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
  if (n == 0) return 0;
  utf8proc_int32_t c;
  utf8proc_ssize_t r = utf8proc_iterate(s, n > 4 ? 4 : (utf8proc_ssize_t)n, &c);
  if (r <= 0) return 0;
  if (cp) *cp = (uint32_t)c;
  return (size_t)r;
}
