// Validates recorded HTTP exchanges against openapi.yaml (the contract test's second half;
// tests/api/test_openapi.py records them from a running daemon).
//
// For each exchange {tag, method, target, status, headers, body_b64, request_json?, generic?}:
// - the operation must be documented (path template + method), and so must the status;
// - the response's media type must be one the status documents (a body where none is documented
//   fails), and each required response header must be present and match its schema;
// - the body is validated with Ajv (JSON Schema 2020-12, OpenAPI 3.1's dialect) against the
//   schema of that path/method/status/media type: JSON bodies whole, JSON Lines and Server-Sent
//   Events line by line / event by event against the media type's `x-item-schema`;
// - for a 2xx answer, the query parameters and the JSON request body sent must be accepted by
//   their documented schemas (so the document is not stricter than the daemon).
// `generic` exchanges (404 on an unknown path, 405, OPTIONS) have no operation: their problem
// body is validated against components/schemas/Problem. Finally every operation of the document
// must have been called at least once.
//
// Usage: node validate.mjs OPENAPI.yaml EXCHANGES.jsonl   (exit 0: all valid; 1: failures)
import fs from "node:fs";
import YAML from "yaml";
import Ajv2020Module from "ajv/dist/2020.js";
import addFormatsModule from "ajv-formats";

const Ajv2020 = Ajv2020Module.default || Ajv2020Module;
const addFormats = addFormatsModule.default || addFormatsModule;

// `node validate.mjs --hyperparameters OPENAPI.yaml` prints the document's Hyperparameters
// properties as JSON (the contract test probes their bounds and defaults on the daemon).
if (process.argv[2] === "--hyperparameters") {
  const d = YAML.parse(fs.readFileSync(process.argv[3], "utf8"));
  console.log(JSON.stringify(d.components.schemas.Hyperparameters.properties));
  process.exit(0);
}
// `node validate.mjs --enum SCHEMA PROPERTY OPENAPI.yaml` prints that property's enum as JSON
// (the contract test compares JobError.code's with the daemon's registry of failure codes).
if (process.argv[2] === "--enum") {
  const d = YAML.parse(fs.readFileSync(process.argv[5], "utf8"));
  console.log(JSON.stringify(d.components.schemas[process.argv[3]].properties[process.argv[4]].enum));
  process.exit(0);
}
const [specPath, exchangesPath] = process.argv.slice(2);
if (!specPath || !exchangesPath) {
  console.error("usage: node validate.mjs OPENAPI.yaml EXCHANGES.jsonl");
  process.exit(2);
}

const doc = YAML.parse(fs.readFileSync(specPath, "utf8"));
const DOC_ID = "https://dapod.dev/openapi.json";
// strictSchema: an unknown keyword or format in a schema is an error (Ajv's stylistic strictTypes /
// strictRequired checks are off: they reject valid conditional schemas).
const ajv = new Ajv2020({ strictSchema: true, strictNumbers: true, strictTypes: false,
  strictTuples: false, strictRequired: false, allErrors: true, allowUnionTypes: true });
addFormats(ajv);
// The whole document is added as one schema so that its "#/components/..." references resolve;
// its OpenAPI (non-schema) members are declared as annotations, so that strict mode still
// refuses any unknown keyword inside the schemas themselves.
ajv.addVocabulary(["openapi", "info", "jsonSchemaDialect", "servers", "paths", "webhooks",
  "components", "security", "tags", "externalDocs"]);
ajv.addSchema(doc, DOC_ID);

const METHODS = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];
const ptr = (parts) =>
  "#/" + parts.map((p) => String(p).replace(/~/g, "~0").replace(/\//g, "~1")).join("/");
const compiled = new Map();
function validator(parts) {
  const key = ptr(parts);
  if (!compiled.has(key)) {
    const v = ajv.getSchema(DOC_ID + key);
    if (!v) throw new Error("no schema at " + key);
    compiled.set(key, v);
  }
  return compiled.get(key);
}
function deref(obj) {
  // components/responses, parameters and headers may be $refs
  while (obj && obj.$ref) {
    const parts = obj.$ref.replace(/^#\//, "").split("/").map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"));
    obj = parts.reduce((o, k) => o[k], doc);
  }
  return obj;
}
function refParts(obj, parts) {
  // the pointer of obj after following $refs (for compiling schemas in place)
  while (obj && obj.$ref) {
    parts = obj.$ref.replace(/^#\//, "").split("/").map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"));
    obj = parts.reduce((o, k) => o[k], doc);
  }
  return parts;
}
const errText = (errors) =>
  ajv.errorsText(errors, { separator: "; ", dataVar: "body" }).slice(0, 1500);

// path templates, literal ones first ("/v1/files/validate" before "/v1/files/{file_id}")
const templates = Object.keys(doc.paths)
  .map((t) => ({
    t,
    params: (t.match(/\{[^}]+\}/g) || []).map((p) => p.slice(1, -1)),
    re: new RegExp("^" + t.replace(/[.*+?^$()|[\]\\]/g, "\\$&").replace(/\{[^}]+\}/g, "([^/]+)") + "$"),
  }))
  .sort((a, b) => a.params.length - b.params.length);

function findOperation(method, path) {
  for (const tp of templates) {
    const m = tp.re.exec(path);
    if (!m) continue;
    const item = doc.paths[tp.t];
    const op = item[method];
    if (!op) continue;
    const params = {};
    tp.params.forEach((n, i) => (params[n] = decodeURIComponent(m[i + 1])));
    return { template: tp.t, item, op, params };
  }
  return null;
}

const covered = new Set();
const failures = [];
let checked = 0, items = 0;

function fail(ex, msg) {
  failures.push(`FAIL [${ex.tag}] ${ex.method} ${ex.target} -> ${ex.status}: ${msg}`);
}

function parseSse(text) {
  const events = [];
  let ev = {};
  const lines = text.split(/\r\n|\r|\n/);
  for (const line of lines) {
    if (line === "") {
      if (Object.keys(ev).length) events.push(ev);
      ev = {};
      continue;
    }
    if (line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") ev.data = ev.data === undefined ? value : ev.data + "\n" + value;
    else ev[field] = value;
  }
  if (Object.keys(ev).length) events.push(ev);
  return events;
}

function coerce(schema, raw) {
  // a query value (string) as its schema's type
  const s = deref(schema) || {};
  const t = Array.isArray(s.type) ? s.type : [s.type];
  if ((t.includes("integer") || t.includes("number")) && /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/.test(raw))
    return Number(raw);
  if (t.includes("boolean") && (raw === "true" || raw === "false")) return raw === "true";
  return raw;
}

function checkBody(ex, media, mediaParts, body) {
  const text = body.toString("utf8");
  if (media.schema === undefined) return;
  const schemaParts = refParts(media.schema, [...mediaParts, "schema"]);
  const isJson = (mt) => mt === "application/json" || mt.endsWith("+json");
  const mt = mediaParts[mediaParts.length - 1];
  if (isJson(mt) && !(media.schema && media.schema.type === "string")) {
    let value;
    try {
      value = JSON.parse(text);
    } catch (e) {
      return fail(ex, `body is not JSON (${e.message}): ${text.slice(0, 200)}`);
    }
    const v = validator(schemaParts);
    if (!v(value)) fail(ex, `${mt} body does not match ${ptr(schemaParts)}: ${errText(v.errors)}`);
    else if (mt === "application/problem+json" && value.status !== ex.status)
      fail(ex, `the problem's status ${value.status} is not the HTTP status`);
    return;
  }
  // a text body: the schema (a string) first, then each line / event against x-item-schema
  const v = validator(schemaParts);
  if (!v(text)) fail(ex, `body does not match ${ptr(schemaParts)}: ${errText(v.errors)}`);
  if (!media["x-item-schema"]) return;
  const iv = validator(refParts(media["x-item-schema"], [...mediaParts, "x-item-schema"]));
  if (mt === "text/event-stream") {
    for (const e of parseSse(text)) {
      const item = { type: e.event === undefined ? "message" : e.event };
      if (e.id !== undefined) item.id = /^[0-9]+$/.test(e.id) ? Number(e.id) : e.id;
      try {
        // OpenAI's chat stream ends with `data: [DONE]`, the one data line that is not JSON
        item.data = e.data === "[DONE]" ? e.data : JSON.parse(e.data === undefined ? "" : e.data);
      } catch (err) {
        fail(ex, `event ${JSON.stringify(e).slice(0, 200)}: data is not JSON`);
        continue;
      }
      items++;
      if (!iv(item)) fail(ex, `event ${JSON.stringify(item).slice(0, 300)}: ${errText(iv.errors)}`);
    }
    return;
  }
  const lines = text.replace(/^\uFEFF/, "").split("\n");
  lines.forEach((line, i) => {
    line = line.replace(/\r$/, "");
    if (!line.trim()) return;
    let value;
    try {
      value = JSON.parse(line);
    } catch (e) {
      return fail(ex, `line ${i + 1} is not JSON: ${line.slice(0, 200)}`);
    }
    items++;
    if (!iv(value)) fail(ex, `line ${i + 1}: ${errText(iv.errors)}`);
  });
}

function checkExchange(ex) {
  checked++;
  const headers = ex.headers || {};
  const body = Buffer.from(ex.body_b64 || "", "base64");
  const ctype = headers["content-type"] || "";
  const mt = ctype.split(";")[0].trim().toLowerCase();
  const url = new URL(ex.target, "http://dapod.invalid");
  const method = ex.method.toLowerCase();
  const found = findOperation(method, url.pathname);

  if (ex.generic) {
    if (found) return fail(ex, `marked generic, but ${ex.method} ${found.template} is documented`);
    if (body.length === 0) return;
    // the OpenAI-compatible routes answer even their generic errors in OpenAI's shape
    const oai = /^\/v1\/(fine_tuning|chat)(\/|$)/.test(url.pathname);
    const [want, schema] = oai ? ["application/json", "OaiError"] : ["application/problem+json", "Problem"];
    if (mt !== want) return fail(ex, `generic answer with Content-Type ${ctype}`);
    const v = validator(["components", "schemas", schema]);
    let value;
    try {
      value = JSON.parse(body.toString("utf8"));
    } catch (e) {
      return fail(ex, "error body is not JSON");
    }
    if (!v(value)) fail(ex, `error does not match ${schema}: ${errText(v.errors)}`);
    else if (!oai && value.status !== ex.status) fail(ex, `problem status ${value.status} is not the HTTP status`);
    return;
  }
  if (!found) return fail(ex, `no operation ${ex.method} for ${url.pathname} in the document`);
  const { template, item, op } = found;
  covered.add(`${method} ${template}`);
  const opParts = ["paths", template, method];

  const resp = op.responses[String(ex.status)] || op.responses[`${String(ex.status)[0]}XX`];
  if (!resp) return fail(ex, `status ${ex.status} is not documented for ${ex.method} ${template}`);
  const key = op.responses[String(ex.status)] ? String(ex.status) : `${String(ex.status)[0]}XX`;
  const respParts = refParts(resp, [...opParts, "responses", key]);
  const r = deref(resp);

  // required headers
  for (const [name, h0] of Object.entries(r.headers || {})) {
    const h = deref(h0);
    const value = headers[name.toLowerCase()];
    if (value === undefined) {
      if (h.required) fail(ex, `required header ${name} is missing`);
      continue;
    }
    const hp = refParts(h0, [...respParts, "headers", name]);
    if (h.schema) {
      const hv = validator([...hp, "schema"]);
      if (!hv(value)) fail(ex, `header ${name}: ${JSON.stringify(value)}: ${errText(hv.errors)}`);
    }
  }

  // the body
  const noBody = method === "head" || ex.status === 304 || ex.status === 204;
  if (noBody) {
    if (body.length) fail(ex, `a ${ex.method} ${ex.status} answer has a body`);
  } else if (!r.content) {
    if (body.length) fail(ex, `status ${ex.status} documents no body, got ${body.length} bytes of ${ctype}`);
  } else {
    const media = r.content[mt];
    if (!media)
      fail(ex, `media type ${JSON.stringify(mt)} is not documented (documented: ${Object.keys(r.content).join(", ")})`);
    else checkBody(ex, media, [...respParts, "content", mt], body);
    const cl = headers["content-length"];
    if (cl !== undefined && Number(cl) !== body.length)
      fail(ex, `Content-Length ${cl} but ${body.length} body bytes`);
  }

  if (ex.status < 200 || ex.status > 299) return;
  // a successful request must fit the documented parameters and request body
  const params = [];
  const add = (arr, base) =>
    (arr || []).forEach((p, i) => params.unshift({ p: deref(p), parts: refParts(p, [...base, "parameters", i]) }));
  add(item.parameters, ["paths", template]);
  add(op.parameters, opParts); // operation-level first: they override path-level ones
  const check = (where, name, raw) => {
    // a deepObject parameter (`metadata[k]=v`): the value against its additionalProperties
    const deep = /^([^[\]]+)\[([^\]]*)\]$/.exec(name);
    const obj = deep && params.find((x) => x.p.in === where && x.p.name === deep[1] && x.p.style === "deepObject");
    if (obj) {
      const dv = validator([...obj.parts, "schema", "additionalProperties"]);
      if (!dv(raw)) fail(ex, `${where} parameter ${name}=${raw}: ${errText(dv.errors)}`);
      return;
    }
    const entry = params.find((x) => x.p.in === where && x.p.name === name);
    if (!entry) return fail(ex, `${where} parameter ${name} is not documented`);
    const pv = validator([...entry.parts, "schema"]);
    if (!pv(coerce(entry.p.schema, raw))) fail(ex, `${where} parameter ${name}=${raw}: ${errText(pv.errors)}`);
  };
  for (const [name, raw] of url.searchParams) check("query", name, raw);
  for (const [name, raw] of Object.entries(found.params)) check("path", name, raw);
  if (ex.request_content_type !== undefined) {
    // a raw body: its media type must be documented; a dataset the daemon judged valid must
    // match the media type's x-item-schema line by line
    const rmt = ex.request_content_type.split(";")[0].trim().toLowerCase();
    const rb = deref(op.requestBody);
    if (!rb || !rb.content[rmt]) return fail(ex, `request media type ${rmt} is not documented`);
    const itemSchema = rb.content[rmt]["x-item-schema"];
    let verdict = null;
    try {
      // a stored file's check is `validation` (its `status` is OpenAI's); a dry run's is `status`
      const answer = JSON.parse(body.toString("utf8"));
      verdict = answer.object === "file" ? answer.validation : answer.status;
    } catch (e) {}
    if (itemSchema && verdict === "valid") {
      const rbParts = refParts(op.requestBody, [...opParts, "requestBody"]);
      const iv = validator(refParts(itemSchema, [...rbParts, "content", rmt, "x-item-schema"]));
      const text = Buffer.from(ex.request_b64, "base64").toString("utf8").replace(/^\uFEFF/, "");
      text.split("\n").forEach((line, i) => {
        if (!line.trim()) return;
        items++;
        if (!iv(JSON.parse(line))) fail(ex, `request line ${i + 1}: ${errText(iv.errors)}`);
      });
    }
  }
  if (ex.request_json !== undefined) {
    if (!op.requestBody) return fail(ex, "a JSON body was sent but the operation documents none");
    const rb = deref(op.requestBody);
    const rbParts = refParts(op.requestBody, [...opParts, "requestBody"]);
    if (!rb.content["application/json"]) return fail(ex, "the request body is not documented as application/json");
    const rv = validator([...rbParts, "content", "application/json", "schema"]);
    if (!rv(ex.request_json))
      fail(ex, `the request body the daemon accepted does not match its schema: ${errText(rv.errors)}`);
  }
}

const lines = fs.readFileSync(exchangesPath, "utf8").split("\n").filter((l) => l.trim());
for (const line of lines) {
  const ex = JSON.parse(line);
  try {
    checkExchange(ex);
  } catch (e) {
    fail(ex, `validator error: ${e.stack}`);
  }
}

const operations = [];
for (const [t, item] of Object.entries(doc.paths))
  for (const m of METHODS) if (item[m]) operations.push(`${m} ${t}`);
const missed = operations.filter((o) => !covered.has(o));
for (const o of missed) failures.push(`FAIL operation ${o.toUpperCase().split(" ")[0]} ${o.split(" ")[1]} was never called`);

for (const f of failures) console.log(f);
const summary = `openapi contract: ${checked} responses (${items} lines/events) validated, ` +
  `${operations.length - missed.length} of ${operations.length} operations called, ${failures.length} failures`;
console.log(summary);
process.exit(failures.length ? 1 : 0);
