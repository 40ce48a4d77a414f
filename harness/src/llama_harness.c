/* oracles-wire-llama: a far side of the oracles wire (docs/wire.md) in C, over libllama.
 *
 * It serves what the in-process llama.cpp engine (oracles/engines/llamacpp/) serves, computed the same
 * way, so the two are bit-equal on the same GGUF and settings: a context per cache (n_ctx 2048, n_batch =
 * n_ubatch 512, one sequence, an f32 KV cache, no flash attention, embeddings on with pooling NONE, the
 * client's thread count), a forward as llama_decode per 512 ids with the asked rows marked as outputs, a
 * snapshot as llama_state_seq_get_data's bytes, its buffers read back from those bytes (keys in
 * transformers' rotary order), llama.cpp's sampler chain for a generation, its tokenizer. The chat template
 * is rendered by the client (jinja2, as llama.cpp's --jinja mode): the handshake says "render_chat":
 * "client". What it does not serve (layers=True, pictures, a bounded KV window) is refused as the engine
 * refuses it; the calls it lacks are absent from its handshake.
 *
 * Protocol: frames on stdin/stdout, one response per request, exit 0 at EOF. Diagnostics go to stderr.
 * ORACLES_HARNESS_FAULT=KIND:CALL injects one fault at one call, for the suite's fault tests: crash, hang,
 * half (half a frame, then exit), shape (the first array one column short), dtype (f32 sent as i32),
 * garbage (text on stdout).
 *
 * The llama.cpp declarations come from the binding's own CFFI text (Makefile: build/llama_api.h). This file:
 * the handshake, describe, the request loop and the faults; the calls are in contexts.c, buffers.c, text.c. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#ifndef LLAMA_COMMIT
#define LLAMA_COMMIT "unknown"
#endif
#ifndef LLAMA_LIBRARY
#define LLAMA_LIBRARY "unknown"
#endif

struct harness H;

static void on_log(enum ggml_log_level level, const char *text, void *data) {
    (void)data;
    if (level == GGML_LOG_LEVEL_ERROR && text && *text) {
        snprintf(H.last_error, sizeof H.last_error, "%s", text);
        size_t n = strlen(H.last_error);
        while (n && (H.last_error[n - 1] == '\n' || H.last_error[n - 1] == ' ')) H.last_error[--n] = 0;
    }
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr); /* its warnings repeat per context: not the tail's lines */
}

/* -- the handshake and describe -------------------------------------------------------------------- */
static const char *CALLS = "[\"forward\",\"make_cache\",\"cache_length\",\"is_trimmable\",\"trim\",\"snapshot\","
    "\"restore\",\"snapshot_buffers\",\"resident_bytes\",\"generate\",\"decode\",\"describe\",\"tokenizer.encode\","
    "\"tokenizer.decode\",\"tokenizer.convert_ids_to_tokens\"]";

static void put_token_text(sbuf *b, llama_token t) {
    if (t < 0) { sb_puts(b, "null"); return; }
    const char *s = llama_vocab_get_text(H.vocab, t);
    sb_json_str(b, s, strlen(s));
}

static void call_hello(const request *r, response *out, sbuf *e) {
    int64_t protocol, threads;
    const jval *pin = arg(r, "pin"), *files = json_get(pin, "files"), *name = json_get(pin, "name"), *root = arg(r, "root");
    if (!arg_int(r, "protocol", &protocol, 0, NULL, e) || !arg_int(r, "threads", &threads, 0, NULL, e)) return;
    if (protocol != WIRE_PROTOCOL) { err_field(e, "args.protocol", "this harness speaks protocol 1"); return; }
    if (H.model) { err_error(e, "a model is loaded already: one handshake a conversation"); return; }
    if (!files || files->kind != J_OBJ || !root || root->kind != J_STR) { err_field(e, "args.pin.files", "expected the pin's files and its root"); return; }
    snprintf(H.pin, sizeof H.pin, "%s", name && name->kind == J_STR ? name->str : "?");
    int found = 0;
    for (size_t k = 0; k < files->len; k++) {
        size_t len = strlen(files->keys[k]);
        if (len > 5 && !strcmp(files->keys[k] + len - 5, ".gguf")) { found++; snprintf(H.gguf, sizeof H.gguf, "%s", files->keys[k]); }
    }
    if (found != 1) {
        char m[400];
        snprintf(m, sizeof m, "llama.cpp loads one GGUF file; pin %s pins %d .gguf files", H.pin, found);
        err_kind(e, "unsupported", "load the pin", m);
        return;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root->str, H.gguf);
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    H.last_error[0] = 0;
    if (!(H.model = llama_model_load_from_file(path, mp))) {
        char m[5000];
        snprintf(m, sizeof m, "%s: llama.cpp cannot load it: %s", path, H.last_error[0] ? H.last_error : "llama_model_load_from_file failed");
        err_error(e, m);
        return;
    }
    H.threads = (int)threads;
    H.vocab = llama_model_get_vocab(H.model);
    H.n_vocab = llama_vocab_n_tokens(H.vocab);
    H.n_embd = llama_model_n_embd(H.model);
    H.n_layer = llama_model_n_layer(H.model);
    H.n_head_kv = llama_model_n_head_kv(H.model);
    int32_t train = llama_model_n_ctx_train(H.model);
    H.max_context = train > 0 && train < N_CTX ? train : N_CTX;
    sbuf *o = &out->result;
    sb_printf(o, "{\"protocol\":%d,\"server\":\"%s (llama.cpp %s)\",\"engine\":\"%s\",\"calls\":%s,\"facts\":{",
              WIRE_PROTOCOL, NAME, LLAMA_COMMIT, NAME, CALLS);
    sb_printf(o, "\"vocab_size\":%d,\"hidden_size\":%d,\"num_layers\":%d,\"max_context\":%d,\"eos_token_ids\":[",
              H.n_vocab, H.n_embd, H.n_layer, H.max_context);
    for (int32_t t = 0, first = 1; t < H.n_vocab; t++)
        if (llama_vocab_is_eog(H.vocab, t)) { sb_printf(o, "%s%d", first ? "" : ",", t); first = 0; }
    const char *tmpl = llama_model_chat_template(H.model, NULL);
    sb_puts(o, "],\"chat_template\":");
    if (tmpl) sb_json_str(o, tmpl, strlen(tmpl)); else sb_puts(o, "null");
    sb_puts(o, ",\"bos_token\":");
    put_token_text(o, llama_vocab_bos(H.vocab));
    sb_puts(o, ",\"eos_token\":");
    put_token_text(o, llama_vocab_eos(H.vocab));
    sb_puts(o, ",\"render_chat\":\"client\"}}");
}

static void call_describe(response *out, sbuf *e) {
    char arch[128] = "?";
    llama_model_meta_val_str(H.model, "general.architecture", arch, sizeof arch);
    if (!H.scratch && !(H.scratch = new_context(e))) return;
    sbuf *o = &out->result;
    sb_printf(o, "{\"engine\":\"%s\",\"class\":\"harness/src/llama_harness.c\",\"model_class\":\"llama.cpp %s\","
                 "\"device\":\"cpu\",\"llama_cpp_commit\":\"%s\",\"library\":\"%s\",\"gguf\":",
              NAME, arch, LLAMA_COMMIT, LLAMA_LIBRARY);
    sb_json_str(o, H.gguf, strlen(H.gguf));
    sb_puts(o, ",\"kv_type\":\"f32\",\"threads\":");
    if (H.threads) sb_printf(o, "%d", H.threads); else sb_puts(o, "null");
    sb_printf(o, ",\"n_threads\":%d,\"n_ctx\":%d,\"n_batch\":%d,\"flash_attn\":false,"
                 "\"chat_mode\":\"jinja, rendered by the client\",\"config_overrides\":{},\"system_info\":",
              llama_n_threads(H.scratch), N_CTX, N_BATCH);
    const char *info = llama_print_system_info();
    sb_json_str(o, info, strlen(info));
    sb_puts(o, "}");
}

/* -- the loop ------------------------------------------------------------------------------------- */
static void dispatch(const request *r, response *out, sbuf *e) {
    const char *c = r->call;
    if (!strcmp(c, "hello")) { call_hello(r, out, e); return; }
    if (!H.model) { err_error(e, "no model: the first call must be hello"); return; }
    if (!strcmp(c, "forward")) call_forward(r, out, e);
    else if (!strcmp(c, "make_cache") || !strcmp(c, "cache_length") || !strcmp(c, "is_trimmable") || !strcmp(c, "trim") ||
             !strcmp(c, "snapshot") || !strcmp(c, "restore") || !strcmp(c, "resident_bytes")) call_cache(r, out, e);
    else if (!strcmp(c, "snapshot_buffers")) call_buffers(r, out, e);
    else if (!strcmp(c, "generate")) call_generate(r, out, e);
    else if (!strcmp(c, "describe")) call_describe(out, e);
    else if (!strncmp(c, "tokenizer.", 10) || !strcmp(c, "decode")) call_text(r, out, e);
    else {
        char m[200];
        snprintf(m, sizeof m, "%s does not serve call %s", NAME, c);
        err_kind(e, "unsupported", c, m);
    }
}

/* The fault ORACLES_HARNESS_FAULT names, at its call; returns 1 when the answer was written here. */
static int inject(const request *r, response *out) {
    if (!H.fault_kind[0] || strcmp(r->call, H.fault_call)) return 0;
    fprintf(stderr, "%s: injecting fault %s at %s\n", NAME, H.fault_kind, r->call);
    fflush(stderr);
    if (!strcmp(H.fault_kind, "crash")) abort();
    if (!strcmp(H.fault_kind, "hang")) for (;;) pause();
    if (!strcmp(H.fault_kind, "garbage")) {
        const char *text = "llama_model_load: loading model tensors, this can take a while... done\n";
        for (int k = 0; k < 4; k++) if (write(1, text, strlen(text)) < 0) break;
        for (;;) pause();
    }
    if (!strcmp(H.fault_kind, "half")) {
        size_t n;
        uint8_t *bytes = wire_result_bytes(r->id, out, &n);
        if (write(1, bytes, n / 2) < 0) _exit(1);
        _exit(0);
    }
    if (out->n_arrays && !strcmp(H.fault_kind, "shape")) {
        warray *a = &out->arrays[0];
        size_t per = a->nbytes / (size_t)(a->shape[a->ndim - 1] ? a->shape[a->ndim - 1] : 1);
        a->shape[a->ndim - 1]--;
        a->nbytes -= per;
    }
    if (out->n_arrays && !strcmp(H.fault_kind, "dtype")) snprintf(out->arrays[0].dtype, 4, "i32");
    return 0;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *fault = getenv("ORACLES_HARNESS_FAULT");
    if (fault && strchr(fault, ':')) {
        snprintf(H.fault_kind, sizeof H.fault_kind, "%.*s", (int)(strchr(fault, ':') - fault), fault);
        snprintf(H.fault_call, sizeof H.fault_call, "%s", strchr(fault, ':') + 1);
    }
    llama_log_set(on_log, NULL);
    llama_backend_init();
    char err[256];
    for (;;) {
        request r;
        int got = wire_read(0, &r, err, sizeof err);
        if (got == 0) break;
        if (got < 0) { fprintf(stderr, "%s: the client sent a broken frame: %s\n", NAME, err); wire_request_free(&r); return 2; }
        const jval *freed = json_get(r.header, "free");
        for (size_t k = 0; freed && freed->kind == J_ARR && k < freed->len; k++) release(freed->items[k]->i);
        response out;
        sbuf e;
        resp_init(&out);
        sb_init(&e);
        dispatch(&r, &out, &e);
        int ok = e.len ? wire_write_error(1, r.id, e.data) : (inject(&r, &out), wire_write_result(1, r.id, &out));
        resp_free(&out);
        sb_free(&e);
        wire_request_free(&r);
        if (!ok) { fprintf(stderr, "%s: stdout closed\n", NAME); return 1; }
    }
    for (size_t k = 0; k < H.n_objs; k++) release((int64_t)k + 1);
    if (H.scratch) llama_free(H.scratch);
    if (H.model) llama_model_free(H.model);
    return 0;
}
