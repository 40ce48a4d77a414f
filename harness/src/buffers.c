/* A snapshot's buffers, read back from llama_state_seq_get_data's bytes (oracles/engines/llamacpp/state.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* -- a snapshot's buffers (oracles/engines/llamacpp/state.py) ------------------------------------- */
typedef struct { const uint8_t *d; size_t n, at; int bad; } reader;

static uint64_t take(reader *rd, size_t k) {
    uint64_t v = 0;
    if (rd->at + k > rd->n) { rd->bad = 1; return 0; }
    for (size_t j = 0; j < k; j++) v |= (uint64_t)rd->d[rd->at + j] << (8 * j);
    rd->at += k;
    return v;
}

/* One layer's [cells, n_head_kv * head_dim] rows (or transposed channels) as [1, n_head_kv, cells, head_dim],
 * keys put back in transformers' rotary order: hf[j * half + i] = llama[2 * i + j]. */
static float *layer_buffer(const float *src, size_t cells, size_t head_dim, int transposed, int rotary) {
    size_t heads = (size_t)H.n_head_kv, half = head_dim / 2;
    float *out = malloc(heads * cells * head_dim * 4 + 4);
    for (size_t h = 0; h < heads; h++)
        for (size_t c = 0; c < cells; c++)
            for (size_t d = 0; d < head_dim; d++) {
                size_t from = rotary ? 2 * (d % half) + d / half : d;
                float v = transposed ? src[(h * head_dim + from) * cells + c] : src[c * heads * head_dim + h * head_dim + from];
                out[(h * cells + c) * head_dim + d] = v;
            }
    return out;
}

void call_buffers(const request *r, response *out, sbuf *e) {
    object *s = handle_of(r, "snapshot", 2, e);
    if (!s) return;
    reader rd = {s->state, s->size, 0, 0};
    take(&rd, 8);
    uint64_t streams = take(&rd, 4), cells = 0;
    sb_puts(&out->result, "[");
    for (uint64_t k = 0; k < streams && !rd.bad; k++) {
        uint64_t n = take(&rd, 4);
        if (!n) continue;
        if (cells) { err_error(e, "llama.cpp state: more than one non-empty KV stream"); return; }
        cells = n;
        for (uint64_t c = 0; c < cells; c++) { take(&rd, 4); rd.at += 4 * take(&rd, 4); }
        uint64_t v_trans = take(&rd, 4), n_layer = take(&rd, 4);
        take(&rd, 8);
        float **keys = calloc(n_layer + 1, sizeof *keys);
        size_t head_dim = 0;
        for (int pass = 0; pass < 2 && !rd.bad; pass++)
            for (uint64_t l = 0; l < n_layer && !rd.bad; l++) {
                uint64_t type = take(&rd, 4), row_elems;
                int transposed = pass == 1 && v_trans;
                if (type != 0) { err_error(e, "llama.cpp state: a KV type other than f32 (this harness makes f32 caches)"); return; }
                if (transposed) { take(&rd, 4); row_elems = take(&rd, 4); }
                else row_elems = take(&rd, 8) / 4;
                head_dim = row_elems / (size_t)H.n_head_kv;
                if (rd.at + cells * row_elems * 4 > rd.n) { rd.bad = 1; break; }
                float *src = malloc(cells * row_elems * 4 + 4);
                memcpy(src, rd.d + rd.at, cells * row_elems * 4);
                rd.at += cells * row_elems * 4;
                float *buf = layer_buffer(src, cells, head_dim, transposed, pass == 0);
                free(src);
                if (pass == 0) { keys[l] = buf; continue; }
                int64_t shape[4] = {1, H.n_head_kv, (int64_t)cells, (int64_t)head_dim};
                size_t bytes = (size_t)H.n_head_kv * cells * head_dim * 4;
                sb_printf(&out->result, "%s[\"layers.%llu.keys\",", l ? "," : "", (unsigned long long)l);
                resp_array(out, "f32", 4, shape, keys[l], bytes, 1);
                sb_printf(&out->result, "],[\"layers.%llu.values\",", (unsigned long long)l);
                resp_array(out, "f32", 4, shape, buf, bytes, 1);
                sb_puts(&out->result, "]");
                keys[l] = NULL;
            }
        for (uint64_t l = 0; l < n_layer; l++) free(keys[l]);
        free(keys);
    }
    if (rd.bad) { err_error(e, "llama.cpp state: the bytes end early"); return; }
    sb_puts(&out->result, "]");
}
