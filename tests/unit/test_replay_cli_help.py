"""Every option of every `kqp replay` command says in its --help what it does and its default."""

from __future__ import annotations

import argparse
import importlib

import pytest

from kqp.spark_jobs.cli import JOB_MODULES
from kqp.spark_jobs.common import HelpFormatter


def parser_of(command: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = importlib.import_module(JOB_MODULES[command]).build_parser()
    return parser


@pytest.mark.parametrize("command", sorted(JOB_MODULES))
def test_every_option_says_what_it_does_and_its_default(command: str) -> None:
    parser = parser_of(command)
    formatter = HelpFormatter(prog=parser.prog)
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        text = formatter._get_help_string(action)
        if not (action.help or "").strip():
            missing.append(f"{name}: no help")
        elif action.option_strings and not action.required and "default" not in text.lower():
            missing.append(f"{name}: no default in {text!r}")
    assert missing == [], f"kqp replay {command}: " + "; ".join(missing)


@pytest.mark.parametrize("command", sorted(JOB_MODULES))
def test_the_help_prints_each_default(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser_of(command).parse_args(["--help"])
    text = capsys.readouterr().out
    assert "(default: " in text
    # argparse's %-formatting ran: no "%(default)s" left for the reader.
    assert "%(" not in text


def test_generate_names_its_population_and_seed_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser_of("generate").parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "random seed: the same options always write the same capture (default: 7)" in text
    assert "requests (rows) to write (default: 20000)" in text
