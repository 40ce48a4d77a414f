/* The tokenizer calls, decode and generate (oracles/engines/llamacpp/tokenizer.py, engine.py's generate). */
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* -- text ----------------------------------------------------------------------------------------- */
void put_detokenized(sbuf *b, const llama_token *ids, size_t n, int skip_special) {
    llama_token zero = 0;
    int32_t room = 16 * (int32_t)n + 16;
    for (int attempt = 0; attempt < 2; attempt++) {
        char *buf = malloc((size_t)room);
        int32_t k = llama_detokenize(H.vocab, n ? ids : &zero, (int32_t)n, buf, room, skip_special, !skip_special);
        if (k >= 0) { sb_json_str(b, buf, (size_t)k); free(buf); return; }
        free(buf);
        room = -k + 1;
    }
    sb_json_str(b, "", 0);
}

void call_text(const request *r, response *out, sbuf *e) {
    const char *c = r->call;
    llama_token *ids;
    size_t n;
    if (!strcmp(c, "tokenizer.encode")) {
        const jval *t = arg(r, "text");
        int add;
        if (!t || t->kind != J_STR) { err_field(e, "args.text", "expected a string"); return; }
        if (!arg_bool(r, "add_special_tokens", &add, e)) return;
        int32_t room = (int32_t)t->len + 8;
        llama_token *buf = malloc((size_t)room * sizeof *buf);
        int32_t k = llama_tokenize(H.vocab, t->str, (int32_t)t->len, buf, room, add, true);
        if (k < 0) {
            room = -k;
            buf = realloc(buf, (size_t)room * sizeof *buf);
            k = llama_tokenize(H.vocab, t->str, (int32_t)t->len, buf, room, add, true);
        }
        sb_puts(&out->result, "[");
        for (int32_t j = 0; j < k; j++) sb_printf(&out->result, "%s%d", j ? "," : "", buf[j]);
        sb_puts(&out->result, "]");
        free(buf);
    } else if (!strcmp(c, "tokenizer.decode") || !strcmp(c, "decode")) {
        int skip = 0;
        int is_engine = !strcmp(c, "decode");
        if (!id_list(arg(r, is_engine ? "ids" : "token_ids"), is_engine ? "args.ids" : "args.token_ids", &ids, &n, e)) return;
        if (!is_engine && !arg_bool(r, "skip_special_tokens", &skip, e)) { free(ids); return; }
        put_detokenized(&out->result, ids, n, skip);
        free(ids);
    } else if (!strcmp(c, "tokenizer.convert_ids_to_tokens")) {
        if (!id_list(arg(r, "ids"), "args.ids", &ids, &n, e)) return;
        sb_puts(&out->result, "[");
        for (size_t j = 0; j < n; j++) {
            const char *s = llama_vocab_get_text(H.vocab, ids[j]);
            if (j) sb_puts(&out->result, ",");
            sb_json_str(&out->result, s, strlen(s));
        }
        sb_puts(&out->result, "]");
        free(ids);
    }
}

/* -- generation (the engine's generate: llama.cpp's sampler chain on a fresh context) --------------- */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static struct llama_sampler *chain_of(const jval *s, int *greedy, sbuf *e) {
    const jval *t = json_get(s, "temperature"), *p = json_get(s, "top_p"), *k = json_get(s, "top_k"),
               *seed = json_get(s, "seed");
    if (!t || !p || !k || !seed || t->kind != J_NUM || p->kind != J_NUM || k->kind != J_NUM || seed->kind != J_NUM) {
        err_field(e, "args.sampler", "expected temperature, top_p, top_k and seed numbers");
        return NULL;
    }
    struct llama_sampler *chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    *greedy = t->num == 0.0;
    if (*greedy) { llama_sampler_chain_add(chain, llama_sampler_init_greedy()); return chain; }
    if (k->i > 0) llama_sampler_chain_add(chain, llama_sampler_init_top_k((int32_t)k->i));
    if (p->num < 1.0) llama_sampler_chain_add(chain, llama_sampler_init_top_p((float)p->num, 1));
    llama_sampler_chain_add(chain, llama_sampler_init_temp((float)t->num));
    llama_sampler_chain_add(chain, llama_sampler_init_dist((uint32_t)(seed->i & 0xFFFFFFFF)));
    return chain;
}

void call_generate(const request *r, response *out, sbuf *e) {
    int64_t max_new, window;
    int no_window, greedy;
    llama_token *ids;
    size_t n;
    if (!arg_int(r, "max_new_tokens", &max_new, 0, NULL, e) || !arg_int(r, "max_kv_size", &window, 1, &no_window, e)) return;
    if (!no_window) { err_kind(e, "unsupported", "bound its KV cache (max_kv_size)", "llama.cpp has no rotating KV window"); return; }
    if (!prompt_ids(r, &ids, &n, e)) return;
    if (!fits(0, n + (size_t)(max_new - 1 > 0 ? max_new - 1 : 0), e)) { free(ids); return; }
    struct llama_sampler *chain = chain_of(arg(r, "sampler"), &greedy, e);
    struct llama_context *ctx = chain ? new_context(e) : NULL;
    if (!ctx) { free(ids); if (chain) llama_sampler_free(chain); return; }
    int32_t length = 0;
    size_t cap = (size_t)(max_new > 0 ? max_new : 1), count = 0;
    float *rows = malloc(cap * (size_t)H.n_vocab * 4);
    llama_token *tokens = malloc(cap * sizeof *tokens);
    const char *finish = "length";
    double start = now(), first = 0;
    int ok = decode(ctx, &length, ids, n, 1, rows, NULL, e);
    while (ok) {
        count++;
        llama_token tok = llama_sampler_sample(chain, ctx, -1);
        tokens[count - 1] = tok;
        if (first == 0) first = now();
        if (llama_vocab_is_eog(H.vocab, tok)) { finish = "stop"; break; }
        if ((int64_t)count >= max_new) break;
        ok = decode(ctx, &length, &tok, 1, 1, rows + count * (size_t)H.n_vocab, NULL, e);
    }
    double end = now();
    llama_sampler_free(chain);
    llama_free(ctx);
    free(ids);
    if (!ok) { free(rows); free(tokens); return; }
    if (first == 0) first = end;
    sb_puts(&out->result, "{\"tokens\":[");
    for (size_t j = 0; j < count; j++) sb_printf(&out->result, "%s%d", j ? "," : "", tokens[j]);
    sb_puts(&out->result, "],\"text\":");
    put_detokenized(&out->result, tokens, count, 0);
    sb_printf(&out->result, ",\"finish_reason\":\"%s\",\"step_logits\":", finish);
    int64_t shape[2] = {(int64_t)count, H.n_vocab};
    resp_array(out, "f32", 2, shape, rows, count * (size_t)H.n_vocab * 4, 1);
    sb_printf(&out->result, ",\"prefill_seconds\":%.9f,\"decode_seconds\":%.9f,\"extra\":{\"sampler\":\"%s\"}}",
              first - start, end - first, greedy ? "llama_sampler_init_greedy" : "chain");
    free(tokens);
}
