"""The reasoning split of srt/reasoning_parser.py: deepseek-r1 reads text up to </think> as reasoning
with or without a leading <think>, qwen3 only when the output opens with <think>; an unclosed block is
all reasoning; and a stream cut at every possible boundary (tags split across chunks) adds up to the
split of the whole text, never sending text that later turns out to be a tag."""

from __future__ import annotations

import pytest

from sglang import demo
from sglang.srt.reasoning_parser import REASONING_FORMATS, ReasoningStream, request_thinks, split_reasoning
from sglang.srt.server_args import REASONING_PARSER_CHOICES, ServerArgs, prepare_server_args

R1, QWEN3 = REASONING_FORMATS["deepseek-r1"], REASONING_FORMATS["qwen3"]


def parts(text, fmt):
    split = split_reasoning(text, fmt)
    return split.reasoning, text[: split.block_end], split.answer(text)


def test_every_parser_flag_has_a_format():
    assert set(REASONING_PARSER_CHOICES) == set(REASONING_FORMATS)


def test_the_flag_takes_upstreams_names_and_refuses_others(capsys):
    args = prepare_server_args(["--model-path", demo.TARGET_PATH, "--reasoning-parser", "qwen3"])
    assert args.reasoning_parser == "qwen3" and ServerArgs(model_path=demo.TARGET_PATH).reasoning_parser is None
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", demo.TARGET_PATH, "--reasoning-parser", "deepseek-v3"])
    err = capsys.readouterr().err
    assert "--reasoning-parser" in err and "deepseek-r1" in err and "qwen3" in err
    with pytest.raises(ValueError, match="--reasoning-parser must be one of deepseek-r1, qwen3"):
        ServerArgs(model_path=demo.TARGET_PATH, reasoning_parser="r1")
    with pytest.raises(SystemExit):
        prepare_server_args(["--help"])
    help_text = capsys.readouterr().out
    group = help_text[help_text.index("structured outputs and tool calling:") :]
    assert "--reasoning-parser {deepseek-r1,qwen3}" in group[: group.index("\n\n")]


def test_deepseek_r1_output_starts_inside_the_block():
    assert parts("Okay, 2 + 2.\n</think>\n\nIt is 4.", R1) == ("Okay, 2 + 2.", "Okay, 2 + 2.\n</think>\n\n", "It is 4.")
    # R1-0528 writes the start tag itself.
    assert parts("<think>\nOkay.\n</think>4", R1) == ("Okay.", "<think>\nOkay.\n</think>", "4")
    assert parts("Still thinking", R1) == ("Still thinking", "Still thinking", "")


def test_qwen3_has_a_block_only_where_the_output_opens_one():
    assert parts("<think>\nHmm.\n</think>\n\nHi", QWEN3) == ("Hmm.", "<think>\nHmm.\n</think>\n\n", "Hi")
    assert parts("Hi </think> there", QWEN3) == ("", "", "Hi </think> there")
    assert parts("<think>cut short", QWEN3) == ("cut short", "<think>cut short", "")


def test_only_the_first_end_tag_closes_the_block():
    assert parts("a</think>b</think>c", R1) == ("a", "a</think>", "b</think>c")


def test_qwen3_thinks_unless_told_not_to():
    assert request_thinks("qwen3", None) and request_thinks("qwen3", {"enable_thinking": True})
    assert not request_thinks("qwen3", {"enable_thinking": False})
    assert request_thinks("deepseek-r1", {"enable_thinking": False}) and not request_thinks(None, None)


TEXTS = [
    "<think>\n I add 2 and 2. </think>\n\n The answer: 4 ",
    "Okay </thi </think> not a tag, then </think>done",
    "<thin is not a tag",
    "  <think>x</think>",
    "no block at all </think>",
    "<think> never closed </thi",
]


@pytest.mark.parametrize("fmt", [R1, QWEN3], ids=["deepseek-r1", "qwen3"])
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3, 5])
def test_stream_cut_anywhere_adds_up_to_the_whole_split(fmt, text, step):
    stream, reasoning, block, answer = ReasoningStream(fmt), "", "", ""
    ends = list(range(step, len(text), step)) + [len(text)]
    for end in ends:
        update = stream.update(text[:end], final=end == len(text))
        reasoning, block, answer = reasoning + update.reasoning, block + update.block, answer + update.answer
        assert update.answer_so_far == answer
        assert fmt.end not in reasoning  # a tag is never sent as reasoning, even half of one
    assert (reasoning, block, answer) == parts(text, fmt)


def test_a_half_written_end_tag_is_held_back_until_it_is_known():
    stream = ReasoningStream(R1)
    assert stream.update("I think </th", final=False).reasoning == "I think"
    update = stream.update("I think </thus", final=False)
    assert update.reasoning == " </thus" and update.answer == ""
    update = stream.update("I think </thus</think>\nyes", final=False)
    assert (update.reasoning, update.answer) == ("", "yes")
