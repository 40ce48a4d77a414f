/* See json.h. A recursive-descent parser over RFC 8259 JSON, depth-limited. */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct { const char *s; size_t n, at; const char *err; int depth; } parser;

static jval *new_val(jkind k) {
    jval *v = calloc(1, sizeof *v);
    if (v) v->kind = k;
    return v;
}

static void skip_ws(parser *p) {
    while (p->at < p->n && (p->s[p->at] == ' ' || p->s[p->at] == '\n' || p->s[p->at] == '\r' || p->s[p->at] == '\t'))
        p->at++;
}

static jval *fail(parser *p, const char *err) {
    if (!p->err) p->err = err;
    return NULL;
}

static jval *parse_value(parser *p);

static int hex4(parser *p, unsigned *out) {
    if (p->at + 4 > p->n) return 0;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->at++];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

static void put_utf8(sbuf *b, unsigned cp) {
    char t[4];
    if (cp < 0x80) { t[0] = (char)cp; sb_put(b, t, 1); }
    else if (cp < 0x800) { t[0] = (char)(0xC0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 0x3F)); sb_put(b, t, 2); }
    else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[2] = (char)(0x80 | (cp & 0x3F));
        sb_put(b, t, 3);
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[3] = (char)(0x80 | (cp & 0x3F));
        sb_put(b, t, 4);
    }
}

static char *parse_string(parser *p, size_t *len) {
    sbuf b;
    sb_init(&b);
    p->at++; /* the opening quote */
    while (p->at < p->n) {
        unsigned char c = (unsigned char)p->s[p->at++];
        if (c == '"') {
            sb_put(&b, "", 1);
            *len = b.len - 1;
            return b.data;
        }
        if (c < 0x20) { p->err = "a control character inside a string"; break; }
        if (c != '\\') { sb_put(&b, (const char *)&c, 1); continue; }
        if (p->at >= p->n) break;
        char e = p->s[p->at++];
        unsigned cp;
        switch (e) {
        case '"': sb_put(&b, "\"", 1); break;
        case '\\': sb_put(&b, "\\", 1); break;
        case '/': sb_put(&b, "/", 1); break;
        case 'b': sb_put(&b, "\b", 1); break;
        case 'f': sb_put(&b, "\f", 1); break;
        case 'n': sb_put(&b, "\n", 1); break;
        case 'r': sb_put(&b, "\r", 1); break;
        case 't': sb_put(&b, "\t", 1); break;
        case 'u':
            if (!hex4(p, &cp)) { p->err = "a bad \\u escape"; goto out; }
            if (cp >= 0xD800 && cp < 0xDC00 && p->at + 6 <= p->n && p->s[p->at] == '\\' && p->s[p->at + 1] == 'u') {
                unsigned lo;
                size_t save = p->at;
                p->at += 2;
                if (hex4(p, &lo) && lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else p->at = save;
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* a lone surrogate */
            put_utf8(&b, cp);
            break;
        default: p->err = "a bad escape"; goto out;
        }
    }
out:
    if (!p->err) p->err = "an unterminated string";
    sb_free(&b);
    return NULL;
}

static int push(jval *v, jval *item, char *key) {
    jval **items = realloc(v->items, (v->len + 1) * sizeof *items);
    if (!items) return 0;
    v->items = items;
    if (v->kind == J_OBJ) {
        char **keys = realloc(v->keys, (v->len + 1) * sizeof *keys);
        if (!keys) return 0;
        v->keys = keys;
        v->keys[v->len] = key;
    }
    v->items[v->len++] = item;
    return 1;
}

static jval *parse_container(parser *p, jkind kind) {
    char close = kind == J_ARR ? ']' : '}';
    if (++p->depth > MAX_DEPTH) return fail(p, "nesting deeper than 64");
    jval *v = new_val(kind);
    p->at++;
    skip_ws(p);
    if (p->at < p->n && p->s[p->at] == close) { p->at++; p->depth--; return v; }
    for (;;) {
        char *key = NULL;
        skip_ws(p);
        if (kind == J_OBJ) {
            size_t klen;
            if (p->at >= p->n || p->s[p->at] != '"' || !(key = parse_string(p, &klen))) { fail(p, "an object key"); break; }
            skip_ws(p);
            if (p->at >= p->n || p->s[p->at] != ':') { free(key); fail(p, "':' after a key"); break; }
            p->at++;
        }
        jval *item = parse_value(p);
        if (!item || !push(v, item, key)) { free(key); json_free(item); fail(p, "a value"); break; }
        skip_ws(p);
        if (p->at < p->n && p->s[p->at] == ',') { p->at++; continue; }
        if (p->at < p->n && p->s[p->at] == close) { p->at++; p->depth--; return v; }
        fail(p, kind == J_ARR ? "',' or ']'" : "',' or '}'");
        break;
    }
    json_free(v);
    return NULL;
}

static jval *parse_number(parser *p) {
    size_t start = p->at;
    if (p->s[p->at] == '-') p->at++;
    bool frac = false;
    while (p->at < p->n) {
        char c = p->s[p->at];
        if (c >= '0' && c <= '9') p->at++;
        else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') { frac = true; p->at++; }
        else break;
    }
    char tmp[64];
    size_t n = p->at - start;
    if (n == 0 || n >= sizeof tmp) return fail(p, "a number");
    memcpy(tmp, p->s + start, n);
    tmp[n] = 0;
    char *end;
    jval *v = new_val(J_NUM);
    v->num = strtod(tmp, &end);
    if (*end) { json_free(v); return fail(p, "a number"); }
    if (!frac) { v->i = strtoll(tmp, &end, 10); v->is_int = true; }
    else if (v->num == (double)(int64_t)v->num) { v->i = (int64_t)v->num; v->is_int = true; }
    return v;
}

static jval *literal(parser *p, const char *word, jkind kind, bool b) {
    size_t n = strlen(word);
    if (p->at + n > p->n || memcmp(p->s + p->at, word, n) != 0) return fail(p, "a value");
    p->at += n;
    jval *v = new_val(kind);
    v->b = b;
    return v;
}

static jval *parse_value(parser *p) {
    skip_ws(p);
    if (p->at >= p->n) return fail(p, "a value before the end");
    char c = p->s[p->at];
    if (c == '{') return parse_container(p, J_OBJ);
    if (c == '[') return parse_container(p, J_ARR);
    if (c == '"') {
        size_t len;
        char *s = parse_string(p, &len);
        if (!s) return NULL;
        jval *v = new_val(J_STR);
        v->str = s;
        v->len = len;
        return v;
    }
    if (c == 't') return literal(p, "true", J_BOOL, true);
    if (c == 'f') return literal(p, "false", J_BOOL, false);
    if (c == 'n') return literal(p, "null", J_NULL, false);
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p);
    return fail(p, "a value");
}

jval *json_parse(const char *text, size_t n, const char **err, size_t *at) {
    parser p = {text, n, 0, NULL, 0};
    jval *v = parse_value(&p);
    skip_ws(&p);
    if (v && p.at != n) { json_free(v); v = NULL; p.err = "text after the value"; }
    if (!v) { *err = p.err ? p.err : "malformed"; *at = p.at; }
    return v;
}

void json_free(jval *v) {
    if (!v) return;
    for (size_t k = 0; k < v->len && v->items; k++) {
        json_free(v->items[k]);
        if (v->keys) free(v->keys[k]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

const jval *json_get(const jval *obj, const char *key) {
    if (!obj || obj->kind != J_OBJ) return NULL;
    for (size_t k = 0; k < obj->len; k++)
        if (strcmp(obj->keys[k], key) == 0) return obj->items[k];
    return NULL;
}

/* -- the writer ---------------------------------------------------------------------------------- */
void sb_init(sbuf *b) { b->data = NULL; b->len = b->cap = 0; }
void sb_free(sbuf *b) { free(b->data); sb_init(b); }

void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) { fputs("oracles-wire-llama: out of memory\n", stderr); exit(70); }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

void sb_printf(sbuf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) { sb_put(b, small, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_put(b, big, (size_t)n);
    free(big);
}

/* Bytes of the well-formed UTF-8 sequence at s (Unicode 15, table 3-7), or 0 when it is not one; `*sub` is
 * then the length of its maximal subpart (at least 1): the bytes one U+FFFD replaces. */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *sub) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    *sub = 1;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    for (size_t k = 1; k < need; k++) {
        if (k >= n) { *sub = k; return 0; }
        unsigned char d = s[k];
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (d < l || d > h) { *sub = k; return 0; }
    }
    return need;
}

void sb_json_str(sbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    sb_put(b, "\"", 1);
    for (size_t k = 0; k < n;) {
        unsigned char c = u[k];
        if (c == '"' || c == '\\') { sb_put(b, "\\", 1); sb_put(b, (const char *)&c, 1); k++; continue; }
        if (c < 0x20) { sb_printf(b, "\\u%04x", c); k++; continue; }
        size_t sub, m = utf8_seq(u + k, n - k, &sub);
        if (m) { sb_put(b, (const char *)u + k, m); k += m; }
        else { sb_put(b, "\xEF\xBF\xBD", 3); k += sub; }
    }
    sb_put(b, "\"", 1);
}
