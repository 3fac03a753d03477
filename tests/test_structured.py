"""Structured output and tool calls through every dialect, against `localspec serve` on a real model
(Qwen2.5-Coder-0.5B-Instruct, whose GGUF template lists tools and answers with <tool_call>) with the
real clients: the openai SDK (`parse()`, tools, streamed calls) and the ollama Python client."""

import json

import httpx
import pytest
from pydantic import BaseModel

from localspec.engine.events import answer_tokens
from localspec.engine.sampling import SamplingSettings
from localspec.errors import LocalspecError
from localspec.loader import load
from localspec.structured import json_grammar, schema_grammar
from servers import serving

pytestmark = pytest.mark.model

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}


@pytest.fixture(scope="module")
def qwen_server(qwen_coder_path):
    with serving(qwen_coder_path, "qwen2.5-coder-0.5b-instruct", 2048) as running:
        yield running


@pytest.fixture(scope="module")
def smol_server(smollm2_path):
    with serving(smollm2_path, str(smollm2_path), 512) as running:
        yield running


def _openai(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120)


class Person(BaseModel):
    name: str
    age: int
    city: str


class Order(BaseModel):
    item: str
    quantity: int
    express: bool


class Book(BaseModel):
    title: str
    author: str
    year: int


SCHEMA_PROMPTS = [
    (Person, "Alice is 31 and lives in Paris."), (Person, "Bob, aged 45, from Lyon."),
    (Person, "Carla (27) moved to Berlin last year."), (Person, "Dev is a 52-year-old living in Pune."),
    (Order, "Please send 3 blue mugs by express delivery."), (Order, "I'd like one keyboard, no rush."),
    (Order, "Twelve pencils, standard shipping."), (Book, "Dune by Frank Herbert, published 1965."),
    (Book, "'Beloved' (1987), Toni Morrison."), (Book, "Orwell wrote Nineteen Eighty-Four in 1949."),
]


def test_openai_parse_returns_a_valid_object_for_every_schema_prompt(qwen_server):
    client = _openai(qwen_server)
    parsed = []
    for model, text in SCHEMA_PROMPTS:
        reply = client.beta.chat.completions.parse(
            model="localspec", messages=[{"role": "user", "content": f"Extract the fields as JSON: {text}"}],
            response_format=model, max_tokens=96, temperature=0)
        assert reply.choices[0].finish_reason == "stop", reply
        parsed.append(reply.choices[0].message.parsed)
    assert all(isinstance(p, m) for p, (m, _) in zip(parsed, SCHEMA_PROMPTS))
    assert parsed[0].age == 31 and parsed[0].city == "Paris"  # the model reads the text, the grammar shapes it


def test_openai_json_object_and_llama_cpp_grammar_fields_on_chat(qwen_server):
    client = _openai(qwen_server)
    reply = client.chat.completions.create(model="localspec", max_tokens=48, temperature=0,
                                           messages=[{"role": "user", "content": "A JSON object with key a set to 1"}],
                                           response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    answer = client.chat.completions.create(model="localspec", max_tokens=8, temperature=0,
                                            messages=[{"role": "user", "content": "Is the sky green?"}],
                                            extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert answer.choices[0].message.content in ("yes", "no")


def test_openai_tool_calls_round_trip_streamed_and_not(qwen_server):
    client = _openai(qwen_server)
    ask = [{"role": "user", "content": "What is the weather in Lyon?"}]
    reply = client.chat.completions.create(model="localspec", messages=ask, tools=[WEATHER], tool_choice="required",
                                           max_tokens=64, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)

    calls, finish = {}, None
    for chunk in client.chat.completions.create(model="localspec", messages=ask, tools=[WEATHER],
                                                tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                                max_tokens=64, temperature=0, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            entry = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
            entry["id"] = delta.id or entry["id"]
            entry["name"] = delta.function.name or entry["name"]
            entry["arguments"] += delta.function.arguments or ""
        finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == json.loads(call.function.arguments)  # arguments came in pieces

    back = client.chat.completions.create(model="localspec", tools=[WEATHER], max_tokens=32, temperature=0, messages=[
        *ask, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}])
    assert back.choices[0].message.content or back.choices[0].message.tool_calls  # the result was rendered and answered


def test_openai_tool_choice_auto_parses_a_call_the_model_makes(qwen_server):
    reply = _openai(qwen_server).chat.completions.create(
        model="localspec", messages=[{"role": "user", "content": "What is the weather in Lyon?"}], tools=[WEATHER],
        max_tokens=64, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Lyon"}


def _streamed_calls(server, **request) -> tuple[dict, int, str, str | None]:
    """(the calls by index, how many deltas carried arguments, the content, the finish reason)."""
    calls, pieces, content, finish = {}, 0, "", None
    for chunk in _openai(server).chat.completions.create(
            model="localspec", messages=[{"role": "user", "content": "What is the weather in Lyon?"}],
            tools=[WEATHER], max_tokens=64, temperature=0, stream=True, **request):
        delta = chunk.choices[0].delta if chunk.choices else None
        for call in (delta.tool_calls or []) if delta else []:
            entry = calls.setdefault(call.index, {"name": None, "arguments": ""})
            entry["name"] = call.function.name or entry["name"]
            entry["arguments"] += call.function.arguments or ""
            pieces += bool(call.function.arguments)
        content += (delta.content or "") if delta else ""
        finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
    return calls, pieces, content, finish


def test_a_streamed_call_sends_its_arguments_as_they_are_generated(qwen_server):
    calls, pieces, content, finish = _streamed_calls(qwen_server, tool_choice="required",
                                                     extra_body={"drafter": "none"})  # a token a round
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather" and not content
    assert json.loads(calls[0]["arguments"]) == {"city": "Lyon"} and pieces >= 4


def test_openai_tool_choice_auto_streams_a_call(qwen_server):
    """tool_choice auto: free text until the model opens a call (then the lazy grammar holds it to the
    tools' schemas); this model answers with the call's JSON in a fence, which is held back and sent as
    the call, not as content."""
    calls, _pieces, content, finish = _streamed_calls(qwen_server)
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather" and not content.strip()
    assert json.loads(calls[0]["arguments"]) == {"city": "Lyon"}


def test_a_lazy_grammar_allows_any_text_until_its_trigger_token(qwen_coder_path, smollm2_path):
    """llama.cpp's lazy grammar behind Vocabulary.grammar(trigger=…), where <tool_call> is one token
    (Qwen2.5). Where it is several (SmolLM2) the vocabulary refuses it, and a request carrying it
    decodes free text: a trigger inside a longer piece could feed the grammar what it forbids."""
    with load(str(qwen_coder_path), n_ctx=256, calibrate=False) as engine:
        vocab = engine.vocab
        lazy = vocab.grammar('root ::= "<tool_call>" [0-9]+', trigger="<tool_call>")
        free = vocab.tokenize("Hello, world", add_special=False)
        assert lazy.allows(free).all()
        for token in free:
            lazy.accept(token)
        (trigger,) = vocab.tokenize("<tool_call>", add_special=False, parse_special=True)
        lazy.accept(trigger)
        digits, words = vocab.tokenize("42", add_special=False), vocab.tokenize(" Hello", add_special=False)
        assert lazy.allows(digits[:1]).all() and not lazy.allows(words[:1]).any()  # constrained from the trigger on
        lazy.close()
    with load(str(smollm2_path), n_ctx=256, calibrate=False) as engine:
        with pytest.raises(LocalspecError, match="must be one token"):
            engine.vocab.grammar('root ::= "<tool_call>" [0-9]+', trigger="<tool_call>")
        settings = SamplingSettings(grammar='root ::= "<tool_call>" [0-9]+', grammar_trigger="<tool_call>")
        events = list(engine.generate("Say hello.", max_tokens=8, sampling=settings, drafter="none"))
        assert events[-1].generated_tokens > 0 and not events[-1].text.startswith("<tool_call>")


def test_ollama_client_format_and_tools(qwen_server):
    from ollama import Client

    client = Client(host=qwen_server.url)
    options = {"temperature": 0, "num_predict": 64}
    reply = client.chat(model="localspec", messages=[{"role": "user", "content": "Extract: Bob is 40 and lives in Oslo."}],
                        format=Person.model_json_schema(), options=options)
    assert isinstance(Person.model_validate_json(reply.message.content), Person)
    reply = client.chat(model="localspec", messages=[{"role": "user", "content": "A JSON object with key a set to 1"}],
                        format="json", options=options)
    assert isinstance(json.loads(reply.message.content), dict)

    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
          city: the city's name
        """
        return "sunny"

    ask = [{"role": "user", "content": "What is the weather in Lyon?"}]
    reply = client.chat(model="localspec", messages=ask, tools=[get_weather], options=options)
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Lyon"}
    parts = list(client.chat(model="localspec", messages=ask, tools=[get_weather], options=options, stream=True))
    assert parts[-1].done and [c.function.name for p in parts for c in p.message.tool_calls or []] == ["get_weather"]
    answer = client.chat(model="localspec", options=options, tools=[get_weather], messages=[
        *ask, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                                 "arguments": {"city": "Lyon"}}}]},
        {"role": "tool", "content": "18 degrees and sunny"}])
    assert answer.done


def test_llama_cpp_completion_with_json_schema_and_grammar(qwen_server):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    out = httpx.post(qwen_server.url + "/completion", timeout=120, json={
        "prompt": "2 + 2 as JSON:", "json_schema": schema, "n_predict": 24, "temperature": 0}).json()
    assert isinstance(json.loads(out["content"])["answer"], int)
    out = httpx.post(qwen_server.url + "/completion", timeout=120, json={
        "prompt": "Yes or no?", "grammar": 'root ::= "yes" | "no"', "n_predict": 8}).json()
    assert out["content"] in ("yes", "no")


@pytest.mark.parametrize("path,body,needle", [
    ("/completion", {"prompt": "x", "grammar": "root ::= ("}, "not valid GBNF"),
    ("/completion", {"prompt": "x", "json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}, "not both"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
     "response_format.type"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "no tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "needs logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 99},
     "between 0 and 20"),
    ("/v1/completions", {"prompt": "x", "logprobs": 2, "echo": True}, "echo with logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]},
     "deprecated"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
                              "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ("/api/chat", {"model": "localspec", "messages": [{"role": "user", "content": "x"}], "format": "yaml"},
     "format must be"),
    ("/completion", {"prompt": "x", "n_probs": -1}, "n_probs must be"),
    ("/completion", {"prompt": "x", "n_probs": 500}, "n_probs must be"),
    ("/completion", {"prompt": "x", "mirostat": 2}, "mirostat"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "big", "schema": {"enum": [f"value-{i}" for i in range(20_000)]}}}},
     "at most 3000"),
    ("/completion", {"prompt": "x", "grammar": "root ::= " + " | ".join(f'"v{i}"' for i in range(5000))}, "at most 3000"),
    ("/api/generate", {"model": "localspec", "prompt": "x", "format": {"enum": list(range(4000))}}, "at most 3000"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"42": 5}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "presence_penalty": 0.5},
     "presence_penalty"),
    ("/api/generate", {"model": "localspec", "prompt": "x", "options": {"mirostat": 1}}, "mirostat"),
    # (a model served without a projector: the 400 names it; tests/test_vision.py serves one with)
    ("/api/generate", {"model": "localspec", "prompt": "x", "images": ["aGk="]}, "cannot see images"),
    ("/api/chat", {"model": "localspec", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     "cannot see images"),
])
def test_structured_fields_that_cannot_be_honoured_get_a_400_naming_them(qwen_server, path, body, needle):
    response = httpx.post(qwen_server.url + path, json=body, timeout=60)
    assert response.status_code == 400 and needle in response.text, response.text


def test_neutral_values_of_unimplemented_fields_pass(qwen_server):
    """A client that sends a field at its neutral value (no penalty, no log-probs) is served as usual."""
    response = httpx.post(qwen_server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "presence_penalty": 0,
        "frequency_penalty": 0.0, "logprobs": False, "logit_bias": {}, "typical_p": 1.0})
    assert response.status_code == 200, response.text


def test_tools_for_a_model_whose_template_has_no_call_format_are_refused(smol_server):
    response = httpx.post(smol_server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]})
    assert response.status_code == 400 and "tool-call format" in response.text


def test_greedy_output_under_a_grammar_is_the_same_with_and_without_drafting(smollm2_path):
    """The real grammar sampler in the speculative loop: drafting (copies, history, what the grammar
    forces) changes the speed, never the constrained greedy answer."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
        "type": "string"}}}, "required": ["name", "tags"]}
    prompt = "Describe the fox as JSON with a name and tags. The quick brown fox, the quick brown fox:"
    answers, drafted, forced = {}, 0, 0
    with load(str(smollm2_path), n_ctx=512, calibrate=False, history="memory") as engine:
        for grammar in (json_grammar(), schema_grammar(schema, "schema")):
            for drafter in ("none", "ngram", "grammar", "auto", "none"):
                # (the grammar's drafts at a fixed length: whether the planner prices them in depends on
                # this machine's costs, which the test does not pin)
                events = list(engine.generate(prompt, max_tokens=48, drafter=drafter,
                                              draft_len=4 if drafter == "grammar" else "default",
                                              sampling=SamplingSettings(grammar=grammar)))
                answers.setdefault(grammar, []).append(answer_tokens(events))
                drafted += events[-1].accepted
                forced += events[-1].accepted_by_drafter.get("grammar", 0) if drafter == "grammar" else 0
    assert drafted > 0  # drafts were verified under the grammar, and some kept
    assert forced > 0  # the schema's key names, drafted from the grammar alone
    for runs in answers.values():
        assert all(run == runs[0] for run in runs) and len(runs[0]) > 5


def test_a_200_deep_schema_is_answered_under_its_grammar(qwen_server):
    schema: dict = {"type": "object", "properties": {}, "required": ["a"]}
    inner = schema
    for _ in range(200):
        inner["properties"]["a"] = {"type": "object", "properties": {}, "required": ["a"]}
        inner = inner["properties"]["a"]
    del inner["required"]
    out = httpx.post(qwen_server.url + "/completion", timeout=120, json={
        "prompt": "JSON:", "json_schema": schema, "n_predict": 24, "temperature": 0})
    assert out.status_code == 200, out.text
    assert out.json()["content"].replace(" ", "").replace("\n", "").startswith('{"a":{"a":')
