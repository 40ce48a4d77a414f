/* What the C harness's files share (harness/src/llama_harness.c says what the harness is): the state of one
 * conversation, the objects behind handles, and the helpers each call uses. The llama.cpp declarations come
 * from build/llama_api.h, included first by the Makefile. */
#ifndef ORACLES_HARNESS_H
#define ORACLES_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"
#include "wire.h"

#define NAME "oracles-wire-llama"
#define N_CTX 2048
#define N_BATCH 512

typedef struct {
    int kind; /* 1: a cache, 2: a snapshot */
    struct llama_context *ctx;
    int32_t length;
    uint8_t *state;
    size_t size;
} object;

struct harness {
    struct llama_model *model;
    const struct llama_vocab *vocab;
    int32_t n_vocab, n_embd, n_layer, n_head_kv, max_context;
    int threads;
    char pin[256], gguf[256];
    object **objs;
    size_t n_objs;
    struct llama_context *scratch;
    char last_error[512];
    char fault_kind[16], fault_call[64];
};
extern struct harness H;

/* errors.c: each error a JSON object written into `e` (docs/wire.md, section 2) */
void err_kind(sbuf *e, const char *kind, const char *capability, const char *why);
void err_value(sbuf *e, const char *message);
void err_error(sbuf *e, const char *message);
void err_field(sbuf *e, const char *field, const char *problem);

/* args.c: arguments by name, handles */
const jval *arg(const request *r, const char *name);
int arg_int(const request *r, const char *name, int64_t *out, int nullable, int *is_null, sbuf *e);
int arg_bool(const request *r, const char *name, int *out, sbuf *e);
int id_list(const jval *v, const char *field, llama_token **ids, size_t *n, sbuf *e);
int prompt_ids(const request *r, llama_token **ids, size_t *n, sbuf *e);
object *handle_of(const request *r, const char *name, int kind, sbuf *e);
int64_t new_handle(object *o);
void release(int64_t h);

/* contexts.c: contexts, decoding, the cache calls */
struct llama_context *new_context(sbuf *e);
void call_forward(const request *r, response *out, sbuf *e);
void call_cache(const request *r, response *out, sbuf *e);
int decode(struct llama_context *ctx, int32_t *length, const llama_token *ids, size_t n, size_t outputs,
           float *logits, float *hidden, sbuf *e);
int fits(size_t cached, size_t n, sbuf *e);

/* buffers.c: a snapshot's buffers */
void call_buffers(const request *r, response *out, sbuf *e);

/* text.c: the tokenizer, decode and generate */
void put_detokenized(sbuf *b, const llama_token *ids, size_t n, int skip_special);
void call_text(const request *r, response *out, sbuf *e);
void call_generate(const request *r, response *out, sbuf *e);

#endif
