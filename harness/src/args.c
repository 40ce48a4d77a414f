/* Arguments by name and the handles of the C harness. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* -- arguments ----------------------------------------------------------------------------------- */
const jval *arg(const request *r, const char *name) { return json_get(r->args, name); }

int arg_int(const request *r, const char *name, int64_t *out, int nullable, int *is_null, sbuf *e) {
    const jval *v = arg(r, name);
    char field[64];
    snprintf(field, sizeof field, "args.%s", name);
    if (is_null) *is_null = !v || v->kind == J_NULL;
    if ((!v || v->kind == J_NULL) && nullable) return 1;
    if (!v || v->kind != J_NUM || !v->is_int) { err_field(e, field, "expected an integer"); return 0; }
    *out = v->i;
    return 1;
}

int arg_bool(const request *r, const char *name, int *out, sbuf *e) {
    const jval *v = arg(r, name);
    if (!v || v->kind != J_BOOL) {
        char field[64];
        snprintf(field, sizeof field, "args.%s", name);
        err_field(e, field, "expected true or false");
        return 0;
    }
    *out = v->b;
    return 1;
}

/* A list of ids (`field` names it); *ids malloc'ed. */
int id_list(const jval *v, const char *field, llama_token **ids, size_t *n, sbuf *e) {
    if (!v || v->kind != J_ARR) { err_field(e, field, "expected a list of integers"); return 0; }
    *n = v->len;
    *ids = malloc((v->len ? v->len : 1) * sizeof **ids);
    for (size_t k = 0; k < v->len; k++) {
        if (v->items[k]->kind != J_NUM || !v->items[k]->is_int) { free(*ids); err_field(e, field, "an id that is not an integer"); return 0; }
        (*ids)[k] = (llama_token)v->items[k]->i;
    }
    return 1;
}

/* The prompt's ids; pictures are refused as the text-only engine refuses them. */
int prompt_ids(const request *r, llama_token **ids, size_t *n, sbuf *e) {
    const jval *p = arg(r, "prompt"), *images = json_get(p, "images"), *videos = json_get(p, "videos");
    if ((images && images->kind == J_ARR && images->len) || (videos && videos->kind == J_ARR && videos->len)) {
        err_kind(e, "unsupported", "read images or video", "a text-only engine");
        return 0;
    }
    return id_list(json_get(p, "ids"), "args.prompt.ids", ids, n, e);
}

object *handle_of(const request *r, const char *name, int kind, sbuf *e) {
    int64_t h;
    char field[64];
    snprintf(field, sizeof field, "args.%s", name);
    if (!arg_int(r, name, &h, 0, NULL, e)) return NULL;
    if (h < 1 || (size_t)h > H.n_objs || !H.objs[h - 1] || (kind && H.objs[h - 1]->kind != kind)) {
        err_field(e, field, kind == 2 ? "not a snapshot this harness holds" : "not a handle this harness holds");
        return NULL;
    }
    return H.objs[h - 1];
}

int64_t new_handle(object *o) {
    H.objs = realloc(H.objs, (H.n_objs + 1) * sizeof *H.objs);
    H.objs[H.n_objs++] = o;
    return (int64_t)H.n_objs;
}

void release(int64_t h) {
    if (h < 1 || (size_t)h > H.n_objs || !H.objs[h - 1]) return;
    object *o = H.objs[h - 1];
    if (o->ctx) llama_free(o->ctx);
    free(o->state);
    free(o);
    H.objs[h - 1] = NULL;
}
