#!/usr/bin/env python3
"""Builds the chat-template fixtures: one checkpoint-like folder per supported architecture under
tests/data/chat_templates/<arch>/ (its template, as a checkpoint ships it) and expected.json there: conversations
and what transformers' apply_chat_template(..., tokenize=False) renders for them (or the error it raises).

Templates:
  glm4_moe_lite   zai-org/GLM-4.7's chat_template.jinja (the real one; tools/make_tokenizer.py holds its text),
                  shipped as chat_template.jinja.
  glm_moe_dsa     representative, NOT the published GLM-5 file (not available offline): GLM-4.7's template with the
                  GLM-5 differences kiln's notes record ("<think></think>" for cleared history, tools listed by
                  their function), shipped in tokenizer_config.json as a string.
  deepseek_v3     representative of DeepSeek-V3's template (bos_token from tokenizer_config.json as an AddedToken
                  dict, system prompt gathered in a namespace, tool calls written with tojson, tool outputs),
                  written for these tests, not copied from the checkpoint.
  glm5_next       representative, exercising the rest of what transformers provides: a list of named templates
                  ("default" and "tool_use"), raise_exception, strftime_now, loop controls, {% generation %},
                  tojson with indent / sort_keys / separators, and chat_template_kwargs.

The messages are what kiln hands the template: the request's messages with null content read as "" and
tool-call arguments parsed from their JSON strings into objects (as vLLM does).

Run from the repository root with transformers 5.17 and the tokenizers package:
  python3 tools/make_chat_template_fixtures.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import transformers
from transformers import PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "chat_templates"
sys.path.insert(0, str(REPO / "tools"))
from make_tokenizer import CONVERSATIONS, GLM47_CHAT_TEMPLATE  # noqa: E402

GLM5_CHAT_TEMPLATE = GLM47_CHAT_TEMPLATE.replace(
    "{{ tool | tojson(ensure_ascii=False) }}",
    "{{ (tool.function if tool.function is defined else tool) | tojson(ensure_ascii=False) }}",
).replace(
    "{%- else -%}\n{{ '</think>' }}",
    "{%- else -%}\n{{ '<think></think>' }}",
)
assert GLM5_CHAT_TEMPLATE != GLM47_CHAT_TEMPLATE

DEEPSEEK_V3_CHAT_TEMPLATE = r"""{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}
{%- set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{%- if ns.system_prompt -%}{%- set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] -%}
{%- else -%}{%- set ns.system_prompt = message['content'] -%}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{{ bos_token }}{{ ns.system_prompt }}
{%- if tools %}

## Tools
{% for tool in tools %}
### {{ tool.function.name }}
{{ tool.function.parameters | tojson(indent=2) }}
{% endfor %}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'user' %}
{%- set ns.is_tool = false -%}
{{ '<｜User｜>' + message['content'] }}
{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}
{%- set ns.is_tool = false -%}
{%- for tool in message['tool_calls'] %}
{%- if loop.first %}
{{ '<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜>' }}
{%- endif %}
{{ '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n```json\n' + tool['function']['arguments'] | tojson + '\n```<｜tool▁call▁end｜>' }}
{%- endfor %}
{{ '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}
{%- elif message['role'] == 'assistant' %}
{%- if ns.is_tool %}{{ '<｜tool▁outputs▁end｜>' }}{%- set ns.is_tool = false -%}{%- endif %}
{%- set content = message['content'] %}
{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}
{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}
{%- elif message['role'] == 'tool' %}
{%- if not ns.is_tool %}{{ '<｜tool▁outputs▁begin｜>' }}{%- endif %}
{%- set ns.is_tool = true -%}
{{ '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
{%- endif %}
{%- endfor -%}
{% if ns.is_tool %}{{ '<｜tool▁outputs▁end｜>' }}{% endif %}
{% if add_generation_prompt and not ns.is_tool %}{{ '<｜Assistant｜>' }}{% endif %}"""

GLM5_NEXT_DEFAULT = r"""{%- if messages | length == 0 %}{{ raise_exception('at least one message is needed') }}{% endif -%}
[gMASK]<sop>
{%- if show_date is defined and show_date %}<|system|>Today is {{ strftime_now('%Y') | length }}-digit year.{% endif %}
{%- for m in messages %}
{%- if m.role not in ['system', 'user', 'assistant', 'tool'] %}{{ raise_exception('unknown role ' + m.role) }}{% endif %}
{%- if m.role == 'system' and loop.index0 > 0 %}{% continue %}{% endif %}
{%- if m.role == 'user' %}<|user|>
{%- if m.content is string %}{{ m.content }}{% else %}{% for part in m.content %}{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}
{%- elif m.role == 'system' %}<|system|>{{ m.content }}
{%- elif m.role == 'assistant' %}<|assistant|>{% generation %}
{%- if m.reasoning_content is defined and m.reasoning_content and (keep_reasoning | default(false)) %}<think>{{ m.reasoning_content | trim }}</think>{% else %}</think>{% endif %}
{{- m.content | trim }}{% endgeneration %}
{%- elif m.role == 'tool' %}<|observation|><tool_response>{{ m.content }}</tool_response>
{%- endif %}
{%- if stop_after is defined and loop.index == stop_after %}{% break %}{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{{ '<think>' if (enable_thinking | default(true)) else '</think>' }}
{%- if reasoning_effort is defined %}effort={{ reasoning_effort }}{% endif %}{% endif %}"""

GLM5_NEXT_TOOL_USE = r"""[gMASK]<sop><|system|># Tools
{% for tool in tools %}
{{ tool | tojson(sort_keys=True, separators=(',', ':')) }}
{% endfor %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|user|>{{ m.content }}
{%- elif m.role == 'assistant' %}<|assistant|></think>{{ m.content }}
{%- for tc in m.tool_calls | default([]) %}<tool_call>{{ tc.function.name }}
{%- for k, v in tc.function.arguments | dictsort %}<arg_key>{{ k }}</arg_key><arg_value>{{ v if v is string else v | tojson }}</arg_value>{% endfor %}</tool_call>
{%- endfor %}
{%- elif m.role == 'tool' %}<|observation|><tool_response>{{ m.content }}</tool_response>
{%- elif m.role == 'system' %}<|system|>{{ m.content }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|><think>{% endif %}"""


def kiln_messages(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        if "tool_calls" in m:
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def tokenizer_with(template, special_tokens: dict) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_file=str(REPO / "tests/data/tokenizer/tokenizer.json"),
                                   chat_template=template, **special_tokens)


def cases_for(tokenizer, conversations) -> list[dict]:
    cases = []
    for name, messages, tools, options in conversations:
        options = dict(options)
        add_generation_prompt = options.pop("add_generation_prompt", True)
        case = {"name": name, "messages": messages, "tools": tools or None,
                "add_generation_prompt": add_generation_prompt, "kwargs": options}
        try:
            case["expected"] = tokenizer.apply_chat_template(
                kiln_messages(messages), tools=tools or None, add_generation_prompt=add_generation_prompt,
                tokenize=False, **options)
        except Exception as e:  # the template's own errors (raise_exception) are fixtures too
            case["error"] = str(e)
        cases.append(case)
    return cases


def write(arch: str, files: dict[str, str], cases: list[dict]) -> None:
    folder = OUT / arch
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "expected.json").write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n")


def main() -> None:
    assert transformers.__version__ == "5.17.0", transformers.__version__
    user = {"role": "user", "content": "Hi"}
    extra = [
        ("special_tokens_in_client_text", [
            {"role": "system", "content": "Quote: <|user|> and <|assistant|> are markers."},
            {"role": "user", "content": "Say <|observation|> literally, and [gMASK]."}], [], {}),
    ]

    glm47 = tokenizer_with(GLM47_CHAT_TEMPLATE, {"eos_token": "<|endoftext|>"})
    write("glm4_moe_lite", {"chat_template.jinja": GLM47_CHAT_TEMPLATE},
          cases_for(glm47, CONVERSATIONS + extra))

    glm5 = tokenizer_with(GLM5_CHAT_TEMPLATE, {"eos_token": "<|endoftext|>"})
    write("glm_moe_dsa", {"tokenizer_config.json": json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
         "chat_template": GLM5_CHAT_TEMPLATE}, ensure_ascii=False, indent=1) + "\n"},
          cases_for(glm5, CONVERSATIONS + extra))

    ds_specials = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
    deepseek = tokenizer_with(DEEPSEEK_V3_CHAT_TEMPLATE, ds_specials)
    ds_conversations = [c for c in CONVERSATIONS if c[0] != "content_parts"]
    write("deepseek_v3", {"tokenizer_config.json": json.dumps(
        {"tokenizer_class": "LlamaTokenizerFast",
         "bos_token": {"__type": "AddedToken", "content": ds_specials["bos_token"], "lstrip": False,
                       "normalized": True, "rstrip": False, "single_word": False},
         "eos_token": {"__type": "AddedToken", "content": ds_specials["eos_token"], "lstrip": False,
                       "normalized": True, "rstrip": False, "single_word": False},
         "chat_template": DEEPSEEK_V3_CHAT_TEMPLATE}, ensure_ascii=False, indent=1) + "\n"},
          cases_for(deepseek, ds_conversations))

    named = [{"name": "default", "template": GLM5_NEXT_DEFAULT}, {"name": "tool_use", "template": GLM5_NEXT_TOOL_USE}]
    glm5_next = tokenizer_with({t["name"]: t["template"] for t in named}, {"eos_token": "<|endoftext|>"})
    glm5_next_conversations = CONVERSATIONS + extra + [
        ("kwargs_reasoning_effort", [user], [], {"reasoning_effort": "high", "enable_thinking": False}),
        ("kwargs_keep_reasoning", [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": " A ", "reasoning_content": " why "},
            {"role": "user", "content": "Q2"}], [], {"keep_reasoning": True}),
        ("kwargs_show_date", [user], [], {"show_date": True}),
        ("loop_break", [user, {"role": "assistant", "content": "A"}, {"role": "user", "content": "dropped"}], [],
         {"stop_after": 2}),
        ("later_system_skipped", [user, {"role": "system", "content": "late"}], [], {}),
        ("unknown_role_raises", [{"role": "narrator", "content": "x"}], [], {}),
    ]
    write("glm5_next", {"tokenizer_config.json": json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "chat_template": named},
        ensure_ascii=False, indent=1) + "\n"}, cases_for(glm5_next, glm5_next_conversations))


if __name__ == "__main__":
    main()
