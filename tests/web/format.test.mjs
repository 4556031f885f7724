// Unit test of how the dashboard writes numbers (clients/web/format.js) under Node (label web):
// thousands separators for counts and rates, about 2 significant digits for values below 1,
// exact axis ticks, whole steps only on the step axis; and that charts.js wires them into
// uPlot (a stand-in uPlot records the options a StepChart gives it).
// Usage: node format.test.mjs CLIENTS_WEB_DIR

import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const dir = process.argv[2];
if (!dir) { console.error('usage: node format.test.mjs CLIENTS_WEB_DIR'); process.exit(2); }
const mod = (name) => import(pathToFileURL(join(dir, name)).href);
const { fmtBytes, fmtNumber, fmtProgress, fmtStep, fmtTick, STEP_INCRS } = await mod('format.js');

let failed = 0;
function check(cond, msg) {
  console.log(`${cond ? 'ok  ' : 'FAIL'} ${msg}`);
  if (!cond) failed++;
}
function table(name, f, cases) {
  for (const [v, want] of cases) {
    const got = f(v);
    check(got === want, `${name}(${Object.is(v, -0) ? '-0' : JSON.stringify(v) ?? String(v)}) = ${JSON.stringify(got)}${got === want ? '' : `, want ${JSON.stringify(want)}`}`);
  }
}

// ---- metrics, counts, rates ----
table('fmtNumber', fmtNumber, [
  // counts and rates: separators; integers exact, others to 4 significant digits
  [331500, '331,500'], [331512.3, '331,500'], [75038.599035170089, '75,040'], [1234, '1,234'],
  [1234567, '1,234,567'], [-2500, '-2,500'], [1000.4, '1,000'], [999.96, '1,000'],
  // 1 to 1,000: 3 significant digits
  [4.5692731253802776, '4.57'], [15.333, '15.3'], [123.4, '123'], [1.0000001, '1'], [-1.5, '-1.5'],
  // below 1: 2 significant digits after the leading zeros
  [0.0083333333, '0.0083'], [0.0088975694444444441, '0.0089'], [0.91562, '0.92'],
  [-0.98220486111111116, '-0.98'], [0.5, '0.5'], [0.05, '0.05'], [0.012369791666666666, '0.012'],
  [0.00025, '0.00025'],
  // tiny values
  [0.000012, '1.2e-5'], [1e-5, '1e-5'], [-3.456e-9, '-3.5e-9'],
  // the rest
  [0, '0'], [-0, '0'], [1, '1'], [7, '7'], [null, '–'], [undefined, '–'], ['', '–'],
  ['running', 'running'], [NaN, 'NaN'], [Infinity, '∞'],
]);
check(!/\d{4}/.test(fmtNumber(331500)) && !/\d{5,}/.test(fmtNumber(0.008333333)),
  'no long runs of digits (331500, 0.008333...)');

// ---- steps and step-axis ticks ----
table('fmtStep', fmtStep, [[1, '1'], [60, '60'], [12345, '12,345'], [0, '0'], [2.5, ''], [1.5, ''],
  [null, ''], [undefined, '']]);
check(STEP_INCRS.every((x) => Number.isInteger(x) && x > 0), `STEP_INCRS are whole (${STEP_INCRS.slice(0, 8).join(', ')}, ...)`);
check(STEP_INCRS.every((x, i) => i === 0 || x > STEP_INCRS[i - 1]) && STEP_INCRS[0] === 1,
  'STEP_INCRS increase from 1');
check(STEP_INCRS[STEP_INCRS.length - 1] >= 1e9, 'STEP_INCRS reach a billion steps');

// ---- value-axis ticks: the tick's own value ----
table('fmtTick', fmtTick, [[0, '0'], [-0, '0'], [0.125, '0.125'], [0.005, '0.005'], [2.5, '2.5'],
  [2500, '2,500'], [331500, '331,500'], [1500000, '1.5M'], [-2000000, '-2M'], [0.1 + 0.2, '0.3'],
  [null, '']]);

// ---- sizes ----
table('fmtBytes', fmtBytes, [[0, '0 B'], [1023, '1,023 B'], [1024, '1.0 KiB'], [397320, '388.0 KiB'],
  [5 * 1024 * 1024, '5.0 MiB'], [3 * 1024 ** 3, '3.0 GiB']]);

// ---- progress reports of long passes (progress events, a job's progress) ----
table('fmtProgress', fmtProgress, [
  [{ step: 3, pass: 'update', round: 0, done: 2, total: 4, unit: 'micro_batches', tokens: 4800 },
    'step 3: update 2/4 micro-batches, 4,800 tokens'],
  [{ step: 12, pass: 'generation', round: 2, done: 0, total: 1024, unit: 'sequences', tokens: 0 },
    'step 12: generation round 2 0/1,024 sequences, 0 tokens'],
  [{ step: 1, pass: 'old_logprob', round: 0, done: 21, total: 21, unit: 'micro_batches', tokens: 1234567 },
    'step 1: old_logprob 21/21 micro-batches, 1,234,567 tokens'],
  [{ step: 40, pass: 'evaluation', round: 0, done: 7, total: 64, unit: 'sequences', tokens: 96 },
    'step 40: evaluation 7/64 sequences, 96 tokens'],
  [null, '']]);

// ---- charts.js hands them to uPlot ----
globalThis.ResizeObserver = class { observe() {} disconnect() {} };
const { CHARTS, MetricSeries, StepChart } = await mod('charts.js');
let opts = null;
class FakeUPlot {
  constructor(o) { opts = o; }
  setData() {}
  destroy() {}
}
const el = { clientWidth: 600, dataset: {} };
const chart = new StepChart(FakeUPlot, el, CHARTS.find((c) => c.id === 'throughput'));
const ms = new MetricSeries();
ms.add({ step: 1, 'throughput/gen_tokens_per_s': 331512.3, 'throughput/train_tokens_per_s': 4.5 });
ms.add({ step: 2, 'throughput/gen_tokens_per_s': 75038.6 });
chart.update(ms);
check(opts !== null, 'a StepChart builds a uPlot');
const [xAxis, yAxis] = opts.axes;
const call = (f, ...a) => (typeof f === 'function' ? f(...a) : undefined); // a missing hook fails
check(xAxis.incrs === STEP_INCRS, 'the step axis uses the whole increments');
check(JSON.stringify(call(xAxis.values, null, [1, 1.5, 2, 2.5, 1000])) === JSON.stringify(['1', '', '2', '', '1,000']),
  'the step axis labels whole steps only');
check(JSON.stringify(call(yAxis.values, null, [0, 100000, 250000, 0.125])) === JSON.stringify(['0', '100,000', '250,000', '0.125']),
  'the value axis writes ticks with separators');
check(opts.legend.live === true, 'the legend shows the values under the cursor');
const u = { data: [[1, 2], [331512.3, 75038.6], [0.008333, null]] }; // uPlot's columns
const legend = (sidx, idx) => call(opts.series[sidx].value, u, idx === null ? null : u.data[sidx][idx], sidx, idx);
check(legend(0, 0) === '1' && legend(1, 0) === '331,500' && legend(2, 0) === '0.0083',
  'the legend writes the values under the cursor as the page does (step 1: 1, 331,500, 0.0083)');
check(legend(0, null) === '2' && legend(1, null) === '75,040' && legend(2, null) === '0.0083',
  'without a cursor the legend shows each series\' newest value (2, 75,040, 0.0083)');
check(legend(2, 1) === null, 'a gap under the cursor stays uPlot\'s "--"');
check(el.dataset.points === '2', 'the chart counts its points');
chart.destroy();

console.log(failed ? `${failed} check(s) failed` : 'all checks passed');
process.exit(failed ? 1 : 0);
