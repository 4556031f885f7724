// The dapod dashboard: one page with hash routes.
//   #/jobs                       job list (polled every 2 s while shown)
//   #/new                        upload a dataset and start a job
//   #/jobs/{id}                  live charts (SSE), controls, event log, checkpoints
//   #/jobs/{id}/rollouts/{step}  rollout viewer
// Everything from the daemon is put in the page as text (textContent), never as HTML.

import {
  api, ApiError, download, getKey, jsonLines, onKeyChange, setKey, setKeyPrompt, uploadFile,
} from './api.js';
import { MetricSeries, StepChart, chartsFor, loadUplot } from './charts.js';
import { fmtBytes, fmtNumber as fmt, fmtProgress, fmtStep } from './format.js';
import { followEvents } from './sse.js';

// ---- small DOM helpers ----

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function fmtTime(t) {
  if (!t) return '–';
  return new Date(t * 1000).toLocaleString(undefined, { dateStyle: 'short', timeStyle: 'medium' });
}

function badge(status) {
  return h('span', { class: `badge st-${status}`, text: status });
}

function toast(msg, kind = 'info') {
  const t = document.getElementById('toast');
  t.textContent = msg;
  t.className = `toast ${kind}`;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 5000);
}

function errorBox(e) {
  const box = h('div', { class: 'alert error' }, h('strong', { text: e.problem && e.problem.title ? e.problem.title : 'Error' }), ' ', e.message || String(e));
  return box;
}

// ---- the API key dialog ----

function setupKey() {
  const dlg = document.getElementById('key-dialog');
  const input = document.getElementById('key-input');
  const err = document.getElementById('key-error');
  const state = document.getElementById('key-state');
  const forget = document.getElementById('key-forget');
  let resolver = null;
  const show = (msg) => {
    err.hidden = !msg;
    err.textContent = msg || '';
    input.value = '';
    if (!dlg.open) dlg.showModal();
    input.focus();
  };
  document.getElementById('key-form').addEventListener('submit', () => {
    setKey(input.value.trim());
    if (resolver) { resolver(); resolver = null; }
  });
  dlg.addEventListener('cancel', (ev) => { if (resolver) ev.preventDefault(); });
  setKeyPrompt((msg) => new Promise((resolve) => { resolver = resolve; show(msg); }));
  document.getElementById('key-change').addEventListener('click', () => show(''));
  forget.addEventListener('click', () => { setKey(''); route(); });
  const paint = (k) => {
    state.textContent = k ? 'API key set' : 'no API key';
    forget.hidden = !k;
  };
  onKeyChange(paint);
  paint(getKey());
}

// ---- routing ----

let cleanup = [];
function onLeave(f) { cleanup.push(f); }

function route() {
  cleanup.forEach((f) => { try { f(); } catch (e) { /* ignore */ } });
  cleanup = [];
  const hash = location.hash.replace(/^#/, '') || '/jobs';
  const parts = hash.split('/').filter(Boolean);
  const view = document.getElementById('view');
  view.replaceChildren();
  document.querySelectorAll('[data-nav]').forEach((a) => a.classList.toggle('active',
    (parts[0] === 'new' && a.dataset.nav === 'new') || (parts[0] === 'jobs' && a.dataset.nav === 'jobs')));
  if (parts[0] === 'new') return viewNew(view);
  if (parts[0] === 'jobs' && parts[1] && parts[2] === 'rollouts') return viewRollouts(view, parts[1], parts[3]);
  if (parts[0] === 'jobs' && parts[1]) return viewJob(view, parts[1]);
  return viewJobs(view);
}

// ---- job list ----

function viewJobs(view) {
  document.title = 'Jobs · dapod';
  const tbody = h('tbody');
  const info = h('p', { class: 'muted', id: 'jobs-info' });
  view.append(
    h('div', { class: 'page-head' }, h('h1', { text: 'Jobs' }), h('a', { class: 'button primary', href: '#/new', text: 'New job' })),
    h('div', { class: 'card flush' }, h('table', { class: 'table', id: 'jobs-table' },
      h('thead', {}, h('tr', {}, ['Job', 'Model', 'Method', 'Status', 'Progress', 'Reward / loss', 'Accuracy', 'Created'].map((t) => h('th', { text: t, class: ['Reward / loss', 'Accuracy'].includes(t) ? 'num' : null })))),
      tbody)),
    info);
  let timer = null;
  let stopped = false;
  const load = async () => {
    try {
      const list = await api('GET', '/v1/jobs?limit=100');
      tbody.replaceChildren(...list.data.map(jobRow));
      if (!list.data.length) tbody.append(h('tr', {}, h('td', { colspan: 8, class: 'empty' }, 'No jobs yet. ', h('a', { href: '#/new', text: 'Start one' }), '.')));
      info.textContent = `${fmt(list.data.length)} job${list.data.length === 1 ? '' : 's'}${list.has_more ? ' (newest 100 shown)' : ''} · updated ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      info.replaceChildren(errorBox(e));
    }
    if (!stopped) timer = setTimeout(load, 2000);
  };
  load();
  onLeave(() => { stopped = true; clearTimeout(timer); });
}

// A job's headline figures as [label, value]: a DAPO job's reward and accuracy, a supervised
// job's loss and token accuracy, a DPO job's loss and preference accuracy.
function headline(method, m) {
  if (method === 'supervised') return [['Loss', m['train/loss']], ['Token accuracy', m['train/mean_token_accuracy']]];
  if (method === 'dpo') return [['Loss', m['train/loss']], ['Preference accuracy', m['rewards/accuracy']]];
  return [['Reward', m['reward/mean']], ['Accuracy', m.accuracy]];
}

function jobRow(j) {
  const m = j.latest_metrics || {};
  const [[, first], [, second]] = headline(j.method, m);
  const pct = j.total_steps ? Math.round((100 * (j.step || 0)) / j.total_steps) : 0;
  return h('tr', { dataset: { job: j.id, status: j.status } },
    h('td', {}, h('a', { href: `#/jobs/${j.id}`, class: 'mono', text: j.id }), j.suffix ? h('div', { class: 'muted small', text: j.suffix }) : null),
    h('td', { text: j.model }),
    h('td', { class: 'small', text: j.method || 'dapo' }),
    h('td', {}, badge(j.status), j.phase ? h('span', { class: 'muted small', text: ` ${j.phase}` }) : null,
      j.progress ? h('span', { class: 'muted small pass-mini', title: fmtProgress(j.progress), text: ` ${j.progress.pass} ${fmtStep(j.progress.done)}/${fmtStep(j.progress.total)}` }) : null,
      j.queue_position ? h('span', { class: 'muted small', text: ` #${j.queue_position}` }) : null),
    h('td', {}, h('div', { class: 'progress' }, h('div', { class: 'bar', dataset: { pct: String(pct) } })),
      h('span', { class: 'small', text: `${fmtStep(j.step || 0)} / ${fmtStep(j.total_steps)}` })),
    h('td', { class: 'num', text: fmt(first) }),
    h('td', { class: 'num', text: fmt(second) }),
    h('td', { class: 'small', text: fmtTime(j.created_at) }));
}

// Progress bars: the width comes from data-pct (no inline styles under the page's CSP).
const observer = new MutationObserver(() => {
  document.querySelectorAll('.progress .bar[data-pct]').forEach((b) => {
    b.style.width = `${b.dataset.pct}%`;
    b.removeAttribute('data-pct');
  });
});

// ---- new job ----

// The knobs shown first for each method; the rest of the method's are under "All hyperparameters".
const COMMON = {
  dapo: ['total_steps', 'group_size', 'prompt_batch_size', 'max_new_tokens', 'learning_rate', 'temperature', 'checkpoint_every'],
  supervised: ['epochs', 'batch_size', 'learning_rate', 'lr_schedule', 'max_sequence_tokens', 'checkpoint_every'],
  dpo: ['epochs', 'batch_size', 'beta', 'learning_rate', 'lr_schedule', 'checkpoint_every'],
};
const METHODS = [
  ['dapo', 'dapo — reinforcement learning from a judge\'s rewards (DAPO / GRPO)'],
  ['supervised', 'supervised — fine-tuning on demonstrations (SFT)'],
  ['dpo', 'dpo — preferences between two responses (DPO)'],
];
const DATA_HINT = {
  dapo: 'JSON Lines: one object a line with "prompt" (or chat "messages") and "answer"; optional "id" and "metadata".',
  supervised: 'JSON Lines: {"prompt", "completion"} or chat {"messages"} whose assistant messages (weight 1, the default) are trained.',
  dpo: 'JSON Lines: {"input": {"messages"}, "preferred_output": [...], "non_preferred_output": [...]} (OpenAI) or {"prompt", "chosen", "rejected"} (TRL).',
};

async function viewNew(view) {
  document.title = 'New job · dapod';
  view.append(h('div', { class: 'page-head' }, h('h1', { text: 'New job' })));
  let models; let files; let table;
  try {
    [models, files, table] = await Promise.all([
      api('GET', '/v1/models?limit=100'),
      api('GET', '/v1/files?limit=100'),
      fetch('hyperparameters.json').then((r) => r.json()),
    ]);
  } catch (e) {
    view.append(errorBox(e));
    return;
  }
  const form = h('form', { id: 'job-form', novalidate: true, class: 'job-form' });
  const fields = new Map(); // API field name -> { input, err }
  const field = (name, label, input, hint) => {
    const err = h('div', { class: 'field-error', hidden: true, dataset: { errorFor: name } });
    const id = `f-${name.replace(/[^a-z0-9]/gi, '-')}`;
    input.id = id;
    input.dataset.field = name;
    fields.set(name, { input, err });
    return h('div', { class: 'field' }, h('label', { for: id, text: label }), input,
      hint ? h('div', { class: 'hint', text: hint }) : null, err);
  };

  // method: which knobs, whether a judge
  const methodSelect = h('select', { name: 'method' }, METHODS.map(([v, t]) => h('option', { value: v, text: t })));
  const dataHint = h('p', { class: 'muted', id: 'data-hint', text: DATA_HINT.dapo });

  // dataset
  const fileSelect = h('select', { name: 'training_file' });
  const valSelect = h('select', { name: 'validation_file' });
  // the files that fit the method chosen: the upload check lists the methods a file fits (methods);
  // without that list a valid file is a DAPO dataset
  const fits = (f, m) => (Array.isArray(f.methods) ? f.methods.includes(m) : m === 'dapo' && f.validation === 'valid');
  const fillFiles = (selected) => {
    const valid = files.data.filter((f) => fits(f, methodSelect.value)).reverse(); // status is OpenAI's
    const opts = () => valid.map((f) => h('option', { value: f.id, text: `${f.filename} · ${fmt(f.n_items)} items · ${f.id}` }));
    const keepVal = valSelect.value;
    fileSelect.replaceChildren(h('option', { value: '', text: valid.length ? '— choose an uploaded file —' : '— upload a file first —' }), ...opts());
    valSelect.replaceChildren(h('option', { value: '', text: 'none (no evaluation)' }), ...opts());
    if (selected) fileSelect.value = selected;
    valSelect.value = keepVal;
  };
  fillFiles();
  const upInput = h('input', { type: 'file', accept: '.jsonl,.ndjson,application/x-ndjson,application/jsonl', id: 'upload-input' });
  const upResult = h('div', { id: 'upload-result', class: 'upload-result' });
  const upButton = h('button', { type: 'button', id: 'upload-button', text: 'Upload' });
  upButton.addEventListener('click', async () => {
    const f = upInput.files[0];
    upResult.replaceChildren();
    if (!f) { upResult.append(h('div', { class: 'field-error', text: 'Choose a .jsonl file first.' })); return; }
    upButton.disabled = true;
    upButton.textContent = 'Uploading…';
    try {
      const fo = await uploadFile(f);
      if (fits(fo, methodSelect.value)) {
        files.data.push(fo);
        fillFiles(fo.id);
        upResult.append(h('div', { class: 'alert ok' }, `Uploaded ${fo.filename}: ${fmt(fo.n_items)} items, ${fmtBytes(fo.bytes)}. `, h('span', { class: 'mono small', text: fo.id })));
      } else {
        const other = Array.isArray(fo.methods) && fo.methods.length ? ` (it fits ${fo.methods.join(', ')} jobs)` : '';
        upResult.append(h('div', { class: 'alert error' }, h('strong', { text: `${fo.filename} is not a valid dataset for ${methodSelect.value} jobs${other}` }),
          h('ul', {}, (fo.errors || []).slice(0, 20).map((er) => h('li', { text: er.line ? `line ${er.line}: ${er.message}` : er.message })))));
      }
    } catch (e) {
      upResult.append(errorBox(e));
    } finally {
      upButton.disabled = false;
      upButton.textContent = 'Upload';
    }
  });

  // model
  const modelSelect = h('select', { name: 'model' },
    models.data.filter((m) => m.status === 'ready').map((m) => h('option', { value: m.id, text: m.kind === 'preset' ? `${m.id} — ${m.description || ''}` : `${m.id} (${m.kind})` })));

  // judge
  const judgeType = h('select', { name: 'judge.type' }, ['exact', 'math', 'regex', 'http'].map((t) => h('option', { value: t, text: t })));
  const pattern = h('input', { type: 'text', placeholder: 'answer: (\\d+)' });
  const url = h('input', { type: 'url', placeholder: 'http://127.0.0.1:8000/judge' });
  const patternField = field('judge.pattern', 'Pattern (first capture group is compared)', pattern);
  const urlField = field('judge.url', 'Judge URL', url, 'POST {job_id, step, items} → {results}; hosts limited by judge_allowed_hosts');
  const syncJudge = () => {
    patternField.hidden = judgeType.value !== 'regex';
    urlField.hidden = judgeType.value !== 'http';
  };
  judgeType.addEventListener('change', syncJudge);
  syncJudge();

  const seed = h('input', { type: 'number', step: '1', min: '0', placeholder: '0' });
  const suffix = h('input', { type: 'text', maxlength: '64', placeholder: 'optional label' });

  // hyperparameters from the daemon's own table
  const knobs = table.data;
  const hpInputs = new Map();
  const hpField = (k) => {
    let input;
    if (k.type === 'boolean') {
      input = h('select', {}, h('option', { value: '', text: `default (${k.default})` }), h('option', { value: 'true', text: 'true' }), h('option', { value: 'false', text: 'false' }));
    } else if (k.choices) {
      input = h('select', {}, h('option', { value: '', text: `default (${k.default})` }), k.choices.map((c) => h('option', { value: c, text: c })));
    } else {
      input = h('input', { type: 'text', inputmode: k.type === 'integer' ? 'numeric' : 'decimal', autocomplete: 'off' });
    }
    hpInputs.set(k.name, { input, knob: k });
    const range = k.minimum !== undefined ? `[${k.minimum}, ${k.maximum}]` : '';
    return field(`hyperparameters.${k.name}`, k.name, input, [k.help, range].filter(Boolean).join(' · '));
  };
  const paintDefaults = () => {
    const grpo = hpInputs.get('algorithm') && hpInputs.get('algorithm').input.value === 'grpo';
    for (const { input, knob } of hpInputs.values()) {
      const d = grpo ? knob.grpo_default : knob.default;
      const text = d === null ? 'derived' : String(d);
      if (input.tagName === 'SELECT') input.options[0].textContent = `default (${text})`;
      else input.placeholder = text;
    }
  };
  const knobFields = new Map(knobs.map((k) => [k.name, hpField(k)]));
  const commonGrid = h('div', { class: 'grid' });
  const otherGrid = h('div', { class: 'grid' });
  const otherCount = h('summary');
  const judgeField = field('judge.type', 'Judge', judgeType);
  // the method's knobs (the daemon's table says whose each is), its data, its judge
  const ofMethod = (k) => !k.methods || k.methods.includes(methodSelect.value);
  const syncMethod = () => {
    const m = methodSelect.value;
    const common = COMMON[m].map((n) => knobs.find((k) => k.name === n)).filter((k) => k && ofMethod(k));
    const other = knobs.filter((k) => ofMethod(k) && !common.includes(k));
    commonGrid.replaceChildren(...common.map((k) => knobFields.get(k.name)));
    otherGrid.replaceChildren(...other.map((k) => knobFields.get(k.name)));
    otherCount.textContent = `All hyperparameters (${other.length} more)`;
    dataHint.textContent = DATA_HINT[m];
    fillFiles(fileSelect.value);
    judgeField.hidden = m !== 'dapo';
    if (m !== 'dapo') { patternField.hidden = true; urlField.hidden = true; } else syncJudge();
  };
  methodSelect.addEventListener('change', syncMethod);
  syncMethod();
  paintDefaults();
  hpInputs.get('algorithm') && hpInputs.get('algorithm').input.addEventListener('change', paintDefaults);

  const general = h('div', { class: 'alert error', id: 'form-error', hidden: true });
  const submit = h('button', { type: 'submit', class: 'primary', id: 'submit-job', text: 'Start job' });

  form.append(
    h('section', { class: 'card' }, h('h2', { text: 'Dataset' }),
      dataHint,
      h('div', { class: 'row' }, upInput, upButton), upResult,
      h('div', { class: 'grid' }, field('training_file', 'Training file', fileSelect),
        field('validation_file', 'Validation file', valSelect, 'evaluated every eval_every steps (eval/accuracy on the reward chart)'))),
    h('section', { class: 'card' }, h('h2', { text: 'Method, model and judge' }),
      h('div', { class: 'grid' }, field('method', 'Method', methodSelect), field('model', 'Base model', modelSelect), judgeField, patternField, urlField,
        field('seed', 'Seed', seed), field('suffix', 'Suffix', suffix))),
    h('section', { class: 'card' }, h('h2', { text: 'Hyperparameters' }),
      h('p', { class: 'muted', text: 'Empty fields take the default shown.' }), commonGrid,
      h('details', { id: 'all-knobs' }, otherCount, otherGrid)),
    general,
    h('div', { class: 'actions' }, submit));
  view.append(form);

  const clearErrors = () => {
    for (const { input, err } of fields.values()) { err.hidden = true; err.textContent = ''; input.classList.remove('invalid'); }
    general.hidden = true;
    general.replaceChildren();
  };
  const showError = (name, msg) => {
    let f = fields.get(name);
    if (!f && name.startsWith('judge')) f = fields.get('judge.type');
    if (!f) return false;
    f.err.textContent = msg;
    f.err.hidden = false;
    f.input.classList.add('invalid');
    const det = f.input.closest('details');
    if (det) det.open = true;
    return true;
  };

  // the same checks the daemon makes on each knob alone (bounds, types); cross-field rules are
  // the daemon's, shown next to the field from its 422
  const build = () => {
    const errs = [];
    const method = methodSelect.value;
    const body = { model: modelSelect.value, training_file: fileSelect.value };
    if (method === 'dapo') body.judge = { type: judgeType.value };
    else body.method = method;
    if (!body.training_file) errs.push(['training_file', 'choose or upload a training file']);
    if (!body.model) errs.push(['model', 'choose a model']);
    if (valSelect.value) body.validation_file = valSelect.value;
    if (method === 'dapo' && judgeType.value === 'regex') {
      if (!pattern.value) errs.push(['judge.pattern', 'a regex judge needs a pattern']);
      body.judge.pattern = pattern.value;
    }
    if (method === 'dapo' && judgeType.value === 'http') {
      if (!/^https?:\/\/./.test(url.value)) errs.push(['judge.url', 'an http(s) URL']);
      body.judge.url = url.value;
    }
    if (seed.value !== '') {
      if (!/^\d+$/.test(seed.value)) errs.push(['seed', 'a whole number ≥ 0']);
      else body.seed = Number(seed.value);
    }
    if (suffix.value) body.suffix = suffix.value;
    const hp = {};
    for (const [name, { input, knob }] of hpInputs) {
      if (!ofMethod(knob)) continue; // another method's: not shown, not sent
      const raw = input.value.trim();
      if (raw === '') continue;
      const f = `hyperparameters.${name}`;
      if (knob.type === 'boolean') { hp[name] = raw === 'true'; continue; }
      if (knob.choices) { hp[name] = raw; continue; }
      if (knob.type === 'integer' ? !/^-?\d+$/.test(raw) : !/^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(raw)) {
        errs.push([f, knob.type === 'integer' ? 'expected an integer' : 'expected a number']);
        continue;
      }
      const v = Number(raw);
      if (v < knob.minimum || v > knob.maximum) {
        errs.push([f, `${raw} not in [${knob.minimum}, ${knob.maximum}]`]);
        continue;
      }
      hp[name] = v;
    }
    body.hyperparameters = hp;
    return { body, errs };
  };

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    clearErrors();
    const { body, errs } = build();
    if (errs.length) {
      errs.forEach(([n, m]) => showError(n, m));
      general.hidden = false;
      general.append(`Fix the ${errs.length} highlighted field${errs.length > 1 ? 's' : ''}.`);
      const first = form.querySelector('.invalid');
      if (first) first.focus();
      return;
    }
    submit.disabled = true;
    try {
      const job = await api('POST', '/v1/jobs', body);
      toast(`Job ${job.id} created`, 'ok');
      location.hash = `#/jobs/${job.id}`;
    } catch (e) {
      general.hidden = false;
      general.append(h('strong', { text: e.problem.title || 'Error' }), ' ', e.message);
      const rest = e.errors.filter((er) => !showError(er.field || '', er.message));
      if (rest.length) general.append(h('ul', {}, rest.map((er) => h('li', { text: `${er.field || er.line || ''}: ${er.message}` }))));
      const first = form.querySelector('.invalid');
      if (first) first.focus();
    } finally {
      submit.disabled = false;
    }
  });
}

// ---- job page ----

function describeEvent(ev, method) {
  const d = ev.data || {};
  switch (ev.type) {
    case 'status': return `${d.previous || '–'} → ${d.status}${d.error ? `: ${d.error.message}` : ''}`;
    case 'metrics': {
      if (method === 'supervised' || method === 'dpo') {
        const valid = Object.keys(d).some((k) => k.startsWith('valid/'));
        if (method === 'supervised') {
          return valid ? `step ${fmtStep(d.step)} valid: loss ${fmt(d['valid/loss'])}, token accuracy ${fmt(d['valid/mean_token_accuracy'])}`
            : `step ${fmtStep(d.step)}: loss ${fmt(d['train/loss'])}, token accuracy ${fmt(d['train/mean_token_accuracy'])}`;
        }
        return valid ? `step ${fmtStep(d.step)} valid: loss ${fmt(d['valid/loss'])}, preference accuracy ${fmt(d['valid/rewards/accuracy'])}`
          : `step ${fmtStep(d.step)}: loss ${fmt(d['train/loss'])}, preference accuracy ${fmt(d['rewards/accuracy'])}, margin ${fmt(d['rewards/margin'])}`;
      }
      if (Object.keys(d).some((k) => k.startsWith('eval/'))) return `step ${fmtStep(d.step)} eval: accuracy ${fmt(d['eval/accuracy'])}`;
      return `step ${fmtStep(d.step)}: reward ${fmt(d['reward/mean'])}, accuracy ${fmt(d.accuracy)}, groups ${fmt(d['groups/kept'])}/${fmt(d['groups/sampled'])}, ${fmt(d['throughput/gen_tokens_per_s'])} gen tok/s`;
    }
    case 'checkpoint': return `checkpoint of step ${fmtStep(d.step)} (${(d.files || []).length} files)`;
    case 'log': return `${d.level || 'info'}: ${d.message}`;
    case 'end': return `stream ends: ${d.status}`;
    default: return JSON.stringify(d);
  }
}

async function viewJob(view, id) {
  document.title = `${id} · dapod`;
  const abort = new AbortController();
  onLeave(() => abort.abort());
  let job;
  try {
    job = await api('GET', `/v1/jobs/${encodeURIComponent(id)}`);
  } catch (e) {
    view.append(h('div', { class: 'page-head' }, h('h1', { text: 'Job' })), errorBox(e));
    return;
  }
  const statusEl = h('span', { id: 'job-status' });
  const progressBar = h('div', { class: 'bar' });
  const progressText = h('span', { class: 'small', id: 'job-step' });
  // the latest progress report of a long pass of the step under way (progress events)
  const passBar = h('div', { class: 'bar' });
  const passText = h('span', { class: 'small', id: 'job-pass-text' });
  const passBox = h('span', { class: 'pass', id: 'job-pass', hidden: true }, h('div', { class: 'progress' }, passBar), passText);
  const conn = h('span', { class: 'muted small', id: 'stream-state', text: 'connecting' });
  const btn = (action, label, cls = '') => h('button', { type: 'button', class: cls, id: `job-${action}`, text: label, onclick: () => act(action) });
  const buttons = { pause: btn('pause', 'Pause'), resume: btn('resume', 'Resume'), cancel: btn('cancel', 'Cancel', 'danger') };
  const stats = h('div', { class: 'stats' });
  const chartsBox = h('div', { class: 'charts', id: 'charts' });
  const logBody = h('tbody');
  const ckptBox = h('div', { id: 'checkpoints' });
  const errBox = h('div');
  const rolloutsLink = h('a', { class: 'button', href: `#/jobs/${id}/rollouts`, id: 'open-rollouts', text: 'Rollout viewer' });
  const csvButton = h('button', { type: 'button', text: 'Metrics CSV', onclick: () => download(`/v1/jobs/${id}/metrics?format=csv`, `${id}-metrics.csv`).catch((e) => toast(e.message, 'error')) });

  view.append(
    h('div', { class: 'page-head' },
      h('div', {}, h('div', { class: 'crumbs' }, h('a', { href: '#/jobs', text: 'Jobs' }), ' / '), h('h1', { class: 'mono', text: id })),
      h('div', { class: 'row' }, rolloutsLink, csvButton, buttons.pause, buttons.resume, buttons.cancel)),
    h('div', { class: 'card summary' },
      h('div', { class: 'row' }, statusEl, passBox, h('div', { class: 'progress wide' }, progressBar), progressText, conn),
      h('dl', { class: 'meta' },
        h('dt', { text: 'Model' }), h('dd', { text: job.model }),
        h('dt', { text: 'Method' }), h('dd', { id: 'job-method', text: job.method || 'dapo' }),
        h('dt', { text: 'Judge' }), h('dd', { text: job.judge ? job.judge.type : '–' }),
        h('dt', { text: 'Training file' }), h('dd', { class: 'mono', text: job.training_file }),
        h('dt', { text: 'Created' }), h('dd', { text: fmtTime(job.created_at) })),
      errBox, stats),
    chartsBox,
    h('div', { class: 'two' },
      h('section', { class: 'card' }, h('h2', { text: 'Checkpoints' }), ckptBox),
      h('section', { class: 'card' }, h('h2', { text: 'Event log' }),
        h('div', { class: 'log-scroll' }, h('table', { class: 'table compact', id: 'event-log' },
          h('thead', {}, h('tr', {}, ['#', 'Type', 'Event'].map((t) => h('th', { text: t })))), logBody)))));

  const paintJob = (j) => {
    job = j;
    statusEl.replaceChildren(badge(j.status), j.phase ? h('span', { class: 'muted small', text: ` ${j.phase}` }) : '',
      j.queue_position ? h('span', { class: 'muted small', text: ` position ${j.queue_position} in the queue` }) : '');
    const pct = j.total_steps ? (100 * (j.step || 0)) / j.total_steps : 0;
    progressBar.style.width = `${pct}%`;
    progressText.textContent = `step ${fmtStep(j.step || 0)} of ${fmtStep(j.total_steps)}`;
    buttons.pause.disabled = j.status !== 'running';
    buttons.resume.disabled = j.status !== 'paused';
    buttons.cancel.disabled = !['queued', 'running', 'pausing', 'paused'].includes(j.status);
    errBox.replaceChildren();
    if (j.error) errBox.append(h('div', { class: 'alert error' }, h('strong', { text: `${j.error.code} (${j.error.category})` }), ` ${j.error.message}`, j.error.param ? ` · ${j.error.param}` : ''));
    if (j.fine_tuned_model) errBox.append(h('div', { class: 'alert ok' }, 'Fine-tuned model: ', h('span', { class: 'mono', text: j.fine_tuned_model })));
  };
  paintJob(job);

  // A progress event's report beside the phase, until the step's metrics (or its evaluation's)
  // arrive or the job stops running; null clears it.
  const paintPass = (p) => {
    passBox.hidden = !p;
    passText.textContent = p ? fmtProgress(p) : '';
    passBar.style.width = p && p.total ? `${(100 * p.done) / p.total}%` : '0';
  };

  const act = async (action) => {
    try {
      paintJob(await api('POST', `/v1/jobs/${id}/${action}`));
      toast(`${action}: ${job.status}`, 'ok');
    } catch (e) {
      toast(e.message, 'error');
    }
  };

  const paintStats = (m) => {
    const cells = job.method === 'supervised' || job.method === 'dpo' ? [
      ...headline(job.method, m), ['Valid loss', m['valid/loss']],
      ...(job.method === 'dpo' ? [['Margin', m['rewards/margin']]] : [['Tokens trained', m['train/tokens']]]),
      ['Learning rate', m.learning_rate], ['Epoch', m.epoch],
    ] : [
      ...headline(job.method, m), ['Entropy', m.entropy],
      ['Mean length', m['response_length/mean']], ['Groups kept', m['groups/kept'] === undefined ? null : `${fmt(m['groups/kept'])} / ${fmt(m['groups/sampled'])}`],
      ['Gen tokens/s', m['throughput/gen_tokens_per_s']],
    ];
    stats.replaceChildren(...cells.map(([k, v]) => h('div', { class: 'stat' }, h('div', { class: 'stat-label', text: k }), h('div', { class: 'stat-value', text: fmt(v) }))));
  };
  let shown = { ...(job.latest_metrics || {}) };
  paintStats(shown);

  // charts
  const series = new MetricSeries();
  const uPlot = await loadUplot();
  if (abort.signal.aborted) return; // left while the library loaded
  const charts = [];
  if (!uPlot) {
    chartsBox.append(h('div', { class: 'alert warn', id: 'charts-unavailable', text: 'Charts are unavailable: this build has no uPlot (npm was not available when it was built). The numbers are in the event log and under Metrics CSV.' }));
  } else {
    for (const spec of chartsFor(job.method)) {
      const el = h('div', { class: 'chart', id: `chart-${spec.id}`, dataset: { points: '0' } });
      chartsBox.append(h('section', { class: 'card chart-card' }, h('h3', { text: spec.title }), el));
      charts.push(new StepChart(uPlot, el, spec));
    }
    onLeave(() => charts.forEach((c) => c.destroy()));
  }
  let redraw = 0;
  const scheduleRedraw = () => {
    if (redraw) return;
    redraw = requestAnimationFrame(() => { redraw = 0; charts.forEach((c) => c.update(series)); });
  };

  const loadCheckpoints = async () => {
    try {
      const list = await api('GET', `/v1/jobs/${id}/checkpoints`);
      if (!list.data.length) { ckptBox.replaceChildren(h('p', { class: 'muted', text: 'No checkpoints yet.' })); return; }
      ckptBox.replaceChildren(...list.data.slice().reverse().map((c) => h('details', { class: 'ckpt', dataset: { step: String(c.step) }, open: c === list.data[list.data.length - 1] },
        h('summary', {}, h('strong', { text: `step ${fmtStep(c.step)}` }), h('span', { class: 'muted small', text: ` · ${fmtTime(c.created_at)} · ` }), h('span', { class: 'mono small', text: c.model })),
        h('table', { class: 'table compact' }, h('tbody', {}, c.files.map((f) => h('tr', {},
          h('td', { class: 'mono', text: f.name }),
          h('td', { class: 'num small', text: fmtBytes(f.bytes) }),
          h('td', { class: 'mono small muted', title: f.sha256, text: `${f.sha256.slice(0, 12)}…` }),
          h('td', {}, h('button', {
            type: 'button', class: 'link', dataset: { download: `${c.step}/${f.name}` }, text: 'Download',
            onclick: () => download(`/v1/jobs/${id}/checkpoints/${c.step}/${encodeURIComponent(f.name)}`, `${id}-step-${c.step}-${f.name}`).catch((e) => toast(e.message, 'error')),
          })))))))));
    } catch (e) {
      ckptBox.replaceChildren(errorBox(e));
    }
  };
  loadCheckpoints();

  let refresh = null;
  const refreshJob = () => {
    if (refresh) return;
    refresh = setTimeout(async () => {
      refresh = null;
      try { paintJob(await api('GET', `/v1/jobs/${id}`)); } catch (e) { /* next event retries */ }
    }, 150);
  };

  let nlog = 0;
  followEvents(`/v1/jobs/${encodeURIComponent(id)}/events/stream`, {
    signal: abort.signal,
    onState: (s) => { conn.textContent = s === 'live' ? '● live' : s; conn.dataset.state = s; },
    onEvent: (ev) => {
      if (ev.type === 'heartbeat') return;
      // progress is shown beside the phase, not logged: up to 21 reports a pass
      if (ev.type === 'progress') { paintPass(ev.data); return; }
      if (ev.type === 'metrics' || ev.type === 'end' ||
          (ev.type === 'status' && !['running', 'pausing', 'cancelling'].includes(ev.data && ev.data.status))) paintPass(null);
      if (ev.type === 'metrics' && ev.data) {
        series.add(ev.data);
        if (job.method === 'supervised' || job.method === 'dpo') { // a validation event adds to the step's
          shown = { ...shown, ...ev.data };
          paintStats(shown);
        } else if (!Object.keys(ev.data).some((k) => k.startsWith('eval/'))) paintStats(ev.data);
        scheduleRedraw();
        if (ev.data.step > (job.step || 0)) { job.step = ev.data.step; progressText.textContent = `step ${fmtStep(job.step)} of ${fmtStep(job.total_steps)}`; progressBar.style.width = `${(100 * job.step) / job.total_steps}%`; }
      }
      if (ev.type === 'status' || ev.type === 'end') refreshJob();
      if (ev.type === 'checkpoint') loadCheckpoints();
      nlog++;
      logBody.prepend(h('tr', { class: `ev-${ev.type}` }, h('td', { class: 'num muted', text: ev.id === null ? '' : String(ev.id) }),
        h('td', {}, h('span', { class: `tag tag-${ev.type}`, text: ev.type })), h('td', { text: describeEvent(ev, job.method) })));
      while (logBody.children.length > 500) logBody.lastChild.remove();
    },
  });
}

// ---- rollout viewer ----

// An episode (docs/AGENTS.md) as a conversation: the model's turns (its tool calls, or why a call
// could not be read), the tools' answers, the environment's observations with their rewards, and
// how the episode ended; the final answer follows in pre.response, as for a single response.
function conversation(r) {
  const turn = (t, i) => {
    const who = t.role === 'assistant' ? 'model' : t.role === 'tool' ? 'tool' : 'world';
    const parts = [h('span', { class: 'who', text: who })];
    if (t.role === 'assistant') {
      parts.push(h('pre', { class: 'text said', text: t.content === '' ? '∅' : t.content }));
      for (const c of t.tool_calls || []) parts.push(h('div', { class: 'call mono', text: `→ ${c.name}(${JSON.stringify(c.arguments)})` }));
      if (t.malformed) parts.push(h('div', { class: 'call bad', text: `not a call: ${t.malformed}` }));
    } else if (t.role === 'tool') {
      for (const a of t.answers || []) parts.push(h('pre', { class: `text said ${a.status === 'ok' ? '' : 'bad'}`, text: `${a.name ? a.name + ': ' : ''}${a.content}${a.status === 'ok' ? '' : ` [${a.status}]`}` }));
    } else {
      for (const m of t.messages || []) parts.push(h('pre', { class: 'text said', text: `${m.role}: ${m.content}` }));
      if (t.error) parts.push(h('div', { class: 'call bad', text: t.error }));
      if (t.reward !== null && t.reward !== undefined) parts.push(h('span', { class: 'badge reward', text: `reward ${fmt(t.reward)}` }));
      if (t.done) parts.push(h('span', { class: 'badge', text: 'done' }));
    }
    if (t.fits === false) parts.push(h('span', { class: 'badge', text: 'did not fit' }));
    return h('div', { class: `turn ${who}`, dataset: { turn: String(i), role: t.role } }, ...parts);
  };
  return h('div', { class: 'conversation' }, ...r.turns.map(turn),
    h('div', { class: 'ended muted small', text: `ended: ${r.finish_reason}${r.env_reward !== undefined && r.env_reward !== null ? ` · environment reward ${fmt(r.env_reward)}` : ''}` }));
}

async function viewRollouts(view, id, stepParam) {
  document.title = `Rollouts ${id} · dapod`;
  let job;
  try {
    job = await api('GET', `/v1/jobs/${encodeURIComponent(id)}`);
  } catch (e) {
    view.append(errorBox(e));
    return;
  }
  const last = job.step || 0;
  const step = Math.min(Math.max(Number(stepParam) || last, 1), Math.max(last, 1));
  const stepSelect = h('select', { id: 'rollout-step', onchange: () => { location.hash = `#/jobs/${id}/rollouts/${stepSelect.value}`; } },
    Array.from({ length: last }, (_, i) => i + 1).reverse().map((s) => h('option', { value: String(s), text: `step ${fmtStep(s)}`, selected: s === step })));
  const nav = (d) => h('button', { type: 'button', text: d < 0 ? '← previous' : 'next →', disabled: step + d < 1 || step + d > last, onclick: () => { location.hash = `#/jobs/${id}/rollouts/${step + d}`; } });
  const body = h('div', { id: 'rollouts' });
  view.append(
    h('div', { class: 'page-head' },
      h('div', {}, h('div', { class: 'crumbs' }, h('a', { href: '#/jobs', text: 'Jobs' }), ' / ', h('a', { href: `#/jobs/${id}`, class: 'mono', text: id }), ' / '), h('h1', { text: 'Rollouts' })),
      h('div', { class: 'row' }, nav(-1), stepSelect, nav(1))),
    body);
  if (!last) { body.append(h('p', { class: 'muted', text: 'No step has finished yet.' })); return; }
  let rows;
  try {
    rows = await jsonLines(`/v1/jobs/${id}/rollouts?step=${step}`);
  } catch (e) {
    body.append(errorBox(e));
    return;
  }
  const groups = new Map();
  for (const r of rows) {
    if (!groups.has(r.group)) groups.set(r.group, []);
    groups.get(r.group).push(r);
  }
  const kept = [...groups.values()].filter((g) => g.some((r) => r.kept)).length;
  const correct = rows.filter((r) => r.correct).length;
  body.append(h('p', { class: 'muted', id: 'rollout-summary', text: `step ${fmtStep(step)}: ${fmt(groups.size)} groups (${fmt(kept)} kept by dynamic sampling), ${fmt(rows.length)} responses, ${fmt(correct)} correct` }));
  for (const [g, rs] of [...groups.entries()].sort((a, b) => a[0] - b[0])) {
    rs.sort((a, b) => a.index - b.index);
    const first = rs[0];
    const isKept = rs.some((r) => r.kept);
    const nc = rs.filter((r) => r.correct).length;
    body.append(h('section', { class: `card group ${isKept ? 'kept' : 'dropped'}`, dataset: { group: String(g) } },
      h('div', { class: 'group-head' },
        h('h3', { text: `Group ${g}` }),
        h('span', { class: `badge ${isKept ? 'st-succeeded' : 'st-cancelled'}`, text: isKept ? 'kept' : 'dropped' }),
        h('span', { class: 'muted small', text: `${fmt(nc)} / ${fmt(rs.length)} correct` })),
      h('div', { class: 'prompt' }, h('div', { class: 'label', text: 'Prompt' }), h('pre', { class: 'text', text: first.prompt })),
      h('div', { class: 'prompt' }, h('div', { class: 'label', text: 'Answer' }), h('pre', { class: 'text', text: first.answer })),
      h('table', { class: 'table compact responses' },
        h('thead', {}, h('tr', {}, ['#', 'Response', 'Reward', 'Raw', 'Correct', 'Advantage', 'Length', 'Truncated'].map((t) => h('th', { text: t, class: ['#', 'Reward', 'Raw', 'Advantage', 'Length'].includes(t) ? 'num' : null })))),
        h('tbody', {}, rs.map((r) => h('tr', { class: r.correct ? 'correct' : '' },
          h('td', { class: 'num', text: String(r.index) }),
          h('td', {}, r.turns ? conversation(r) : null, h('pre', { class: 'text response', text: r.response === '' ? '∅ (empty)' : r.response })),
          h('td', { class: 'num', text: fmt(r.reward) }),
          h('td', { class: 'num muted', text: fmt(r.reward_raw) }),
          h('td', { text: r.correct ? '✓' : '✗' }),
          h('td', { class: `num ${r.advantage > 0 ? 'pos' : r.advantage < 0 ? 'neg' : ''}`, text: fmt(r.advantage) }),
          h('td', { class: 'num', text: fmt(r.length) }),
          h('td', { text: r.truncated ? 'yes' : 'no' })))))));
  }
}

// ---- start ----

setupKey();
observer.observe(document.getElementById('view'), { childList: true, subtree: true });
window.addEventListener('hashchange', route);
route();
