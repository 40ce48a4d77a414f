"""The ``oracles`` command: ``pin | materialize | records | receipts | compare | summarize | survey | bisect |
report | faults | kld | serve | wire-check | recording-check``.

Each subcommand lives in its own module and is imported only when called, so ``oracles receipts``
never imports torch. Pins and token ids are looked up in the project of the current folder (its
pytest ini file's ``oracles_pins`` / ``oracles_records``: :mod:`oracles.pins.project`), then the built-in ones;
``--pins-dir`` / ``--records-dir`` name other folders for one call (where ``oracles pin`` and ``oracles
records`` write), e.g. the package's own::

    oracles --records-dir oracles/builtin/records records d1 --pin smollm2-135m-instruct

The command opens its own :class:`~oracles.pins.project.Project` and enters it only while the subcommand
runs, so a call from inside a test session leaves that session's stores as they were.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Callable

from oracles.errors import OracleError

#: name -> (module, help). The module defines ``add_arguments(parser)`` and ``run(args) -> int``.
COMMANDS: dict[str, tuple[str, str]] = {
    "pin": ("oracles.commands.pin", "pin a snapshot you have (a folder, or hf:REPO@REVISION from the local HF cache)"),
    "materialize": ("oracles.commands.materialize", "build a snapshot under $ORACLES_HOME (local:/hf: pins: verify in place)"),
    "records": ("oracles.commands.records", "regenerate a family's expected ids from the tokenizer alone"),
    "receipts": ("oracles.commands.receipts", "list receipts, or print one's checks table"),
    "compare": ("oracles.commands.compare", "hold a port's receipt against a reference receipt, record by record"),
    "summarize": ("oracles.commands.summarize", "summarise a d1 receipt: gold agreement, near ties, red arms"),
    "survey": ("oracles.commands.survey", "activation absmax per layer of a receipt's runs against the fp16 limit (JSON + PNG)"),
    "bisect": ("oracles.commands.bisect", "name the first layer where a port leaves the reference on one record"),
    "report": ("oracles.commands.report", "a receipt as one self-contained HTML page, and a Markdown summary"),
    "faults": ("oracles.commands.faults", "print the fault panel's detection matrix from a receipt"),
    "kld": ("oracles.commands.kld", "llama-perplexity --kl-divergence-base files: export the reference's, compare two"),
    "serve": ("oracles.commands.serve", "serve any engine on a pin over the wire (stdio or TCP): a reference where it fits"),
    "wire-check": ("oracles.commands.wire_check", "conformance of a far side (a harness command or HOST:PORT) to the wire"),
    "recording-check": ("oracles.commands.recording_check", "conformance of a recording (--record ENGINE=DIR) to its layout"),
}


def main(argv: list[str] | None = None) -> int:
    """Run ``oracles COMMAND ...`` (``argv``: the words after the program name, default ``sys.argv[1:]``).

    Returns the exit status: 0 done, 1 a check failed (the commands that judge), 2 bad input (one line
    on stderr naming file, record, field or option), :data:`BROKEN_PIPE` when stdout's reader went away.
    """
    # No abbreviations: ``--pin`` of a command is not ``--pins-dir``.
    parser = argparse.ArgumentParser(prog="oracles", description="numerical reference oracles for LLM conversions",
                                     allow_abbrev=False)
    _add_folders(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    runners: dict[str, Callable[[argparse.Namespace], int]] = {}
    argv = sys.argv[1:] if argv is None else argv
    folders = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_folders(folders)
    words = folders.parse_known_args(argv)[1]  # the command's name comes after the folder options
    # A named command's parser alone (each parser costs argparse's message lookups, ~0.3 ms); every command's,
    # for the help and the refusal that list them.
    named = [words[0]] if words and words[0] in COMMANDS else list(COMMANDS)
    for name in named:
        module_name, text = COMMANDS[name]
        sp = sub.add_parser(name, help=text, description=text)
        if words and words[0] == name:  # import only the module that runs
            module = importlib.import_module(module_name)
            module.add_arguments(sp)
            runners[name] = module.run
    args = parser.parse_args(argv)
    from oracles.pins.project import Project, ProjectDirs, project_dirs

    found = project_dirs()
    dirs = ProjectDirs(pins=(args.pins_dir or found.pins).resolve(), records=(args.records_dir or found.records).resolve(),
                       ini=found.ini)
    try:
        with Project.open(dirs).entered():
            status = runners[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return status
    except OracleError as exc:
        print(f"oracles {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _reader_went_away()


def _add_folders(parser: argparse.ArgumentParser) -> None:
    """The options before COMMAND: the project's folders for this call."""
    parser.add_argument("--pins-dir", type=Path, default=None, metavar="DIR",
                        help="the project's pins folder for this call, before the built-in pins; default: the ini "
                             "file's oracles_pins (fixtures/pins)")
    parser.add_argument("--records-dir", type=Path, default=None, metavar="DIR",
                        help="the project's records folder for this call, before the built-in records; default: the "
                             "ini file's oracles_records (fixtures/records)")


#: Exit status when the reader of stdout closed it (``oracles receipts | head``): 128 + SIGPIPE, what a
#: shell reports for a program the signal ended, and distinct from 1 ("a check failed") and 2 (bad input).
BROKEN_PIPE = 141


def _reader_went_away() -> int:
    """Exit quietly when stdout's reader closed the pipe (the recipe of Python's ``signal`` docs, "Note
    on SIGPIPE"): point stdout at devnull so the interpreter's final flush raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (an in-process caller's buffer)
        pass
    return BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
