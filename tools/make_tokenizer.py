#!/usr/bin/env python3
"""Builds the tokenizer test fixtures for kiln's C++ tokenizer (core/src/tokenizer).

Trains a small byte-level BPE tokenizer (4096 ids including the GLM special tokens) with the Hugging Face
`tokenizers` package on the docstrings of Python standard-library modules (freely licensed text that is on
every machine), using GLM-4.x's pre-tokenizer (the cl100k-style split regex, then ByteLevel without its own
regex) and GLM-4.7's special tokens, appended after the BPE vocabulary in GLM's order.

Writes
  tests/data/tokenizer/tokenizer.json   the tokenizer, as `tokenizers` serialises it
  tests/data/tokenizer/reference.json   encode/decode results of `tokenizers` over a fixed corpus, plus
                                         variants (a JSON merge patch applied to tokenizer.json and the ids
                                         the patched tokenizer produces) for features the base file lacks
  tests/data/tokenizer/chat_reference.json
                                         conversations and what jinja2 renders for them from GLM-4.7's
                                         chat template, with transformers' settings (trim_blocks,
                                         lstrip_blocks, a tojson that keeps key order and non-ASCII)

Deterministic: fixed module list, sorted inputs, seeded sampling. Run from the repository root:
  python3 tools/make_tokenizer.py
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import random
import warnings
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "tokenizer"

VOCAB_SIZE = 4096
SEED = 20240611

# GLM-4.x tokenizer.json pre-tokenizer split (the cl100k_base pattern without possessive quantifiers).
GLM_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# GLM-4.7's added tokens in id order (real ids 154820..154855; here they follow the BPE vocabulary).
GLM_SPECIAL_TOKENS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
    "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>", "<|end_of_transcription|>",
    "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>",
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "/nothink", "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>",
]

DOCSTRING_MODULES = sorted([
    "abc", "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "cmd", "codecs", "collections",
    "colorsys", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib",
    "email", "enum", "filecmp", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext", "glob",
    "gzip", "hashlib", "heapq", "hmac", "html", "http.client", "imaplib", "inspect", "io", "ipaddress",
    "itertools", "json", "locale", "logging", "mailbox", "math", "mimetypes", "operator", "optparse",
    "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "sched", "secrets", "selectors", "shlex",
    "shutil", "smtplib", "socket", "sqlite3", "statistics", "string", "struct", "subprocess", "tarfile",
    "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace", "traceback", "typing",
    "unittest", "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref", "zipfile",
])

# Text written for these fixtures (not taken from anywhere): scripts the docstrings lack.
EXTRA_TRAINING_TEXT = [
    "你好，世界！今天天气很好。我们一起去公园散步吧。",
    "机器学习模型需要大量的数据来训练。分词器把文本切成词元。",
    "こんにちは、世界。今日はいい天気ですね。",
    "안녕하세요, 세계! 오늘 날씨가 좋네요.",
    "Привет, мир! Как дела? Всё хорошо.",
    "Grüße aus München: Äpfel, Öl und Übermut — café, naïve, façade.",
    "Emoji: 😀 😃 🎉 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨ 🚀",
    "Math: ∑ ∫ √ π ≈ 3.14159, ∞ ≠ ∅, α β γ δ ε.",
]

REFERENCE_TEXTS = [
    "",
    " ",
    "Hello, world!",
    "Hello world",
    " leading space",
    "trailing space ",
    "multiple   spaces    here",
    "tabs\tand\ttabs\t\t\tend",
    "line one\nline two\r\nline three\n\n\nafter blank lines\n",
    "   \n\t  \n  mixed whitespace runs   \t\n",
    "numbers 1 12 123 1234 12345 3.14159 -42 1e10 0x1F",
    "dates 2024-06-11 and times 23:59:59",
    "I'm sure you're right, it's what we'd've done; they'll see. I'M SURE YOU'RE RIGHT",
    "def main(argv):\n    for i in range(10):\n        print(f\"{i:>3}\")  # comment\n    return 0\n",
    "int main() { std::vector<int> v{1, 2, 3}; return v.size() > 2 ? 0 : 1; }",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "path/to/file.txt C:\\Windows\\System32 https://example.com/a?b=c&d=e#f",
    "你好，世界！",
    "机器学习模型需要大量的数据来训练。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "Привет, мир!",
    "Ελληνικά γράμματα",
    "עברית וערבית: مرحبا بالعالم",
    "हिन्दी पाठ",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 heart ❤️",
    "combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0351\u0352\u0353",
    "precomposed: é ä ñ ộ",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "nbsp\u00a0here and\u3000ideographic space",
    "control \u0001\u0002\u007f chars",
    "[gMASK]<sop><|system|>You are helpful.<|user|>Hi<|assistant|><think>",
    "text<|endoftext|>more text",
    "<think>reasoning here</think>answer",
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
    "<|observation|><tool_response>{\"temp\": 21}</tool_response>",
    "adjacent<|user|><|assistant|>tokens",
    "partial <|user and <think but not closed",
    " <|user|> spaces around special ",
    "/nothink please",
    "mixed 中文 and English with 123 numbers and emoji 🚀 together",
    "a" * 300,
    "ab" * 100 + " " + "xyz" * 50,
    "!!!???...,,,;;;:::---___===+++***&&&^^^%%%$$$###@@@",
    "'s 't 're 've 'm 'll 'd",
    "\n",
    "\t",
    "\r\n\r\n",
    "12345678901234567890",
]

# Non-special added tokens exercising lstrip / rstrip / single_word / normalized.
EXTRA_ADDED_TOKENS = [
    AddedToken("<|lstrip|>", lstrip=True, rstrip=False, single_word=False, normalized=False, special=False),
    AddedToken("<|rstrip|>", lstrip=False, rstrip=True, single_word=False, normalized=False, special=False),
    AddedToken("word", lstrip=False, rstrip=False, single_word=True, normalized=False, special=False),
    AddedToken("plain", lstrip=False, rstrip=False, single_word=False, normalized=True, special=False),
    AddedToken("<|both|>", lstrip=True, rstrip=True, single_word=False, normalized=False, special=True),
]
ADDED_TOKEN_TEXTS = [
    "a <|lstrip|> b",
    "a   <|lstrip|>   b",
    "a <|rstrip|> b",
    "a   <|rstrip|>   b",
    "x  <|both|>  y",
    "word words sword word. (word) a_word word1",
    "plain explained plainly plain",
    "word<|lstrip|>word<|rstrip|>plain",
    "\n<|lstrip|>\n",
    "<think> <|both|> </think>",
]


# zai-org/GLM-4.7 chat_template.jinja (MIT licence), the reference kiln's C++ renderer reproduces.
GLM47_CHAT_TEMPLATE = r'''[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>{{ visible_text(m.content) }}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if ((clear_thinking is defined and not clear_thinking) or loop.index0 > ns.last_user_index) and reasoning_content -%}
{{ '<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '</think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{- '<tool_call>' + tc.name -}}
{% set _args = tc.arguments %}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>{% endfor %}</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
{%- if m.content is string -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '<tool_response>' }}
{{- m.content }}
{{- '</tool_response>' }}
{%- else -%}
<|observation|>{% for tr in m.content %}
<tool_response>{{ tr.output if tr.output is defined else tr }}</tool_response>{% endfor -%}
{% endif -%}
{%- elif m.role == 'system' -%}
<|system|>{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '</think>' if (enable_thinking is defined and not enable_thinking) else '<think>' -}}
{%- endif -%}
'''

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city — température, 天气",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {
        "type": "string", "enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
        "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web.\nReturns \"snippets\".",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}}


def call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = [
    ("system_user", [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "Hello!"}], [], {}),
    ("thinking_off", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], [],
     {"enable_thinking": False}),
    ("no_generation_prompt", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}], [],
     {"add_generation_prompt": False}),
    ("multi_turn_history_reasoning", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Simple addition."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "\n 6 \n", "reasoning_content": "  Add again.\n"},
        {"role": "user", "content": "Thanks"}], [], {}),
    ("preserved_thinking", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Simple addition."},
        {"role": "user", "content": "Thanks"}], [], {"clear_thinking": False}),
    ("reasoning_inline_in_content", [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nold thought\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "<think>new thought</think>A2 </think> tail"}], [],
     {"add_generation_prompt": False}),
    ("tools_defined", [{"role": "user", "content": "Weather in Paris?"}], [WEATHER_TOOL, SEARCH_TOOL], {}),
    ("tools_with_system", [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Go"}],
     [SEARCH_TOOL], {"enable_thinking": False}),
    ("tool_call_round_trip", [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris and Tokyo, and search news?"},
        {"role": "assistant", "content": None, "reasoning_content": "I need three calls.",
         "tool_calls": [call("c1", "get_weather", '{"city": "Paris", "unit": "c", "days": 3}'),
                        call("c2", "get_weather", '{"city": "東京", "days": 1.5, "unit": null}'),
                        call("c3", "search", '{"query": "news \\"today\\"", "limit": 5, '
                                             '"filters": {"lang": ["en", "fr"], "safe": true}}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "c2", "content": "{\"temp\": 12}"},
        {"role": "tool", "tool_call_id": "c3", "content": "Headline one.\nHeadline two."},
        {"role": "assistant", "content": "Paris 21°C, Tokyo 12°C.", "reasoning_content": "Summarise."},
        {"role": "user", "content": "Thanks!"}], [WEATHER_TOOL, SEARCH_TOOL], {}),
    ("tool_result_pending", [
        {"role": "user", "content": "Search it"},
        {"role": "assistant", "content": "Searching.", "reasoning_content": "Call search.",
         "tool_calls": [call("c1", "search", '{"query": "kiln"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "result"}], [SEARCH_TOOL], {}),
    ("tool_call_empty_arguments", [
        {"role": "user", "content": "Now"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "search", "{}")]},
        {"role": "tool", "tool_call_id": "c1", "content": ""}], [SEARCH_TOOL], {"enable_thinking": False}),
    ("content_parts", [
        {"role": "system", "content": [{"type": "text", "text": "Part A. "}, {"type": "text", "text": "Part B."}]},
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "text", "text": "多语言 😀"}]}],
     [], {}),
    ("assistant_last_no_user", [
        {"role": "system", "content": "S"},
        {"role": "assistant", "content": "Hello, how can I help?", "reasoning_content": "Greet."}], [], {}),
]


def render_chat(template: str, messages: list[dict], tools: list[dict], options: dict) -> str:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    jinja_messages = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""  # kiln reads null content as "", as vLLM does
        if "tool_calls" in m:
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        jinja_messages.append(m)
    kwargs = {"add_generation_prompt": options.get("add_generation_prompt", True)}
    for key in ("enable_thinking", "clear_thinking"):
        if key in options:
            kwargs[key] = options[key]
    return env.from_string(template).render(messages=jinja_messages, tools=tools, **kwargs)


def chat_reference() -> list[dict]:
    return [{"name": name, "messages": messages, "tools": tools, "options": options,
             "expected": render_chat(GLM47_CHAT_TEMPLATE, messages, tools, options)}
            for name, messages, tools, options in CONVERSATIONS]


def docstring_corpus() -> list[str]:
    texts: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in DOCSTRING_MODULES:
            try:
                module = importlib.import_module(name)
            except Exception:  # a module missing from this Python build is simply skipped
                continue
            docs = [inspect.getdoc(module) or ""]
            for attr in sorted(dir(module)):
                if attr.startswith("_"):
                    continue
                obj = getattr(module, attr, None)
                if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj):
                    docs.append(inspect.getdoc(obj) or "")
            texts.extend(d for d in docs if d)
    return texts


def train(corpus: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(GLM_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GLM_SPECIAL_TOKENS])
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE, tok.get_vocab_size(with_added_tokens=True)
    return tok


def encode(tok: Tokenizer, text: str, parse_special: bool) -> list[int]:
    tok.encode_special_tokens = not parse_special
    ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return ids


def case(tok: Tokenizer, text: str) -> dict:
    ids = encode(tok, text, parse_special=True)
    ids_plain = encode(tok, text, parse_special=False)
    return {
        "text": text,
        "ids": ids,
        "ids_no_special": ids_plain,
        "decoded": tok.decode(ids, skip_special_tokens=False),
        "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
    }


def patched(base: dict, patch: dict) -> Tokenizer:
    """Applies an RFC 7386 merge patch (what nlohmann::json::merge_patch does) and loads the result."""

    def merge(target, p):
        if not isinstance(p, dict):
            return copy.deepcopy(p)
        target = dict(target) if isinstance(target, dict) else {}
        for k, v in p.items():
            if v is None:
                target.pop(k, None)
            else:
                target[k] = merge(target.get(k), v)
        return target

    return Tokenizer.from_str(json.dumps(merge(base, patch)))


def variants(tok: Tokenizer, texts: list[str]) -> list[dict]:
    base = json.loads(tok.to_str())
    with_added = Tokenizer.from_str(tok.to_str())
    with_added.add_tokens(EXTRA_ADDED_TOKENS)
    added_patch = {"added_tokens": json.loads(with_added.to_str())["added_tokens"]}

    specs = [
        ("added_token_flags", added_patch, ADDED_TOKEN_TEXTS + texts[:8]),
        ("ignore_merges", {"model": {"ignore_merges": True}}, texts),
        ("nfc_normalizer", {"normalizer": {"type": "NFC"}}, texts),
        ("nfc_normalizer_added_tokens", {**added_patch, "normalizer": {"type": "NFC"}},
         ADDED_TOKEN_TEXTS + ["pla\u0301in plain e\u0301"]),
        ("gpt2_byte_level", {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                               "trim_offsets": True, "use_regex": True}}, texts),
        ("byte_level_prefix_space", {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True,
                                                       "trim_offsets": True, "use_regex": True}}, texts),
        ("split_removed_whitespace", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Removed", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}}, texts),
        ("split_string_merged_with_next", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}}, texts),
        ("split_merged_with_previous", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"[.,!?]"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}}, texts),
        ("split_contiguous", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{N}"}, "behavior": "Contiguous", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}}, texts),
        ("split_invert", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{L}+"}, "behavior": "Isolated", "invert": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}}, texts),
    ]
    # Without the merge that builds "Ġthe", the word is still in the vocabulary but only ignore_merges finds it.
    the_merge = next(m for m in base["model"]["merges"] if "".join(m) == "Ġthe")
    specs.append(("ignore_merges_unreachable_word", {"model": {"ignore_merges": True}}, texts + [" the", "the the"],
                  [the_merge]))
    specs.append(("unreachable_word", {}, [" the", "the the"], [the_merge]))

    out = []
    for name, patch, cases, *dropped in specs:
        dropped = dropped[0] if dropped else []
        source = copy.deepcopy(base)
        source["model"]["merges"] = [m for m in source["model"]["merges"] if m not in dropped]
        vt = patched(source, patch)
        out.append({
            "name": name,
            "drop_merges": dropped,
            "patch": patch,
            "cases": [{"text": t, "ids": encode(vt, t, True), "ids_no_special": encode(vt, t, False),
                       "decoded": vt.decode(encode(vt, t, True), skip_special_tokens=False)} for t in cases],
        })
    return out


def main() -> None:
    rng = random.Random(SEED)
    corpus = docstring_corpus() + EXTRA_TRAINING_TEXT
    tok = train(corpus)

    doc_lines = sorted({line.strip() for text in corpus for line in text.splitlines() if 20 <= len(line.strip()) <= 120})
    sampled = sorted(rng.sample(doc_lines, 40))
    texts = REFERENCE_TEXTS + sampled

    random_ids = [[rng.randrange(VOCAB_SIZE) for _ in range(rng.randrange(1, 24))] for _ in range(40)]
    random_decodes = [{"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                       "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)} for ids in random_ids]

    reference = {
        "generator": "tools/make_tokenizer.py",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "special_tokens": {t: tok.token_to_id(t) for t in GLM_SPECIAL_TOKENS},
        "cases": [case(tok, t) for t in texts],
        "random_decodes": random_decodes,
        "variants": variants(tok, REFERENCE_TEXTS),
    }

    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"), pretty=False)
    (OUT / "reference.json").write_text(json.dumps(reference, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (OUT / "chat_reference.json").write_text(json.dumps(chat_reference(), ensure_ascii=False, indent=1) + "\n",
                                             encoding="utf-8")
    for name in ("tokenizer.json", "reference.json", "chat_reference.json"):
        print(f"{name}: {(OUT / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()
