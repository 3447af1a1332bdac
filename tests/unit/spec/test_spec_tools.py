"""task.yaml's ``tools:``: the MCP tools a task offers, checked against forgelib.mcp's names."""

from __future__ import annotations

from pathlib import Path

from forgelib.mcp.names import ALL_TOOLS, DEFAULT_TOOLS
from forgelib.spec.loader import load_project_config
from forgelib.spec.schema import schema
from forgelib.spec.validate import validate_project

from ._support import edit

TASK = "tasks/read_widget/task.yaml"


def _tools(project: Path) -> dict[str, tuple[str, ...]]:
    return {t.name: t.tools for t in load_project_config(project).tasks}


def test_the_schema_lists_exactly_the_servers_tools() -> None:
    assert tuple(schema("task")["properties"]["tools"]["items"]["enum"]) == ALL_TOOLS


def test_a_task_offers_the_tools_it_declares_else_the_default(basic: Path) -> None:
    edit(basic / TASK, "description: Read the widget back.\n", "description: x\ntools: [read_file, exec]\n")
    tools = _tools(basic)
    assert tools["read_widget"] == ("read_file", "exec")
    assert tools["warm_cache"] == DEFAULT_TOOLS
    # Only a named list starts an oracle's tool server.
    declared = {t.name: t.tools_declared for t in load_project_config(basic).tasks}
    assert declared == {"read_widget": True, "warm_cache": False}


def test_an_unknown_tool_is_located_and_the_valid_ones_named(basic: Path) -> None:
    edit(
        basic / TASK, "description: Read the widget back.\n", "description: x\ntools: [read_file, read_fil]\n"
    )
    report = validate_project(str(basic))
    (issue,) = report.errors
    assert issue.file.endswith(TASK) and issue.line == 2 and issue.json_path == "$.tools[1]"
    assert issue.message == (f"'read_fil' is not one of: {', '.join(ALL_TOOLS)}; did you mean 'read_file'?")
