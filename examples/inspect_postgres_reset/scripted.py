"""A scripted stand-in for a model, for ``mockllm/model`` (``custom_outputs``): it plays the agent of
task.py with tool calls, so the example runs offline (CI). Every sample it:

1. reads the database and the workspace (the read the test checks: a clean stack shows only the seed);
2. writes what it read to /work/submission.txt;
3. corrupts both: renames widget 1, adds a row, and litters /work (the next sample must not see it);
4. submits the name it read first.

The step comes from the conversation (how many tool results it holds), so concurrent samples and epochs
each follow their own script.
"""

from __future__ import annotations

import shlex
from typing import Any

from inspect_ai.model import ChatMessage, ChatMessageTool, ModelOutput, ModelUsage

MODEL = "mockllm/model"
PSQL = "PGPASSWORD=app psql -h app-db -U app -d app -At"
FIRST_READ = f"{PSQL} -c 'select id, name from widgets order by id'; ls -A /work"
CORRUPT = (
    f"{PSQL} -c \"update widgets set name = 'corrupted' where id = 1;"
    " insert into widgets values (99, 'junk')\""
    " && echo junk > /work/litter.txt && echo corrupted"
)


def first_read_name(output: str) -> str:
    """Widget 1's name from the first read's ``id|name`` rows."""
    for line in output.splitlines():
        if line.startswith("1|"):
            return line.split("|", 1)[1]
    return "(widget 1 not found)"


def call(tool: str, **arguments: str) -> ModelOutput:
    out = ModelOutput.for_tool_call(MODEL, tool, dict(arguments), content="")
    # Usage given: mockllm would otherwise count tokens with tiktoken, which downloads its encoding.
    out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return out


def agent(messages: list[ChatMessage], *_: Any) -> ModelOutput:
    results = [m for m in messages if isinstance(m, ChatMessageTool)]
    step = len(results)
    if step == 0:
        return call("bash", command=FIRST_READ)
    name = first_read_name(results[0].text)
    if step == 1:
        return call("bash", command=f"printf %s {shlex.quote(name)} > /work/submission.txt")
    if step == 2:
        return call("bash", command=CORRUPT)
    return call("submit", answer=name)
