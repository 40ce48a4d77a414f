/* See wire.h. */
#include "wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int read_full(int fd, void *buf, size_t n, size_t *got) {
    *got = 0;
    while (*got < n) {
        ssize_t k = read(fd, (char *)buf + *got, n - *got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 0;
        *got += (size_t)k;
    }
    return 1;
}

static int write_full(int fd, const void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t k = write(fd, (const char *)buf + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 0;
        done += (size_t)k;
    }
    return 1;
}

static size_t dtype_size(const char *d) {
    if (!strcmp(d, "f32") || !strcmp(d, "i32")) return 4;
    if (!strcmp(d, "i64")) return 8;
    if (!strcmp(d, "u8")) return 1;
    return 0;
}

int wire_read(int fd, request *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    uint8_t prefix[16];
    size_t got;
    if (!read_full(fd, prefix, 16, &got)) {
        if (got == 0) return 0;
        snprintf(err, errlen, "the stream ended inside a frame's prefix");
        return -1;
    }
    if (memcmp(prefix, "ORWP", 4) != 0) { snprintf(err, errlen, "bad magic"); return -1; }
    uint32_t hlen = (uint32_t)prefix[4] | (uint32_t)prefix[5] << 8 | (uint32_t)prefix[6] << 16 | (uint32_t)prefix[7] << 24;
    uint64_t blen = 0;
    for (int k = 7; k >= 0; k--) blen = blen << 8 | prefix[8 + k];
    if (hlen > WIRE_MAX_HEADER || blen > WIRE_MAX_BODY) { snprintf(err, errlen, "a length past the limits"); return -1; }
    char *text = malloc(hlen + 1);
    r->body = malloc(blen ? blen : 1);
    if (!text || !r->body) { snprintf(err, errlen, "out of memory"); free(text); return -1; }
    if (!read_full(fd, text, hlen, &got) || !read_full(fd, r->body, blen, &got)) {
        free(text);
        snprintf(err, errlen, "the stream ended inside a frame");
        return -1;
    }
    const char *jerr;
    size_t at;
    r->header = json_parse(text, hlen, &jerr, &at);
    free(text);
    if (!r->header || r->header->kind != J_OBJ) {
        snprintf(err, errlen, "the header is not a JSON object (%s at byte %zu)", r->header ? "not an object" : jerr, at);
        return -1;
    }
    const jval *id = json_get(r->header, "id"), *call = json_get(r->header, "call");
    r->id = id && id->kind == J_NUM ? id->i : -1;
    r->call = call && call->kind == J_STR ? call->str : "";
    r->args = json_get(r->header, "args");
    const jval *arrays = json_get(r->header, "arrays");
    size_t n = arrays && arrays->kind == J_ARR ? arrays->len : 0, off = 0;
    r->arrays = calloc(n ? n : 1, sizeof *r->arrays);
    for (size_t k = 0; k < n; k++) {
        const jval *d = arrays->items[k], *dt = json_get(d, "dtype"), *shape = json_get(d, "shape");
        warray *a = &r->arrays[k];
        if (!dt || dt->kind != J_STR || !dtype_size(dt->str) || !shape || shape->kind != J_ARR || shape->len > 4) {
            snprintf(err, errlen, "field arrays[%zu]: a bad descriptor", k);
            return -1;
        }
        snprintf(a->dtype, sizeof a->dtype, "%s", dt->str);
        a->ndim = (int)shape->len;
        size_t count = 1;
        for (size_t j = 0; j < shape->len; j++) { a->shape[j] = shape->items[j]->i; count *= (size_t)a->shape[j]; }
        a->nbytes = count * dtype_size(a->dtype);
        if (off + a->nbytes > blen) { snprintf(err, errlen, "field arrays[%zu]: past the body's end", k); return -1; }
        a->data = r->body + off;
        off += a->nbytes;
    }
    r->n_arrays = n;
    return 1;
}

void wire_request_free(request *r) {
    json_free(r->header);
    free(r->body);
    free(r->arrays);
    memset(r, 0, sizeof *r);
}

void resp_init(response *r) { memset(r, 0, sizeof *r); sb_init(&r->result); }

void resp_free(response *r) {
    for (size_t k = 0; k < r->n_arrays; k++)
        if (r->arrays[k].owned) free(r->arrays[k].data);
    free(r->arrays);
    sb_free(&r->result);
    memset(r, 0, sizeof *r);
}

void resp_array(response *r, const char *dtype, int ndim, const int64_t *shape, void *data, size_t nbytes, int owned) {
    if (r->n_arrays == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 8;
        r->arrays = realloc(r->arrays, r->cap * sizeof *r->arrays);
    }
    warray *a = &r->arrays[r->n_arrays];
    memset(a, 0, sizeof *a);
    snprintf(a->dtype, sizeof a->dtype, "%s", dtype);
    a->ndim = ndim;
    memcpy(a->shape, shape, (size_t)ndim * sizeof *shape);
    a->data = data;
    a->nbytes = nbytes;
    a->owned = owned;
    sb_printf(&r->result, "{\"array\":%zu}", r->n_arrays++);
}

static void header_of(sbuf *h, int64_t id, const char *key, const char *value, warray *arrays, size_t n, uint64_t *body) {
    *body = 0;
    sb_printf(h, "{\"id\":%lld,\"%s\":%s,\"arrays\":[", (long long)id, key, value);
    for (size_t k = 0; k < n; k++) {
        warray *a = &arrays[k];
        sb_printf(h, "%s{\"dtype\":\"%s\",\"shape\":[", k ? "," : "", a->dtype);
        for (int j = 0; j < a->ndim; j++) sb_printf(h, "%s%lld", j ? "," : "", (long long)a->shape[j]);
        sb_printf(h, "],\"nbytes\":%zu}", a->nbytes);
        *body += a->nbytes;
    }
    sb_puts(h, "]}");
}

static void prefix_of(uint8_t p[16], size_t hlen, uint64_t body) {
    memcpy(p, "ORWP", 4);
    for (int k = 0; k < 4; k++) p[4 + k] = (uint8_t)(hlen >> (8 * k));
    for (int k = 0; k < 8; k++) p[8 + k] = (uint8_t)(body >> (8 * k));
}

static int write_frame(int fd, int64_t id, const char *key, const char *value, warray *arrays, size_t n) {
    sbuf h;
    sb_init(&h);
    uint64_t body;
    header_of(&h, id, key, value, arrays, n, &body);
    uint8_t p[16];
    prefix_of(p, h.len, body);
    int ok = write_full(fd, p, 16) && write_full(fd, h.data, h.len);
    for (size_t k = 0; ok && k < n; k++) ok = write_full(fd, arrays[k].data, arrays[k].nbytes);
    sb_free(&h);
    return ok;
}

int wire_write_result(int fd, int64_t id, response *r) {
    return write_frame(fd, id, "result", r->result.len ? r->result.data : "null", r->arrays, r->n_arrays);
}

int wire_write_error(int fd, int64_t id, const char *error_json) { return write_frame(fd, id, "error", error_json, NULL, 0); }

uint8_t *wire_result_bytes(int64_t id, response *r, size_t *n) {
    sbuf h;
    sb_init(&h);
    uint64_t body;
    header_of(&h, id, "result", r->result.len ? r->result.data : "null", r->arrays, r->n_arrays, &body);
    *n = 16 + h.len + body;
    uint8_t *out = malloc(*n), *at = out + 16;
    prefix_of(out, h.len, body);
    memcpy(at, h.data, h.len);
    at += h.len;
    for (size_t k = 0; k < r->n_arrays; k++) { memcpy(at, r->arrays[k].data, r->arrays[k].nbytes); at += r->arrays[k].nbytes; }
    sb_free(&h);
    return out;
}
