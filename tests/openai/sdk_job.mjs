// The official openai SDK (pinned in package.json) drives a whole reinforcement fine-tuning job
// on dapod, unchanged: node sdk_job.mjs BASE_URL WORKDIR. Exits non-zero on the first surprise;
// prints one line per check.
import fs from 'node:fs';
import path from 'node:path';
import OpenAI, { toFile } from 'openai';

const [baseURL, work] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || 'x', maxRetries: 0 });
let checks = 0;
function check(cond, what) {
  checks++;
  if (!cond) throw new Error('check failed: ' + what);
  console.log('ok', what);
}
async function raises(p, cls, what) {
  try {
    await p;
  } catch (e) {
    check(e instanceof cls, `${what}: ${e.constructor.name} ${e.status} ${e.message}`);
    return e;
  }
  throw new Error(what + ': no error');
}

const lines = [];
for (let a = 0; a < 5; a++)
  for (let b = 0; b < 5; b++)
    lines.push(JSON.stringify({ messages: [{ role: 'user', content: `What is ${a}+${b}?` }],
                                answer: undefined, sum: String(a + b) }));
const trainPath = path.join(work, 'train.jsonl');
fs.writeFileSync(trainPath, lines.join('\n') + '\n');

// 1. files: a stream (chunked upload) and a buffer
const train = await client.files.create({ file: fs.createReadStream(trainPath), purpose: 'fine-tune' });
check(train.id && train.object === 'file' && train.bytes > 0, 'training file uploaded (chunked)');
const valid = await client.files.create({
  file: await toFile(Buffer.from(lines.slice(0, 5).join('\n') + '\n'), 'valid.jsonl'),
  purpose: 'fine-tune' });
check(valid.id !== train.id, 'validation file uploaded');
const got = await client.files.retrieve(train.id);
check(got.id === train.id, 'file retrieved');
// files.waitForProcessing() returns at its first retrieve when the status is terminal (maxWait 0:
// any other status would be a timeout error, not a wait)
const processed = await client.files.waitForProcessing(train.id, { pollInterval: 10, maxWait: 0 });
check(processed.status === 'processed' && processed.status_details === null &&
      processed.validation === 'valid', `waitForProcessing: a valid upload is processed (${processed.status})`);
const broken = await client.files.create({
  file: await toFile(Buffer.from('{"messages": "not a list"}\nnot json\n'), 'broken.jsonl'),
  purpose: 'fine-tune' });
const failed = await client.files.waitForProcessing(broken.id, { pollInterval: 10, maxWait: 0 });
check(failed.status === 'error' && failed.validation === 'invalid' &&
      /^invalid dataset: line 1: /.test(failed.status_details) && failed.errors.length === 2,
      `waitForProcessing: an invalid upload is error, status_details "${failed.status_details}"`);
check((await client.files.delete(broken.id)).deleted === true, 'the invalid upload deleted');

const grader = {
  type: 'multi', name: 'sum',
  graders: {
    exact: { type: 'string_check', name: 'exact', input: '{{sample.output_text}}',
             reference: '{{item.sum}}', operation: 'eq' },
    close: { type: 'text_similarity', name: 'close', input: '{{sample.output_text}}',
             reference: '{{item.sum}}', evaluation_metric: 'fuzzy_match' },
  },
  calculate_output: '0.9 * exact + 0.1 * close',
};

// 2. graders run and validate
const v = await client.fineTuning.alpha.graders.validate({ grader });
check(v.grader.type === 'multi', 'grader validated');
const run = await client.fineTuning.alpha.graders.run({ grader, model_sample: '7', item: { sum: '7' } });
check(Math.abs(run.reward - 1) < 1e-9 && run.metadata.errors.invalid_variable_error === false,
      'grader run: reward 1');
const bad = await client.fineTuning.alpha.graders.run({ grader, model_sample: '7', item: {} });
check(bad.reward === 0 && bad.metadata.errors.invalid_variable_error === true,
      'grader run: invalid variable counted');

// 3. jobs: one that trains, one that waits behind it (one worker)
const hp = { n_epochs: 'auto', batch_size: 16, eval_interval: 20, learning_rate_multiplier: 'auto',
             // DAPO's own knobs, by their native names
             total_steps: 40, max_new_tokens: 1, group_size: 16, learning_rate: 0.002 };
const job = await client.fineTuning.jobs.create({
  model: 'tiny', training_file: train.id, validation_file: valid.id, seed: 1, suffix: 'sums',
  metadata: { team: 'a' },
  method: { type: 'reinforcement', reinforcement: { grader, hyperparameters: hp } } });
check(job.object === 'fine_tuning.job' && job.id, 'job created: ' + job.status);
let j = job; // the queue holds one job (--max-queued-jobs 1): wait for the worker to take it
while (j.status === 'queued') {
  await new Promise((r) => setTimeout(r, 100));
  j = await client.fineTuning.jobs.retrieve(job.id);
}
const other = await client.fineTuning.jobs.create({
  model: 'tiny', training_file: train.id, metadata: { team: 'b' },
  method: { type: 'reinforcement', reinforcement: { grader, hyperparameters: { total_steps: 2 } } } });
check(other.status === 'queued', 'second job queued behind the first');

// errors: 400, 401, 404, 409 (below), 429, each with OpenAI's error members
let e = await raises(client.fineTuning.jobs.create({ model: 'tiny', training_file: train.id,
  method: { type: 'ppo', ppo: {} } }), OpenAI.BadRequestError, 'an unknown method refused');
check(e.param === 'method.type' && e.type === 'invalid_request_error', '400 names method.type');
e = await raises(client.chat.completions.create({ model: 'tiny', messages: [], n: 1 }),
                 OpenAI.BadRequestError, 'empty messages refused');
check(e.param === 'messages', '400 names messages');
const stranger = new OpenAI({ baseURL, apiKey: 'not-a-key', maxRetries: 0 });
e = await raises(stranger.fineTuning.jobs.list(), OpenAI.AuthenticationError, 'unknown API key');
check(e.type === 'authentication_error' && e.code === 'unauthorized', '401 in OpenAI\'s shape');
await raises(stranger.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] }),
             OpenAI.AuthenticationError, 'unknown API key on chat');
e = await raises(client.fineTuning.jobs.retrieve('job-nope'), OpenAI.NotFoundError, 'unknown job');
check(e.code === 'not_found' && e.param === 'fine_tuning_job_id', '404 names the job');
await raises(client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'hi' }] }),
             OpenAI.NotFoundError, 'unknown model');
e = await raises(client.fineTuning.jobs.create({ model: 'tiny', training_file: train.id,
  method: { type: 'reinforcement', reinforcement: { grader, hyperparameters: { total_steps: 2 } } } }),
  OpenAI.RateLimitError, 'a second queued job is over max_queued_jobs');
check(e.type === 'rate_limit_error' && e.headers.get('retry-after') === '30', '429 with Retry-After');
// pagination and the metadata filter
const page = await client.fineTuning.jobs.list({ limit: 1 });
check(page.data.length === 1 && page.data[0].id === other.id && page.has_more, 'first page');
const ids = [];
for await (const j of client.fineTuning.jobs.list({ limit: 1 })) ids.push(j.id);
check(ids.includes(job.id) && ids.includes(other.id), 'auto-pagination lists both jobs');
const a = await client.fineTuning.jobs.list({ metadata: { team: 'a' } });
check(a.data.length === 1 && a.data[0].id === job.id, 'metadata filter');

// pause while it runs, resume
if (j.status === 'running') {
  await raises(client.fineTuning.jobs.pause(other.id), OpenAI.ConflictError, 'pausing a queued job');
  j = await client.fineTuning.jobs.pause(job.id);
  check(['running', 'paused'].includes(j.status), 'pause accepted: ' + j.status);
  while (j.status === 'running') j = await client.fineTuning.jobs.retrieve(job.id);
  check(j.status === 'paused' || j.status === 'succeeded', 'paused: ' + j.status);
  if (j.status === 'paused') {
    j = await client.fineTuning.jobs.resume(job.id);
    check(j.status === 'queued' || j.status === 'running', 'resumed: ' + j.status);
  }
}
let c = await client.fineTuning.jobs.cancel(other.id); // it may have started while A was paused
while (c.status === 'running') c = await client.fineTuning.jobs.retrieve(other.id);
check(c.status === 'cancelled', 'second job cancelled');
while (!['succeeded', 'failed', 'cancelled'].includes(j.status)) {
  await new Promise((r) => setTimeout(r, 200));
  j = await client.fineTuning.jobs.retrieve(job.id);
}
check(j.status === 'succeeded' && j.fine_tuned_model.startsWith('ft:tiny:'), 'succeeded: ' + j.fine_tuned_model);
e = await raises(client.fineTuning.jobs.cancel(job.id), OpenAI.ConflictError, 'cancelling a finished job');
check(e.code === 'invalid_state' && e.headers.get('x-should-retry') === 'false', '409 not retried');

// events and checkpoints
const events = [];
for await (const ev of client.fineTuning.jobs.listEvents(job.id, { limit: 10 })) events.push(ev);
const metrics = events.filter((e) => e.type === 'metrics');
check(metrics.length >= 40 && metrics.some((e) => typeof e.data.train_mean_reward === 'number'),
      `events: ${events.length}, metrics ${metrics.length}`);
check(events[0].id !== events[1].id && events.every((e) => e.object === 'fine_tuning.job.event'),
      'events newest first, unique ids');
const ck = await client.fineTuning.jobs.checkpoints.list(job.id);
check(ck.data.length >= 2 && ck.data[0].step_number > ck.data[1].step_number, 'checkpoints newest first');
check(ck.data[0].fine_tuned_model_checkpoint.includes(':ckpt-step-'), ck.data[0].fine_tuned_model_checkpoint);

// chat completions on the fine-tuned model and on a checkpoint, plain and streamed
const chat = await client.chat.completions.create({ model: j.fine_tuned_model,
  messages: [{ role: 'user', content: 'What is 2+3?' }], max_completion_tokens: 1, temperature: 0,
  logprobs: true, top_logprobs: 1 });
check(chat.object === 'chat.completion' && typeof chat.choices[0].message.content === 'string' &&
      chat.choices[0].logprobs.content.length === 1, 'chat: ' + chat.choices[0].message.content);
const stream = await client.chat.completions.create({
  model: ck.data[0].fine_tuned_model_checkpoint, messages: [{ role: 'user', content: 'What is 1+1?' }],
  max_tokens: 1, temperature: 0, stream: true, stream_options: { include_usage: true } });
let text = '', usage = null;
for await (const chunk of stream) {
  text += chunk.choices[0]?.delta?.content ?? '';
  if (chunk.usage) usage = chunk.usage;
}
check(text.length === 1 && usage && usage.completion_tokens === 1, 'streamed chat: ' + text);
// top_logprobs in the SDK's shape: per content entry the 5 likeliest, most likely first, the greedy
// token first with its own logprob; the legacy route's integer logprobs as {token: logprob}
const top = await client.chat.completions.create({ model: 'tiny', max_tokens: 3, temperature: 0,
  messages: [{ role: 'user', content: 'What is 2+2?' }], logprobs: true, top_logprobs: 5 });
check(top.choices[0].logprobs.content.length === 3 && top.choices[0].logprobs.content.every((e) =>
  e.top_logprobs.length === 5 && e.top_logprobs[0].token === e.token &&
  e.top_logprobs[0].logprob === e.logprob && JSON.stringify(e.top_logprobs[0].bytes) === JSON.stringify(e.bytes) &&
  e.top_logprobs.every((a, i) => typeof a.token === 'string' && a.logprob <= 0 && Array.isArray(a.bytes) &&
                                 (i === 0 || a.logprob <= e.top_logprobs[i - 1].logprob))),
      'chat top_logprobs: ' + JSON.stringify(top.choices[0].logprobs.content[0]));
const legacy = await client.completions.create({ model: 'tiny', prompt: 'What is 2+2?', max_tokens: 3,
  temperature: 0, logprobs: 5 });
check(legacy.choices[0].logprobs.top_logprobs.length === 3 &&
      legacy.choices[0].logprobs.top_logprobs.every((d, t) =>
        Object.keys(d).length === 5 && /* (JS lists integer-like keys first: compare the best) */
        Math.max(...Object.values(d)) === top.choices[0].logprobs.content[t].logprob),
      'completions top_logprobs: ' + JSON.stringify(legacy.choices[0].logprobs.top_logprobs[0]));
const many = await client.chat.completions.create({ model: 'tiny', n: 2, seed: 3, stop: ['\n'],
  messages: [{ role: 'user', content: 'What is 2+2?' }], max_tokens: 4 });
check(many.choices.length === 2, 'n=2 on a base model');
// stop ends generation; streamed token by token, the concatenation is the whole answer (same seed)
const req = { model: 'tiny', n: 2, seed: 4, max_tokens: 24, logprobs: true, top_logprobs: 3,
  messages: [{ role: 'user', content: 'What is 3+4?' }] };
const free = await client.chat.completions.create(req);
const stopAt = free.choices[0].message.content.slice(2, 4);
const whole = await client.chat.completions.create({ ...req, stop: [stopAt] });
check(whole.choices[0].finish_reason === 'stop' && whole.usage.completion_tokens < free.usage.completion_tokens &&
      whole.choices[0].message.content === free.choices[0].message.content.split(stopAt)[0] &&
      whole.choices[0].logprobs.content.length < free.choices[0].logprobs.content.length,
      'stop ends generation: ' + JSON.stringify(stopAt) + ' -> ' + JSON.stringify(whole.choices[0].message.content));
const parts = [[], []], finish = [null, null], lps = [[], []];
let streamed = null;
for await (const chunk of await client.chat.completions.create({ ...req, stop: [stopAt], stream: true,
  stream_options: { include_usage: true } })) {
  if (chunk.usage) streamed = chunk.usage;
  for (const c of chunk.choices) {
    parts[c.index].push(c.delta?.content ?? '');
    if (c.finish_reason) finish[c.index] = c.finish_reason;
    if (c.logprobs) lps[c.index].push(...c.logprobs.content);
  }
}
check([0, 1].every((i) => parts[i].join('') === whole.choices[i].message.content &&
                          finish[i] === whole.choices[i].finish_reason &&
                          JSON.stringify(lps[i]) === JSON.stringify(whole.choices[i].logprobs.content)) &&
      JSON.stringify(streamed) === JSON.stringify(whole.usage) && parts[1].length > 3,
      `streamed chat (n 2, stop, logprobs, top_logprobs) equals the whole answer: ${parts[0].length + parts[1].length} chunks`);

// a python grader inside a job (bubblewrap sandbox); skipped, saying why, where it cannot run
const pyGrader = { type: 'python', name: 'py', source:
  'def grade(sample, item):\n    return 1.0 if sample["output_text"].strip() == item["sum"] else 0.0\n' };
let sandbox = true;
try {
  await client.fineTuning.alpha.graders.validate({ grader: pyGrader });
} catch (err) {
  if (!(err instanceof OpenAI.BadRequestError) || err.param !== 'grader.type') throw err;
  console.log('python grader skipped: ' + err.message);
  sandbox = false;
}
if (sandbox) {
  const ok = await client.fineTuning.alpha.graders.run({ grader: pyGrader, model_sample: '4', item: { sum: '4' } });
  check(ok.reward === 1, 'python grader run: reward 1');
  const raising = { type: 'python', name: 'boom', source: 'def grade(sample, item):\n    raise ValueError("no")\n' };
  const bad = await client.fineTuning.alpha.graders.run({ grader: raising, model_sample: '4', item: {} });
  check(bad.reward === 0 && bad.metadata.errors.python_grader_runtime_error &&
        /ValueError/.test(bad.metadata.errors.python_grader_runtime_error_details),
        'a raising python grader scores 0, counted: ' + bad.metadata.errors.python_grader_runtime_error_details);
  let pj = await client.fineTuning.jobs.create({ model: 'tiny', training_file: train.id, seed: 2,
    method: { type: 'reinforcement', reinforcement: { grader: pyGrader,
      hyperparameters: { total_steps: 2, max_new_tokens: 1, group_size: 4, batch_size: 4 } } } });
  while (!['succeeded', 'failed', 'cancelled'].includes(pj.status)) {
    await new Promise((r) => setTimeout(r, 200));
    pj = await client.fineTuning.jobs.retrieve(pj.id);
  }
  check(pj.status === 'succeeded', 'a job rewarded by a python grader: ' + pj.status);
  const pev = await client.fineTuning.jobs.listEvents(pj.id, { limit: 100 });
  const rewards = pev.data.filter((e) => e.type === 'metrics' && typeof e.data.train_mean_reward === 'number')
    .map((e) => e.data.train_mean_reward);
  check(rewards.length === 2 && rewards.every((x) => x >= 0 && x <= 1), 'its rewards: ' + rewards.join(', '));
}
console.log(`${checks} checks passed`);
