"""The docs checker: what the README and docs/ name must exist: repository paths, ``oracles`` subcommands and their options,
pytest options, markers, ``make`` targets, ``oracles.*`` names and relative links.

Each page's code (inline spans, code blocks) is split into shell commands judged by program: ``oracles
SUB`` (SUB in :data:`oracles.cli.COMMANDS`, options those it registers), ``pytest`` (the plugin's options
or this process's; ``-m`` names markers), ``make TARGET``, a span starting with an option; other programs
are not judged. A word whose first segment is a top-level entry is a path that must exist (but under
:data:`GENERATED`); one written from inside the package (``checks/port.py``) is refused; placeholders
(``<pin>``, ``*``, ``~``, ``$VAR``) are not judged. ``oracles.x.Name`` must name a module and, read with
``ast``, a name defined in it (and a member of that class).
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterator
from unittest.mock import MagicMock

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Folders a run or a project creates (receipts, a project's pins and records, the venv): a path under
#: one need not exist in a checkout. ``receipts/README.md`` is committed and checked like any file.
GENERATED = ("receipts/", "fixtures/", ".venv/", "bench/out/", "harness/build/")
#: What a word must end with to be read as a file when it has no ``/`` (``pytest.ini``, ``conftest.py``).
FILE_SUFFIXES = (".py", ".md", ".json", ".jsonl", ".toml", ".ini", ".txt", ".cfg", ".pyi", ".npz", ".png")
#: Marks a word as a placeholder or outside the repository: not judged as a path.
UNJUDGED = re.compile(r"[<>{}*$~\[\]]|\.\.\.|://")
#: A dotted name in the package: ``oracles.checks.tolerance.FLOAT32``, ``oracles.suite``.
MODULE_NAME = re.compile(r"oracles(?:\.[A-Za-z_]\w*)+")
#: Words that tell a page's history instead of what the code does. A nickname for one of the original
#: reference programs names nothing a reader can find: a page says what that program does ("the d1-3B
#: reference", "the DeepSeek-V4 decode-cohort proof").
HISTORY = re.compile(r"\b(the\s+seed(?:'s)?|this\s+session|(?:last|previous|earlier)\s+session|before\s+this\s+work|"
                     r"the\s+issue's\s+order)\b", flags=re.IGNORECASE)
#: The README's sections, in the order a user needs them.
README_SECTIONS = ("Install", "Quick start", "Your port", "Options", "Commands", "Families", "Where things are",
                   "Documentation")


@dataclass(frozen=True)
class Facts:
    """What the docs are held to, read from the tree and from this pytest process."""

    root: Path
    top_level: frozenset[str]  # entries of the repository root
    inner: frozenset[str]  # subpackage folders of oracles/ (a path starting with one is written from inside)
    commands: dict[str, frozenset[str]]  # oracles subcommand -> its option strings
    plugin_options: frozenset[str]
    pytest_dests: frozenset[str]  # dest names of every option this pytest process registered
    make_targets: frozenset[str]
    markers: frozenset[str]

    def pytest_option(self, option: str) -> bool:
        """Whether pytest takes ``option``: the plugin's, or another registered one (by its dest name:
        ``--dist`` is ``dist``; pytest keeps no public list of option strings)."""
        name = option[2:]  # pytest names a dest either way: --collect-only is collectonly, --no-header no_header
        return option in self.plugin_options or {name.replace("-", "_"), name.replace("-", "")} & self.pytest_dests != set()

    def any_option(self, option: str) -> bool:
        return self.pytest_option(option) or any(option in opts for opts in self.commands.values())


@dataclass
class Findings:
    """The problems (``page:line: `word`: why``) and how many names of each kind were judged."""

    problems: list[str] = field(default_factory=list)
    judged: Counter[str] = field(default_factory=Counter)


def _options(register: Any) -> frozenset[str]:
    """The ``--option`` strings ``register(parser)`` adds to a parser: pytest's (``getgroup().addoption``,
    ``addoption``) or argparse's (``add_argument``), recorded by a mock standing in for it."""
    parser = MagicMock()
    register(parser)
    calls = [*parser.add_argument.call_args_list, *parser.addoption.call_args_list,
             *parser.getgroup.return_value.addoption.call_args_list]
    return frozenset({"--help", *(n for c in calls for n in c.args if isinstance(n, str) and n.startswith("--"))})


def read_facts(pytestconfig: pytest.Config, root: Path = ROOT) -> Facts:
    """The names the docs may use, from the tree at ``root`` and this pytest process."""
    import oracles.plugin
    from oracles.cli import COMMANDS
    from oracles.families import FAMILIES, OTHER_MARKERS

    commands = {name: _options(importlib.import_module(module).add_arguments) for name, (module, _) in COMMANDS.items()}
    makefile = (root / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", makefile, flags=re.MULTILINE))
    return Facts(root=root, top_level=frozenset(p.name for p in root.iterdir()),
                 inner=frozenset(p.name for p in (root / "oracles").iterdir() if p.is_dir() and p.name != "__pycache__"),
                 commands=commands, plugin_options=_options(oracles.plugin.pytest_addoption) - {"--help"},
                 pytest_dests=frozenset(vars(pytestconfig.option)), make_targets=frozenset(targets),
                 markers=frozenset([f.name for f in FAMILIES] + list(OTHER_MARKERS)))


# -- reading a page --------------------------------------------------------------------------------------
def _lines(text: str) -> Iterator[tuple[int, str, bool]]:
    """``(line number, line, inside a fenced block)`` of every line but the fences themselves."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith(("```", "~~~")) and (fence is None or line.strip().startswith(fence)):
            fence = line.strip()[:3] if fence is None else None
        else:
            yield number, line, fence is not None


def code_of(text: str) -> Iterator[tuple[int, str, bool]]:
    """``(line number, code, in a block)`` for every inline code span and every code-block line (fenced,
    or indented four spaces after a blank line)."""
    previous_blank, indented = True, False
    for number, line, fenced in _lines(text):
        indented = not fenced and line.startswith(("    ", "\t")) and bool(line.strip()) and (previous_blank or indented)
        previous_blank = not line.strip()
        if fenced or indented:
            yield number, line, True
        else:
            yield from ((number, m.group(2).strip(), False) for m in re.finditer(r"(`+)(.+?)\1", line))


def links_of(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, target)`` of every Markdown link outside code."""
    for number, line, fenced in _lines(text):
        if not fenced:
            yield from ((number, m.group(1)) for m in re.finditer(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)))


def commands_of(code: str, block: bool) -> Iterator[list[str]]:
    """The shell commands of one code line, each as its words (a block line's ``#`` comment dropped)."""
    if block:
        code = re.sub(r"(^|\s)#.*$", "", code)
    for part in re.split(r"&&|\|\||;|\|", code):
        try:
            words = shlex.split(part)
        except ValueError:  # an unbalanced quote in an example: its words as written
            words = part.split()
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # VAR=value before a program
            words = words[1:]
        if words:
            yield words


# -- judging ---------------------------------------------------------------------------------------------
def _word(raw: str) -> str:
    return raw.strip("[](),;:'\"")


def _option(raw: str) -> str | None:
    word = _word(raw)
    return word.split("=", 1)[0] if re.fullmatch(r"--[a-z][\w-]*(=.*)?", word) else None


def _judge(found: Findings, kind: str, ok: bool, problem: str) -> None:
    found.judged[kind] += 1
    if not ok:
        found.problems.append(problem)


def judge_command(words: list[str], facts: Facts, found: Findings, where: str) -> None:
    """The subcommand, options, make targets and markers of one command, by its program (the module's rules)."""
    program = PurePosixPath(words[0]).name
    options = [o for o in map(_option, words) if o]
    if program == "oracles" and len(words) > 1 and re.fullmatch(r"[a-z][\w-]*", words[1]):
        sub, known = words[1], facts.commands.get(words[1], frozenset())
        _judge(found, "subcommand", sub in facts.commands,
               f"{where}: `oracles {sub}`: no such subcommand (oracles/cli.py COMMANDS: {', '.join(sorted(facts.commands))})")
        for option in options if sub in facts.commands else ():
            _judge(found, "option", option in known,
                   f"{where}: `oracles {sub} {option}`: not an option of `oracles {sub}` (it takes {', '.join(sorted(known))})")
    elif program == "pytest" or (program.startswith("python") and words[1:3] == ["-m", "pytest"]):
        for option in options:
            _judge(found, "option", facts.pytest_option(option),
                   f"{where}: `{option}`: not an option of pytest or of the plugin (oracles/plugin/__init__.py)")
        for value in (v for flag, v in zip(words, words[1:]) if flag == "-m"):
            for name in sorted(set(re.findall(r"[A-Za-z_]\w*", value)) - {"and", "or", "not"}):
                _judge(found, "marker", name in facts.markers, f"{where}: `-m {value}`: {name!r} is not a registered marker")
    elif program == "make":
        for target in (w for w in words[1:] if not w.startswith("-") and "=" not in w):
            _judge(found, "make target", target in facts.make_targets,
                   f"{where}: `make {target}`: no such target in the Makefile")
    elif words[0].startswith("--"):
        for option in options:
            _judge(found, "option", facts.any_option(option),
                   f"{where}: `{option}`: not an option of the plugin or of any oracles subcommand")


def path_problem(raw: str, facts: Facts) -> str | None:
    """Why ``raw`` names no file of the repository, or None (it does, or it is not a repository path)."""
    word = _word(raw)
    if word.startswith("-") and "=" in word:
        word = word.split("=", 1)[1]
    if not word or UNJUDGED.search(word) or word.startswith(("/", "-")):
        return None
    if "/" not in word and not word.endswith(FILE_SUFFIXES):
        return None
    parts = PurePosixPath(word).parts
    if not parts:
        return None
    if parts[0] in facts.top_level:
        if (facts.root / word).exists() or word.startswith(GENERATED):
            return None
        return "no such file or folder in the repository"
    if parts[0] in facts.inner and "/" in word:
        return f"a path inside the package: write it from the repository root (oracles/{word})"
    return None


def _defined(tree: ast.Module | ast.ClassDef) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
    return names


@functools.cache
def _module_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def module_problem(dotted: str, root: Path = ROOT) -> str | None:
    """Why ``dotted`` (``oracles.checks.port.MAX_NMSE``) names nothing in the tree, or None."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:i])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            break
    else:
        return "no such module in the tree"
    rest = parts[i:]
    if not rest:
        return None
    scope: ast.Module | ast.ClassDef = _module_tree(source)
    for depth, name in enumerate(rest[:2]):
        node = _defined(scope).get(name)
        if node is None:
            return f"{'.'.join(parts[:i + depth])} defines no {name!r} ({source.relative_to(root)})"
        if not isinstance(node, ast.ClassDef):
            return None
        scope = node
    return None


def judge_names(code: str, facts: Facts, found: Findings, where: str) -> None:
    """The repository paths and ``oracles.*`` names of one code line."""
    words = code.split()
    for raw in words:
        word = _word(raw)
        if (problem := path_problem(word, facts)) is not None:
            found.problems.append(f"{where}: `{word}`: {problem}")
        elif "/" in word or word.endswith(FILE_SUFFIXES):
            found.judged["path"] += word.split("/")[0] in facts.top_level
        for name in MODULE_NAME.findall(word):
            found.judged["module name"] += 1
            if (problem := module_problem(name, facts.root)) is not None:
                found.problems.append(f"{where}: `{name}`: {problem}")
    if words[:1] == ["from"] and len(words) > 3 and words[2] == "import" and MODULE_NAME.fullmatch(words[1]):
        for name in (_word(w) for w in words[3:]):
            dotted = f"{words[1]}.{name}"
            found.judged["module name"] += 1
            if name and (problem := module_problem(dotted, facts.root)) is not None:
                found.problems.append(f"{where}: `from {words[1]} import {name}`: {problem}")


def check_page(text: str, page: Path, facts: Facts, found: Findings) -> Findings:
    """Judge one page (its text, and its path for relative links and messages) into ``found``."""
    shown = page.relative_to(facts.root) if page.is_relative_to(facts.root) else page
    for number, code, block in code_of(text):
        where = f"{shown}:{number}"
        judge_names(code, facts, found, where)
        for words in commands_of(code, block):
            judge_command(words, facts, found, where)
    for number, target in links_of(text):
        if re.match(r"[a-z]+:|#", target):
            continue
        found.judged["link"] += 1
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            found.problems.append(f"{shown}:{number}: link ({target}): no such file ({(page.parent / path)})")
    return found


def pages(root: Path = ROOT) -> list[Path]:
    """The pages a user reads: the README, receipts/README.md and everything under docs/."""
    return [root / "README.md", root / "receipts" / "README.md", *sorted((root / "docs").rglob("*.md"))]


def layout_missing(text: str, modules: list[Path]) -> list[str]:
    """The modules (repository-relative paths) that ``text`` names neither as `` `path` `` nor, for a
    package's ``__init__.py``, by its folder (`` `oracles/x/` `` or ``**oracles/x/**``)."""

    def named(m: Path) -> bool:
        if m.name != "__init__.py" or m.parent.name == "oracles":
            return f"`{m}`" in text
        return f"`{m.parent}/`" in text or f"**{m.parent}/**" in text

    return [str(m) for m in modules if not named(m)]


def history_of(text: str) -> list[str]:
    """The lines of ``text`` that tell history (:data:`HISTORY`), as ``line: phrase``."""
    return [f"{n}: {m.group(0)!r}" for n, line in enumerate(text.splitlines(), 1) for m in HISTORY.finditer(line)]
