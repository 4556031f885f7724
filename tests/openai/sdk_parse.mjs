// Structured outputs through the official openai SDK (pinned in package.json), unchanged:
// node sdk_parse.mjs BASE_URL WORKDIR. chat.completions.parse with a plain (zod-free) json_schema
// response_format on the tiny preset (random weights: what it writes is dapod's mask): every
// reply comes back as message.parsed, an object of the schema; the streamed helper's final
// completion is the same reply for the same seed; a reply cut by max_tokens is the SDK's
// LengthFinishReasonError; a schema with a keyword outside the subset is a BadRequestError whose
// param names it. Exits non-zero on the first surprise; prints one line per check.
import OpenAI from 'openai';
import { LengthFinishReasonError } from 'openai/error';

const [baseURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || 'x', maxRetries: 0 });
function check(cond, what) {
  if (!cond) throw new Error('check failed: ' + what);
  console.log('ok', what);
}

const schema = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 8 },
    population: { type: 'integer', minimum: 1, maximum: 99999 },
    coastal: { type: 'boolean' },
    rating: { anyOf: [{ type: 'number', minimum: 0, maximum: 5 }, { type: 'null' }] },
    climate: { type: 'string', enum: ['dry', 'wet', 'cold'] },
  },
  required: ['city', 'population', 'coastal', 'rating', 'climate'],
  additionalProperties: false,
};
const response_format = { type: 'json_schema', json_schema: { name: 'city', strict: true, schema } };
const messages = [{ role: 'user', content: 'A city, please.' }];

function valid(p) {
  return p && typeof p === 'object' && !Array.isArray(p) &&
    JSON.stringify(Object.keys(p)) === JSON.stringify(Object.keys(schema.properties)) &&
    typeof p.city === 'string' && [...p.city].length <= 8 &&
    Number.isInteger(p.population) && p.population >= 1 && p.population <= 99999 &&
    typeof p.coastal === 'boolean' &&
    (p.rating === null || (typeof p.rating === 'number' && p.rating >= 0 && p.rating <= 5)) &&
    ['dry', 'wet', 'cold'].includes(p.climate);
}

let parsed = 0;
for (let seed = 1; seed <= 8; seed++) {
  const c = await client.chat.completions.parse({ model: 'tiny', messages, response_format,
                                                  max_tokens: 300, temperature: 1, seed });
  const m = c.choices[0].message;
  check(c.choices[0].finish_reason === 'stop' && valid(m.parsed) &&
        JSON.stringify(m.parsed) === JSON.stringify(JSON.parse(m.content)), `seed ${seed}: parsed ${m.content}`);
  parsed++;
}
check(parsed === 8, '8 of 8 replies parsed');

// the streaming helper: the same reply for the same seed (the SDK parses a stream's final
// message only for its auto-parseable (zod) formats, so the content is parsed here)
const whole = await client.chat.completions.parse({ model: 'tiny', messages, response_format,
                                                    max_tokens: 300, temperature: 1, seed: 3 });
const stream = client.chat.completions.stream({ model: 'tiny', messages, response_format,
                                                max_tokens: 300, temperature: 1, seed: 3 });
const final = await stream.finalChatCompletion();
const streamed = final.choices[0].message.content;
check(streamed === whole.choices[0].message.content && valid(JSON.parse(streamed)) &&
      final.choices[0].finish_reason === 'stop', 'streamed reply: the same object ' + streamed);

// cut by max_tokens: finish_reason "length", which parse reports as LengthFinishReasonError
try {
  await client.chat.completions.parse({ model: 'tiny', messages, response_format, max_tokens: 4 });
  check(false, 'a cut reply throws');
} catch (err) {
  check(err instanceof LengthFinishReasonError, 'cut reply: ' + err.constructor.name);
}

// a keyword outside the subset: refused by name
try {
  const bad = { type: 'object', properties: { x: { type: 'string', format: 'iri' } } };
  await client.chat.completions.parse({ model: 'tiny', messages, max_tokens: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'bad', strict: true, schema: bad } } });
  check(false, 'a bad schema is refused');
} catch (err) {
  check(err instanceof OpenAI.BadRequestError &&
        err.param === 'response_format.json_schema.schema.properties.x.format',
        `refused: ${err.status} ${err.param}: ${err.message}`);
}
