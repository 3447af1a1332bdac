"""A scripted stand-in for a model, for ``mockllm/model`` (``custom_outputs``): it plays the agent of
task.py with tool calls, so the example runs offline (CI). Every sample it:

1. reads shop-db as root (the read the test checks: a clean stack shows only the seed): the orders, the
   accounts named reporter or mallory, a database named loot, and max_connections;
2. writes order 1's status to /work/submission.txt and reads order 1 through the api;
3. vandalises shop-db (everything but order 1, which grading reads): a row changed and one added, a
   database, a user and a global variable;
4. submits the status it read first.

The step comes from the conversation (how many tool results it holds), so concurrent samples and epochs
each follow their own script.
"""

from __future__ import annotations

import shlex
from typing import Any

from inspect_ai.model import ChatMessage, ChatMessageTool, ModelOutput, ModelUsage

MODEL = "mockllm/model"
ROOT = "MYSQL_PWD=root mariadb -uroot --batch --skip-column-names"
FIRST_READ = (
    f"{ROOT} -e \"select concat(id, '|', status) from shop.orders order by id;"
    " select concat('user|', user) from mysql.user where user in ('reporter', 'mallory') order by 1;"
    " select concat('database|', schema_name) from information_schema.schemata where schema_name = 'loot';"
    " select concat('max_connections|', @@global.max_connections)\""
)
VANDALISE = (
    f"{ROOT} -e \"update shop.orders set status = 'lost' where id = 2;"
    " insert into shop.orders values (99, 'mallory', 'junk', 'junk');"
    " create database loot; create user 'mallory'@'%' identified by 'x';"
    " set global max_connections = 7; select 'vandalised'\""
)


def first_read_status(output: str) -> str:
    """Order 1's status from the first read's ``id|status`` rows."""
    for line in output.splitlines():
        if line.startswith("1|"):
            return line.split("|", 1)[1]
    return "(order 1 not found)"


def call(tool: str, **arguments: str) -> ModelOutput:
    out = ModelOutput.for_tool_call(MODEL, tool, dict(arguments), content="")
    # Usage given: mockllm would otherwise count tokens with tiktoken, which downloads its encoding.
    out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return out


def agent(messages: list[ChatMessage], *_: Any) -> ModelOutput:
    results = [m for m in messages if isinstance(m, ChatMessageTool)]
    step = len(results)
    if step == 0:
        return call("shop_db", command=FIRST_READ)
    status = first_read_status(results[0].text)
    if step == 1:
        write = f"printf %s {shlex.quote(status)} > /work/submission.txt"
        return call("bash", command=f"{write} && curl -fsS http://api:8000/orders/1")
    if step == 2:
        return call("shop_db", command=VANDALISE)
    return call("submit", answer=status)
