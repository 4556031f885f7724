// Live step charts with uPlot (loaded from uPlot.esm.js, copied next to the page by the build).
// When the library is missing (a build without npm) loadUplot() resolves to null and the page
// says that the charts are unavailable; everything else works. Numbers are written by format.js:
// the step axis has whole steps only, value ticks keep their own value with separators, and the
// legend shows the values under the cursor (else the newest step's) as the page writes them.

import { fmtNumber, fmtStep, fmtTick, STEP_INCRS } from './format.js';

let uplotPromise = null;
export function loadUplot() {
  if (!uplotPromise) {
    uplotPromise = import('./uPlot.esm.js').then((m) => m.default).catch(() => null);
  }
  return uplotPromise;
}

// The legend's values: the point under the cursor, else the newest point of the series.
function lastValue(col) {
  for (let i = col.length - 1; i >= 0; i--) if (col[i] !== null && col[i] !== undefined) return col[i];
  return null;
}
function legendValue(write) {
  return (u, v, sidx, idx) => {
    const x = idx === null || idx === undefined ? lastValue(u.data[sidx]) : v;
    return x === null || x === undefined ? null : write(x); // null: uPlot's "--"
  };
}

const PALETTE = ['#2457d6', '#e07a10', '#1a9c5b', '#c2334d', '#7a4cc2', '#4b5563'];

// The charts of the job page: title, then series as [metric key, label]; a DAPO job's.
export const CHARTS = [
  { id: 'reward', title: 'Reward and accuracy', series: [['reward/mean', 'reward'], ['accuracy', 'accuracy'], ['eval/accuracy', 'eval accuracy']] },
  { id: 'entropy', title: 'Entropy (nats/token)', series: [['entropy', 'entropy']] },
  { id: 'length', title: 'Response length (tokens)', series: [['response_length/mean', 'mean'], ['response_length/max', 'max']] },
  { id: 'clip', title: 'Clip fractions', fraction: true, series: [['policy/clip_frac_low', 'low'], ['policy/clip_frac_high', 'high'], ['policy/clip_frac_dual', 'dual']] },
  { id: 'groups', title: 'Groups (dynamic sampling)', series: [['groups/kept', 'kept'], ['groups/sampled', 'sampled']] },
  { id: 'throughput', title: 'Tokens/s', series: [['throughput/gen_tokens_per_s', 'generation'], ['throughput/train_tokens_per_s', 'training']] },
];

// A supervised job's (docs/TRAINING.md "Supervised fine-tuning"): the loss and the token
// accuracy on the training batch and on the validation file.
const SFT_CHARTS = [
  { id: 'loss', title: 'Loss (nats/token)', series: [['train/loss', 'train'], ['valid/loss', 'valid'], ['full_valid/loss', 'full valid']] },
  { id: 'token-accuracy', title: 'Token accuracy', fraction: true, series: [['train/mean_token_accuracy', 'train'], ['valid/mean_token_accuracy', 'valid'], ['full_valid/mean_token_accuracy', 'full valid']] },
  { id: 'lr', title: 'Learning rate and gradient norm', series: [['learning_rate', 'learning rate'], ['grad_norm', 'grad norm']] },
];

// A DPO job's (docs/TRAINING.md "DPO"): the loss, the implicit rewards beta * (log-prob ratio to
// the reference) of the chosen and rejected responses with their margin, and the share of pairs
// ranked right.
const DPO_CHARTS = [
  { id: 'loss', title: 'Loss', series: [['train/loss', 'train'], ['valid/loss', 'valid']] },
  { id: 'dpo-rewards', title: 'Rewards (beta x log-ratio)', series: [['rewards/chosen', 'chosen'], ['rewards/rejected', 'rejected'], ['rewards/margin', 'margin']] },
  { id: 'dpo-accuracy', title: 'Preference accuracy', fraction: true, series: [['rewards/accuracy', 'train'], ['valid/rewards/accuracy', 'valid']] },
  { id: 'lr', title: 'Learning rate and gradient norm', series: [['learning_rate', 'learning rate'], ['grad_norm', 'grad norm']] },
];

// The charts of a job of this method ("dapo" when the job says none).
export function chartsFor(method) {
  return method === 'supervised' ? SFT_CHARTS : method === 'dpo' ? DPO_CHARTS : CHARTS;
}

// Step metrics merged by step (training and eval/ events of the same step).
export class MetricSeries {
  constructor() {
    this.byStep = new Map();
  }

  add(m) {
    if (!m || typeof m.step !== 'number') return;
    const row = this.byStep.get(m.step) || {};
    Object.assign(row, m);
    this.byStep.set(m.step, row);
  }

  // uPlot's columns: [steps, series...]; missing values are null (gaps).
  columns(series) {
    const steps = [...this.byStep.keys()].sort((a, b) => a - b)
      .filter((s) => series.some(([k]) => typeof this.byStep.get(s)[k] === 'number'));
    const cols = [steps];
    for (const [k] of series) cols.push(steps.map((s) => {
      const v = this.byStep.get(s)[k];
      return typeof v === 'number' ? v : null;
    }));
    return cols;
  }
}

// One chart in container el; update(metricSeries) redraws with the current points.
export class StepChart {
  constructor(uPlot, el, spec) {
    this.uPlot = uPlot;
    this.el = el;
    this.spec = spec;
    this.plot = null;
    this.points = 0;
    this.observer = new ResizeObserver(() => this.resize());
    this.observer.observe(el);
  }

  size() {
    return { width: Math.max(240, this.el.clientWidth - 4), height: 190 };
  }

  resize() {
    if (this.plot) this.plot.setSize(this.size());
  }

  // The step axis' labels; the ticks uPlot chose are kept in data-step-ticks (the browser test
  // checks that they are whole steps).
  stepTicks(vals) {
    this.el.dataset.stepTicks = vals.join(' ');
    return vals.map(fmtStep);
  }

  update(metrics) {
    if (this.destroyed) return; // a redraw scheduled before the page was left
    const data = metrics.columns(this.spec.series);
    this.points = data[0].length;
    this.el.dataset.points = String(this.points);
    if (!this.plot) {
      const opts = {
        ...this.size(),
        legend: { show: true, live: true }, // the values under the cursor, else the newest
        cursor: { drag: { x: true, y: false } },
        // fractions start at 0 and show at least up to 5 %, so an all-zero series is not a 0..100 axis
        scales: this.spec.fraction
          ? { x: { time: false }, y: { range: (u, min, max) => [0, Math.max(0.05, max * 1.1)] } }
          : { x: { time: false } },
        axes: [
          { label: 'step', stroke: '#6b7280', grid: { stroke: '#eef0f3' }, ticks: { stroke: '#eef0f3' }, incrs: STEP_INCRS, values: (u, vals) => this.stepTicks(vals) },
          { stroke: '#6b7280', grid: { stroke: '#eef0f3' }, ticks: { stroke: '#eef0f3' }, size: 60, values: (u, vals) => vals.map(fmtTick) },
        ],
        series: [
          { label: 'step', value: legendValue(fmtStep) },
          ...this.spec.series.map(([, label], i) => ({
            label,
            value: legendValue(fmtNumber),
            stroke: PALETTE[i % PALETTE.length],
            width: 2,
            points: { show: true, size: 5 },
            spanGaps: true,
          })),
        ],
      };
      this.plot = new this.uPlot(opts, data, this.el);
    } else {
      this.plot.setData(data);
    }
  }

  destroy() {
    this.destroyed = true;
    this.observer.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}
