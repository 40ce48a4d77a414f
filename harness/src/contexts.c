/* Contexts and the calls on them (oracles/engines/llamacpp/runtime.py's Context, engine.py's cache calls). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* -- contexts (oracles/engines/llamacpp/runtime.py's Context) ------------------------------------ */
struct llama_context *new_context(sbuf *e) {
    struct llama_context_params p = llama_context_default_params();
    p.n_ctx = N_CTX;
    p.n_batch = p.n_ubatch = N_BATCH;
    p.n_seq_max = 1;
    if (H.threads) p.n_threads = p.n_threads_batch = H.threads;
    p.type_k = p.type_v = GGML_TYPE_F32;
    p.flash_attn_type = (enum llama_flash_attn_type)0;
    p.embeddings = true;
    p.pooling_type = (enum llama_pooling_type)0;
    H.last_error[0] = 0;
    struct llama_context *ctx = llama_init_from_model(H.model, p);
    if (!ctx) {
        char m[700];
        snprintf(m, sizeof m, "%s: llama.cpp cannot make a context: %s", H.gguf, H.last_error[0] ? H.last_error : "NULL");
        err_error(e, m);
    }
    return ctx;
}

static int remove_from(struct llama_context *ctx, int32_t *length, int32_t pos) {
    int done = llama_memory_seq_rm(llama_get_memory(ctx), 0, pos, -1);
    if (done && *length > pos) *length = pos;
    return done;
}

/* Append ids at *length in batches of N_BATCH, the last `outputs` marked; their logits [outputs, V] and
 * embeddings [outputs, D] copied out. */
int decode(struct llama_context *ctx, int32_t *length, const llama_token *ids, size_t n, size_t outputs,
                  float *logits, float *hidden, sbuf *e) {
    size_t first_out = n - outputs, row = 0;
    for (size_t start = 0; start < n; start += N_BATCH) {
        size_t chunk = n - start < N_BATCH ? n - start : N_BATCH;
        struct llama_batch b = llama_batch_init((int32_t)chunk, 0, 1);
        for (size_t j = 0; j < chunk; j++) {
            b.token[j] = ids[start + j];
            b.pos[j] = *length + (int32_t)j;
            b.n_seq_id[j] = 1;
            b.seq_id[j][0] = 0;
            b.logits[j] = start + j >= first_out;
        }
        b.n_tokens = (int32_t)chunk;
        H.last_error[0] = 0;
        int rc = llama_decode(ctx, b);
        llama_batch_free(b);
        if (rc != 0) {
            char m[700];
            snprintf(m, sizeof m, "%s: llama_decode returned %d at position %d: %s", H.gguf, rc, *length,
                     H.last_error[0] ? H.last_error : "no reason logged");
            err_error(e, m);
            return 0;
        }
        *length += (int32_t)chunk;
        long marked = (long)(start + chunk) - (long)(first_out > start ? first_out : start);
        for (long r = 0; r < marked; r++, row++) {
            int32_t i = (int32_t)(r - marked);
            if (logits) memcpy(logits + row * (size_t)H.n_vocab, llama_get_logits_ith(ctx, i), 4 * (size_t)H.n_vocab);
            if (hidden) memcpy(hidden + row * (size_t)H.n_embd, llama_get_embeddings_ith(ctx, i), 4 * (size_t)H.n_embd);
        }
    }
    return 1;
}

int fits(size_t cached, size_t n, sbuf *e) {
    char m[600];
    if (n == 0) { err_value(e, "forward: no token ids"); return 0; }
    if (H.max_context && cached + n > (size_t)H.max_context) {
        snprintf(m, sizeof m, "forward: %zu cached + %zu new tokens exceed the context of %d (max_position_embeddings of %s)",
                 cached, n, H.max_context, H.pin);
        err_value(e, m);
        return 0;
    }
    return 1;
}

/* -- the calls ------------------------------------------------------------------------------------ */
static void step_result(response *out, float *logits, float *hidden, size_t rows) {
    int64_t ls[2] = {(int64_t)rows, H.n_vocab}, hs[2] = {(int64_t)rows, H.n_embd};
    sb_puts(&out->result, "{\"logits\":");
    resp_array(out, "f32", 2, ls, logits, rows * (size_t)H.n_vocab * 4, 1);
    sb_puts(&out->result, ",\"hidden\":");
    resp_array(out, "f32", 2, hs, hidden, rows * (size_t)H.n_embd * 4, 1);
    sb_puts(&out->result, ",\"layers\":null,\"positions\":null}");
}

void call_forward(const request *r, response *out, sbuf *e) {
    int64_t keep;
    int layers, no_cache;
    llama_token *ids;
    size_t n;
    if (!arg_bool(r, "layers", &layers, e) || !arg_int(r, "keep", &keep, 0, NULL, e)) return;
    if (layers) {
        err_kind(e, "unsupported", "return the residual stream after each layer (layers=True)",
                 "llama.cpp's C API gives the final-norm embeddings and the logits only");
        return;
    }
    if (!prompt_ids(r, &ids, &n, e)) return;
    int64_t dummy;
    if (!arg_int(r, "cache", &dummy, 1, &no_cache, e)) { free(ids); return; }
    object *cache = no_cache ? NULL : handle_of(r, "cache", 1, e);
    if ((!no_cache && !cache) || !fits(cache ? (size_t)cache->length : 0, n, e)) { free(ids); return; }
    struct llama_context *ctx;
    int32_t scratch_len = 0, *length = &scratch_len;
    if (cache) { ctx = cache->ctx; length = &cache->length; }
    else {
        if (!H.scratch && !(H.scratch = new_context(e))) { free(ids); return; }
        ctx = H.scratch;
        remove_from(ctx, length, 0);
    }
    size_t rows = keep > 0 ? ((size_t)keep < n ? (size_t)keep : n) : n;
    float *logits = malloc(rows * (size_t)H.n_vocab * 4), *hidden = malloc(rows * (size_t)H.n_embd * 4);
    if (!decode(ctx, length, ids, n, rows, logits, hidden, e)) { free(ids); free(logits); free(hidden); return; }
    free(ids);
    step_result(out, logits, hidden, rows);
}

static uint8_t *state_of(struct llama_context *ctx, size_t *size) {
    size_t room = llama_state_seq_get_size(ctx, 0);
    uint8_t *buf = malloc(room ? room : 1);
    *size = llama_state_seq_get_data(ctx, buf, room, 0);
    return buf;
}

void call_cache(const request *r, response *out, sbuf *e) {
    const char *c = r->call;
    if (!strcmp(c, "make_cache")) {
        object *o = calloc(1, sizeof *o);
        o->kind = 1;
        if (!(o->ctx = new_context(e))) { free(o); return; }
        sb_printf(&out->result, "%lld", (long long)new_handle(o));
    } else if (!strcmp(c, "cache_length")) {
        int none;
        int64_t h;
        if (!arg_int(r, "cache", &h, 1, &none, e)) return;
        object *o = none ? NULL : handle_of(r, "cache", 1, e);
        if (!none && !o) return;
        sb_printf(&out->result, "%d", o ? o->length : 0);
    } else if (!strcmp(c, "is_trimmable")) {
        if (handle_of(r, "cache", 1, e)) sb_puts(&out->result, "true");
    } else if (!strcmp(c, "trim")) {
        int64_t n;
        object *o = handle_of(r, "cache", 1, e);
        if (!o || !arg_int(r, "n", &n, 0, NULL, e)) return;
        int done = n <= 0 ? n == 0 : remove_from(o->ctx, &o->length, o->length - n > 0 ? o->length - (int32_t)n : 0);
        sb_puts(&out->result, done ? "true" : "false");
    } else if (!strcmp(c, "snapshot")) {
        object *o = handle_of(r, "cache", 1, e);
        if (!o) return;
        object *s = calloc(1, sizeof *s);
        s->kind = 2;
        s->length = o->length;
        s->state = state_of(o->ctx, &s->size);
        sb_printf(&out->result, "%lld", (long long)new_handle(s));
    } else if (!strcmp(c, "restore")) {
        object *s = handle_of(r, "snapshot", 2, e);
        if (!s) return;
        object *o = calloc(1, sizeof *o);
        o->kind = 1;
        if (!(o->ctx = new_context(e))) { free(o); return; }
        if (s->size && llama_state_seq_set_data(o->ctx, s->state, s->size, 0) == 0) {
            char m[1000];
            snprintf(m, sizeof m, "%s: llama_state_seq_set_data read none of a %zu-byte snapshot: %s", H.gguf, s->size,
                     H.last_error[0] ? H.last_error : "no reason logged");
            llama_free(o->ctx);
            free(o);
            err_error(e, m);
            return;
        }
        o->length = s->length;
        sb_printf(&out->result, "%lld", (long long)new_handle(o));
    } else if (!strcmp(c, "resident_bytes")) {
        object *o = handle_of(r, "obj", 0, e);
        if (!o) return;
        size_t size = o->size;
        if (o->kind == 1) free(state_of(o->ctx, &size));
        sb_printf(&out->result, "%zu", size);
    }
}
