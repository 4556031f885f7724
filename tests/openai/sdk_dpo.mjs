// The official openai SDK (pinned in package.json) drives a DPO job on dapod, unchanged:
// node sdk_dpo.mjs BASE_URL WORKDIR. files.create of OpenAI's preference lines, a bad file and a
// beta out of range refused (OpenAI's error shape naming the line or field),
// fineTuning.jobs.create with method dpo, retrieve until succeeded, listEvents, checkpoints.list,
// files.content of result_files[0], then chat.completions on the fine-tuned model. Exits
// non-zero on the first surprise; prints one line per check.
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';

const [baseURL, work] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || 'x', maxRetries: 0 });
function check(cond, what) {
  if (!cond) throw new Error('check failed: ' + what);
  console.log('ok', what);
}
async function refused(promise, what) {
  try {
    await promise;
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.type === 'invalid_request_error', what + ' refused');
    return e;
  }
  throw new Error('check failed: ' + what + ' was accepted');
}
async function upload(name, lines) {
  const p = path.join(work, name);
  fs.writeFileSync(p, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
  return client.files.create({ file: fs.createReadStream(p), purpose: 'fine-tune' });
}

// OpenAI's DPO lines on the tiny preset: after the question "ab", prefer the digit after b to
// the one before it (mod 10); questions whose (10a + b) mod 3 is 0 held out for validation
const pair = (a, b) => ({
  input: { messages: [{ role: 'user', content: `${a}${b}` }] },
  preferred_output: [{ role: 'assistant', content: String((b + 1) % 10) }],
  non_preferred_output: [{ role: 'assistant', content: String((b + 9) % 10) }] });
const trainLines = [], validLines = [];
for (let a = 0; a < 10; a++)
  for (let b = 0; b < 10; b++)
    if (a !== b) ((10 * a + b) % 3 ? trainLines : validLines).push(pair(a, b));
const train = await upload('dpo_train.jsonl', trainLines);
const valid = await upload('dpo_valid.jsonl', validLines);
check(train.id && JSON.stringify(train.methods) === '["dpo"]', 'training file uploaded, fit for dpo');

// bad inputs: two preferred outputs (named by line and field), beta 3 (named by field)
const two = pair(1, 2);
two.preferred_output.push({ role: 'assistant', content: '4' });
const bad = await upload('dpo_bad.jsonl', [pair(1, 3), two]);
let e = await refused(client.fineTuning.jobs.create({ model: 'tiny', training_file: bad.id,
  method: { type: 'dpo', dpo: {} } }), 'two preferred outputs');
check(e.param === 'training_file' && e.message.includes("line 2: field 'preferred_output'"),
      'the error names line 2 and preferred_output: ' + e.message);
e = await refused(client.fineTuning.jobs.create({ model: 'tiny', training_file: train.id,
  method: { type: 'dpo', dpo: { hyperparameters: { beta: 3 } } } }), 'beta 3');
check(e.param === 'method.dpo.hyperparameters.beta', 'the error names ' + e.param);

const hyperparameters = { beta: 0.5, n_epochs: 10, batch_size: 10, learning_rate_multiplier: 50 };
const job = await client.fineTuning.jobs.create({
  model: 'tiny', training_file: train.id, validation_file: valid.id, seed: 2, suffix: 'prefs',
  method: { type: 'dpo', dpo: { hyperparameters } } });
check(job.object === 'fine_tuning.job' && job.method.type === 'dpo', 'dpo job created');
check(JSON.stringify(job.method.dpo.hyperparameters) === JSON.stringify(
  { batch_size: 10, learning_rate_multiplier: 50, n_epochs: 10, beta: 0.5 }), 'hyperparameters resolved');

let j = job;
const end = Date.now() + 120000;
while (!['succeeded', 'failed', 'cancelled'].includes(j.status) && Date.now() < end) {
  await new Promise((r) => setTimeout(r, 200));
  j = await client.fineTuning.jobs.retrieve(job.id);
}
check(j.status === 'succeeded', `job ${j.status} ${JSON.stringify(j.error)}`);
check(j.fine_tuned_model === `ft:tiny:dapod:prefs:${j.id}`, 'fine_tuned_model ' + j.fine_tuned_model);
check(Number.isInteger(j.trained_tokens) && j.trained_tokens > 0, 'trained_tokens ' + j.trained_tokens);
check(j.result_files.length === 1, 'one result file');

const metrics = [];
for await (const ev of client.fineTuning.jobs.listEvents(j.id, { limit: 50 }))
  if (ev.type === 'metrics') metrics.push(ev.data);
const train_ev = metrics.filter((d) => 'train_loss' in d);
const valid_ev = metrics.filter((d) => 'valid_loss' in d).sort((a, b) => a.step - b.step);
check(train_ev.length === 60 && train_ev.every((d) => d.total_steps === 60 &&
      typeof d.train_rewards_accuracy === 'number' && typeof d.train_rewards_margin === 'number'),
      `${train_ev.length} training metrics events`);
const first = valid_ev[0], last = valid_ev[valid_ev.length - 1];
check(first.step === 0 && last.step === 60 && last.valid_rewards_accuracy > 0.7 &&
      last.valid_loss < first.valid_loss,
      `held-out rewards accuracy ${first.valid_rewards_accuracy} -> ${last.valid_rewards_accuracy}, ` +
      `loss ${first.valid_loss} -> ${last.valid_loss}`);

const cks = [];
for await (const c of client.fineTuning.jobs.checkpoints.list(j.id)) cks.push(c);
check(cks.length > 0 && cks[0].step_number === 60 && typeof cks[0].metrics.train_loss === 'number' &&
      cks[0].fine_tuned_model_checkpoint === `ft:tiny:dapod:prefs:${j.id}:ckpt-step-60`,
      `${cks.length} checkpoints, the newest with its train_loss`);

const csv = await (await client.files.content(j.result_files[0])).text();
const rows = csv.trim().split('\n');
check(rows[0] === 'step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy' &&
      rows.length === 61, `result CSV: ${rows.length - 1} rows`);
const row60 = rows[60].split(',');
check(Number(row60[0]) === 60 && Number(row60[2]) === train_ev.find((d) => d.step === 60).train_rewards_accuracy &&
      Number(row60[4]) === last.valid_rewards_accuracy, 'the CSV\'s last row equals the step-60 events');

// chat on the fine-tuned model answers (what it prefers is measured by the rewards above)
const c = await client.chat.completions.create({ model: j.fine_tuned_model, temperature: 0,
  max_completion_tokens: 2, messages: [{ role: 'user', content: '36' }] });
check(typeof c.choices[0].message.content === 'string' && c.model === j.fine_tuned_model,
      `chat on the fine-tuned model: '${c.choices[0].message.content}'`);
