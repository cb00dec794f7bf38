#!/usr/bin/env python3
"""Drives a running `kiln serve` with the official `openai` package: models, chat (plain and streamed), a tool
round trip (tool call -> tool result -> answer), prefill progress events (stream_options.include_prefill_progress), the Responses API (plain, streamed, with a function tool), structured output (response_format
json_schema, also through the client's Pydantic `parse`, and Responses text.format; a named and a "required"
tool_choice whose arguments must validate against the tool's schema, one or more calls under "required" and exactly
one with parallel_tool_calls=False; reasoning before a JSON answer, bounded by thinking_token_budget) and error paths. Checks the shapes the client library relies on, not the model's wording, so it passes against a tiny
random checkpoint as well as a real one. Exits 1 when any check fails.

    python3 tools/openai_client_test.py --base-url http://127.0.0.1:8000/v1 [--api-key KEY] [--model NAME]
"""
import argparse
import json
import os
import sys
import traceback

import openai

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def check(condition, message):
    if not condition:
        raise AssertionError(message)


# Bounded strings, numbers and arrays: every path through the schema ends, so even a tiny model that writes nonsense
# finishes a valid answer inside max_tokens when the server constrains decoding.
WIDGET_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
        "size": {"type": "object", "properties": {"w": {"type": "integer", "minimum": 1, "maximum": 99},
                                                  "h": {"type": "integer", "minimum": 1, "maximum": 99}},
                 "required": ["w", "h"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["new", "old", "sale"]}, "maxItems": 3},
        "in_stock": {"type": "boolean"},
    },
    "required": ["name", "color", "size", "tags", "in_stock"],
    "additionalProperties": False,
}
ALARM_TOOL = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "description": "Sets an alarm",
        "parameters": {"type": "object", "properties": {
            "hour": {"type": "integer", "minimum": 0, "maximum": 23},
            "repeat": {"type": "string", "enum": ["never", "daily", "weekdays"]},
            "label": {"type": "string", "maxLength": 10}},
            "required": ["hour", "repeat", "label"], "additionalProperties": False},
    },
}
# The weather tool with a bounded city, so that a forced call to it always ends too.
BOUNDED_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                       "required": ["city"], "additionalProperties": False},
    },
}
STRUCTURED_MAX_TOKENS = 300
# With thinking on, a constrained answer follows the model's reasoning; a tiny random model seldom ends its reasoning
# by itself, so the structured-output checks ask for the answer at once (test_reasoning_then_json covers reasoning).
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
CPU_ONLY = "CPU recipes only"


def schema_problem(value, schema, at="$"):
    """The first way `value` breaks `schema` (the keywords above), or None."""
    if "enum" in schema and value not in schema["enum"]:
        return f"{at}: {value!r} not in {schema['enum']}"
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return f"{at}: not an object"
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            return f"{at}: missing {missing}"
        for key, item in value.items():
            if key not in schema.get("properties", {}):
                if schema.get("additionalProperties", True) is False:
                    return f"{at}: unexpected {key!r}"
                continue
            problem = schema_problem(item, schema["properties"][key], f"{at}.{key}")
            if problem:
                return problem
    elif kind == "array":
        if not isinstance(value, list) or len(value) > schema.get("maxItems", len(value)):
            return f"{at}: not an array of at most {schema.get('maxItems')}"
        for i, item in enumerate(value):
            problem = schema_problem(item, schema.get("items", {}), f"{at}[{i}]")
            if problem:
                return problem
    elif kind == "string":
        if not isinstance(value, str) or len(value) > schema.get("maxLength", len(value)):
            return f"{at}: not a string of at most {schema.get('maxLength')}"
    elif kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool) or not (
                schema.get("minimum", value) <= value <= schema.get("maximum", value)):
            return f"{at}: {value!r} is not an integer in range"
    elif kind == "boolean" and not isinstance(value, bool):
        return f"{at}: not a boolean"
    return None


def cpu_only(error):
    """A device recipe refuses constrained decoding for now: such a server passes these tests by saying so."""
    return isinstance(error, openai.BadRequestError) and CPU_ONLY in str(error)


def test_models(client, model):
    ids = [m.id for m in client.models.list().data]
    check(model in ids, f"/v1/models lists {ids}, not {model}")


def test_chat(client, model, max_tokens):
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                       max_tokens=max_tokens, temperature=0)
    choice = r.choices[0]
    check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    text = (choice.message.content or "") + (getattr(choice.message, "reasoning_content", None) or "")
    check(len(text) > 0 or r.usage.completion_tokens > 0, "empty answer")
    check(r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
          f"usage {r.usage}")


def test_chat_stream(client, model, max_tokens):
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to five."}],
                                            max_tokens=max_tokens, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    check(len(chunks) >= 2, f"only {len(chunks)} chunks")
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(finish and finish[-1] in ("stop", "length"), f"finish reasons {finish}")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0, "no usage chunk")


EXPECT_PREFILL_PROGRESS = False  # --expect-prefill-progress: the server prefills a 1200-token prompt in several chunks


def test_prefill_progress(client, model, max_tokens):
    # About 1200 prompt tokens: several prefill chunks in the tiny recipe (scheduler.max_num_batched_tokens = 512);
    # a server with larger chunks sends no progress event, and the events' shape is checked when there are some.
    stream = client.completions.create(model=model, prompt="plain words again " * 300, max_tokens=4, temperature=0,
                                       stream=True,
                                       stream_options={"include_prefill_progress": True, "include_usage": True})
    chunks = list(stream)
    progress = [c for c in chunks if getattr(c, "object", None) == "prefill.progress"]
    check(len(progress) >= 1 or not EXPECT_PREFILL_PROGRESS, f"no prefill_progress events in {len(chunks)} chunks")
    total = chunks[-1].usage.prompt_tokens
    if not progress:
        return
    done = [p.prompt_tokens_done for p in progress]
    check(done == sorted(done) and 0 < done[-1] < total, f"progress {done} of {total}")
    check(all(p.prompt_tokens_total == total for p in progress), "prompt_tokens_total differs from usage")
    check(any(c.choices for c in chunks if getattr(c, "object", None) == "text_completion"), "no text chunks")


def test_tool_round_trip(client, model, max_tokens):
    messages = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    # Naming the function makes the server start the call, so even a tiny random model produces one (with thinking
    # off: with it on, the model would reason first and spend max_tokens there).
    r = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL], temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                       max_tokens=max_tokens, extra_body=NO_THINKING)
    choice = r.choices[0]
    calls = choice.message.tool_calls or []
    check(len(calls) >= 1, f"no tool call (finish_reason {choice.finish_reason})")
    call = calls[0]
    check(call.type == "function" and call.function.name == "get_weather", f"call {call}")
    check(isinstance(call.function.arguments, str) and call.id, f"call {call}")
    try:
        json.loads(call.function.arguments)
        arguments = call.function.arguments
        check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r} with a complete call")
    except json.JSONDecodeError:
        # A random model may run out of tokens mid-call; the round trip below still exercises the protocol.
        check(choice.finish_reason == "length", f"invalid arguments {call.function.arguments!r} without hitting length")
        arguments = json.dumps({"city": "Paris"})

    # Streamed with the function named: "required" leaves the name to the model, which a tiny model that never saw
    # tool calls does not reliably produce; naming it tests the incremental protocol on any model.
    stream = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL], temperature=0,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            max_tokens=max_tokens, stream=True, extra_body=NO_THINKING)
    names = [tc.function.name for c in stream if c.choices and c.choices[0].delta.tool_calls
             for tc in c.choices[0].delta.tool_calls if tc.function and tc.function.name]
    check(names == ["get_weather"], f"streamed named tool choice gave name deltas {names}")

    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"})
    r = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL], temperature=0,
                                       max_tokens=max_tokens)
    check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"answer {r.choices[0]}")
    check(r.usage.prompt_tokens > 0, "no usage after the tool result")


def test_responses(client, model, max_tokens):
    r = client.responses.create(model=model, input="Say hi.", instructions="Be brief.", max_output_tokens=max_tokens,
                                temperature=0)
    check(r.status in ("completed", "incomplete"), f"status {r.status}")
    check(r.usage.output_tokens > 0, f"usage {r.usage}")
    check(isinstance(r.output_text, str), "output_text")

    events = list(client.responses.create(model=model, input="Say hi.", max_output_tokens=max_tokens, temperature=0,
                                          stream=True))
    types = [e.type for e in events]
    check(types[0] == "response.created", f"first event {types[:1]}")
    check(types[-1] in ("response.completed", "response.incomplete"), f"last event {types[-1:]}")

    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}
    r = client.responses.create(model=model, input="Weather in Paris?", tools=[tool], temperature=0,
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=max_tokens,
                                reasoning={"effort": "none"})
    calls = [item for item in r.output if item.type == "function_call"]
    check(calls and calls[0].name == "get_weather" and calls[0].call_id, f"output {r.output}")

    events = list(client.responses.create(model=model, input="Weather in Paris?", tools=[tool], temperature=0,
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          max_output_tokens=max_tokens, stream=True, reasoning={"effort": "none"}))
    types = [e.type for e in events]
    check("response.function_call_arguments.delta" in types or "response.function_call_arguments.done" in types
          or any(e.type == "response.output_item.added" and e.item.type == "function_call" for e in events),
          f"no function-call events in {types}")


def test_json_schema(client, model, max_tokens):
    fmt = {"type": "json_schema", "json_schema": {"name": "widget", "schema": WIDGET_SCHEMA, "strict": True}}
    try:
        for temperature, seed in ((0, None), (1.0, 3)):
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Describe a widget."}],
                                               response_format=fmt, temperature=temperature, seed=seed,
                                               max_tokens=STRUCTURED_MAX_TOKENS, extra_body=NO_THINKING)
            choice = r.choices[0]
            check(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}: {choice.message.content!r}")
            problem = schema_problem(json.loads(choice.message.content), WIDGET_SCHEMA)
            check(problem is None, f"{problem} in {choice.message.content!r}")
    except openai.BadRequestError as e:
        check(cpu_only(e), f"refused: {e}")
        return

    # Streamed: the concatenated deltas are the answer.
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Another widget."}],
                                            response_format=fmt, temperature=0, max_tokens=STRUCTURED_MAX_TOKENS,
                                            stream=True, extra_body=NO_THINKING)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    problem = schema_problem(json.loads(text), WIDGET_SCHEMA)
    check(problem is None, f"streamed: {problem} in {text!r}")

    # The client's own structured-output helper: a Pydantic model's schema, parsed back into the model.
    import typing
    import pydantic

    class Alarm(pydantic.BaseModel):
        hour: int = pydantic.Field(ge=0, le=23)
        repeat: typing.Literal["never", "daily"]
        note: str = pydantic.Field(max_length=8)

    parsed = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Wake me at 7."}],
                                           response_format=Alarm, temperature=0, max_tokens=STRUCTURED_MAX_TOKENS,
                                           extra_body=NO_THINKING)
    check(isinstance(parsed.choices[0].message.parsed, Alarm), f"parsed {parsed.choices[0].message}")

    # The Responses API's text.format.
    r = client.responses.create(model=model, input="Describe a widget.", temperature=0,
                                max_output_tokens=STRUCTURED_MAX_TOKENS, reasoning={"effort": "none"},
                                text={"format": {"type": "json_schema", "name": "widget", "schema": WIDGET_SCHEMA,
                                                 "strict": True}})
    check(r.status == "completed", f"status {r.status}: {r.output_text!r}")
    problem = schema_problem(json.loads(r.output_text), WIDGET_SCHEMA)
    check(problem is None, f"responses: {problem} in {r.output_text!r}")


def test_tool_choice_constrained(client, model, max_tokens):
    # A device recipe forces the call without a grammar (no constrained decoding there yet): nothing to check.
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=1,
                                       response_format={"type": "json_object"})
    except openai.BadRequestError as e:
        check(cpu_only(e), f"refused: {e}")
        return
    messages = [{"role": "user", "content": "Wake me up at seven."}]
    tools = [BOUNDED_WEATHER_TOOL, ALARM_TOOL]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    cases = [({"type": "function", "function": {"name": "set_alarm"}}, 0, None, True),
             ({"type": "function", "function": {"name": "get_weather"}}, 1.0, 5, True),
             ("required", 0, None, True), ("required", 1.0, 9, True), ("required", 1.0, 10, False)]
    for tool_choice, temperature, seed, parallel in cases:
        r = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice=tool_choice,
                                           temperature=temperature, seed=seed, max_tokens=STRUCTURED_MAX_TOKENS,
                                           parallel_tool_calls=parallel, extra_body=NO_THINKING)
        choice = r.choices[0]
        calls = choice.message.tool_calls or []
        # "required" may call several tools unless parallel_tool_calls is false; a named function is called once. A
        # weak model may keep calling until max_tokens: then the cut-off last call is not judged.
        several = tool_choice == "required" and parallel
        complete = calls[:-1] if several and choice.finish_reason == "length" else calls
        check((choice.finish_reason == "tool_calls" or several) and 1 <= len(complete) <= (len(calls) if several else 1),
              f"{tool_choice}: {choice}")
        for call in complete:
            name = call.function.name
            check(name in schemas and (tool_choice == "required" or name == tool_choice["function"]["name"]),
                  f"{tool_choice}: called {name}")
            problem = schema_problem(json.loads(call.function.arguments), schemas[name])
            check(problem is None, f"{tool_choice}: {problem} in {call.function.arguments!r}")


def test_reasoning_then_json(client, model, max_tokens):
    # Thinking on: the model reasons, then answers in JSON valid for the schema; thinking_token_budget (a kiln and
    # vLLM extension) forces the end of the reasoning so that a tiny model gets to its answer.
    fmt = {"type": "json_schema", "json_schema": {"name": "widget", "schema": WIDGET_SCHEMA, "strict": True}}
    try:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Describe a widget."}],
                                           response_format=fmt, temperature=1.0, seed=2,
                                           max_tokens=STRUCTURED_MAX_TOKENS,
                                           extra_body={"thinking_token_budget": 16})
    except openai.BadRequestError as e:
        check(cpu_only(e), f"refused: {e}")
        return
    choice = r.choices[0]
    check(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}: {choice.message}")
    problem = schema_problem(json.loads(choice.message.content), WIDGET_SCHEMA)
    check(problem is None, f"{problem} in {choice.message.content!r}")
    reasoning = (choice.message.model_extra or {}).get("reasoning_content")
    check(reasoning is None or "</think>" not in reasoning, f"reasoning {reasoning!r}")


def test_bad_schema(client, model, max_tokens):
    for fmt, field in (({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
                        "response_format.json_schema.schema"),
                       ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
                       ({"type": "yaml"}, "response_format.type")):
        try:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                           response_format=fmt, max_tokens=4)
        except openai.BadRequestError as e:
            check(cpu_only(e) or e.body.get("param") == field, f"{fmt}: error does not name {field}: {e}")
            continue
        raise AssertionError(f"response_format {fmt} was accepted")


def test_bad_request(client, model, max_tokens):
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], temperature="hot")
    except openai.BadRequestError as e:
        check("temperature" in str(e), f"error does not name the field: {e}")
        return
    raise AssertionError("temperature='hot' was accepted")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default=os.environ.get("KILN_API_KEY", "none"))
    parser.add_argument("--model", help="default: the first model the server lists")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--expect-prefill-progress", action="store_true",
                        help="fail when a 1200-token prompt brings no prefill_progress event")
    args = parser.parse_args()
    global EXPECT_PREFILL_PROGRESS
    EXPECT_PREFILL_PROGRESS = args.expect_prefill_progress

    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, timeout=300, max_retries=0)
    model = args.model or client.models.list().data[0].id
    tests = [test_models, test_chat, test_chat_stream, test_prefill_progress, test_tool_round_trip, test_responses,
             test_json_schema, test_tool_choice_constrained, test_reasoning_then_json, test_bad_schema,
             test_bad_request]
    failed = 0
    for test in tests:
        try:
            test(client, model, args.max_tokens) if test is not test_models else test(client, model)
            print(f"PASS {test.__name__}")
        except Exception:  # noqa: BLE001 - every failure is reported, then the next test runs
            failed += 1
            print(f"FAIL {test.__name__}\n{traceback.format_exc()}")
    print(f"{len(tests) - failed}/{len(tests)} passed against {args.base_url} ({model})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
