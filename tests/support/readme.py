"""The README's first-project walkthrough: the block a newcomer copies, as tests read it."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN, END = "<!-- first-project:begin -->", "<!-- first-project:end -->"


def first_project_commands(text: str | None = None) -> list[str]:
    """The ``$ `` lines between the first-project markers, verbatim without the prompt, in order."""
    text = README.read_text(encoding="utf-8") if text is None else text
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"README.md needs exactly one {BEGIN} … {END}"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return [line[2:] for line in block.splitlines() if line.startswith("$ ")]
