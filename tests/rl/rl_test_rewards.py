"""A user reward function for the RL tests (imported by `dice train` through `rewards.custom`).

Graded on purpose: a random model's responses differ in it, so groups have variance, advantages
are non-zero and the update changes the params (which a resume test needs to be meaningful).
"""


def letter_fraction(prompts, completions, verdicts, **item_columns):
  """Share of ASCII letters in each completion (0 for an empty one)."""
  del prompts, verdicts
  assert {"phase", "problem_id", "reference_source"} <= set(item_columns)
  return [sum(c.isascii() and c.isalpha() for c in text) / max(len(text), 1) for text in completions]
