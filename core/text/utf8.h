/* UTF-8 as the rest of dapod reads it: one character at a time, strictly, by utf8proc's rules (no
 * overlong forms, no surrogates, nothing past U+10FFFF, no character cut short). Byte-level BPE
 * repairs bytes as Rust's from_utf8_lossy does instead (bpe_utf8_next, bpe.h). */
#ifndef DAPO_UTF8_H
#define DAPO_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length (1 to 4) of the valid character at s[0..n), its code point in *cp (cp may be NULL);
 * 0 when the bytes there are not one, or n is 0. A NUL byte is a character of its own. */
size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp);

#endif
