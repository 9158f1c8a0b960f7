/* server_wire.c — the input side of the mux protocol.
 * Owns: the stdin buffer (poll, read, overlong lines), splitting command lines into fields,
 * parsing numbers and the SUBMIT header, draining a payload whose size is known so the stream
 * stays in sync, BAD_FRAME, and dispatch of SUBMIT / STOP / CANCEL. */
#include "server_impl.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PAYLOAD   (16u << 20)   /* SUBMIT bytes: 16 MiB accepted, one more refused */
#define MAX_GRAMMAR   (1u << 20)    /* gbytes */
#define MAX_FIELDS    40
#define INPUT_ROUNDS  4             /* reads of newly arrived commands before a decode step */

/* ------------------------------------------------------------------ fields */

static int parse_u64(const char *s, uint64_t *out) {
    if (!*s) return -1;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *s, double *out) {
    if (!*s || !(*s == '.' || *s == '-' || *s == '+' || (*s >= '0' && *s <= '9'))) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* Splits s in place at single spaces; an empty field (double space, leading or
 * trailing space) makes the line malformed: returns -1. */
static int split_fields(char *s, char **f, int maxf) {
    int n = 0;
    if (!*s) return 0;
    for (;;) {
        if (n == maxf) return -1;
        f[n++] = s;
        char *sp = strchr(s, ' ');
        if (!sp) break;
        *sp = 0;
        s = sp + 1;
        if (!*s || *s == ' ') return -1;
    }
    for (int i = 0; i < n; i++)
        if (!*f[i]) return -1;
    return n;
}

void wire_bad_request(void) { out_line("ERROR 0 BAD_REQUEST"); }

/* ------------------------------------------------------------------ the SUBMIT header */

/* The payload (+ grammar) bytes to drain after a header, when both counts parse; else -1.
 * Known independently of the header's validity. */
static long long submit_consume(char **f, int nf) {
    uint64_t bytes, gbytes;
    if (nf < 3 || parse_u64(f[2], &bytes) != 0 || bytes > MAX_PAYLOAD) return -1;
    if (nf < 7 || strchr(f[6], '=')) return (long long)bytes;
    if (parse_u64(f[6], &gbytes) != 0 || gbytes > MAX_GRAMMAR) return -1;
    return (long long)(bytes + gbytes);
}

/* id slot bytes max_tokens temperature top_p [gbytes]: returns the index of the first
 * option field, or -1. */
static int parse_positional(char **f, int nf, submit_hdr *h) {
    if (nf < 6) return -1;
    if (parse_u64(f[0], &h->id) || h->id == 0) return -1;
    if (parse_u64(f[1], &h->slot)) return -1;
    if (parse_u64(f[2], &h->bytes) || h->bytes > MAX_PAYLOAD) return -1;
    if (parse_u64(f[3], &h->max_tokens)) return -1;
    if (parse_float(f[4], &h->temperature) || h->temperature < 0 || h->temperature > 2) return -1;
    if (parse_float(f[5], &h->top_p) || !(h->top_p > 0) || h->top_p > 1) return -1;
    if (nf == 6 || strchr(f[6], '=')) return 6;
    if (parse_u64(f[6], &h->gbytes) || h->gbytes > MAX_GRAMMAR) return -1;
    return 7;
}

/* A flag option (0 or 1) given at most once. */
static int set_flag(int *have, int *dst, uint64_t val) {
    if (*have || val > 1) return -1;
    *have = 1;
    *dst = (int)val;
    return 0;
}

/* One key=value option; 0 if known, valid and not repeated. */
static int parse_option(char *field, submit_hdr *h) {
    char *eq = strchr(field, '=');
    if (!eq) return -1;                 /* extra positional field */
    *eq = 0;
    const char *k = field;
    uint64_t val;
    if (parse_u64(eq + 1, &val)) return -1;
    if (!strcmp(k, "seed")) {
        if (h->have_seed) return -1;
        h->have_seed = 1;
        h->seed = val;
    } else if (!strcmp(k, "logprobs")) {
        if (h->have_logprobs || val > MAX_LOGPROBS) return -1;
        h->have_logprobs = 1;
        h->logprobs = (int)val;
    } else if (!strcmp(k, "experts")) {  /* range checked after the payload: a request error */
        if (h->have_experts) return -1;
        h->have_experts = 1;
        h->experts = val;
    } else if (!strcmp(k, "top_k")) {   /* 0 = no cut; >= vocab is no cut either */
        if (h->have_top_k || val > INT32_MAX) return -1;
        h->have_top_k = 1;
        h->top_k = val;
    } else if (!strcmp(k, "routes")) {             /* 2: per-token ROUTESTEP lines too */
        if (h->have_routes || val > 2) return -1;
        h->have_routes = 1;
        h->routes = (int)val;
    } else if (!strcmp(k, "lptext")) return set_flag(&h->have_lptext, &h->lptext, val);
    else if (!strcmp(k, "heat")) return set_flag(&h->have_heat, &h->heat, val);
    else if (!strcmp(k, "grammar")) {
        if (h->grammar || val != 1) return -1;
        h->grammar = 1;
    } else return -1;
    return 0;
}

/* Parses the SUBMIT fields. Returns 0 if valid. Independently of validity, sets
 * *consume to the payload bytes (+ grammar) to drain when both counts parsed. */
static int parse_submit(char *args, submit_hdr *h, long long *consume) {
    char *f[MAX_FIELDS];
    memset(h, 0, sizeof *h);
    h->heat = 1;
    *consume = -1;
    int nf = args ? split_fields(args, f, MAX_FIELDS) : 0;
    if (nf < 0) return -1;
    *consume = submit_consume(f, nf);
    int i = parse_positional(f, nf, h);
    if (i < 0) return -1;
    for (; i < nf; i++)
        if (parse_option(f[i], h) != 0) return -1;
    if (h->max_tokens == 0 && h->logprobs == 0) return -1;
    if (h->grammar && h->gbytes == 0) return -1;
    return 0;
}

/* ------------------------------------------------------------------ stdin buffer */

/* Reads what is available (one read; blocks only if nothing is). 1 data, 0 EOF, -1 EINTR. */
static int fill(server *S) {
    if (S->in_off > 0 && (S->in_off == S->in_len || S->in_off > S->in_cap / 2)) {
        memmove(S->in, S->in + S->in_off, S->in_len - S->in_off);
        S->in_len -= S->in_off;
        S->in_off = 0;
    }
    if (S->in_cap - S->in_len < 65536) {
        size_t nc = S->in_cap * 2 + 65536;
        char *p = realloc(S->in, nc);
        if (!p) return 0;                 /* treat as EOF: nothing sane left to do */
        S->in = p;
        S->in_cap = nc;
    }
    ssize_t r = read(STDIN_FILENO, S->in + S->in_len, S->in_cap - S->in_len);
    if (r < 0) return errno == EINTR ? -1 : 0;
    S->in_len += (size_t)r;
    return r > 0;
}

/* Makes sure `need` unread bytes are buffered (blocking). 0 ok, -1 EOF (short read). */
static int need_bytes(server *S, size_t need) {
    while (S->in_len - S->in_off < need) {
        int r = fill(S);
        if (r == 0) return -1;
        if (r < 0 && srv_terminating()) return -1;
    }
    return 0;
}

static void stop_reading(server *S) {
    S->reading = 0;
}

/* A malformed header: our improvement over colibri drains a payload whose size is known, so
 * the stream stays in sync; then BAD_REQUEST. */
static void refuse_header(server *S, long long consume) {
    if (consume >= 0) {
        if (need_bytes(S, (size_t)consume + 1) != 0) {
            wire_bad_request();
            stop_reading(S);
            return;
        }
        S->in_off += (size_t)consume;
        if (S->in[S->in_off] == '\n') S->in_off++;
    }
    wire_bad_request();
}

const char *wire_submit_payload(server *S, char *args, submit_hdr *h) {
    long long consume;
    if (parse_submit(args, h, &consume) != 0) {
        refuse_header(S, consume);
        return NULL;
    }
    size_t total = (size_t)(h->bytes + h->gbytes);
    if (need_bytes(S, total + 1) != 0) {       /* short read: EOF */
        stop_reading(S);
        return NULL;
    }
    const char *payload = S->in + S->in_off;
    if (payload[total] != '\n') {
        unsigned long long id = (unsigned long long)h->id;
        out_line("ERROR %llu BAD_FRAME", id);
        fprintf(stderr, "[API] bad frame for id=%llu: no newline after the payload; stopping input\n", id);
        S->in_off += total;
        stop_reading(S);
        return NULL;
    }
    S->in_off += total + 1;      /* payload stays valid: nothing reads stdin before it is used */
    return payload;
}

/* ------------------------------------------------------------------ commands */

/* "STOP <id>" / "CANCEL <id>" */
static void cmd_stop_cancel(server *S, char *args, int cancel) {
    char *f[2];
    uint64_t id;
    if (!args || split_fields(args, f, 2) != 1 || parse_u64(f[0], &id) != 0 || id == 0) {
        wire_bad_request();
        return;
    }
    srv_stop_cancel(S, id, cancel);
}

static void handle_line(server *S, char *line) {
    char *sp = strchr(line, ' ');
    char *args = NULL;
    if (sp) {
        *sp = 0;
        args = sp + 1;
    }
    if (!strcmp(line, "SUBMIT") && args) {
        submit_hdr h;
        const char *payload = wire_submit_payload(S, args, &h);
        if (payload) cmd_submit(S, &h, payload);
    } else if (!strcmp(line, "STOP")) cmd_stop_cancel(S, args, 0);
    else if (!strcmp(line, "CANCEL")) cmd_stop_cancel(S, args, 1);
    else wire_bad_request();
}

/* Runs every complete command line in the buffer. */
static void run_buffered(server *S) {
    while (S->reading && !srv_terminating()) {
        char *start = S->in + S->in_off;
        size_t avail = S->in_len - S->in_off;
        char *nl = memchr(start, '\n', avail);
        if (!nl) {
            if (avail > MAX_LINE) {      /* refuse once, then skip to the next newline */
                if (!S->skipping) wire_bad_request();
                S->skipping = 1;
                S->in_off = S->in_len;
            }
            return;
        }
        size_t len = (size_t)(nl - start);
        S->in_off += len + 1;
        if (S->skipping) {
            S->skipping = 0;
            continue;
        }
        if (len > MAX_LINE) {
            wire_bad_request();
            continue;
        }
        memcpy(S->line, start, len);     /* the buffer may move while the command runs */
        S->line[len] = 0;
        if (memchr(S->line, 0, len)) wire_bad_request();
        else handle_line(S, S->line);
    }
}

/* Reads stdin and runs the commands it holds; waits for input only when idle. Input that
 * arrived meanwhile is read again, up to INPUT_ROUNDS times, before the caller's decode step:
 * a prefill takes long enough for the next SUBMITs of a burst to arrive (a web front end admits
 * its clients one after another), and they are prefilled now, as if they had come in one
 * write, instead of each waiting behind a decode step. The bound keeps a steady stream of
 * SUBMITs from starving the decode. Returns -1 when a signal interrupted the wait. */
int wire_read_commands(server *S, int busy) {
    for (int round = 0; round < INPUT_ROUNDS && S->reading; round++) {
        struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
        int pr = poll(&pfd, 1, busy || round > 0 ? 0 : -1);
        if (pr < 0 && errno == EINTR) return -1;
        if (pr < 0) stop_reading(S);
        if (pr <= 0) return 0;
        int fr = fill(S);
        if (fr == 0) {
            stop_reading(S);
            fprintf(stderr, "[API] stdin closed: draining %s\n",
                    srv_any_active(S) ? "active requests" : "(idle)");
        }
        if (fr <= 0) return 0;
        run_buffered(S);
    }
    return 0;
}
