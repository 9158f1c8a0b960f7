/* telemetry.h — host facts and protocol output.
 * Owns: the one-write-per-line writer for stdout, HWINFO (cores, RAM, CPU name),
 * RSS, hex encoding, and FNV-1a ids. */
#ifndef COLI_TELEMETRY_H
#define COLI_TELEMETRY_H
#include <stddef.h>
#include <stdint.h>

/* Formats one protocol line (the trailing \n is added) and writes it with a single write(2). */
void out_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "DATA <id> <n>\n<bytes>\n" in one write. */
void out_data(uint64_t id, const char *bytes, int n);
/* Writes a line that is already formatted (without \n); one write. */
void out_raw_line(const char *s, size_t len);
/* 1 once a write to stdout failed with EPIPE: nobody reads the replies any more. */
int out_closed(void);

void hw_line(char *buf, size_t cap);        /* "HWINFO <cores> <tot> <avail> 0 0.0 <cpu>|" */
double rss_peak_gb(void);
void hex_encode(const uint8_t *in, size_t n, char *out);  /* out: 2n+1 chars */
uint32_t fnv1a32(const char *s);
double now_s(void);                          /* monotonic seconds */
#endif
