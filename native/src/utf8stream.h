/* utf8stream.h — streaming UTF-8 sanitizer for text sent to clients token by token.
 * Push raw bytes, get back the longest well-formed prefix; an incomplete sequence at the
 * end is held until the next push; ill-formed bytes become U+FFFD (EF BF BD), one per
 * maximal ill-formed subpart (the Unicode / WHATWG "substitution of maximal subparts"
 * practice, as Python's errors='replace' does). utf8s_flush emits a held tail as U+FFFD. */
#ifndef COLI_UTF8STREAM_H
#define COLI_UTF8STREAM_H

typedef struct {
    unsigned char held[4];
    int n_held;
} utf8s;

void utf8s_init(utf8s *s);
/* Returns bytes written to out; cap must be >= 3 * (n + 3) (worst case: every byte
 * replaced), otherwise -1 and nothing is consumed. */
int utf8s_push(utf8s *s, const char *in, int n, char *out, int cap);
/* End of stream: held bytes (if any) become one U+FFFD; returns bytes written (0 or 3),
 * -1 if cap < 3. The stream is ready for reuse. */
int utf8s_flush(utf8s *s, char *out, int cap);
#endif
