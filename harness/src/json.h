/* A small JSON reader (a tree) and writer (a growing buffer), enough for the wire's headers (docs/wire.md).
 * Strings are decoded to UTF-8 (\uXXXX escapes and surrogate pairs included); numbers keep their double
 * value and, when integral, their int64 value. No dependencies beyond libc. */
#ifndef ORACLES_JSON_H
#define ORACLES_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jkind;

typedef struct jval {
    jkind kind;
    bool b;
    double num;
    int64_t i;           /* the number as an integer (when is_int) */
    bool is_int;
    char *str;           /* J_STR: NUL-terminated UTF-8 (may hold NUL bytes: see len) */
    size_t len;          /* J_STR: bytes; J_ARR/J_OBJ: items */
    struct jval **items; /* J_ARR: values; J_OBJ: values (keys beside) */
    char **keys;         /* J_OBJ */
} jval;

/* Parse `n` bytes; NULL on error with `err` (a static message) and `*at` the byte offset. */
jval *json_parse(const char *text, size_t n, const char **err, size_t *at);
void json_free(jval *v);
/* Member `key` of an object (NULL when absent or not an object). */
const jval *json_get(const jval *obj, const char *key);

/* A growing byte buffer. */
typedef struct { char *data; size_t len, cap; } sbuf;
void sb_init(sbuf *b);
void sb_free(sbuf *b);
void sb_put(sbuf *b, const char *s, size_t n);
void sb_puts(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* `n` bytes as a JSON string: quoted, escaped; invalid UTF-8 replaced by U+FFFD per maximal subpart
 * (what Python's bytes.decode("utf-8", "replace") does). */
void sb_json_str(sbuf *b, const char *s, size_t n);

#endif
