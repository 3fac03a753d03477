"""Tool calls split out of a streamed answer: whatever the pieces the answer arrives in, the text passed
on and the calls (name, then arguments in pieces) are what the whole answer parses to."""

import json

import pytest

from localspec.call_stream import Arguments, CallStart, CallStream, Text
from localspec.structured import parse_calls, tools_of

TOOLS = tools_of([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}},
])

ANSWERS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Kyoto \\"old\\" {town}"}}\n</tool_call>',
    'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"q": "a < b"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "No call here, just <tool text> and a tool_call word.",
    '{"name": "get_weather", "arguments": {"city": "Lima"}}',            # the call's JSON alone
    '```json\n{"name": "search", "arguments": {"q": "x"}}\n```',
    '<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>',   # not a known tool: text
    '<tool_call>\n{"arguments": {"city": "Rome"}, "name": "get_weather"}\n</tool_call>',  # another key order
    "```python\nprint(1)\n```",
]


def _run(answer: str, sizes) -> list:
    stream, pieces, at, i = CallStream(TOOLS), [], 0, 0
    while at < len(answer):
        n = sizes[i % len(sizes)]
        pieces += stream.feed(answer[at:at + n])
        at, i = at + n, i + 1
    return pieces + stream.finish()


def _collect(pieces) -> tuple[str, list[tuple[str, dict]]]:
    text = "".join(p.text for p in pieces if isinstance(p, Text))
    names = {p.index: p.name for p in pieces if isinstance(p, CallStart)}
    args: dict[int, str] = {}
    for p in pieces:
        if isinstance(p, Arguments):
            assert p.index in names  # a call's name comes before its arguments
            args[p.index] = args.get(p.index, "") + p.text
    return text, [(names[i], json.loads(args[i])) for i in sorted(names)]


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("sizes", [[1], [3], [7, 1, 2], [1000]])
def test_a_streamed_answer_splits_into_what_the_whole_answer_parses_to(answer, sizes):
    content, calls = parse_calls(answer, TOOLS)
    text, streamed = _collect(_run(answer, sizes))
    assert streamed == [(c.name, c.arguments) for c in calls]
    assert text.strip() == content.strip()


def test_arguments_are_passed_on_while_they_are_generated():
    stream = CallStream(TOOLS)
    assert stream.feed("Sure.\n<tool") == [Text("Sure.\n")]  # '<tool' may open a call: held
    opened = stream.feed('_call>\n{"name": "get_weather", "arguments": {"ci')
    assert [type(p) for p in opened] == [CallStart, Arguments] and opened[0].name == "get_weather"
    assert opened[1].text == '{"ci'
    assert stream.feed('ty": "Pa') == [Arguments(0, 'ty": "Pa')]
    assert stream.feed('ris"}}\n</tool_call>') == [Arguments(0, 'ris"}')]
    assert stream.finish() == [] and stream.calls == 1


def test_plain_text_streams_at_once():
    stream = CallStream(TOOLS)
    assert stream.feed("Hello") == [Text("Hello")]
    assert stream.feed(" world, ") == [Text(" world, ")]


@pytest.mark.parametrize("answer", [
    "<tool_call>" + " " * 20_000 + "x",
    "<tool_call>" + " " * 20_000 + "a" + " " * 20_000,
    "```json" + " " * 20_000 + "x",
    "```" + " " * 20_000 + "```x",
    "<tool_call>" * 2_000 + " " * 20_000,
])
def test_answers_of_long_whitespace_runs_are_parsed_in_linear_time(answer):
    """A lazy regular expression between whitespace runs backtracked in cubic time: 2,000 spaces took
    seconds, these would take hours. Parsed on a thread that must finish (30 s: ~1000x the time it takes)."""
    import threading

    out = []
    worker = threading.Thread(target=lambda: out.append(parse_calls(answer, TOOLS)), daemon=True)
    worker.start()
    worker.join(30)
    assert out == [(answer, [])]
    stream = CallStream(TOOLS)
    pieces = stream.feed(answer) + stream.finish()
    assert "".join(p.text for p in pieces if isinstance(p, Text)) == answer
