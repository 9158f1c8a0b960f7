/* utf8stream.c — see utf8stream.h */
#include <string.h>

#include "utf8stream.h"

void utf8s_init(utf8s *s) { memset(s, 0, sizeof *s); }

static int put_fffd(char *o)
{
    o[0] = (char)0xEF; o[1] = (char)0xBF; o[2] = (char)0xBD;
    return 3;
}

/* Expected length of a sequence led by b (0: b cannot start one) and the allowed range
 * of its second byte. */
static int lead_info(unsigned b, unsigned *lo, unsigned *hi)
{
    *lo = 0x80; *hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) *lo = 0xA0;
        if (b == 0xED) *hi = 0x9F;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Consume bytes of a (held tail + new input) stream given as two spans. */
int utf8s_push(utf8s *s, const char *in, int n, char *out, int cap)
{
    if (n < 0 || cap < 3 * (n + 3)) return -1;
    unsigned char buf[4];
    int nh = s->n_held;
    memcpy(buf, s->held, (size_t)nh);
    const unsigned char *src = (const unsigned char *)in;
    int total = nh + n, o = 0, i = 0;
#define AT(k) ((k) < nh ? buf[(k)] : src[(k) - nh])
    while (i < total) {
        unsigned b = AT(i), lo, hi;
        if (b < 0x80) { out[o++] = (char)b; i++; continue; }
        int need = lead_info(b, &lo, &hi);
        if (need == 0) { o += put_fffd(out + o); i++; continue; }
        int k = 1;
        while (k < need && i + k < total) {
            unsigned x = AT(i + k);
            if (x < lo || x > hi) break;
            lo = 0x80; hi = 0xBF;
            k++;
        }
        if (k == need) {
            for (int j = 0; j < need; j++) out[o++] = (char)AT(i + j);
            i += need;
        } else if (i + k == total) {       /* incomplete but valid so far: hold it */
            s->n_held = k;
            for (int j = 0; j < k; j++) s->held[j] = AT(i + j);
            return o;
        } else {                           /* maximal ill-formed subpart */
            o += put_fffd(out + o);
            i += k;
        }
    }
#undef AT
    s->n_held = 0;
    return o;
}

int utf8s_flush(utf8s *s, char *out, int cap)
{
    if (cap < 3) return -1;
    int o = s->n_held ? put_fffd(out) : 0;
    s->n_held = 0;
    return o;
}
