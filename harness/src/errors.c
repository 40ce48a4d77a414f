/* Error answers of the C harness (docs/wire.md, section 2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* -- errors: each a JSON object written into `e` ------------------------------------------------- */
void err_kind(sbuf *e, const char *kind, const char *capability, const char *why) {
    sb_printf(e, "{\"kind\":\"%s\",\"capability\":", kind);
    sb_json_str(e, capability, strlen(capability));
    sb_puts(e, ",\"why\":");
    sb_json_str(e, why, strlen(why));
    sb_puts(e, ",\"message\":");
    sb_json_str(e, why, strlen(why));
    sb_puts(e, "}");
}
void err_value(sbuf *e, const char *message) { err_kind(e, "value", "", message); }
void err_error(sbuf *e, const char *message) { err_kind(e, "error", "", message); }
void err_field(sbuf *e, const char *field, const char *problem) {
    char m[300];
    snprintf(m, sizeof m, "field %s: %s", field, problem);
    sb_puts(e, "{\"kind\":\"bad_request\",\"field\":");
    sb_json_str(e, field, strlen(field));
    sb_puts(e, ",\"message\":");
    sb_json_str(e, m, strlen(m));
    sb_puts(e, "}");
}
