"""The warm start (dice_jax.rl.warm_start) as a run: examples, tokenizer, SFT, then RL from its model.

`train(cfg)` is what `dice train` runs: when the warm start applies (a random `model.init` and
`warm_start.steps` > 0) it writes, under `<run_dir>/warm_start/`,
  examples.json   one example per (problem, phase): the RL run's own prompt for that problem (its
                  templates, `data.*_template`) and the known-good answer in one fenced block
                  (phase 1 the `source = \"\"\"...\"\"\"` middle, phase 2 the whole file);
  tokenizer/      the fitted BPE (when `tokenizer_size` > 0);
then runs `dice sft`'s loop (checkpoints/, metrics.jsonl, tensorboard/, hf/) and records
`summary.json`. RL then runs from `warm_start/hf` exactly as from any checkpoint (`model.path`), so
the RL code knows nothing of warm starts, and its resolved config.yaml says where the model came from.

Decision: the SFT scores the answer, not the padding after it (`pad_in_loss=False`). A phase-1
answer of the built-in run is about 20 tokens in a 400-token row, so with the padding scored most
of the scored tokens were pad (an end token of the sampler). Checked on the built-in run's warm
start, seed 0: with the padding scored, 30 of 32 samples on the 8 RL problems failed extraction,
most of them ending before the statement's string closed; without, RL's first step had a format
rate of 0.59. The answer's own end-of-turn token is still scored.

Decision: the learning rate decays to 0 by the SFT's last step (`warm_start.schedule: cosine`).
At a constant 3e-3 the losses still jumped (0.97, 1.96, 0.62 at steps 125, 150, 175), so the last
weights were wherever that trajectory stood, and machines that round differently got different
models: seed 0's first RL step had a format rate of 0.59 on the VMs of 2026-12-04 and 0.06 on a
2-core AMD VM on 2026-12-05, whose four steps then compiled nothing. With the decay, on that VM,
the first step's format rate was 0.81 (seed 0), 0.31 (1) and 0.78 (2), and the compile rate rose
with each of the three seeds (README.md).

Resumable: a rerun skips a warm start whose summary.json exists and resumes an interrupted one from
its checkpoint; a stop (Ctrl-C, SIGTERM) during it saves, and the result says so, as RL's would.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from dice_jax.checkpoints import CheckpointConfig
from dice_jax.config import ConfigError
from dice_jax.data import prompts as prompts_lib
from dice_jax.data.problems import Problem, load_problems
from dice_jax.data.sft_data import SFTDataConfig
from dice_jax.metrics_log import LoggingConfig
from dice_jax.model.tokenizer import load_tokenizer
from dice_jax.rewards.shaping import RewardComponent
from dice_jax.rl import setup
from dice_jax.rl.config import RLConfig
from dice_jax.rl.data import PromptBook
from dice_jax.rl.loop import RLResult, run_rl
from dice_jax.train.bpe_tokenizer import write_bpe_tokenizer
from dice_jax.train.model_setup import ModelSection
from dice_jax.train.optim import OptimizerConfig
from dice_jax.train.sft_loop import SFTConfig, run_sft
from dice_jax.train.sft_step import SFTTrainConfig

log = logging.getLogger(__name__)

FOLDER = "warm_start"
SUMMARY_FILE = "summary.json"


@dataclasses.dataclass(frozen=True)
class WarmStartSummary:
  """What the warm start did (also `<run_dir>/warm_start/summary.json`)."""
  steps: int
  examples: int
  problems: int
  rl_problems: int  # distinct problem ids in data.phase1_files / phase2_files
  rl_problems_unseen: int  # of those, ones the warm start had no example of
  tokenizer_size: int  # 0: the model's own tokenizer
  seconds: float
  final_loss: float | None


def applies(cfg: RLConfig) -> bool:
  """A warm start runs for a random model (model.init) with warm_start.steps > 0."""
  return cfg.model.init is not None and cfg.warm_start.steps > 0


def _load(paths: Sequence[str], key: str) -> list[Problem]:
  loaded = {}
  for path in paths:
    for problem in load_problems(path):
      loaded.setdefault(problem.id, problem)
  if not loaded:
    raise ConfigError(f"{key}: no problems")
  return list(loaded.values())


def examples(cfg: RLConfig, problems: Sequence[Problem]) -> list[dict[str, Any]]:
  """SFT examples (dice_jax.data.sft_data's `messages` form): each problem's phase-1 and phase-2
  prompt, rendered with the RL run's own templates, answered by its known-good candidate."""
  book = PromptBook(cfg.data, tokenizer=None)  # only its templates are used
  rows = []
  for problem in problems:
    if not problem.has_scaffold:
      raise ConfigError(f"warm_start.problems: {problem.id!r} ({problem.origin}) has no known-good answer "
                        "(prefix/middle/suffix); a warm start learns from those")
    for phase, answer in ((1, problem.middle), (2, problem.known_good)):
      messages = prompts_lib.build_messages(problem, phase, infilling=book.infilling, end_to_end=book.end_to_end)
      rows.append({"messages": [*messages, {"role": "assistant", "content": f"```python\n{answer}\n```"}]})
  return rows


def _sft_config(cfg: RLConfig, folder: str, examples_path: str, tokenizer_dir: str | None) -> SFTConfig:
  w = cfg.warm_start
  init = dict(cfg.model.init)
  if tokenizer_dir is not None:
    init["vocab_size"] = max(int(init.get("vocab_size", 0)), w.tokenizer_size)
  model = dataclasses.replace(cfg.model, init=init, tokenizer=tokenizer_dir or cfg.model.tokenizer)
  return SFTConfig(
      model=model, run_dir=folder,
      data=SFTDataConfig(train_files=(examples_path,), max_length=w.max_length, batch_size=w.batch_size, seed=w.seed,
                         pad_in_loss=False),
      train=SFTTrainConfig(steps=w.steps, seed=w.seed),
      optimizer=OptimizerConfig(lr=w.lr, schedule=w.schedule, warmup_steps=w.warmup_steps, weight_decay=0.0,
                                max_grad_norm=1.0),
      mesh=cfg.mesh, distributed=cfg.distributed, checkpoint=CheckpointConfig(every_steps=w.steps, keep=1),
      logging=LoggingConfig(every_steps=max(1, w.steps // 10)))


def _rl_model(cfg: RLConfig, hf_dir: str) -> ModelSection:
  """The RL run's model section: the warm start's export, with the run options of `model`."""
  return dataclasses.replace(cfg.model, path=hf_dir, init=None, tokenizer=None)


def warm_start(cfg: RLConfig, run_dir: str, should_stop: Callable[[], bool],
               before_sft: Callable[[], None] = lambda: None) -> tuple[RLConfig | None, WarmStartSummary | None]:
  """(the RL config to run, what the warm start did); (None, None) when it was stopped first.

  `before_sft` runs once the examples and the tokenizer are checked, right before the SFT (not
  when the warm start is already done). Decision: `train` starts the verifier there, not after
  the warm start: a local server's start-up (importing torch, then its header tiers and
  precompiled headers, minutes on a cold cache) then runs beside the SFT instead of before RL's
  first verdicts, and a bad problem file still fails before anything is started."""
  folder = os.path.join(run_dir, FOLDER)
  summary_path = os.path.join(folder, SUMMARY_FILE)
  hf_dir = os.path.join(folder, "hf")
  if os.path.isfile(summary_path):
    with open(summary_path, encoding="utf-8") as f:
      done = WarmStartSummary(**json.load(f))
    log.info("warm start: already done (%s); RL continues from %s", summary_path, hf_dir)
    return dataclasses.replace(cfg, model=_rl_model(cfg, hf_dir)), done
  w = cfg.warm_start
  start = time.perf_counter()
  problems = _load(w.problems, "warm_start.problems")
  rl_ids = {p.id for p in _load((*cfg.data.phase1_files, *cfg.data.phase2_files), "data.phase*_files")}
  seen = rl_ids & {p.id for p in problems}
  if seen:
    log.warning("warm start: %d of the %d RL problems are also warm-start problems (%s): their RL rewards can be "
                "recall of the warm start's answers", len(seen), len(rl_ids), ", ".join(sorted(seen)[:5]))
  rows = examples(cfg, problems)
  os.makedirs(folder, exist_ok=True)
  examples_path = os.path.join(folder, "examples.json")
  with open(examples_path, "w", encoding="utf-8") as f:
    json.dump(rows, f, indent=1)
  tokenizer_dir = None
  if w.tokenizer_size:
    texts = [turn["content"] for row in rows for turn in row["messages"]]
    tokenizer_dir = str(write_bpe_tokenizer(os.path.join(folder, "tokenizer"), texts, w.tokenizer_size))
    _check_rl_prompts(cfg, load_tokenizer(tokenizer_dir))
  log.info("warm start: %d SFT steps on %d examples of %d problems (%s) before RL on %d problems, %d of them unseen",
           w.steps, len(rows), len(problems), ", ".join(w.problems), len(rl_ids), len(rl_ids - seen))
  before_sft()
  result = run_sft(_sft_config(cfg, folder, examples_path, tokenizer_dir), should_stop=should_stop)
  if result.status != "done":
    return None, None
  if result.hf_dir is None:
    raise ConfigError(f"warm start: {folder} holds a finished SFT run but no hf/ export; remove {folder} to redo it")
  summary = WarmStartSummary(steps=w.steps, examples=len(rows), problems=len(problems), rl_problems=len(rl_ids),
                             rl_problems_unseen=len(rl_ids - seen), tokenizer_size=w.tokenizer_size,
                             seconds=round(time.perf_counter() - start, 1), final_loss=result.metrics.get("loss"))
  with open(summary_path, "w", encoding="utf-8") as f:
    json.dump(dataclasses.asdict(summary), f, indent=1)
  return dataclasses.replace(cfg, model=_rl_model(cfg, result.hf_dir)), summary


def _check_rl_prompts(cfg: RLConfig, tokenizer: Any) -> None:
  """RL's prompt check (PromptBook.problems: some problem of each phase RL needs fits
  data.max_prompt_length) with the fitted tokenizer, before the SFT rather than minutes after it."""
  book, c = PromptBook(cfg.data, tokenizer), cfg.curriculum
  if c.phase1_steps != 0:
    book.problems(1, cfg.data.phase1_files)
  if cfg.data.phase2_files:
    book.problems(2, cfg.data.phase2_files)


@dataclasses.dataclass(frozen=True)
class TrainResult(RLResult):
  """RL's result, with what the warm start before it did (None: no warm start)."""
  warm_start: WarmStartSummary | None = None


def train(cfg: RLConfig, *, should_stop: Callable[[], bool] = lambda: False,
          reward_components: Sequence[RewardComponent] = ()) -> TrainResult:
  """`dice train`: the warm start when it applies, then RL (dice_jax.rl.loop.run_rl)."""
  summary, verifier = None, None
  if applies(cfg):
    run_dir = os.path.abspath(os.path.expanduser(cfg.run_dir))
    started: list[concurrent.futures.Future] = []
    rl_verifier = cfg.verifier
    try:
      cfg, summary = warm_start(cfg, run_dir, should_stop,
                                before_sft=lambda: started.append(setup.start_verifier(rl_verifier, run_dir)))
    except BaseException:
      for future in started:
        setup.close_started(future)
      raise
    verifier = started[0] if started else None
    if cfg is None:
      if verifier is not None:
        setup.close_started(verifier)
      return TrainResult(status="stopped", step=0, start_step=0, history=[], run_dir=run_dir, hf_dir=None,
                         verifier="", warm_start=None)
  result = run_rl(cfg, should_stop=should_stop, reward_components=reward_components, verifier=verifier)
  return TrainResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result)}, warm_start=summary)
