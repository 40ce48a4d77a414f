/* The wire's frames in C (docs/wire.md): read a request from a file descriptor, write a response.
 * A frame: "ORWP", u32 LE header length, u64 LE body length, the JSON header, the arrays' raw bytes. */
#ifndef ORACLES_WIRE_H
#define ORACLES_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"

#define WIRE_PROTOCOL 1
#define WIRE_MAX_HEADER (64u << 20)
#define WIRE_MAX_BODY (8ull << 30)

typedef struct {
    char dtype[4];       /* "f32", "i32", "i64", "u8" */
    int ndim;
    int64_t shape[4];
    void *data;
    size_t nbytes;
    int owned;           /* free(data) once written */
} warray;

typedef struct {
    jval *header;        /* the parsed header */
    int64_t id;
    const char *call;
    const jval *args;    /* may be NULL */
    uint8_t *body;
    warray *arrays;      /* views into body */
    size_t n_arrays;
} request;

/* 1: a request; 0: EOF before one; -1: a broken frame (err says what). */
int wire_read(int fd, request *r, char *err, size_t errlen);
void wire_request_free(request *r);

/* A response under construction: the result's JSON text and its arrays. */
typedef struct {
    sbuf result;
    warray *arrays;
    size_t n_arrays, cap;
} response;

void resp_init(response *r);
void resp_free(response *r);
/* Append an array (taking `data` when owned) and write {"array": i} into the result. */
void resp_array(response *r, const char *dtype, int ndim, const int64_t *shape, void *data, size_t nbytes, int owned);

/* Write the response {"id", "result", "arrays"}, or an error {"id", "error": {...}} (error_json: the object). */
int wire_write_result(int fd, int64_t id, response *r);
int wire_write_error(int fd, int64_t id, const char *error_json);
/* The bytes of a whole result frame, for a fault that writes part of it (caller frees). */
uint8_t *wire_result_bytes(int64_t id, response *r, size_t *n);

#endif
