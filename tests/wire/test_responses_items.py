"""The Responses dialect without a server: input items as the chat they mean, and an answer
with nothing streamed as the SDK's stream state reads it."""

from __future__ import annotations

from typing import Any

import openai
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from jupyter_infer.values.request import RequestResult
from jupyter_infer.wire.openai_responses import (
    ResponsesCall,
    ResponseShape,
    chat_messages,
    listed_item,
)
from jupyter_infer.wire.responses_events import ResponseEvents


def test_items_become_the_chat_they_mean() -> None:
    """Text parts joined; a reasoning item skipped; calls after an assistant's text join its
    turn (parallel calls one turn); each output its own tool message."""
    items = [
        {"role": "developer", "content": "Use metric units."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                                        {"type": "input_text", "text": "Oslo and Rome?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "Rain"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "Sun"}]},
    ]
    chat = chat_messages("Be brief.", items)
    assert [m["role"] for m in chat] == ["system", "developer", "user", "assistant", "tool", "tool"]
    assert chat[2]["content"] == "Weather in Oslo and Rome?"
    assert chat[3]["content"] == "Looking." and [c["id"] for c in chat[3]["tool_calls"]] == ["c1", "c2"]
    assert chat[3]["tool_calls"][1]["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert (chat[4]["tool_call_id"], chat[4]["content"], chat[5]["content"]) == ("c1", "Rain", "Sun")
    listed = listed_item(items[0], 0)
    assert listed == {"id": "item_0", "type": "message", "role": "developer",
                      "content": [{"type": "input_text", "text": "Use metric units."}]}


def test_an_answer_that_streamed_nothing_still_has_its_message() -> None:
    """No piece ever came (the model ended at once): the message is added and done at the end,
    and the SDK's stream state completes with it."""
    echo = {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}
    shape = ResponseShape(ResponsesCall(None, "m", True, True, echo, []), "req-9", "m")  # type: ignore[arg-type]
    events = ResponseEvents(shape)
    result = RequestResult("req-9", "", "stop", 4, 1, None, 1, 0.0, 0.0, 1.0, content="")
    stream = [*events.start(), *events.pieces(()), *events.end(result)[0]]
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for _, data in stream:
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=data))
    final = state._completed_response
    assert final is not None and final.status == "completed" and final.output_text == ""
    assert [d["sequence_number"] for _, d in stream] == list(range(len(stream)))
