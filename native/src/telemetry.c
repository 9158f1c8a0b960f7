/* telemetry.c — protocol output (one write(2) per line) and host facts. */
#include "telemetry.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* Set once a write finds stdout's reader gone (EPIPE): the state of the process's stdout. */
static int stdout_gone;

int out_closed(void) { return stdout_gone; }

/* Write all of buf to stdout. A pipe write of this size is normally taken whole; the
 * loop only matters for partial writes of very long lines, and for EINTR. Errors are
 * dropped (there is nobody left to tell); EPIPE is remembered for out_closed. */
static void write_all(const char *buf, size_t len) {
    while (len > 0) {
        ssize_t w = write(STDOUT_FILENO, buf, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EPIPE) stdout_gone = 1;
            return;
        }
        buf += w;
        len -= (size_t)w;
    }
}

void out_raw_line(const char *s, size_t len) {
    char stackbuf[4096];
    char *buf = len + 1 <= sizeof stackbuf ? stackbuf : malloc(len + 1);
    if (!buf) return;
    memcpy(buf, s, len);
    buf[len] = '\n';
    write_all(buf, len + 1);
    if (buf != stackbuf) free(buf);
}

void out_line(const char *fmt, ...) {
    char stackbuf[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(stackbuf, sizeof stackbuf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof stackbuf - 1) {
        stackbuf[n] = '\n';
        write_all(stackbuf, (size_t)n + 1);
        return;
    }
    char *buf = malloc((size_t)n + 2);
    if (!buf) return;
    va_start(ap, fmt);
    vsnprintf(buf, (size_t)n + 1, fmt, ap);
    va_end(ap);
    buf[n] = '\n';
    write_all(buf, (size_t)n + 1);
    free(buf);
}

void out_data(uint64_t id, const char *bytes, int n) {
    if (n < 0) n = 0;
    char stackbuf[1024];
    size_t cap = (size_t)n + 64;
    char *buf = cap <= sizeof stackbuf ? stackbuf : malloc(cap);
    if (!buf) return;
    int h = snprintf(buf, 64, "DATA %llu %d\n", (unsigned long long)id, n);
    if (n) memcpy(buf + h, bytes, (size_t)n);
    buf[h + n] = '\n';
    write_all(buf, (size_t)h + (size_t)n + 1);
    if (buf != stackbuf) free(buf);
}

/* Value in kB of a /proc/meminfo key, or -1. */
static long meminfo_kb(const char *text, const char *key) {
    const char *p = strstr(text, key);
    if (!p) return -1;
    p += strlen(key);
    while (*p == ' ' || *p == ':' || *p == '\t') p++;
    return strtol(p, NULL, 10);
}

static void cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *p = strchr(line, ':');
        if (!p) continue;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        size_t n = strcspn(p, "\n");
        while (n > 0 && isspace((unsigned char)p[n - 1])) n--;
        if (n == 0) continue;
        if (n >= cap) n = cap - 1;
        memcpy(out, p, n);
        out[n] = 0;
        break;
    }
    fclose(f);
    /* The name sits before '|' on a one-line record: keep it free of both. */
    for (char *q = out; *q; q++)
        if (*q == '|' || (unsigned char)*q < 0x20) *q = ' ';
}

void hw_line(char *buf, size_t cap) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    double tot = 0, avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char text[8192];
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        fclose(f);
        long t = meminfo_kb(text, "MemTotal"), a = meminfo_kb(text, "MemAvailable");
        if (t > 0) tot = t / (1024.0 * 1024.0);
        if (a > 0) avail = a / (1024.0 * 1024.0);
    }
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    snprintf(buf, cap, "HWINFO %ld %.1f %.1f 0 0.0 %s|", cores, tot, avail, cpu);
}

double rss_peak_gb(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return ru.ru_maxrss / (1024.0 * 1024.0);    /* Linux: kilobytes */
}

void hex_encode(const uint8_t *in, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = 0;
}

uint32_t fnv1a32(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 16777619u;
    }
    return h;
}

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
