/* The few C library functions the kernel (and gcc's generated code) needs, and text building (memcpy and
 * memset are the architecture's: x86's string instructions, word copies on Arm). */
#include "kernel.h"

void *memmove(void *dst, const void *src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (d < s || d >= s + n) return memcpy(dst, src, n);
    while (n--) d[n] = s[n];
    return dst;
}

int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return x[i] - y[i];
    return 0;
}

size_t strlen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

int strcmp(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return (unsigned char)*a - (unsigned char)*b;
}

int strncmp(const char *a, const char *b, size_t n) {
    for (; n; n--, a++, b++) {
        if (*a != *b || !*a) return (unsigned char)*a - (unsigned char)*b;
    }
    return 0;
}

char *strchr(const char *s, int c) {
    for (;; s++) {
        if (*s == (char)c) return (char *)s;
        if (!*s) return NULL;
    }
}

void text_char(text *t, char c) {
    if (t->len + 1 < t->cap) t->buf[t->len++] = c;
    t->buf[t->len] = 0;
}

void text_str(text *t, const char *s) {
    while (*s) text_char(t, *s++);
}

void text_u64(text *t, uint64_t v) {
    char digits[21];
    int n = 0;
    do digits[n++] = (char)('0' + v % 10);
    while ((v /= 10));
    while (n) text_char(t, digits[--n]);
}

void text_hex(text *t, uint64_t v) {
    static const char hex[] = "0123456789abcdef";
    text_str(t, "0x");
    int shift = 60;
    while (shift > 0 && !((v >> shift) & 15)) shift -= 4;
    for (; shift >= 0; shift -= 4) text_char(t, hex[(v >> shift) & 15]);
}

void text_i64(text *t, int64_t v) {
    if (v < 0) {
        text_char(t, '-');
        text_u64(t, (uint64_t)0 - (uint64_t)v);
    } else {
        text_u64(t, (uint64_t)v);
    }
}

/* Strings here come from the command line: escape quotes, backslashes and control bytes, cut at 256. */
void text_json_str(text *t, const char *s) {
    static const char hex[] = "0123456789abcdef";
    text_char(t, '"');
    for (int i = 0; s[i] && i < 256; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            text_char(t, '\\');
            text_char(t, (char)c);
        } else if (c < 0x20 || c >= 0x7f) {
            text_str(t, "\\u00");
            text_char(t, hex[c >> 4]);
            text_char(t, hex[c & 15]);
        } else {
            text_char(t, (char)c);
        }
    }
    text_char(t, '"');
}
