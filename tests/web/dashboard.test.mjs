// Browser test of the dapod dashboard (label web): playwright-core drives Debian's
// /usr/bin/chromium (headless) against a dapod started here on 127.0.0.1 port 0 with a scratch
// data dir and an API key, serving the build's web/ folder (web_dir auto).
//
// The scenario, each step checked against the API itself (Node's fetch with the key):
//  1. / redirects to the dashboard; the job list asks for the key; a wrong key is refused in
//     the dialog, the right one is kept in sessionStorage and sent as a Bearer header (never in
//     a URL, checked over every request the page made).
//  2. New job: an invalid upload lists the API's line errors; a JSONL upload through the form
//     (the file object matches the API's), a bad
//     hyperparameter caught in the browser (no request sent), a cross-field one refused by the
//     daemon and shown next to its field (errors[].field), then a job started from the form.
//  3. Job page: the reward chart gains points as steps finish over SSE: after Pause the chart
//     holds exactly job.step points (the API's), after Resume it gains more; Cancel ends it.
//     The daemon runs with --progress-every-pass, so every pass of the tiny job sends progress
//     events: beside the phase the page shows each report as format.js writes it, in the
//     API's order, cleared by the step's metrics and by the pause (every text the element held,
//     recorded by a MutationObserver from the page's start, against the API's events list);
//     after Resume it shows new reports. The job list shows a running job's `progress`.
//  4. Rollout viewer: groups and responses of the step as the API's rollouts file has them.
//  5. A checkpoint's model.safetensors downloaded from the page (fetch + blob with the key):
//     its SHA-256 equals the checkpoint list's and the bytes the API sends.
//  6. Without uPlot the page says the charts are unavailable.
//  7. An agent's episodes (an environment job against tests/rl/env_server.py, spawned here): the
//     rollout viewer shows each episode as a conversation, turn by turn as the rollouts file
//     has them (the model's text, the world's observations with their rewards, how it ended).
//  8. A supervised job from the form: choosing the method shows its own knobs (epochs,
//     batch_size; no group_size) with their defaults and hides the judge; the job is created
//     with method "supervised" and no judge; its page charts the loss and the token accuracy
//     with one point per step the API lists, its tiles show the last step's loss as format.js
//     writes it, and the job list names the method.
//  9. A DPO job from the form (TRL's prompt/chosen/rejected lines): beta offered with its default; its
//     page charts the loss, the rewards and the preference accuracy, one point per step.
// Numbers read as people read them (clients/web/format.js, imported from --web): the tiles, the
// event log, the chart legend under the cursor and the rollout viewer show the API's values as
// format.js writes them (331,500; 0.0083), and the step axis has whole steps only.
// Screenshots go to --artifacts (printed at the end).
//
// Usage: node dashboard.test.mjs --dapod BUILD/server/dapod --data tests/data/addition.jsonl
//          --invalid tests/data/invalid.jsonl --web clients/web --artifacts DIR
//          --env-server tests/rl/env_server.py

import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { chromium } from 'playwright-core';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
for (const k of ['dapod', 'data', 'invalid', 'web', 'artifacts', 'env-server']) {
  if (!args[k]) { console.error(`usage: --dapod BIN --data FILE --invalid FILE --web CLIENTS_WEB_DIR --artifacts DIR --env-server FILE (missing --${k})`); process.exit(2); }
}
const { fmtNumber, fmtProgress, fmtStep } = await import(pathToFileURL(join(args.web, 'format.js')).href);
// A figure as the page writes it, read back as a number ('331,500' -> 331500).
const num = (t) => Number(String(t).replace(/,/g, ''));
// Whole steps only on a chart's step axis (the ticks uPlot chose, kept in data-step-ticks).
const stepTicks = (page, id) => page.evaluate((i) => document.querySelector(`#chart-${i}`).dataset.stepTicks || '', id);
const wholeTicks = (t) => t !== '' && t.split(' ').every((x) => Number.isInteger(Number(x)));

const KEY = 'dashboard-test-key-7f3a';
const WAIT = 90000; // generous: a loaded 2-core machine, a sanitizer build
const sha256 = (buf) => createHash('sha256').update(buf).digest('hex');
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
let failures = 0;
function check(cond, msg) {
  if (cond) { console.log(`ok   ${msg}`); return; }
  failures++;
  console.log(`FAIL ${msg}`);
  throw new Error(`check failed: ${msg}`);
}

// ---- the daemon ----

function startDaemon() {
  const tmp = mkdtempSync(join(tmpdir(), 'dapod-web-'));
  const proc = spawn(args.dapod, ['serve', '--listen', '127.0.0.1:0', '--data-dir', join(tmp, 'var'),
    '--models-dir', join(tmp, 'models'), '--workers', '1', '--blas-threads', '1',
    '--api-keys', `web:${sha256(KEY)}`, '--progress-every-pass', 'true'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const ready = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`dapod did not listen in time:\n${log}`)), WAIT);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/dapod: listening on (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (c) => reject(new Error(`dapod exited (${c}):\n${log}`)));
  });
  return { proc, tmp, ready, log: () => log };
}

async function waitReady(base) {
  const end = Date.now() + WAIT;
  while (Date.now() < end) {
    try { if ((await fetch(`${base}/readyz`)).status === 200) return; } catch (e) { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('dapod not ready in time');
}

function stopDaemon(d) {
  return new Promise((resolve) => {
    if (d.proc.exitCode !== null) { resolve(d.proc.exitCode); return; }
    const t = setTimeout(() => d.proc.kill('SIGKILL'), 30000);
    d.proc.on('exit', (code) => { clearTimeout(t); resolve(code); });
    d.proc.kill('SIGTERM');
  });
}

// ---- the scenario ----

async function main() {
  mkdirSync(args.artifacts, { recursive: true });
  const daemon = startDaemon();
  let browser = null;
  const shots = [];
  try {
    const base = await daemon.ready;
    await waitReady(base);
    const apiGet = async (path) => {
      const r = await fetch(base + path, { headers: { Authorization: `Bearer ${KEY}` } });
      if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
      return r;
    };
    const apiJson = async (path) => (await apiGet(path)).json();

    browser = await chromium.launch({
      executablePath: '/usr/bin/chromium',
      headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
    });
    const context = await browser.newContext({ viewport: { width: 1400, height: 900 }, acceptDownloads: true });
    const page = await context.newPage();
    page.setDefaultTimeout(WAIT);
    const requests = [];
    page.on('request', (r) => requests.push({ url: r.url(), method: r.method(), auth: r.headers().authorization || null }));
    const consoleErrors = [];
    page.on('pageerror', (e) => consoleErrors.push(String(e)));
    // Every text the progress display (#job-pass-text) held, in order ('' when cleared): a
    // MutationObserver from the document's start, so no report is missed however fast they come
    // (setting textContent adds one new text node per report, never changed afterwards).
    await page.addInitScript(() => {
      window.passShown = [];
      new MutationObserver((records) => {
        for (const r of records) {
          if (r.target.id !== 'job-pass-text') continue;
          window.passShown.push(r.addedNodes.length ? r.addedNodes[0].textContent : '');
        }
      }).observe(document, { childList: true, subtree: true });
    });
    const passShown = () => page.evaluate(() => window.passShown.slice());
    // What the display should have held for the API's events: each progress report, and ''
    // when a metrics event, the end or a status other than running/pausing/cancelling clears it.
    const passExpected = (events) => {
      const out = [];
      for (const e of events) {
        if (e.type === 'progress') out.push(fmtProgress(e.data));
        else if ((e.type === 'metrics' || e.type === 'end' || (e.type === 'status' && !['running', 'pausing', 'cancelling'].includes(e.data.status)))
          && out.length && out[out.length - 1] !== '') out.push('');
      }
      return out;
    };
    const shot = async (name) => {
      const p = join(args.artifacts, `${name}.png`);
      await page.screenshot({ path: p, fullPage: true });
      shots.push(p);
    };

    // 1. the key
    await page.goto(`${base}/`);
    check(page.url() === `${base}/ui/`, `/ redirects to /ui/ (${page.url()})`);
    await page.locator('#key-dialog[open]').waitFor();
    check(true, 'the job list asks for the API key');
    await page.fill('#key-input', 'wrong-key');
    await page.click('#key-save');
    await page.locator('#key-error:not([hidden])').waitFor();
    check((await page.textContent('#key-error')).includes('refused'), 'a wrong key is refused in the dialog');
    await shot('00-key-dialog');
    await page.fill('#key-input', KEY);
    await page.click('#key-save');
    await page.locator('#jobs-table td.empty').waitFor();
    check(await page.evaluate(() => sessionStorage.getItem('dapod.apiKey')) === 'dashboard-test-key-7f3a', 'the key is kept in sessionStorage');
    check((await page.textContent('#key-state')) === 'API key set', 'the header says a key is set');
    await shot('01-jobs-empty');

    // 2. new job: upload, field errors, start
    await page.click('a[data-nav="new"]');
    await page.locator('#job-form').waitFor();
    // an invalid dataset: its line errors are listed as the API reports them
    await page.setInputFiles('#upload-input', args.invalid);
    await page.click('#upload-button');
    await page.locator('#upload-result .alert.error li').first().waitFor();
    const bad = (await apiJson('/v1/files')).data.find((f) => f.validation === 'invalid');
    check(bad && bad.status === 'error', 'an invalid upload has OpenAI\'s status "error" and validation "invalid"');
    const shownErrs = await page.locator('#upload-result .alert.error li').allTextContents();
    check(bad && bad.errors.length > 0 && same(shownErrs, bad.errors.slice(0, 20).map((e) => (e.line ? `line ${e.line}: ${e.message}` : e.message))),
      `an invalid upload lists the API's ${bad ? bad.errors.length : 0} line errors`);
    check(await page.inputValue('#f-training-file') === '', 'an invalid file is not offered for training');
    await shot('02a-invalid-upload');
    await page.setInputFiles('#upload-input', args.data);
    await page.click('#upload-button');
    await page.locator('#upload-result .alert.ok').waitFor();
    const files = await apiJson('/v1/files');
    const valid = files.data.filter((f) => f.validation === 'valid');
    check(files.data.length === 2 && valid.length === 1 && valid[0].status === 'processed', 'the upload is stored, valid and processed');
    const fileObj = valid[0];
    check(fileObj.sha256 === sha256(readFileSync(args.data)), 'the stored file has the dataset\'s SHA-256');
    check(await page.inputValue('#f-training-file') === fileObj.id, 'the uploaded file is chosen as training file');
    check((await page.textContent('#upload-result')).includes(`${fileObj.n_items} items`), 'the form shows the item count');
    // defaults from the daemon's table are shown
    check(await page.getAttribute('#f-hyperparameters-group-size', 'placeholder') === '8', 'group_size shows its default 8');
    check(await page.getAttribute('#f-hyperparameters-learning-rate', 'placeholder') === '0.00001', 'learning_rate shows its default 1e-5');

    await page.selectOption('#f-model', 'tiny');
    await page.fill('#f-hyperparameters-total-steps', '2000');
    await page.fill('#f-hyperparameters-group-size', '1');
    await page.fill('#f-hyperparameters-prompt-batch-size', '2');
    await page.fill('#f-hyperparameters-max-new-tokens', '6');
    const postsBefore = requests.filter((r) => r.method === 'POST' && r.url.endsWith('/v1/jobs')).length;
    await page.click('#submit-job');
    const gErr = page.locator('[data-error-for="hyperparameters.group_size"]');
    await gErr.waitFor();
    check((await gErr.textContent()).includes('not in [2, 1024]'), `browser validation names group_size's bounds ("${await gErr.textContent()}")`);
    check(requests.filter((r) => r.method === 'POST' && r.url.endsWith('/v1/jobs')).length === postsBefore, 'nothing was sent for an out-of-range knob');

    await page.fill('#f-hyperparameters-group-size', '4');
    await page.click('#all-knobs summary');
    await page.fill('#f-hyperparameters-minibatch-size', '100');
    await page.selectOption('#f-hyperparameters-dynamic-sampling', 'false');
    const resp422 = page.waitForResponse((r) => r.url().endsWith('/v1/jobs') && r.request().method() === 'POST');
    await page.click('#submit-job');
    const r422 = await resp422;
    check(r422.status() === 422, 'the daemon refuses minibatch_size > group_size x prompt_batch_size (422)');
    const problem = await r422.json();
    const apiMsg = problem.errors.find((e) => e.field === 'hyperparameters.minibatch_size').message;
    const mErr = page.locator('[data-error-for="hyperparameters.minibatch_size"]');
    await mErr.waitFor();
    check(await mErr.textContent() === apiMsg, `the API's message is shown next to minibatch_size ("${apiMsg}")`);
    check(await page.getAttribute('#f-hyperparameters-minibatch-size', 'class') === 'invalid', 'the field is marked invalid');
    await mErr.scrollIntoViewIfNeeded();
    await shot('02-new-job-field-error');
    check((await apiJson('/v1/jobs')).data.length === 0, 'no job was created by the refused submits');

    await page.fill('#f-hyperparameters-minibatch-size', '');
    await page.click('#submit-job');
    await page.waitForURL(/#\/jobs\/job-/);
    const jobId = page.url().split('#/jobs/')[1];
    const created = await apiJson(`/v1/jobs/${jobId}`);
    check(created.model === 'tiny' && created.training_file === fileObj.id, 'the job was created with the form\'s model and file');
    check(created.hyperparameters.total_steps === 2000 && created.hyperparameters.group_size === 4 &&
      created.hyperparameters.prompt_batch_size === 2 && created.hyperparameters.max_new_tokens === 6 &&
      created.hyperparameters.dynamic_sampling === false, 'the job has the form\'s hyperparameters');
    check(created.hyperparameters.learning_rate === 1e-5, 'an empty knob takes the default');

    // 3. live chart: points arrive, pause, resume, cancel
    const points = () => page.evaluate(() => Number(document.querySelector('#chart-reward').dataset.points));
    await page.waitForFunction(() => Number(document.querySelector('#chart-reward')?.dataset.points) >= 2);
    const early = await points();
    check(early >= 2, `the reward chart has points while the job runs (${early})`);
    const earlyTicks = await stepTicks(page, 'reward');
    check(wholeTicks(earlyTicks), `the step axis has whole steps only with few points (ticks ${earlyTicks})`);
    await page.waitForFunction(() => !document.querySelector('#job-pause').disabled);
    await page.click('#job-pause');
    await page.locator('#job-status .badge.st-paused').waitFor();
    const paused = await apiJson(`/v1/jobs/${jobId}`);
    check(paused.status === 'paused', 'the job is paused');
    check(paused.step < 2000, `paused before the end (step ${paused.step})`);
    await page.waitForFunction((n) => Number(document.querySelector('#chart-reward').dataset.points) === n, paused.step);
    check(await points() === paused.step, `the chart holds exactly the ${paused.step} finished steps`);
    const metrics = await apiJson(`/v1/jobs/${jobId}/metrics`);
    const trained = metrics.filter((m) => m.step >= 1 && m['reward/mean'] !== undefined);
    check(trained.length === paused.step, 'the API has as many step metrics');
    const lastM = trained[trained.length - 1];
    const tiles = Object.fromEntries(await page.evaluate(() => [...document.querySelectorAll('.stat')]
      .map((t) => [t.querySelector('.stat-label').textContent, t.querySelector('.stat-value').textContent])));
    const shownReward = tiles.Reward;
    check(shownReward === fmtNumber(lastM['reward/mean']) && Math.abs(num(shownReward) - lastM['reward/mean']) <= 0.05 * Math.max(1e-4, Math.abs(lastM['reward/mean'])),
      `the reward tile shows the last step's reward (${shownReward} for ${lastM['reward/mean']})`);
    for (const [label, key] of [['Accuracy', 'accuracy'], ['Entropy', 'entropy'], ['Mean length', 'response_length/mean'], ['Gen tokens/s', 'throughput/gen_tokens_per_s']]) {
      check(tiles[label] === fmtNumber(lastM[key]), `the ${label} tile reads ${tiles[label]} (${lastM[key]})`);
    }
    check(tiles['Groups kept'] === `${fmtNumber(lastM['groups/kept'])} / ${fmtNumber(lastM['groups/sampled'])}`, `the groups tile reads ${tiles['Groups kept']}`);
    const genRate = lastM['throughput/gen_tokens_per_s'];
    check(genRate < 1000 || /^\d{1,3}(,\d{3})+$/.test(tiles['Gen tokens/s']), `a rate of thousands has separators (${tiles['Gen tokens/s']} for ${genRate})`);
    check(Object.values(tiles).every((t) => !/\d{5}/.test(t.replace(/,\d{3}/g, ''))), `no tile has a long run of digits (${Object.values(tiles).join(' | ')})`);
    const pausedTicks = await stepTicks(page, 'reward');
    check(wholeTicks(pausedTicks), `the step axis has whole steps only at ${paused.step} points (ticks ${pausedTicks})`);
    for (const id of ['entropy', 'throughput']) {
      const t = await stepTicks(page, id);
      check(wholeTicks(t), `chart ${id}: whole steps only (ticks ${t})`);
    }
    // the legend: the newest step's values, and under the cursor the hovered step's, written as
    // the tiles write them
    const legendOf = () => page.locator('#chart-reward .u-legend .u-value').allTextContents();
    let legend = await legendOf();
    check(legend[0] === fmtStep(lastM.step) && legend[1] === fmtNumber(lastM['reward/mean']) && legend[2] === fmtNumber(lastM.accuracy),
      `without a cursor the legend shows the newest step (${legend.join(' | ')})`);
    const over = page.locator('#chart-reward .u-over');
    const box = await over.boundingBox();
    await page.mouse.move(box.x + 2, box.y + box.height / 2);
    await page.waitForFunction((s) => document.querySelector('#chart-reward .u-legend .u-value')?.textContent !== s, legend[0]);
    legend = await legendOf();
    const hovered = trained.find((m) => fmtStep(m.step) === legend[0]);
    check(hovered !== undefined && hovered.step < lastM.step, `the legend names the whole step under the cursor (${legend[0]})`);
    check(hovered && legend[1] === fmtNumber(hovered['reward/mean']) && legend[2] === fmtNumber(hovered.accuracy),
      `the legend shows step ${legend[0]}'s reward and accuracy as the page writes them (${legend.join(' | ')})`);
    await page.mouse.move(0, 0);
    const newestMetrics = await page.locator('#event-log tbody tr.ev-metrics td:nth-child(3)').first().textContent();
    check(newestMetrics === `step ${fmtStep(lastM.step)}: reward ${fmtNumber(lastM['reward/mean'])}, accuracy ${fmtNumber(lastM.accuracy)}, groups ${fmtNumber(lastM['groups/kept'])}/${fmtNumber(lastM['groups/sampled'])}, ${fmtNumber(genRate)} gen tok/s`,
      `the event log's newest metrics row reads "${newestMetrics}"`);
    const apiEvents = [];
    for (let after = null; ;) {
      const pageOfEvents = await apiJson(`/v1/jobs/${jobId}/events?limit=100${after ? `&after=${after}` : ''}`);
      apiEvents.push(...pageOfEvents.data);
      if (!pageOfEvents.has_more) break;
      after = pageOfEvents.next_after;
    }
    // progress reports are shown beside the phase, not in the event log
    const logged = apiEvents.filter((e) => e.type !== 'progress');
    // a paused job is quiet: once the page has shown the API's newest event, both lists are whole
    await page.waitForFunction((id) => Number(document.querySelector('#event-log tbody tr td')?.textContent) >= id,
      apiEvents[apiEvents.length - 1].id);
    const logRows = await page.locator('#event-log tbody tr.ev-metrics').count();
    check(logRows === apiEvents.filter((e) => e.type === 'metrics').length && logRows === paused.step,
      `the event log has the job's ${logRows} metrics events`);
    const logIds = (await page.locator('#event-log tbody tr td:first-child').allTextContents()).map(Number);
    check(same(logIds, logged.map((e) => e.id).reverse()), `the event log lists the API's ${logged.length} events but progress, newest first`);
    // the progress display: every report of the API's, in order, cleared by each step's metrics
    const reports = apiEvents.filter((e) => e.type === 'progress').map((e) => e.data);
    // (the tiny job's rewards are often all equal, so a step may skip its update: no update pass)
    const passes = [...new Set(reports.map((p) => p.pass))];
    check(reports.length >= 2 * paused.step && passes.includes('generation'),
      `the job sent progress events (${reports.length} for ${paused.step} steps; passes ${passes.join(', ')})`);
    const shownPass = await passShown();
    const wantPass = passExpected(apiEvents);
    check(same(shownPass, wantPass), `the progress display showed the API's ${reports.length} reports in order, cleared ${wantPass.filter((t) => t === '').length} times (${shownPass.length} texts)`);
    check(new Set(shownPass.filter(Boolean)).size >= 2, `the progress display updated (e.g. "${shownPass[0]}", then "${shownPass[1]}")`);
    check(shownPass.filter(Boolean).every((t) => /^step \d+: (generation round \d+ \d+\/\d+ sequences|(evaluation \d+\/\d+ sequences)|((old_logprob|update) \d+\/\d+ micro-batches)), [\d,]+ tokens$/.test(t)),
      'each report reads "step N: generation round R d/t sequences, T tokens" or "step N: update d/t micro-batches, T tokens"');
    check(await page.isHidden('#job-pass') && (await page.textContent('#job-pass-text')) === '', 'a paused job shows no progress');
    await shot('03-job-paused');

    await page.click('#job-resume');
    await page.waitForFunction((n) => Number(document.querySelector('#chart-reward').dataset.points) > n, paused.step);
    const later = await points();
    check(later > paused.step, `after Resume the chart gained points live (${paused.step} -> ${later})`);
    const afterResume = (await passShown()).slice(shownPass.length).filter(Boolean);
    check(afterResume.length > 0 && afterResume.every((t) => Number(t.match(/^step (\d+):/)[1]) > paused.step),
      `after Resume the progress display shows the new steps' reports (${afterResume.length}, first "${afterResume[0]}")`);
    for (const id of ['entropy', 'length', 'clip', 'groups', 'throughput']) {
      check(Number(await page.getAttribute(`#chart-${id}`, 'data-points')) > 0, `chart ${id} has points`);
    }
    await page.waitForFunction(() => !document.querySelector('#job-cancel').disabled);
    await page.click('#job-cancel');
    await page.locator('#job-status .badge.st-cancelled').waitFor();
    const final = await apiJson(`/v1/jobs/${jobId}`);
    check(final.status === 'cancelled', 'Cancel ends the job');
    await page.locator('#event-log .tag-end').waitFor();
    check(true, 'the event log shows the stream\'s end');
    await page.waitForFunction((n) => Number(document.querySelector('#chart-reward').dataset.points) === n, final.step);
    check(await points() === final.step, `the chart ends with the job's ${final.step} steps`);
    await page.locator(`#checkpoints details[data-step="${paused.step}"]`).waitFor();
    await shot('04-job-cancelled');

    // 4. rollout viewer
    await page.click('#open-rollouts');
    await page.locator('#rollouts section.group').first().waitFor();
    const step = Number(await page.inputValue('#rollout-step'));
    check(step === final.step, `the viewer opens the last step (${step})`);
    const text = await (await apiGet(`/v1/jobs/${jobId}/rollouts?step=${step}`)).text();
    const rows = text.split('\n').filter(Boolean).map((l) => JSON.parse(l));
    const groups = [...new Set(rows.map((r) => r.group))].sort((a, b) => a - b);
    check(await page.locator('#rollouts section.group').count() === groups.length, `${groups.length} groups shown, as in the rollouts file`);
    for (const g of groups) {
      const rs = rows.filter((r) => r.group === g).sort((a, b) => a.index - b.index);
      const sec = page.locator(`#rollouts section.group[data-group="${g}"]`);
      check(await sec.locator('tbody tr').count() === rs.length && rs.length === 4, `group ${g}: its G = 4 responses`);
      const shown = await sec.locator('pre.response').allTextContents();
      check(shown.every((t, i) => t === (rs[i].response === '' ? '∅ (empty)' : rs[i].response)), `group ${g}: the responses' text`);
      check((await sec.locator('pre.text').first().textContent()) === rs[0].prompt, `group ${g}: the prompt`);
      const adv = await sec.locator('tbody tr td:nth-child(6)').allTextContents();
      check(adv.every((t, i) => t === fmtNumber(rs[i].advantage) && Math.abs(num(t) - rs[i].advantage) <= 0.05 * Math.max(1e-4, Math.abs(rs[i].advantage))),
        `group ${g}: the advantages (${adv.join(' ')})`);
      const rewards = await sec.locator('tbody tr td:nth-child(3)').allTextContents();
      check(rewards.every((t, i) => t === fmtNumber(rs[i].reward)), `group ${g}: the rewards (${rewards.join(' ')})`);
      const kept = (await sec.locator('.group-head .badge').textContent()) === 'kept';
      check(kept === rs.some((r) => r.kept), `group ${g}: kept/dropped as the file says`);
    }
    await shot('05-rollouts');
    if (step > 1) {
      await page.selectOption('#rollout-step', String(step - 1));
      await page.waitForFunction((s) => document.querySelector('#rollout-summary')?.textContent.startsWith(`step ${s}:`), step - 1);
      check(true, 'another step can be picked');
    }

    // 5. download a checkpoint file through the page
    await page.goto(`${base}/ui/#/jobs/${jobId}`);
    const ckpts = await apiJson(`/v1/jobs/${jobId}/checkpoints`);
    const ck = ckpts.data.find((c) => c.step === paused.step);
    check(ck && ck.files.some((f) => f.name === 'model.safetensors'), `the pause checkpoint (step ${paused.step}) is listed`);
    const fileMeta = ck.files.find((f) => f.name === 'model.safetensors');
    const btn = page.locator(`button[data-download="${paused.step}/model.safetensors"]`);
    await btn.waitFor();
    const [dl] = await Promise.all([page.waitForEvent('download'), btn.click()]);
    const dlPath = join(args.artifacts, 'downloaded-model.safetensors');
    await dl.saveAs(dlPath);
    const got = readFileSync(dlPath);
    rmSync(dlPath);
    check(dl.suggestedFilename() === `${jobId}-step-${paused.step}-model.safetensors`, `download named ${dl.suggestedFilename()}`);
    check(got.length === fileMeta.bytes, `downloaded ${got.length} bytes, as listed`);
    check(sha256(got) === fileMeta.sha256, 'the download\'s SHA-256 equals the checkpoint list\'s');
    const direct = Buffer.from(await (await apiGet(`/v1/jobs/${jobId}/checkpoints/${paused.step}/model.safetensors`)).arrayBuffer());
    check(Buffer.compare(direct, got) === 0, 'the download equals the bytes the API sends');

    // the job list shows the job
    await page.goto(`${base}/ui/#/jobs`);
    await page.locator(`#jobs-table tr[data-job="${jobId}"][data-status="cancelled"]`).waitFor();
    check(true, 'the job list shows the cancelled job');
    await shot('06-jobs');
    check(final.progress === null && await page.locator('#jobs-table .pass-mini').count() === 0, 'a finished job has no progress');
    // a running job's progress (the job object's `progress`), through a list answered here
    const report = reports[reports.length - 1];
    const jobList = (url) => url.pathname === '/v1/jobs' && url.search === '?limit=100';
    await page.route(jobList, async (route) => {
      const list = await (await route.fetch()).json();
      for (const j of list.data) Object.assign(j, { status: 'running', phase: 'updating', progress: report });
      await route.fulfill({ json: list });
    });
    const mini = page.locator(`#jobs-table tr[data-job="${jobId}"][data-status="running"] .pass-mini`);
    await mini.waitFor();
    check(await mini.textContent() === ` ${report.pass} ${fmtStep(report.done)}/${fmtStep(report.total)}` && await mini.getAttribute('title') === fmtProgress(report),
      `the job list shows a running job's progress ("${await mini.textContent()}", title "${fmtProgress(report)}")`);
    await page.unroute(jobList);

    // keys never in URLs; API calls carry the Bearer key
    const apiReqs = requests.filter((r) => new URL(r.url).pathname.startsWith('/v1/'));
    check(requests.every((r) => !r.url.includes(KEY)), `the key is in none of the ${requests.length} URLs`);
    check(apiReqs.filter((r) => r.auth === `Bearer ${KEY}`).length > 10, 'API calls send Authorization: Bearer <key>');
    check(apiReqs.some((r) => r.url.includes('/events/stream') && r.auth === `Bearer ${KEY}`), 'the event stream is read with the key header');

    // 6. no uPlot: the page says so
    await page.route('**/uPlot.esm.js', (route) => route.fulfill({ status: 404, body: '' }));
    await page.goto(`${base}/ui/#/jobs/${jobId}`);
    await page.reload();
    await page.locator('#charts-unavailable').waitFor();
    check(true, 'without uPlot the job page says the charts are unavailable');
    await page.unroute('**/uPlot.esm.js');

    // 7. an agent's episodes as conversations
    const env = spawn('/usr/bin/python3', [args['env-server'], join(args.artifacts, 'env.log')], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      const port = await new Promise((resolve, reject) => {
        let out = '';
        env.stdout.on('data', (d) => { out += d; if (out.includes('\n')) resolve(Number(out)); });
        env.on('exit', () => reject(new Error('env_server.py exited')));
      });
      const post = async (path, body, type = 'application/json') => {
        const r = await fetch(base + path, { method: 'POST', headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': type }, body });
        if (!r.ok) throw new Error(`${path}: HTTP ${r.status}: ${await r.text()}`);
        return r.json();
      };
      const file = await post('/v1/files?purpose=fine-tune&filename=ep.jsonl', readFileSync(args.data), 'application/x-ndjson');
      const ej = await post('/v1/jobs', JSON.stringify({
        model: 'tiny', training_file: file.id, judge: { type: 'exact' },
        hyperparameters: { total_steps: 1, group_size: 4, prompt_batch_size: 2, max_new_tokens: 6, dynamic_sampling: false },
        episode: { max_turns: 3, max_new_tokens_per_turn: 2, max_answer_tokens: 8, reward: 'environment',
          environment: { type: 'http', url: `http://127.0.0.1:${port}/guess` } } }));
      let ejob = ej;
      for (let t0 = Date.now(); !['succeeded', 'failed', 'cancelled'].includes(ejob.status) && Date.now() - t0 < WAIT;) {
        await new Promise((r) => setTimeout(r, 200));
        ejob = await apiJson(`/v1/jobs/${ej.id}`);
      }
      check(ejob.status === 'succeeded', `the episode job succeeded (${ejob.status})`);
      await page.goto(`${base}/ui/#/jobs/${ej.id}/rollouts/1`);
      await page.locator('#rollouts .conversation').first().waitFor();
      const erows = (await (await apiGet(`/v1/jobs/${ej.id}/rollouts?step=1`)).text()).split('\n').filter(Boolean).map((l) => JSON.parse(l));
      for (const g of [...new Set(erows.map((r) => r.group))]) {
        const rs = erows.filter((r) => r.group === g).sort((a, b) => a.index - b.index);
        const sec = page.locator(`#rollouts section.group[data-group="${g}"]`);
        for (let i = 0; i < rs.length; i++) {
          const conv = sec.locator('tbody tr').nth(i).locator('.conversation');
          const roles = await conv.locator('.turn').evaluateAll((els) => els.map((e) => e.dataset.role));
          check(same(roles, rs[i].turns.map((t) => t.role)), `group ${g} episode ${i}: its ${roles.length} turns in order (${roles.join(' ')})`);
          const model = await conv.locator('.turn.model pre.said').allTextContents();
          check(same(model, rs[i].turns.filter((t) => t.role === 'assistant').map((t) => (t.content === '' ? '∅' : t.content))), `group ${g} episode ${i}: the model's turns`);
          const world = await conv.locator('.turn.world pre.said').allTextContents();
          check(same(world, rs[i].turns.filter((t) => t.role === 'environment').flatMap((t) => t.messages.map((m) => `${m.role}: ${m.content}`))), `group ${g} episode ${i}: the environment's observations`);
          const rewards = await conv.locator('.turn.world .badge.reward').allTextContents();
          check(same(rewards, rs[i].turns.filter((t) => t.role === 'environment' && t.reward !== null).map((t) => `reward ${fmtNumber(t.reward)}`)), `group ${g} episode ${i}: the rewards (${rewards.join(', ')})`);
          check((await conv.locator('.ended').textContent()).startsWith(`ended: ${rs[i].finish_reason}`), `group ${g} episode ${i}: ended ${rs[i].finish_reason}`);
        }
      }
      await shot('07-episodes');
    } finally {
      env.kill();
    }

    // 8. a supervised job from the form (a fresh page: step 6 left the module without uPlot)
    await page.goto(`${base}/ui/#/new`);
    await page.reload();
    await page.locator('#job-form').waitFor();
    await page.selectOption('#f-method', 'supervised');
    check(await page.locator('#f-hyperparameters-group-size').count() === 0, 'a supervised job\'s form has no group_size');
    check(await page.getAttribute('#f-hyperparameters-epochs', 'placeholder') === '1' &&
      await page.getAttribute('#f-hyperparameters-batch-size', 'placeholder') === '8', 'epochs and batch_size show their defaults (1, 8)');
    check(await page.locator('#f-judge-type').isHidden(), 'a supervised job\'s form has no judge');
    const sftLines = Array.from({ length: 16 }, (_, i) => JSON.stringify({ prompt: `${i % 10}+${(i * 3) % 10}=`, completion: String((i % 10) + ((i * 3) % 10)) })).join('\n') + '\n';
    await page.setInputFiles('#upload-input', { name: 'sums.jsonl', mimeType: 'application/x-ndjson', buffer: Buffer.from(sftLines) });
    await page.click('#upload-button');
    await page.locator('#upload-result .alert.ok').waitFor();
    await page.selectOption('#f-model', 'tiny');
    await page.fill('#f-hyperparameters-epochs', '2');
    await page.fill('#f-hyperparameters-batch-size', '4');
    await page.click('#submit-job');
    await page.waitForURL(/#\/jobs\/job-/);
    const sftId = page.url().split('#/jobs/')[1];
    let sjob = await apiJson(`/v1/jobs/${sftId}`);
    check(sjob.method === 'supervised' && !sjob.judge && sjob.hyperparameters.epochs === 2 && sjob.hyperparameters.batch_size === 4 && sjob.total_steps === 8,
      `the supervised job has the form's method and knobs (${sjob.method}, ${sjob.total_steps} steps)`);
    for (let t0 = Date.now(); !['succeeded', 'failed', 'cancelled'].includes(sjob.status) && Date.now() - t0 < WAIT;) {
      await new Promise((r) => setTimeout(r, 200));
      sjob = await apiJson(`/v1/jobs/${sftId}`);
    }
    check(sjob.status === 'succeeded', `the supervised job succeeded (${sjob.status})`);
    const sm = (await apiJson(`/v1/jobs/${sftId}/metrics`)).filter((m) => typeof m['train/loss'] === 'number');
    await page.waitForFunction((n) => Number(document.querySelector('#chart-loss')?.dataset.points) === n, sm.length);
    check(sm.length === 8 && Number(await page.getAttribute('#chart-token-accuracy', 'data-points')) === 8, 'the loss and token-accuracy charts hold the API\'s 8 steps');
    check(await page.locator('#chart-reward').count() === 0, 'a supervised job has no reward chart');
    const sTiles = Object.fromEntries(await page.locator('.stats .stat').evaluateAll((ts) => ts
      .map((t) => [t.querySelector('.stat-label').textContent, t.querySelector('.stat-value').textContent])));
    const lastLoss = sm[sm.length - 1]['train/loss'];
    check(sTiles.Loss === fmtNumber(lastLoss) && sTiles['Token accuracy'] === fmtNumber(sm[sm.length - 1]['train/mean_token_accuracy']),
      `the tiles show the last step's loss and token accuracy (${sTiles.Loss} for ${lastLoss})`);
    check(await page.textContent('#job-method') === 'supervised', 'the job page names the method');
    await shot('08-supervised-job');
    await page.goto(`${base}/ui/#/jobs`);
    const srow = page.locator(`#jobs-table tr[data-job="${sftId}"]`);
    await srow.waitFor();
    check((await srow.locator('td').nth(2).textContent()) === 'supervised' && (await srow.locator('td').nth(5).textContent()) === fmtNumber(lastLoss),
      'the job list shows the method and the loss');

    // 9. a DPO job from the form
    await page.goto(`${base}/ui/#/new`);
    await page.locator('#job-form').waitFor();
    await page.selectOption('#f-method', 'dpo');
    check(await page.getAttribute('#f-hyperparameters-beta', 'placeholder') === '0.1', 'a DPO job\'s form offers beta (default 0.1)');
    const dpoLines = Array.from({ length: 12 }, (_, i) => JSON.stringify({ prompt: `${i % 10}?`, chosen: String((i + 1) % 10), rejected: String((i + 9) % 10) })).join('\n') + '\n';
    await page.setInputFiles('#upload-input', { name: 'prefs.jsonl', mimeType: 'application/x-ndjson', buffer: Buffer.from(dpoLines) });
    await page.click('#upload-button');
    await page.locator('#upload-result .alert.ok').waitFor();
    await page.selectOption('#f-model', 'tiny');
    await page.fill('#f-hyperparameters-epochs', '2');
    await page.fill('#f-hyperparameters-batch-size', '4');
    await page.click('#submit-job');
    await page.waitForURL(/#\/jobs\/job-/);
    const dpoId = page.url().split('#/jobs/')[1];
    let djob = await apiJson(`/v1/jobs/${dpoId}`);
    check(djob.method === 'dpo' && djob.total_steps === 6, `the DPO job has the form's method and knobs (${djob.method}, ${djob.total_steps} steps)`);
    for (let t0 = Date.now(); !['succeeded', 'failed', 'cancelled'].includes(djob.status) && Date.now() - t0 < WAIT;) {
      await new Promise((r) => setTimeout(r, 200));
      djob = await apiJson(`/v1/jobs/${dpoId}`);
    }
    check(djob.status === 'succeeded', `the DPO job succeeded (${djob.status})`);
    const dm = (await apiJson(`/v1/jobs/${dpoId}/metrics`)).filter((m) => typeof m['rewards/margin'] === 'number');
    await page.waitForFunction((n) => Number(document.querySelector('#chart-dpo-rewards')?.dataset.points) === n, dm.length);
    check(dm.length === 6 && Number(await page.getAttribute('#chart-dpo-accuracy', 'data-points')) === 6 && Number(await page.getAttribute('#chart-loss', 'data-points')) === 6,
      'the loss, rewards and preference-accuracy charts hold the API\'s 6 steps');
    const dTiles = Object.fromEntries(await page.locator('.stats .stat').evaluateAll((ts) => ts
      .map((t) => [t.querySelector('.stat-label').textContent, t.querySelector('.stat-value').textContent])));
    const lastD = dm[dm.length - 1];
    check(dTiles['Preference accuracy'] === fmtNumber(lastD['rewards/accuracy']) && dTiles.Margin === fmtNumber(lastD['rewards/margin']),
      `the tiles show the last step's preference accuracy and margin (${dTiles['Preference accuracy']}, ${dTiles.Margin})`);
    await shot('09-dpo-job');

    check(consoleErrors.length === 0, `no uncaught errors in the page (${consoleErrors.join('; ')})`);
  } finally {
    if (browser) await browser.close();
    const rc = await stopDaemon(daemon);
    if (rc !== 0) { failures++; console.log(`FAIL dapod exited with ${rc}\n${daemon.log()}`); }
    rmSync(daemon.tmp, { recursive: true, force: true });
    console.log(`screenshots: ${shots.join(' ')}`);
  }
}

main().then(() => {
  console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
  process.exit(failures ? 1 : 0);
}).catch((e) => {
  console.log(`FAIL ${e.stack || e}`);
  process.exit(1);
});
