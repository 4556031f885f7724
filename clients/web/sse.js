// Server-Sent Events over fetch(): EventSource cannot send an Authorization header, so the
// stream is read with a ReadableStream reader and parsed here (id / event / data lines, comments,
// blank line = dispatch). When the connection drops before the `end` event, it reconnects with
// `Last-Event-ID` (the daemon replays every later event first), backing off up to 10 s.

import { authHeaders, getKey } from './api.js';

// Parses SSE text fed in chunks; calls onEvent({id, event, data}) for every complete event.
export class SseParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buf = '';
    this.reset();
  }

  reset() {
    this.id = null;
    this.event = '';
    this.data = [];
  }

  feed(text) {
    this.buf += text;
    let nl;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      let line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + 1);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      this.line(line);
    }
  }

  line(line) {
    if (line === '') {
      if (this.data.length || this.event) {
        this.onEvent({ id: this.id, event: this.event || 'message', data: this.data.join('\n') });
      }
      this.reset();
      return;
    }
    if (line.startsWith(':')) return; // comment (": stream")
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'id') this.id = value;
    else if (field === 'event') this.event = value;
    else if (field === 'data') this.data.push(value);
  }
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  if (signal) signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

// Follows url until the `end` event or until signal aborts. handlers: onEvent(ev) with
// ev.data parsed as JSON, onState(text) for the connection state ('live', 'reconnecting ...').
// Returns the last event id seen.
export async function followEvents(url, { signal, onEvent, onState, lastEventId = null }) {
  let last = lastEventId;
  let backoff = 500;
  let ended = false;
  while (!ended && !signal.aborted) {
    try {
      const headers = authHeaders({ Accept: 'text/event-stream' });
      if (last !== null) headers['Last-Event-ID'] = String(last);
      const res = await fetch(url, { headers, signal, cache: 'no-store' });
      if (res.status === 401 && !getKey()) throw new Error('an API key is needed');
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      onState && onState('live');
      backoff = 500;
      const parser = new SseParser((ev) => {
        if (ev.id !== null && ev.id !== '') last = Number(ev.id);
        let data = null;
        try { data = ev.data ? JSON.parse(ev.data) : null; } catch (e) { data = ev.data; }
        if (ev.event === 'end') ended = true;
        onEvent({ id: ev.id === null ? null : Number(ev.id), type: ev.event, data });
      });
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.feed(value);
      }
    } catch (e) {
      if (signal.aborted) break;
      onState && onState(`reconnecting (${e.message || e})`);
    }
    if (ended || signal.aborted) break;
    onState && onState('reconnecting');
    await sleep(backoff, signal);
    backoff = Math.min(backoff * 2, 10000);
  }
  onState && onState(ended ? 'ended' : 'closed');
  return last;
}
