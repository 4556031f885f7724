// The official openai SDK drives a checkpoint through tool calls (docs/AGENTS.md "Serving what
// was trained"): node sdk_tools.mjs BASE_URL MODEL, MODEL a checkpoint that calls its one tool
// (test_openai_sdk.py trains it: the tiny preset against the stand-in environment's /ask route).
// Checked: chat.completions.create with tools answers tool_calls; the stream helper's
// accumulator builds the same call from the streamed delta.tool_calls; runTools runs the loop
// (the SDK calls our function with the call's arguments, sends its answer back, and the model
// calls again), streamed too. Exits non-zero on the first surprise.
import OpenAI from 'openai';

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || 'x', maxRetries: 0 });
let checks = 0;
function check(cond, what) {
  checks++;
  if (!cond) throw new Error('check failed: ' + what);
  console.log('ok', what);
}

const tool = { type: 'function', function: { name: 'lookup', description: 'the code of a key',
                                              parameters: { type: 'object', properties: {} } } };
const base = { model, messages: [{ role: 'user', content: 'code 12?' }], max_tokens: 1,
               temperature: 0, seed: 3 };

// 1. a call
const c = await client.chat.completions.create({ ...base, tools: [tool] });
const call = c.choices[0].message.tool_calls?.[0];
check(c.choices[0].finish_reason === 'tool_calls' && call?.type === 'function' &&
      call.function.name === 'lookup' && JSON.parse(call.function.arguments) !== null,
      `create: finish_reason tool_calls, ${call?.function.name}(${call?.function.arguments})`);

// 2. the stream helper accumulates the streamed call
const stream = client.chat.completions.stream({ ...base, tools: [tool] });
const done = await stream.finalChatCompletion();
const scall = done.choices[0].message.tool_calls?.[0];
check(done.choices[0].finish_reason === 'tool_calls' && scall?.function.name === 'lookup' &&
      scall.function.arguments === call.function.arguments && scall.id,
      'stream: the accumulator builds the same call from delta.tool_calls');

// 3. runTools: the loop, twice, without and with streaming
for (const streaming of [false, true]) {
  const seen = [];
  const lookup = { type: 'function', function: {
    name: 'lookup', description: 'the code of a key', parameters: { type: 'object', properties: {} },
    parse: JSON.parse, function: (args) => { seen.push(args); return '7'; } } };
  const runner = client.chat.completions.runTools(
    { ...base, tools: [lookup], parallel_tool_calls: false, ...(streaming ? { stream: true } : {}) },
    { maxChatCompletions: 2 });
  await runner.done();
  const roles = runner.messages.map((m) => m.role);
  check(seen.length === 2 && seen.every((a) => JSON.stringify(a) === '{}') &&
        JSON.stringify(roles) === JSON.stringify(['user', 'assistant', 'tool', 'assistant', 'tool']) &&
        runner.messages[2].content === '7' &&
        runner.messages[2].tool_call_id === runner.messages[1].tool_calls[0].id,
        `runTools${streaming ? ' (stream)' : ''}: our function called twice, its answer sent back (${roles.join(' ')})`);
}
console.log(`${checks} checks passed`);
