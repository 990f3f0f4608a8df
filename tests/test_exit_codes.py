"""One exit-code table for every `dice` command (dice_jax/cli/exit_codes.py), stated in each --help."""

from __future__ import annotations

import re

import pytest

from dice_jax.cli import exit_codes, main
from dice_jax.cli.exit_codes import Exit


def _subparsers() -> dict:
  parser = main.build_parser()
  sub = next(a for a in parser._actions if a.dest == "command")  # pylint: disable=protected-access
  out = dict(sub.choices)
  rewards = out.pop("rewards")
  inner = next(a for a in rewards._actions if a.choices)  # pylint: disable=protected-access
  out["rewards check"] = inner.choices["check"]
  return out


def test_every_code_has_one_meaning():
  assert len({int(c) for c in Exit}) == len(Exit)
  assert set(exit_codes.MEANING) == set(Exit)


def test_codes_0_to_4_mean_what_they_mean_for_dice_verifier_check():
  from verifier_service import cli as verifier_cli  # pylint: disable=import-outside-toplevel
  assert (Exit.OK, Exit.NONE_CORRECT, Exit.USAGE, Exit.UNVERIFIED, Exit.VERIFIER, Exit.INTERRUPTED) == (
      verifier_cli.EXIT_OK, verifier_cli.EXIT_FAILED, verifier_cli.EXIT_USAGE, verifier_cli.EXIT_NO_GPU,
      verifier_cli.EXIT_INFRA, verifier_cli.EXIT_INTERRUPTED)


@pytest.mark.parametrize("command, codes", [
    ("train", {0, 2, 4, 5, 6, 75, 130}),
    ("sft", {0, 2, 5, 6, 75, 130}),
    ("eval", {0, 2, 4, 130}),
    ("generate", {0, 1, 2, 3, 4, 130}),
    ("rewards check", {0, 2, 4}),
    ("plot", {0, 2}),
])
def test_help_lists_the_codes_the_command_can_return(command, codes):
  text = " ".join(_subparsers()[command].format_help().split())
  found = re.search(r"exit codes: (.*?)\.(\s|$)", text)
  assert found, f"dice {command} --help has no 'exit codes:' line"
  listed = {int(n) for n in re.findall(r"(?:^|, )(\d+) ", found.group(1))}
  assert listed == codes
