// The official openai SDK (pinned in package.json) drives a supervised fine-tuning job on dapod,
// unchanged: node sdk_sft.mjs BASE_URL WORKDIR. files.create, fineTuning.jobs.create with
// method supervised, retrieve until succeeded, listEvents, checkpoints.list, files.content of
// result_files[0], then chat.completions on the fine-tuned model. Exits non-zero on the first
// surprise; prints one line per check.
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';

const [baseURL, work] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || 'x', maxRetries: 0 });
function check(cond, what) {
  if (!cond) throw new Error('check failed: ' + what);
  console.log('ok', what);
}

// chat lines: the tiny preset learns a+b (the answer, then the newline that ends its turn)
const lines = [];
for (let a = 0; a < 10; a++)
  for (let b = 0; b < 10; b++)
    lines.push(JSON.stringify({ messages: [{ role: 'user', content: `${a}+${b}=` },
                                           { role: 'assistant', content: String(a + b) }] }));
const trainPath = path.join(work, 'sft_train.jsonl');
fs.writeFileSync(trainPath, lines.join('\n') + '\n');
const train = await client.files.create({ file: fs.createReadStream(trainPath), purpose: 'fine-tune' });
check(train.id && train.object === 'file', 'training file uploaded');

const hyperparameters = { n_epochs: 40, batch_size: 20, learning_rate_multiplier: 300 };
const job = await client.fineTuning.jobs.create({
  model: 'tiny', training_file: train.id, validation_file: train.id, seed: 1, suffix: 'sums',
  method: { type: 'supervised', supervised: { hyperparameters } } });
check(job.object === 'fine_tuning.job' && job.method.type === 'supervised', 'supervised job created');
check(JSON.stringify(job.method.supervised.hyperparameters) === JSON.stringify(
  { batch_size: 20, learning_rate_multiplier: 300, n_epochs: 40 }), 'hyperparameters resolved');

let j = job;
const end = Date.now() + 120000;
while (!['succeeded', 'failed', 'cancelled'].includes(j.status) && Date.now() < end) {
  await new Promise((r) => setTimeout(r, 200));
  j = await client.fineTuning.jobs.retrieve(job.id);
}
check(j.status === 'succeeded', `job ${j.status} ${JSON.stringify(j.error)}`);
check(j.fine_tuned_model === `ft:tiny:dapod:sums:${j.id}`, 'fine_tuned_model ' + j.fine_tuned_model);
check(Number.isInteger(j.trained_tokens) && j.trained_tokens > 0, 'trained_tokens ' + j.trained_tokens);
check(j.result_files.length === 1, 'one result file');

// events: auto-pagination through every page
const metrics = [];
for await (const ev of client.fineTuning.jobs.listEvents(j.id, { limit: 50 }))
  if (ev.type === 'metrics') metrics.push(ev.data);
const train_ev = metrics.filter((d) => 'train_loss' in d);
const valid_ev = metrics.filter((d) => 'valid_loss' in d).sort((a, b) => a.step - b.step);
check(train_ev.length === 200 && train_ev.every((d) => d.total_steps === 200 &&
      typeof d.train_mean_token_accuracy === 'number'), `${train_ev.length} training metrics events`);
check(valid_ev.length >= 2 && valid_ev[0].step === 0, `${valid_ev.length} validation metrics events`);
const first = valid_ev[0], last = valid_ev[valid_ev.length - 1];
check(last.step === 200 && last.valid_loss < first.valid_loss / 4 && last.valid_mean_token_accuracy > 0.6,
      `validation loss ${first.valid_loss} -> ${last.valid_loss}, token accuracy ${last.valid_mean_token_accuracy}`);

const cks = [];
for await (const c of client.fineTuning.jobs.checkpoints.list(j.id)) cks.push(c);
check(cks.length > 0 && cks[0].step_number === 200 && typeof cks[0].metrics.train_loss === 'number' &&
      cks[0].fine_tuned_model_checkpoint === `ft:tiny:dapod:sums:${j.id}:ckpt-step-200`,
      `${cks.length} checkpoints, the newest with its train_loss`);

// the result file: the CSV of the steps
const file = await client.files.retrieve(j.result_files[0]);
check(file.purpose === 'fine-tune-results', 'result file purpose ' + file.purpose);
const csv = await (await client.files.content(j.result_files[0])).text();
const rows = csv.trim().split('\n');
check(rows[0] === 'step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy' &&
      rows.length === 201, `result CSV: ${rows.length - 1} rows`);
const row200 = rows[200].split(',');
const ev200 = train_ev.find((d) => d.step === 200);
check(Number(row200[0]) === 200 && Number(row200[1]) === ev200.train_loss &&
      Number(row200[3]) === last.valid_loss, 'the CSV\'s last row equals the step-200 events');

// chat on the fine-tuned model: greedy sums
let right = 0;
for (const [a, b] of [[1, 2], [3, 4], [5, 2], [2, 6], [4, 4], [0, 7], [6, 1], [3, 3]]) {
  const c = await client.chat.completions.create({ model: j.fine_tuned_model, temperature: 0,
    max_completion_tokens: 4, messages: [{ role: 'user', content: `${a}+${b}=` }] });
  if (c.choices[0].message.content.trim() === String(a + b)) right++;
}
check(right >= 5, `chat on the fine-tuned model: ${right}/8 sums right`);
