"""dapod_client: a Python client for dapod's REST API, standard library only (Python >= 3.8).

One module, one class, every endpoint of ``openapi.yaml``::

    from dapod_client import Client, ApiError

    c = Client("http://127.0.0.1:8080", api_key=None, timeout=30)
    f = c.upload_file("tests/data/addition.jsonl")
    job = c.create_job({"model": "tiny", "training_file": f["id"], "judge": {"type": "math"},
                        "hyperparameters": {"total_steps": 5}})
    for ev in c.stream_events(job["id"]):          # reconnects with Last-Event-ID by itself
        if ev.type == "metrics":
            print(ev.data["step"], ev.data.get("reward/mean"))
    c.download_checkpoint(job["id"], 5, "model.safetensors", "model.safetensors")

An agent's episode (a rollouts line with ``turns``, docs/AGENTS.md) reads as chat messages with
:func:`episode_messages` and as text with :func:`format_episode`::

    for row in c.rollouts(job["id"], 5):
        print(format_episode(row))

Errors: every non-2xx reply raises a subclass of :class:`ApiError` carrying the RFC 9457
problem+json fields (``type``, ``name``, ``title``, ``status``, ``detail``, ``errors``);
transport failures raise :class:`ConnectionError_` (a subclass of :class:`DapodError`) and
timeouts :class:`Timeout`.
"""

import http.client
import json
import os
import re
import socket
import ssl
import time
import urllib.parse
import uuid

__all__ = [
    "Client", "Event", "DapodError", "ConnectionError_", "Timeout", "ApiError",
    "BadRequestError", "AuthenticationError", "PermissionDeniedError", "NotFoundError",
    "MethodNotAllowedError", "ConflictError", "PayloadTooLargeError", "UnsupportedMediaTypeError",
    "RangeNotSatisfiableError", "ValidationError", "RateLimitError", "InternalServerError",
    "ServiceUnavailableError", "TERMINAL_STATUSES", "episode_messages", "format_episode",
]

__version__ = "0.1.0"

TERMINAL_STATUSES = ("succeeded", "failed", "cancelled")
PROBLEM_BASE = "https://dapod.dev/problems/"
_EOL = re.compile(rb"\r\n|\r|\n")


# ---- errors ----

class DapodError(Exception):
    """Base of every error this module raises."""


class ConnectionError_(DapodError):
    """The daemon could not be reached, or the connection broke before a reply."""


class Timeout(DapodError):
    """A request (or a wait) took longer than its timeout."""


class ApiError(DapodError):
    """The daemon answered with an error status.

    Attributes: ``status`` (HTTP status), ``type`` (the problem's URI), ``name`` (its stable
    snake_case name, e.g. ``"validation_failed"``), ``title``, ``detail``, ``errors`` (list of
    ``{"field" | "line", "message"}``, empty when none), ``problem`` (the whole problem object,
    extension members such as ``job_status`` included), ``headers`` (reply headers, lower-case
    names).
    """

    def __init__(self, status, problem, headers=None, body=b""):
        self.status = status
        self.problem = problem if isinstance(problem, dict) else {}
        self.type = self.problem.get("type")
        self.name = (self.type[len(PROBLEM_BASE):]
                     if isinstance(self.type, str) and self.type.startswith(PROBLEM_BASE)
                     else None)
        self.title = self.problem.get("title")
        self.detail = self.problem.get("detail")
        self.errors = self.problem.get("errors") or []
        self.headers = headers or {}
        self.body = body
        text = "HTTP %d %s: %s" % (status, self.name or "error",
                                   self.detail or self.title or body[:200].decode("utf-8",
                                                                                  "replace"))
        for e in self.errors:
            where = e.get("field") if "field" in e else e.get("line")
            text += "\n  %s: %s" % (where if where is not None else "-", e.get("message"))
        super().__init__(text)


class BadRequestError(ApiError):
    """400: the request could not be read (invalid_request, invalid_json)."""


class AuthenticationError(ApiError):
    """401: missing or unknown API key."""


class PermissionDeniedError(ApiError):
    """403: the key may not do this."""


class NotFoundError(ApiError):
    """404: no such path or resource (also another key's)."""


class MethodNotAllowedError(ApiError):
    """405."""


class ConflictError(ApiError):
    """409: the resource's state forbids the operation (``job_status`` tells the job's)."""

    @property
    def job_status(self):
        return self.problem.get("job_status")


class PayloadTooLargeError(ApiError):
    """413."""


class UnsupportedMediaTypeError(ApiError):
    """415."""


class RangeNotSatisfiableError(ApiError):
    """416: a download's Range starts past the end of the file."""


class ValidationError(ApiError):
    """422: the body was read but its fields break the rules; ``errors`` lists each one."""


class RateLimitError(ApiError):
    """429: a job limit is reached; ``retry_after`` is the server's hint in seconds."""

    @property
    def retry_after(self):
        try:
            return int(self.headers.get("retry-after", ""))
        except ValueError:
            return None


class InternalServerError(ApiError):
    """500 (and any other 5xx but 503)."""


class ServiceUnavailableError(ApiError):
    """503: not ready, shutting down, out of memory or too many streams."""


_BY_STATUS = {400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError,
              404: NotFoundError, 405: MethodNotAllowedError, 409: ConflictError,
              413: PayloadTooLargeError, 415: UnsupportedMediaTypeError,
              416: RangeNotSatisfiableError, 422: ValidationError, 429: RateLimitError,
              503: ServiceUnavailableError}


def episode_messages(row):
    """An episode's turns (a rollouts line of a job with ``episode``, docs/AGENTS.md) as OpenAI
    chat messages: the model's turns as assistant messages (with ``tool_calls``, the arguments
    as JSON text, ids ``call_<turn>_<k>``), each tool answer as a ``tool`` message with the
    ``tool_call_id`` of the call it answers (a turn that could not call gets a ``tool`` message
    without one), an environment's observations as its messages. The prompt is not included:
    it is the line's ``prompt`` (or ``messages``)."""
    out, calls = [], []
    for k, t in enumerate(row.get("turns") or []):
        if t["role"] == "assistant":
            m = {"role": "assistant", "content": t["content"]}
            calls = ["call_%d_%d" % (k, i) for i in range(len(t.get("tool_calls") or []))]
            if calls:
                m["tool_calls"] = [{"id": cid, "type": "function",
                                    "function": {"name": c["name"],
                                                 "arguments": json.dumps(c["arguments"])}}
                                   for cid, c in zip(calls, t["tool_calls"])]
            out.append(m)
        elif t["role"] == "tool":
            for i, a in enumerate(t.get("answers") or []):
                m = {"role": "tool", "content": a["content"]}
                if i < len(calls):
                    m["tool_call_id"] = calls[i]
                out.append(m)
        else:
            out += [dict(m) for m in t.get("messages") or []]
    return out


def _one_line(text):
    text = text.replace("\n", "\\n")
    return text[:200] + ("..." if len(text) > 200 else "")


def format_episode(row):
    """An episode as text, a line a turn, as ``dapoctl rollouts`` prints it: the model's turns
    and calls, the tools' answers (with their status when not ok), the environment's messages,
    rewards and done, what did not fit, how the episode ended."""
    lines = []
    for t in row.get("turns") or []:
        if t["role"] == "assistant":
            lines.append("      model: " + _one_line(t["content"]))
            for c in t.get("tool_calls") or []:
                lines.append("        -> %s(%s)" % (c["name"], json.dumps(c["arguments"],
                                                                     separators=(",", ":"))))
            if t.get("malformed"):
                lines.append("        (not a call: %s)" % t["malformed"])
        elif t["role"] == "tool":
            for a in t.get("answers") or []:
                lines.append("      tool %s: %s%s" % (a["name"], _one_line(a["content"]),
                                                      "" if a["status"] == "ok"
                                                      else " [%s]" % a["status"]))
        else:
            for m in t.get("messages") or []:
                lines.append("      world %s: %s" % (m["role"], _one_line(m["content"])))
            if t.get("reward") is not None:
                lines.append("        (reward %.4g%s)" % (t["reward"],
                                                       ", done" if t.get("done") else ""))
            elif t.get("done"):
                lines.append("        (done)")
            if t.get("error"):
                lines.append("        (failed: %s)" % t["error"])
        if t.get("fits") is False:
            lines.append("        (did not fit the episode)")
    lines.append("      ended: %s" % row.get("finish_reason"))
    return "\n".join(lines)


def _error_for(status, headers, body):
    try:
        problem = json.loads(body.decode("utf-8")) if body else {}
    except (ValueError, UnicodeDecodeError):
        problem = {}
    cls = _BY_STATUS.get(status) or (InternalServerError if status >= 500 else ApiError)
    return cls(status, problem, headers, body)


# ---- events ----

class Event:
    """One job event: ``id`` (int, per job, increasing), ``type`` (``status``, ``log``,
    ``metrics``, ``checkpoint``, ``end``), ``data`` (dict), ``created_at`` (int, from the event
    list; None from a stream)."""

    __slots__ = ("id", "type", "data", "created_at")

    def __init__(self, id, type, data, created_at=None):  # noqa: A002 (the API's names)
        self.id, self.type, self.data, self.created_at = id, type, data, created_at

    def __repr__(self):
        return "Event(%r, %r, %r)" % (self.id, self.type, self.data)

    def __eq__(self, other):
        return (isinstance(other, Event) and (self.id, self.type, self.data)
                == (other.id, other.type, other.data))


class _Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body.decode("utf-8"))


# ---- the client ----

class Client:
    """A client of one daemon.

    ``base_url``: ``http://host:port`` or ``https://...`` (default ``$DAPOD_URL``, else
    ``http://127.0.0.1:8080``). ``api_key``: sent as ``Authorization: Bearer`` (default
    ``$DAPOD_API_KEY``). ``timeout``: seconds for connecting and for each read of a reply.
    ``ssl_context``: for https (e.g. one that trusts a self-signed certificate).
    Thread-safety: each call opens its own connection, so one Client may be shared by threads.
    """

    def __init__(self, base_url=None, api_key=None, timeout=30.0, ssl_context=None):
        base_url = base_url or os.environ.get("DAPOD_URL") or "http://127.0.0.1:8080"
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("base_url must be http://HOST[:PORT] or https://...: %r" % base_url)
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("DAPOD_API_KEY")
        self.timeout = timeout
        self.ssl_context = ssl_context

    # -- transport --

    def _conn(self, timeout):
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=self.ssl_context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _headers(self, extra=None):
        h = {"Accept": "application/json", "User-Agent": "dapod-client-python/" + __version__}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        h.update(extra or {})
        return h

    @staticmethod
    def _query(path, params):
        q = {k: v for k, v in (params or {}).items() if v is not None}
        for k, v in q.items():
            if isinstance(v, bool):
                q[k] = "true" if v else "false"
        return path + ("?" + urllib.parse.urlencode(q) if q else "")

    def _open(self, method, path, body=None, headers=None, timeout=None):
        """Sends a request; returns (conn, response) with the body unread. Raises Timeout or
        ConnectionError_."""
        t = self.timeout if timeout is None else timeout
        conn = self._conn(t)
        try:
            conn.request(method, self.prefix + path, body=body, headers=self._headers(headers))
            return conn, conn.getresponse()
        except socket.timeout as e:
            conn.close()
            raise Timeout("%s %s: timed out after %s s" % (method, path, t)) from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise ConnectionError_("%s %s: %s" % (method, path, e)) from e

    def _request(self, method, path, body=None, headers=None, timeout=None, ok=(200, 201)):
        conn, resp = self._open(method, path, body, headers, timeout)
        try:
            data = resp.read()
        except socket.timeout as e:
            raise Timeout("%s %s: timed out reading the reply" % (method, path)) from e
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionError_("%s %s: %s" % (method, path, e)) from e
        finally:
            conn.close()
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
        if resp.status not in ok:
            raise _error_for(resp.status, hdrs, data)
        return _Response(resp.status, hdrs, data)

    def _json(self, method, path, obj=None, params=None, headers=None, timeout=None):
        body = None
        h = dict(headers or {})
        if obj is not None:
            body = json.dumps(obj).encode("utf-8")
            h["Content-Type"] = "application/json"
        return self._request(method, self._query(path, params), body, h, timeout).json()

    @staticmethod
    def _id(x):
        """Quotes one path segment (ids come from the daemon; a stray '/' must not escape)."""
        return urllib.parse.quote(str(x), safe="")

    def _pages(self, path, params, limit=100):
        """Yields every item of a paginated list, following next_after."""
        after = None
        while True:
            page = self._json("GET", path, params=dict(params or {}, limit=limit, after=after))
            yield from page["data"]
            if not page.get("has_more"):
                return
            after = page["next_after"]

    # -- health and metrics --

    def healthz(self):
        """GET /healthz: liveness (dict)."""
        return self._json("GET", "/healthz")

    def readyz(self):
        """GET /readyz: readiness; raises ServiceUnavailableError when not ready."""
        return self._json("GET", "/readyz")

    def prometheus_metrics(self):
        """GET /metrics: the Prometheus text exposition (str)."""
        return self._request("GET", "/metrics").body.decode("utf-8")

    # -- files --

    @staticmethod
    def _dataset_body(data):
        if isinstance(data, (bytes, bytearray)):
            return bytes(data), None
        if isinstance(data, str):
            path = data
            f = open(path, "rb")  # streamed by http.client (Content-Length from the size)
            return f, os.path.basename(path)
        return data, None  # a binary file object

    def _dataset(self, endpoint, data, purpose, filename, ok):
        body, name = self._dataset_body(data)
        try:
            headers = {"Content-Type": "application/x-ndjson"}
            if hasattr(body, "fileno"):
                headers["Content-Length"] = str(os.fstat(body.fileno()).st_size - body.tell())
            path = self._query(endpoint, {"purpose": purpose, "filename": filename or name})
            return self._request("POST", path, body, headers, ok=ok).json()
        finally:
            if name is not None:
                body.close()

    def upload_file(self, data, purpose="fine-tune", filename=None):
        """POST /v1/files: uploads a JSON Lines dataset. ``data``: a path (str, streamed from
        disk), bytes, or a binary file object. Returns the file object; an invalid dataset is
        stored too, with ``validation == "invalid"`` and ``errors`` (check it; ``status`` is
        OpenAI's: ``"processed"``, or ``"error"`` for an invalid file)."""
        return self._dataset("/v1/files", data, purpose, filename, (201,))

    def validate_file(self, data, purpose="fine-tune", filename=None):
        """POST /v1/files/validate: the same checks, nothing stored (``file.validation``)."""
        return self._dataset("/v1/files/validate", data, purpose, filename, (200,))

    def list_files(self, limit=None, after=None):
        """GET /v1/files: one page (dict with data, has_more, next_after), oldest first."""
        return self._json("GET", "/v1/files", params={"limit": limit, "after": after})

    def iter_files(self):
        """Every file, following the pages."""
        return self._pages("/v1/files", None)

    def get_file(self, file_id):
        """GET /v1/files/{id}."""
        return self._json("GET", "/v1/files/" + self._id(file_id))

    def file_content(self, file_id):
        """GET /v1/files/{id}/content: the bytes exactly as uploaded."""
        return self._request("GET", "/v1/files/%s/content" % self._id(file_id)).body

    def delete_file(self, file_id):
        """DELETE /v1/files/{id}; ConflictError (file_in_use) while a live job uses it."""
        return self._json("DELETE", "/v1/files/" + self._id(file_id))

    # -- models, judges, completions --

    def list_models(self, limit=None, after=None):
        """GET /v1/models: presets, model folders and checkpoints (one page)."""
        return self._json("GET", "/v1/models", params={"limit": limit, "after": after})

    def iter_models(self):
        return self._pages("/v1/models", None)

    def get_model(self, model_id):
        """GET /v1/models/{id} (a checkpoint's id is ``{job_id}:step-{n}``)."""
        return self._json("GET", "/v1/models/" + self._id(model_id))

    def test_judge(self, judge, items):
        """POST /v1/judges/test: runs a judge spec on sample items (``judge.test`` object)."""
        return self._json("POST", "/v1/judges/test", {"judge": judge, "items": items},
                          timeout=max(self.timeout, 660))

    def completions(self, model, prompt, **kw):
        """POST /v1/completions: ``max_tokens``, ``temperature``, ``top_p``, ``n``, ``seed``,
        ``logprobs`` as keywords."""
        return self._json("POST", "/v1/completions", dict(kw, model=model, prompt=prompt))

    # -- jobs --

    def create_job(self, spec, idempotency_key=None):
        """POST /v1/jobs: creates a job from its spec (dict) and returns the job object.
        ``idempotency_key``: the same key and body return the same job (a retry is safe; pass
        ``True`` for a fresh random key)."""
        h = {}
        if idempotency_key is True:
            idempotency_key = str(uuid.uuid4())
        if idempotency_key:
            h["Idempotency-Key"] = idempotency_key
        return self._json("POST", "/v1/jobs", spec, headers=h)

    def list_jobs(self, status=None, limit=None, after=None):
        """GET /v1/jobs: one page, newest first; ``status`` filters."""
        return self._json("GET", "/v1/jobs",
                          params={"status": status, "limit": limit, "after": after})

    def iter_jobs(self, status=None):
        return self._pages("/v1/jobs", {"status": status})

    def get_job(self, job_id, wait=None):
        """GET /v1/jobs/{id}; ``wait`` (0..600 s) long-polls for a status change."""
        t = None if wait is None else self.timeout + wait
        return self._json("GET", "/v1/jobs/" + self._id(job_id), params={"wait": wait}, timeout=t)

    def wait_job(self, job_id, timeout=None, poll=60):
        """Waits (long-polls) until the job has finished; returns it. Raises Timeout after
        ``timeout`` seconds (None: no limit)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = poll if end is None else min(poll, end - time.monotonic())
            if left <= 0:
                raise Timeout("job %s did not finish within %s s" % (job_id, timeout))
            job = self.get_job(job_id, wait=max(0, int(left)))
            if job["status"] in TERMINAL_STATUSES:
                return job

    def cancel_job(self, job_id):
        """POST /v1/jobs/{id}/cancel; returns the job."""
        return self._json("POST", "/v1/jobs/%s/cancel" % self._id(job_id))

    def pause_job(self, job_id):
        """POST /v1/jobs/{id}/pause; returns the job."""
        return self._json("POST", "/v1/jobs/%s/pause" % self._id(job_id))

    def resume_job(self, job_id):
        """POST /v1/jobs/{id}/resume; returns the job."""
        return self._json("POST", "/v1/jobs/%s/resume" % self._id(job_id))

    def delete_job(self, job_id):
        """DELETE /v1/jobs/{id} (a finished job and its artefacts)."""
        return self._json("DELETE", "/v1/jobs/" + self._id(job_id))

    # -- events --

    def list_events(self, job_id, after=None, limit=None):
        """GET /v1/jobs/{id}/events: one page of event objects (dicts)."""
        return self._json("GET", "/v1/jobs/%s/events" % self._id(job_id),
                          params={"after": after, "limit": limit})

    def iter_events(self, job_id, after=None):
        """Every stored event of the job after ``after`` as Event objects (no waiting)."""
        for e in self._pages("/v1/jobs/%s/events" % self._id(job_id),
                             {"after": after} if after else None):
            yield Event(e["id"], e["type"], e["data"], e.get("created_at"))

    def stream_events(self, job_id, last_event_id=None, reconnect=True, max_failures=20,
                      heartbeats=False, read_timeout=60):
        """Follows GET /v1/jobs/{id}/events/stream and yields Event objects until the job's
        ``end`` event (included).

        A dropped connection is reopened with ``Last-Event-ID`` set to the last event
        yielded, so the events arrive once each, in order, without gaps; a half-received event
        is discarded and comes again. ``max_failures`` reconnects in a row without a new event
        give up with ConnectionError_ (backoff 0.25 s doubling to 4 s). ``read_timeout``:
        seconds without a byte (heartbeats come every ``sse_heartbeat_s``, 15 by default)
        that count as a dropped connection. ``heartbeats=True`` also yields heartbeat events
        (id None). API errors (404, ...) are raised, 503 is retried.
        """
        last = last_event_id
        failures, backoff = 0, 0.25
        path = "/v1/jobs/%s/events/stream" % self._id(job_id)
        while True:
            got = False
            h = {"Accept": "text/event-stream"}
            if last is not None:
                h["Last-Event-ID"] = str(last)
            err = None
            try:
                conn, resp = self._open("GET", path, headers=h, timeout=read_timeout)
                try:
                    if resp.status != 200:
                        body = resp.read()
                        e = _error_for(resp.status, {k.lower(): v for k, v in resp.getheaders()},
                                       body)
                        if resp.status != 503 or not reconnect:
                            raise e
                        err = e
                    else:
                        for ev in self._parse_sse(resp):
                            if ev.id is None:
                                if heartbeats:
                                    yield ev
                                continue
                            if last is not None and ev.id <= last:
                                continue  # defensive: never yield an id twice
                            last, got = ev.id, True
                            yield ev
                            if ev.type == "end":
                                return
                finally:
                    conn.close()
            except (ConnectionError_, Timeout, OSError, http.client.HTTPException) as e:
                err = e
            if not reconnect:
                raise ConnectionError_("event stream of %s closed before its end: %s"
                                       % (job_id, err))
            if not got:
                # Nothing new: a stream opened past the end of a finished job closes at once.
                try:
                    if self.get_job(job_id)["status"] in TERMINAL_STATUSES and err is None:
                        return
                except (ConnectionError_, Timeout):
                    pass
                failures += 1
                if failures >= max_failures:
                    raise ConnectionError_("event stream of %s: %d failures in a row (last: %s)"
                                           % (job_id, failures, err))
                time.sleep(backoff)
                backoff = min(4.0, backoff * 2)
            else:
                failures, backoff = 0, 0.25

    @staticmethod
    def _parse_sse(resp):
        """Yields Event objects from an event-stream body (text/event-stream rules: LF, CRLF
        or CR line ends, comments, multi-line data); a trailing half event is dropped."""
        ev_id, ev_type, data = None, None, []
        pending = b""
        while True:
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            if not chunk:
                return
            pending += chunk
            while True:
                m = _EOL.search(pending)
                if not m or (m.group() == b"\r" and m.end() == len(pending)):
                    break  # no whole line yet (a final CR may be half of a CRLF)
                line = pending[:m.start()].decode("utf-8")
                pending = pending[m.end():]
                if line == "":
                    if data or ev_type or ev_id is not None:
                        text = "\n".join(data)
                        yield Event(int(ev_id) if ev_id is not None else None,
                                    ev_type or "message", json.loads(text) if text else None)
                    ev_id, ev_type, data = None, None, []
                    continue
                if line.startswith(":"):
                    continue
                k, _, v = line.partition(":")
                if v.startswith(" "):
                    v = v[1:]
                if k == "data":
                    data.append(v)
                elif k == "event":
                    ev_type = v
                elif k == "id":
                    ev_id = v

    # -- metrics, checkpoints, rollouts --

    def job_metrics(self, job_id):
        """GET /v1/jobs/{id}/metrics: a list of per-step metric dicts."""
        return self._json("GET", "/v1/jobs/%s/metrics" % self._id(job_id))

    def job_metrics_csv(self, job_id):
        """GET /v1/jobs/{id}/metrics?format=csv: the CSV text."""
        return self._request("GET", "/v1/jobs/%s/metrics?format=csv"
                             % self._id(job_id)).body.decode("utf-8")

    def list_checkpoints(self, job_id):
        """GET /v1/jobs/{id}/checkpoints: list of checkpoint objects (step order)."""
        return self._json("GET", "/v1/jobs/%s/checkpoints" % self._id(job_id))["data"]

    def checkpoint_file(self, job_id, step, name):
        """GET /v1/jobs/{id}/checkpoints/{step}/{file}: the bytes (small files)."""
        return self._request("GET", "/v1/jobs/%s/checkpoints/%d/%s"
                             % (self._id(job_id), int(step), self._id(name))).body

    def download_checkpoint(self, job_id, step, name, dest, resume=True, sha256=None):
        """Downloads one checkpoint file to ``dest`` in blocks, resuming a shorter file already
        there with ``Range`` (and ``If-Range`` on the ETag, so a changed file comes whole).
        ``sha256``: when given, the result is checked (DapodError on a mismatch). Returns the
        byte offset the transfer started at."""
        import hashlib
        path = "/v1/jobs/%s/checkpoints/%d/%s" % (self._id(job_id), int(step), self._id(name))
        start = os.path.getsize(dest) if resume and os.path.exists(dest) else 0
        h = {}
        if start:
            h["Range"] = "bytes=%d-" % start
            if sha256:
                h["If-Range"] = '"%s"' % sha256
        conn, resp = self._open("GET", path, headers=h)
        try:
            if resp.status == 416 and start:
                resp.read()
                conn.close()
                return self.download_checkpoint(job_id, step, name, dest, resume=False,
                                                sha256=sha256)
            if resp.status not in (200, 206):
                raise _error_for(resp.status, {k.lower(): v for k, v in resp.getheaders()},
                                 resp.read())
            if resp.status == 200:
                start = 0
            with open(dest, "r+b" if start else "wb") as f:
                f.seek(start)
                while True:
                    block = resp.read(1 << 16)
                    if not block:
                        break
                    f.write(block)
        except socket.timeout as e:
            raise Timeout("%s: timed out" % path) from e
        except (OSError, http.client.HTTPException) as e:
            if isinstance(e, DapodError):
                raise
            raise ConnectionError_("%s: %s" % (path, e)) from e
        finally:
            conn.close()
        if sha256:
            d = hashlib.sha256()
            with open(dest, "rb") as f:
                for block in iter(lambda: f.read(1 << 16), b""):
                    d.update(block)
            if d.hexdigest() != sha256:
                raise DapodError("%s: SHA-256 %s, expected %s" % (dest, d.hexdigest(), sha256))
        return start

    def rollouts(self, job_id, step):
        """GET /v1/jobs/{id}/rollouts?step=N: the step's samples as a list of dicts."""
        body = self._request("GET", "/v1/jobs/%s/rollouts?step=%d"
                             % (self._id(job_id), int(step))).body.decode("utf-8")
        return [json.loads(line) for line in body.splitlines() if line.strip()]
