"""The exit codes of every `dice` command: one number, one meaning.

0 to 4 mean what they mean for `dice-verifier check`, so a script reads
`dice generate` and `dice-verifier check` the same way; 75 is sysexits' EX_TEMPFAIL (run again)
and 130 the shell's code for SIGINT. Each command uses the codes that can happen to it and lists
them at the end of its --help: every subcommand's parser is made by `add_command`, which puts them
there. README.md ("Commands") has the whole table.
"""

from __future__ import annotations

import argparse
import enum
import textwrap
from collections.abc import Sequence


class Exit(enum.IntEnum):
  OK = 0
  NONE_CORRECT = 1  # dice generate: no candidate was proven correct; nothing written
  USAGE = 2         # bad command line, config, input file or model directory: nothing was run
  UNVERIFIED = 3    # dice generate: written, but compile-only (no GPU, or no reference to check)
  VERIFIER = 4      # the verifier could not be started or reached, or INFRA_ERROR verdicts remain
  DIVERGED = 5      # dice train / sft: the loss became NaN or infinite
  CHECKPOINT = 6    # dice train / sft: a checkpoint does not match the config
  PREEMPTED = 75    # stopped by SIGTERM or a preemption notice after saving: run it again to resume
  INTERRUPTED = 130  # Ctrl-C (or SIGTERM where no checkpoint applies): what was done is kept


MEANING: dict[Exit, str] = {
    Exit.OK: "done",
    Exit.NONE_CORRECT: "no candidate proven correct",
    Exit.USAGE: "bad command line, config or input",
    Exit.UNVERIFIED: "compile-only result (UNVERIFIED)",
    Exit.VERIFIER: "verifier unreachable (or INFRA_ERROR verdicts left)",
    Exit.DIVERGED: "loss diverged",
    Exit.CHECKPOINT: "checkpoint does not match the config",
    Exit.PREEMPTED: "stopped (SIGTERM/preemption) after saving",
    Exit.INTERRUPTED: "interrupted",
}


def epilog(*codes: Exit, **wording: str) -> str:
  """`exit codes: 0 done, 2 bad ..., 4 ...` for a command's --help; `wording` (by code name)
  says what a code means for this command where the table's words are too general."""
  parts = [f"{int(c)} {wording.get(c.name, MEANING[c])}" for c in codes]
  return textwrap.fill("exit codes: " + ", ".join(parts) + ".", width=100)


def add_command(subparsers, name: str, help_text: str, description: str, examples: str,
                codes: Sequence[Exit], **wording: str) -> argparse.ArgumentParser:
  """A subcommand's parser whose --help ends with `examples` (kept as written) and then the exit
  codes it can return (the table's words, or the command's own by code name: `USAGE="bad input"`)."""
  return subparsers.add_parser(name, help=help_text, description=description,
                               epilog=f"{examples.rstrip()}\n\n{epilog(*codes, **wording)}",
                               formatter_class=argparse.RawDescriptionHelpFormatter)
