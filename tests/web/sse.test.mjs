// Unit test of the dashboard's SSE reader (clients/web/sse.js) under Node (label web): the parser
// against hand-written streams cut at every byte, and followEvents() against a scripted server
// that drops the connection mid-stream: the reconnect must send Last-Event-ID with the last id
// seen, every event must arrive exactly once, and the reader must stop after `end`.
// Usage: node sse.test.mjs CLIENTS_WEB_DIR

import { createServer } from 'node:http';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const dir = process.argv[2];
if (!dir) { console.error('usage: node sse.test.mjs CLIENTS_WEB_DIR'); process.exit(2); }
// api.js keeps the key in sessionStorage: a stand-in for Node
const store = new Map([['dapod.apiKey', 'k-123']]);
globalThis.sessionStorage = {
  getItem: (k) => (store.has(k) ? store.get(k) : null),
  setItem: (k, v) => store.set(k, String(v)),
  removeItem: (k) => store.delete(k),
};
const { SseParser, followEvents } = await import(pathToFileURL(join(dir, 'sse.js')).href);

let failed = 0;
function check(cond, msg) {
  console.log(`${cond ? 'ok  ' : 'FAIL'} ${msg}`);
  if (!cond) failed++;
}

// ---- the parser ----
const text = ': stream\n\nid: 1\nevent: status\ndata: {"status":"running"}\n\n'
  + 'event: heartbeat\ndata: {}\n\n'
  + 'id: 2\r\nevent: log\r\ndata: line one\r\ndata: line two\r\n\r\n'
  + 'id:3\nevent:metrics\ndata:{"step":1}\n\n'
  + 'data: no event name\n\n'
  + 'id: 4\nevent: end\ndata: {"status":"succeeded"}\n\n'
  + 'id: 5\nevent: partial\ndata: never dispatched';
const want = [
  { id: '1', event: 'status', data: '{"status":"running"}' },
  { id: null, event: 'heartbeat', data: '{}' },
  { id: '2', event: 'log', data: 'line one\nline two' },
  { id: '3', event: 'metrics', data: '{"step":1}' },
  { id: null, event: 'message', data: 'no event name' },
  { id: '4', event: 'end', data: '{"status":"succeeded"}' },
];
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
let allCuts = true;
for (let cut = 0; cut <= text.length; cut++) {
  const got = [];
  const p = new SseParser((ev) => got.push(ev));
  p.feed(text.slice(0, cut));
  p.feed(text.slice(cut));
  if (!same(got, want)) { allCuts = false; console.log(`cut at ${cut}: ${JSON.stringify(got)}`); break; }
}
check(allCuts, `the parser gives the same ${want.length} events wherever the text is cut (${text.length + 1} cuts)`);
const bytewise = [];
const p2 = new SseParser((ev) => bytewise.push(ev));
for (const ch of text) p2.feed(ch);
check(same(bytewise, want), 'the parser gives them fed one character at a time');

// ---- reconnects ----
const events = Array.from({ length: 6 }, (_, i) => ({ id: i + 1, type: i === 5 ? 'end' : 'metrics', data: { step: i + 1 } }));
const seen = []; // {lastEventId, auth} per connection
const server = createServer((req, res) => {
  const last = req.headers['last-event-id'];
  seen.push({ last: last === undefined ? null : last, auth: req.headers.authorization || null, url: req.url });
  res.writeHead(200, { 'Content-Type': 'text/event-stream' });
  res.write(': stream\n\n');
  const from = last === undefined ? 0 : Number(last);
  const conn = seen.length;
  // 1st connection: events 1-2 then the connection drops; 2nd: 3-4 (event 4 cut in half, so it
  // is lost and must come again), then drops; 3rd: the rest and end
  const rest = events.filter((e) => e.id > from);
  const send = (e) => `id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify(e.data)}\n\n`;
  if (conn === 1) { res.end(rest.slice(0, 2).map(send).join('')); return; }
  if (conn === 2) { res.end(send(rest[0]) + send(rest[1]).slice(0, 12)); return; }
  res.write('event: heartbeat\ndata: {}\n\n');
  res.end(rest.map(send).join(''));
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const url = `http://127.0.0.1:${server.address().port}/v1/jobs/job-x/events/stream`;
const got = [];
const states = [];
const ac = new AbortController();
const timer = setTimeout(() => ac.abort(), 30000);
const last = await followEvents(url, { signal: ac.signal, onEvent: (e) => got.push(e), onState: (s) => states.push(s) });
clearTimeout(timer);
server.close();
const ids = got.filter((e) => e.type !== 'heartbeat').map((e) => e.id);
check(same(ids, [1, 2, 3, 4, 5, 6]), `every event arrives exactly once across two drops (${ids})`);
check(same(seen.map((s) => s.last), [null, '2', '3']), `reconnects send Last-Event-ID of the last whole event (${seen.map((s) => s.last)})`);
check(seen.every((s) => s.auth === 'Bearer k-123'), 'every connection sends the key as a Bearer header');
check(seen.every((s) => !s.url.includes('k-123')), 'the key is in no URL');
check(seen.length === 3 && last === 6 && states[states.length - 1] === 'ended', `it stops after end (3 connections, last id ${last}, state ${states[states.length - 1]})`);
check(got.find((e) => e.id === 3).data.step === 3, 'data is parsed as JSON');

console.log(failed ? `${failed} check(s) failed` : 'all checks passed');
process.exit(failed ? 1 : 0);
