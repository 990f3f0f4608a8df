"""`python -m dice_jax.rl [--config YAML] [key=value ...]`: the same as `dice train`."""

import argparse
import sys

from dice_jax.cli import train


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dice_jax.rl")
  train.add_parser(parser.add_subparsers(dest="command"))
  return train.run(parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
  sys.exit(main())
