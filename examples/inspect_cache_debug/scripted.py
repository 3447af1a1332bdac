"""A scripted stand-in for a model (``mockllm/model`` with ``custom_outputs``) playing task.py's agent,
so the example runs offline: it reads the served order and its source of truth, writes a root-cause note
quoting both statuses, and submits. The step comes from the conversation (tool results so far)."""

from __future__ import annotations

import json
import shlex
from typing import Any

from inspect_ai.model import ChatMessage, ChatMessageTool, ModelOutput, ModelUsage

MODEL = "mockllm/model"
API = "http://orders-api:8000"
READS = f"curl -fsS {API}/orders/4021; echo; curl -fsS {API}/orders/4021/source; echo"


def call(tool: str, **arguments: str) -> ModelOutput:
    out = ModelOutput.for_tool_call(MODEL, tool, dict(arguments), content="")
    # Usage given: mockllm would otherwise count tokens with tiktoken, which downloads its encoding.
    out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return out


def note(reads: str) -> str:
    served, source = (json.loads(line)["status"] for line in reads.splitlines()[:2])
    return (
        "# Order 4021 is served with a stale status\n\nEvidence:\n"
        f'- orders-api GET /orders/4021 -> status "{served}" (what clients are served)\n'
        f'- orders-api GET /orders/4021/source -> status "{source}" (postgres, the source of truth)\n\n'
        "Root cause: missing cache invalidation. POST /orders/{id} updates postgres but never deletes the "
        "cached order:<id> entry, and GET /orders/{id} is cache-first.\n\n"
        "Fix: delete the key after the commit in the status update path.\n"
    )


def agent(messages: list[ChatMessage], *_: Any) -> ModelOutput:
    results = [m for m in messages if isinstance(m, ChatMessageTool)]
    if not results:
        return call("bash", command=READS)
    if len(results) == 1:
        text = note(results[0].text)
        return call(
            "bash",
            command=f"mkdir -p /work/notes && printf %s {shlex.quote(text)} > /work/notes/root_cause.md",
        )
    return call("submit", answer="missing cache invalidation on status update")
