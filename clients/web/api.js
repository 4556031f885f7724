// The dashboard's API client: every call goes to the daemon that served the page, with
// `Authorization: Bearer <key>` when the user has entered a key (kept in sessionStorage, never
// put in a URL). A 401 asks for the key (once, shared by concurrent calls) and retries.

const KEY_ITEM = 'dapod.apiKey';

export function getKey() {
  return sessionStorage.getItem(KEY_ITEM) || '';
}

export function setKey(k) {
  if (k) sessionStorage.setItem(KEY_ITEM, k);
  else sessionStorage.removeItem(KEY_ITEM);
  keyListeners.forEach((f) => f(getKey()));
}

const keyListeners = [];
export function onKeyChange(f) {
  keyListeners.push(f);
}

// Set by the app: shows the key dialog and resolves when the user saved a key.
let askKey = null;
let pendingAsk = null;
export function setKeyPrompt(f) {
  askKey = f;
}

async function needKey(message) {
  if (!askKey) throw new ApiError(401, { title: 'Unauthorized', detail: message });
  if (!pendingAsk) pendingAsk = askKey(message).finally(() => { pendingAsk = null; });
  return pendingAsk;
}

// A problem+json reply (RFC 9457) or a transport failure.
export class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
    this.errors = (problem && Array.isArray(problem.errors)) ? problem.errors : [];
  }
}

export function authHeaders(extra = {}) {
  const h = { ...extra };
  const k = getKey();
  if (k) h.Authorization = `Bearer ${k}`;
  return h;
}

// fetch() with the key; on 401 asks for a key and tries again (at most 3 times).
export async function rawFetch(path, opts = {}) {
  for (let attempt = 0; ; attempt++) {
    const res = await fetch(path, { ...opts, headers: authHeaders(opts.headers || {}) });
    if (res.status !== 401 || attempt >= 3) return res;
    let detail = 'this daemon needs an API key';
    try { detail = (await res.json()).detail || detail; } catch (e) { /* not JSON */ }
    await needKey(getKey() ? `The key was refused: ${detail}` : 'This daemon needs an API key.');
  }
}

async function problemOf(res) {
  const text = await res.text();
  try { return JSON.parse(text); } catch (e) { return { title: res.statusText, detail: text.slice(0, 300) }; }
}

// JSON in, JSON out; throws ApiError with the problem's fields.
export async function api(method, path, body) {
  const opts = { method, headers: {} };
  if (body !== undefined) {
    opts.headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  const res = await rawFetch(path, opts);
  if (!res.ok) throw new ApiError(res.status, await problemOf(res));
  const ct = res.headers.get('Content-Type') || '';
  return ct.includes('json') ? res.json() : res.text();
}

// Uploads a File as a raw JSON Lines body (streamed by the daemon), returns the file object.
export async function uploadFile(file, purpose = 'fine-tune') {
  const q = new URLSearchParams({ purpose, filename: file.name || 'upload.jsonl' });
  const res = await rawFetch(`/v1/files?${q}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/x-ndjson' },
    body: file,
  });
  if (!res.ok) throw new ApiError(res.status, await problemOf(res));
  return res.json();
}

// JSON Lines (rollouts) as an array of objects.
export async function jsonLines(path) {
  const res = await rawFetch(path);
  if (!res.ok) throw new ApiError(res.status, await problemOf(res));
  const text = await res.text();
  return text.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
}

// Downloads path with the key (fetch + blob + a temporary object URL) as file `name`.
export async function download(path, name) {
  const res = await rawFetch(path);
  if (!res.ok) throw new ApiError(res.status, await problemOf(res));
  const blob = await res.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
  return blob.size;
}
