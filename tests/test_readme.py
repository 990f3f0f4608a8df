"""Every code block of README.md, checked as a reader would use it.

- ```python blocks run as written, in README order, each as its own script in one scratch folder
  (a fresh interpreter on one CPU device, as on a laptop). The folder holds what the prose says the
  reader has: `ckpt_dir`, a tiny random checkpoint made here. A block whose first line is
  `# <name>.py` is also saved under that name, so later blocks and commands can import it.
- ```bash blocks: every `dice ...` / `dice-verifier ...` command line is parsed by the real
  argument parsers; `dice train`/`dice sft` overrides are resolved against the config schema
  (unknown keys fail) and `rewards` sections are built, importing custom reward functions from the
  scratch folder as `dice train` would. Other commands must be ones the README may ask for, and
  repository paths they name must exist.
- ```text blocks are synopses: each `--flag` must exist on its subcommand.
- Inline `dotted.names` of our packages resolve (a Python object or a proto symbol), and inline
  repository paths exist.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TRACKED_DIRS = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} - {
    "runs", "build", "dist", "dice_jax.egg-info"}
SHELL_TOOLS = {"python3", "python", "pip", ".", "docker", "openssl", "kubectl", "dice", "dice-verifier"}
TINY_MODEL = dict(model_type="sdar", vocab_size=264, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, block_size=4, mask_token_id=259,
                  rope_theta=10000.0, max_position_embeddings=8192, eos_token_id=258, bos_token_id=256)


def _blocks(lang: str) -> list[tuple[int, str]]:
  """(line number, text) of each fenced block of `lang`."""
  out = []
  for m in re.finditer(r"^```(\w*)\n(.*?)^```$", README, flags=re.M | re.S):
    if m.group(1) == lang:
      out.append((README.count("\n", 0, m.start()) + 1, m.group(2)))
  return out


def _commands(block: str) -> list[list[str]]:
  """Shell words of each command: continuation lines joined, comments dropped, split on && and ;."""
  joined = re.sub(r"\\\n\s*", " ", block)
  out = []
  for line in joined.splitlines():
    words = shlex.split(line, comments=True)
    command: list[str] = []
    for word in [*words, "&&"]:
      if word in ("&&", ";"):
        if command:
          out.append(command)
        command = []
      else:
        command.append(word)
  return out


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> pathlib.Path:
  """The reader's folder: a tiny random checkpoint as `ckpt_dir`, and the README's module files."""
  from dice_jax.model import hf_io, transformer  # pylint: disable=import-outside-toplevel
  from dice_jax.model.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from dice_jax.train import tiny_tokenizer  # pylint: disable=import-outside-toplevel
  folder = tmp_path_factory.mktemp("readme")
  tokenizer = tiny_tokenizer.write_byte_tokenizer(folder / ".tokenizer")
  hf_io.save_pretrained(transformer.init_model(ModelConfig.from_hf_dict(dict(TINY_MODEL)), seed=0),
                        folder / "ckpt_dir", tokenizer_dir=tokenizer)
  for _, text in _blocks("python"):
    name = re.match(r"# (\w+\.py)\n", text)
    if name:
      (folder / name.group(1)).write_text(text)
  return folder


def test_every_block_says_how_it_is_checked():
  languages = re.findall(r"^```(\w*)\n.*?^```$", README, flags=re.M | re.S)
  assert languages and set(languages) <= {"python", "bash", "text"}, languages


@pytest.mark.slow
def test_python_blocks_run_as_written(scratch):
  blocks = _blocks("python")
  assert len(blocks) >= 3
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}  # a laptop: one device
  for i, (line, text) in enumerate(blocks):
    script = scratch / f".readme_block_{i}.py"
    script.write_text(text)
    done = subprocess.run([sys.executable, script.name], cwd=scratch, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, f"README.md line {line}:\n{text}\n{done.stderr[-3000:]}"
  assert (scratch / "out_dir" / "config.json").is_file()  # the library block saved the model back


def _check_dice(argv: list[str], where: str, scratch: pathlib.Path, monkeypatch) -> None:
  from dice_jax.cli import main as dice_main  # pylint: disable=import-outside-toplevel
  from dice_jax.config import apply_overrides, from_dict, read_yaml  # pylint: disable=import-outside-toplevel
  args = dice_main.build_parser().parse_args(argv)  # a bad flag exits: the test fails with argparse's message
  if args.command not in ("train", "sft"):
    return
  if args.command == "train":
    from dice_jax.rl.config import RLConfig as schema  # pylint: disable=import-outside-toplevel
  else:
    from dice_jax.train.sft_loop import SFTConfig as schema  # pylint: disable=import-outside-toplevel
  if args.config:
    assert (ROOT / args.config).is_file(), f"{where}: {args.config} does not exist"
  data = apply_overrides(schema, read_yaml(str(ROOT / args.config)) if args.config else {}, args.overrides)
  if args.command == "train" and "rewards" in data:
    from dice_jax.rewards.defaults import RewardConfig  # pylint: disable=import-outside-toplevel
    monkeypatch.chdir(scratch)  # where the reader runs `dice train`, beside myrewards.py
    section = from_dict(RewardConfig, data["rewards"], where="rewards")
    assert section.custom_components() or not section.custom


def test_shell_commands_parse_with_the_real_parsers(scratch, monkeypatch):
  from verifier_service import cli as verifier_cli  # pylint: disable=import-outside-toplevel
  blocks = _blocks("bash")
  assert blocks and "dice train" in blocks[0][1]  # the README's first command
  checked = 0
  for line, text in blocks:
    made: set[str] = set()  # files a command of this block writes with `>`
    for argv in _commands(text):
      where = f"README.md line {line}: {shlex.join(argv)}"
      assert argv[0] in SHELL_TOOLS, f"{where}: {argv[0]!r} is not a command the README may ask for"
      for i, word in enumerate(argv):
        if i and argv[i - 1] == ">":
          made.add(word)
        elif "/" in word and word.split("/")[0] in TRACKED_DIRS and word not in made:
          path = word.split("=", 1)[-1]
          assert (ROOT / path).exists(), f"{where}: {path} is not in the repository"
      argv = [w for w in argv if w != ">"]
      if argv[0] == "dice":
        _check_dice(argv[1:], where, scratch, monkeypatch)
        checked += 1
      elif argv[0] == "dice-verifier":
        verifier_cli.build_parser().parse_args(argv[1:])
        checked += 1
  assert checked >= 8


def _flags(parser) -> set[str]:
  return {flag for action in parser._actions for flag in action.option_strings}  # pylint: disable=protected-access


def test_synopsis_flags_exist():
  from dice_jax.cli import main as dice_main  # pylint: disable=import-outside-toplevel
  from verifier_service import cli as verifier_cli  # pylint: disable=import-outside-toplevel
  parsers = {}
  for prog, parser in (("dice", dice_main.build_parser()), ("dice-verifier", verifier_cli.build_parser())):
    sub = next(a for a in parser._actions if a.dest == "command")  # pylint: disable=protected-access
    parsers |= {(prog, name): p for name, p in sub.choices.items()}
  lines = [ln.split("#")[0] for _, text in _blocks("text") for ln in text.splitlines()]
  commands = [ln.split() for ln in lines if ln.startswith(("dice ", "dice-verifier "))]
  assert len(commands) >= 10
  for words in commands:
    parser, rest = parsers[(words[0], words[1])], words[2:]
    nested = [a for a in parser._actions if a.choices and rest and rest[0] in a.choices]  # pylint: disable=protected-access
    if nested:  # `dice rewards check ...`: the flags are the inner subcommand's
      parser, rest = nested[0].choices[rest[0]], rest[1:]
    for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", " ".join(rest)):
      assert flag in _flags(parser), f"{' '.join(words)}: {words[0]} {words[1]} has no {flag}"


def _resolves(name: str) -> bool:
  import importlib  # pylint: disable=import-outside-toplevel
  from google.protobuf import descriptor_pool  # pylint: disable=import-outside-toplevel
  from dice.verifier.v1 import verifier_pb2  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    try:
      for attr in parts[i:]:
        obj = getattr(obj, attr)
      return True
    except AttributeError:
      break
  pool = descriptor_pool.Default()  # else a proto service, message or enum name
  for find in (pool.FindServiceByName, pool.FindMessageTypeByName, pool.FindEnumTypeByName):
    try:
      find(name)
      return True
    except KeyError:
      continue
  return False


def test_inline_names_and_paths_exist():
  spans = set(re.findall(r"(?<!`)`([^`\n]+)`(?!`)", README))
  names = [s for s in spans if re.fullmatch(r"(dice_jax|dice|verifier_service)(\.\w+)+", s)]
  assert "dice.verifier.v1.verifier_pb2.Verdict" in names
  for name in names:
    assert _resolves(name), f"README names `{name}`, which does not exist"
  paths = [s for s in spans if re.fullmatch(r"[\w.-]+/[\w./-]*", s) and s.split("/")[0] in TRACKED_DIRS]
  assert len(paths) >= 5
  for path in paths:
    assert (ROOT / path).exists(), f"README names `{path}`, which does not exist"


def test_train_extra_installs_no_torch():
  """What the README's extras table says: `train` (plus the base) pulls no torch and no CUDA wheels."""
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  trainer_side = [*project["dependencies"], *project["optional-dependencies"]["train"]]
  assert not [d for d in trainer_side if re.match(r"(torch|triton|nvidia|cuda)", d, re.I)], trainer_side
  assert any(d.startswith("torch") for d in project["optional-dependencies"]["verify"])
  assert not [d for d in project["optional-dependencies"]["verify"] if d.startswith(("jax", "flax"))]
