/* Unit checks of api/ pieces that the HTTP tests see only indirectly: the error registry (rows in
 * enum order, unique stable names, statuses in their class) and the streamed replies' output
 * buffer (bytes out in order in any piece size, appends between takes, the cap). */
#include <string.h>

#include "check.h"
#include "errors.h"
#include "outbuf.h"

static void check_registry(void) {
  CHECK(api_err_count() == API_ERR_COUNT);
  for (int i = 0; i < api_err_count(); i++) {
    const struct api_err_row *r = api_err_get(i);
    CHECK_MSG((int)r->code == i, "row %d holds code %d", i, (int)r->code);
    CHECK(api_err_row(r->code) == r);
    CHECK(api_err_find(r->name) == r);
    CHECK(r->http_status >= 400 && r->http_status <= 599);
    CHECK(r->title && r->title[0] && r->hint && r->hint[0]);
    for (const char *p = r->name; *p; p++) CHECK((*p >= 'a' && *p <= 'z') || *p == '_');
  }
  CHECK(api_err_row(API_ERR_COUNT)->http_status == 500);
  CHECK(api_err_find("nope") == NULL);
  CHECK(api_err_row(API_ERR_NOT_FOUND)->http_status == 404);
  CHECK(api_err_row(API_ERR_VALIDATION_FAILED)->http_status == 422);
  CHECK(!strcmp(api_err_row(API_ERR_PAYLOAD_TOO_LARGE)->name, "payload_too_large"));
}

static void check_outbuf(void) {
  static char text[10000], got[sizeof text];
  for (size_t i = 0; i < sizeof text; i++) text[i] = (char)('a' + i % 26);
  for (size_t piece = 1; piece <= 9000; piece = piece * 3 + 1) {
    struct api_outbuf b;
    api_outbuf_init(&b, 1 << 20);
    char none[4];
    CHECK(api_outbuf_take(&b, none, sizeof none) == 0); /* empty, nothing allocated */
    size_t in = 0, out = 0;
    /* appends of 700 bytes interleaved with takes of `piece` bytes */
    while (out < sizeof text) {
      if (in < sizeof text) {
        size_t n = sizeof text - in < 700 ? sizeof text - in : 700;
        CHECK(api_outbuf_add(&b, text + in, n) == 0);
        in += n;
      }
      size_t n = api_outbuf_take(&b, got + out, piece);
      CHECK(n == (in - out < piece ? in - out : piece));
      out += n;
      CHECK(api_outbuf_pending(&b) == in - out);
    }
    CHECK_MSG(!memcmp(got, text, sizeof text), "pieces of %zu", piece);
    CHECK(b.off == 0 && b.len == 0); /* drained: starts again at the beginning */
    api_outbuf_deinit(&b);
  }
  /* the cap: 4 KiB doubled up to max, no further; a refused append leaves the buffer as it was */
  struct api_outbuf b;
  api_outbuf_init(&b, 8192);
  CHECK(api_outbuf_add(&b, text, 8000) == 0);
  CHECK(api_outbuf_add(&b, text, 192) == 0);
  CHECK(api_outbuf_add(&b, text, 1) == -1);
  CHECK(api_outbuf_pending(&b) == 8192);
  CHECK(api_outbuf_take(&b, got, sizeof got) == 8192);
  CHECK(api_outbuf_add(&b, text, 8192) == 0); /* room again once taken */
  api_outbuf_deinit(&b);
  CHECK(b.buf == NULL && api_outbuf_pending(&b) == 0);
}

int main(void) {
  check_registry();
  check_outbuf();
  return check_done("test_api_units");
}
