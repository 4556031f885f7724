// Numbers as people read them, everywhere the dashboard shows one (tables, the latest-metrics
// tiles, the event log, chart legends and axes). Always en-US, whatever the browser's locale, so
// that the page reads the same on every machine and tests can pin the text:
//   counts and rates   331,500 tok/s    (thousands separators; integers exact, other values of
//                                         1,000 or more to 4 significant digits)
//   from 1 to 1,000    4.57, 15.3, 123  (3 significant digits)
//   below 1            0.0083, 0.92     (2 significant digits after the leading zeros)
//   below 0.0001       1.2e-5
// Steps are whole numbers: fmtStep() leaves a non-integer tick blank, and STEP_INCRS gives the
// step axis whole increments only (uPlot would otherwise put a tick at 2.5).

const EN = 'en-US';
const INT = new Intl.NumberFormat(EN, { maximumFractionDigits: 0 });
const SIG2 = new Intl.NumberFormat(EN, { maximumSignificantDigits: 2 });
const SIG3 = new Intl.NumberFormat(EN, { maximumSignificantDigits: 3 });
const SIG4 = new Intl.NumberFormat(EN, { maximumSignificantDigits: 4 });
const TICK = new Intl.NumberFormat(EN, { maximumFractionDigits: 6 });
const ONE_DECIMAL = new Intl.NumberFormat(EN, {
  minimumFractionDigits: 1, maximumFractionDigits: 1,
});

export const DASH = '–';

// A metric or any number from the API; '–' for a missing one, other types as text.
export function fmtNumber(v) {
  if (v === null || v === undefined || v === '') return DASH;
  if (typeof v !== 'number') return String(v);
  if (Number.isNaN(v)) return 'NaN';
  if (!Number.isFinite(v)) return v > 0 ? '∞' : '-∞';
  if (v === 0) return '0'; // also -0
  if (Number.isInteger(v)) return INT.format(v);
  const a = Math.abs(v);
  if (a >= 1000) return SIG4.format(v);
  if (a >= 1) return SIG3.format(v);
  if (a >= 1e-4) return SIG2.format(v);
  return v.toExponential(1).replace(/\.0e/, 'e').replace('e+', 'e');
}

// A step number, a count of steps, items or groups: whole, with separators; '' for a value that
// is not a whole number (an axis tick between two steps).
export function fmtStep(v) {
  if (typeof v !== 'number' || !Number.isInteger(v)) return '';
  return INT.format(v);
}

// A chart's value-axis tick: the tick's own value (uPlot picks round numbers; 0.125 must not
// read 0.13), with separators; 1.5M from a million on, where the axis has no room.
export function fmtTick(v) {
  if (v === null || v === undefined) return '';
  const r = Math.abs(v) >= 1e6 ? +(v / 1e6).toFixed(3) : +v.toFixed(6); // without float noise
  const text = r === 0 ? '0' : TICK.format(r);
  return Math.abs(v) >= 1e6 ? `${text}M` : text;
}

// Whole increments for the step axis: 1, 2, 5, 10, 20, 25, 50, 100, ... up to 5e9.
export const STEP_INCRS = (() => {
  const out = [];
  for (let p = 1; p <= 1e9; p *= 10) out.push(p, 2 * p, ...(p >= 10 ? [2.5 * p] : []), 5 * p);
  return out;
})();

// A size in bytes: 512 B, 388.0 KiB, 1.5 MiB, 2.3 GiB.
export function fmtBytes(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return DASH;
  if (n < 1024) return `${INT.format(n)} B`;
  if (n < 1024 ** 2) return `${ONE_DECIMAL.format(n / 1024)} KiB`;
  if (n < 1024 ** 3) return `${ONE_DECIMAL.format(n / 1024 ** 2)} MiB`;
  return `${ONE_DECIMAL.format(n / 1024 ** 3)} GiB`;
}

// A progress report of a long pass (a `progress` event's data, or a job's `progress`), as
// `dapod train` prints it, numbers written as above:
//   step 3: update 2/4 micro-batches, 4,800 tokens
//   step 3: generation round 1 5/8 sequences, 40 tokens
export function fmtProgress(p) {
  if (!p) return '';
  const round = p.pass === 'generation' && p.round ? ` round ${fmtStep(p.round)}` : '';
  const unit = p.unit === 'sequences' ? 'sequences' : 'micro-batches';
  return `step ${fmtStep(p.step)}: ${p.pass}${round} ${fmtStep(p.done)}/${fmtStep(p.total)} ${unit}, ${fmtNumber(p.tokens)} tokens`;
}
