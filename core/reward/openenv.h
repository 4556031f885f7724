/* Internal to core/reward: the client side of OpenEnv environments' WebSocket sessions
 * (docs/AGENTS.md "Environments"), one socket an episode, through libwebsockets. A client owns
 * one lws context serviced by one thread of its own (lws is not thread-safe): callers on other
 * threads post what they want done, wake the service thread (lws_cancel_service) and wait for
 * the outcome with a deadline. The sockets stay serviced between exchanges, so that the server's
 * pings are answered while an episode's model thinks. Messages are text; what they say is the
 * caller's (env.h reads the replies). */
#ifndef DAPO_OPENENV_H
#define DAPO_OPENENV_H

#include <jansson.h>
#include <stddef.h>

#include "error.h"
#include "judge.h"
#include "outside.h"

struct openenv;

/* A client of the environment at url (a JSON string: ws://host[:port][/path], the path "/ws"
 * when none) with extra handshake headers (an object of strings, or NULL), under pol (the host
 * policy: checked here and again before every connect); field names it in errors. Its service
 * thread starts here. NULL + e on failure. */
struct openenv *openenv_new(const char *field, const json_t *url, const json_t *headers,
                            const struct judge_policy *pol, struct dapo_err *e);
/* Makes every exchange waiting (and every later one) give up at once: the toolbox is stopping.
 * Thread-safe. */
void openenv_abort(struct openenv *oe);
/* Stops the service thread, closes every socket and frees. No exchange may be running (abort
 * them first and wait for their threads). */
void openenv_free(struct openenv *oe);

enum openenv_op {
  OPENENV_OPEN, /* a fresh socket for the session (one open under that id is dropped first) */
  OPENENV_SEND, /* on the session's socket */
  OPENENV_CLOSE /* the message sent, then the socket closed; no reply is read */
};

/* Sends text[0..n) for the session `id` (op says on which socket) and, but for a close, waits
 * for one whole message in reply: OUT_OK with the reply in *reply (owned, NUL-terminated,
 * *reply_n bytes). Otherwise, with what (cap bytes) saying how: OUT_TIMEOUT (nothing within
 * timeout_ms; the socket is dropped), OUT_TOO_LARGE (a reply over max_reply bytes; dropped),
 * OUT_REFUSED (the host policy refused every address), OUT_CONNECT (no connection, a failed
 * handshake, a socket closed or dropped, no open session). A close waits up to timeout_ms for
 * the socket to close and always gives OUT_OK. Thread-safe; one exchange at a time a session. */
enum outside_outcome openenv_call(struct openenv *oe, const char *id, enum openenv_op op,
                                  const char *text, size_t n, long timeout_ms, size_t max_reply,
                                  char **reply, size_t *reply_n, char *what, size_t cap);

#endif
