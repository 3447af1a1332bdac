"""The README stays a ten-minute read, and no link in it or in the guide under docs/ leads nowhere.

The README's test command and the one `.ci/run` runs are the same string, and its first-project
walkthrough is a block tests/e2e/test_readme_walkthrough.py can find and run verbatim.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from support.readme import first_project_commands

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 300  # the brief is "about 250": room for a few more lines, not for a second guide
# [text](target) and [text](target "title"); images too. Autolinks and bare URLs are not relative links.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
TEST_COMMAND = "nox -s lint tests integration e2e harbor"


def _markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md"))]


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks: a link-like string in code is not a link."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def relative_links(path: Path) -> list[tuple[int, str]]:
    """Every relative link target in ``path`` (file part only), with its line number."""
    found = []
    for n, line in _prose(path.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
                continue  # http:, https:, mailto:, and anchors within the same page
            found.append((n, target.split("#", 1)[0]))
    return found


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail into a page under docs/ "
        "and link to it (docs/README.md is the index)"
    )


def test_every_relative_link_points_to_an_existing_file() -> None:
    broken = [
        f"{path.relative_to(ROOT)}:{n}: {target}"
        for path in _markdown_files()
        for n, target in relative_links(path)
        if not (path.parent / target).exists()
    ]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_link_finder_sees_a_broken_link(tmp_path: Path) -> None:
    """The check above can fail: a missing target is found, code blocks and URLs are skipped."""
    page = tmp_path / "page.md"
    page.write_text(
        "See [a](missing.md#x) and [b](https://example.com) and [c](#local).\n```\n[d](in-code.md)\n```\n",
        encoding="utf-8",
    )
    assert relative_links(page) == [(1, "missing.md")]


def _nox_runs(script: str) -> list[str]:
    """Each nox invocation in a shell script, from `nox` on: `nox …`, `step NAME nox …` or `"$PY" -m nox …`
    (not `nox` named as a package to install)."""
    runs = []
    for line in script.splitlines():
        argv = [] if line.lstrip().startswith("#") else shlex.split(line)
        for i, word in enumerate(argv):
            if word == "nox" and (i == 0 or argv[i - 1] == "-m" or (argv[0] == "step" and i == 2)):
                runs.append(" ".join(argv[i:]))
    return runs


def test_readme_and_ci_run_the_same_test_command() -> None:
    readme = README.read_text(encoding="utf-8")
    assert f"\n{TEST_COMMAND}\n" in readme, f"README.md's quickstart no longer shows `{TEST_COMMAND}`"
    runs = _nox_runs((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    assert runs == [TEST_COMMAND], f".ci/run runs {runs}, the README says `{TEST_COMMAND}`: make them one"


def test_first_project_walkthrough_is_marked_and_uses_forge() -> None:
    """What the e2e walkthrough test relies on: one marked block, `forge` commands, `forge init` first."""
    commands = first_project_commands()
    assert commands, "the first-project block holds no `$ ` command lines"
    assert all(c.startswith("forge ") for c in commands), commands
    assert commands[0].startswith("forge init "), commands
