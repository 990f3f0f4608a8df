"""Prompt construction for both phases, target fields, and user templates."""

import pytest

from dice_jax.data import problems as P
from dice_jax.data import prompts as Q


@pytest.fixture(scope="module")
def relu():
  return next(p for p in P.load_bundled() if p.id == "tiny_relu")


def test_infilling_prompt_shows_reference_and_scaffold_but_not_the_answer(relu):
  messages = Q.build_messages(relu, 1)
  assert [m["role"] for m in messages] == ["system", "user"]
  user = messages[1]["content"]
  assert relu.reference_source.strip() in user
  assert Q.MISSING_MARKER in user
  assert 'functions=["relu_cuda"]' in user and "class ModelNew" in user  # the suffix is visible
  assert "__global__ void relu_kernel" not in user                      # the known-good middle is not
  assert user.index("import torch") < user.index(Q.MISSING_MARKER) < user.index("cpp_src")


def test_end_to_end_prompt_is_one_shot_with_the_reference(relu):
  user = Q.build_messages(relu, 2)[1]["content"]
  assert user.count("class ModelNew") == 1 and "add_kernel" in user  # the worked example
  assert relu.reference_source.strip() in user
  assert "load_inline" in user and "```python" in user
  assert "cpp_src = \"torch::Tensor relu_cuda" not in user             # no scaffold in phase 2


def test_target_spec_fills_the_prompt(relu):
  target = Q.TargetSpec(arch="sm_90", precision="bf16", shapes="x: float32[16, 256]")
  for phase in (1, 2):
    user = Q.build_messages(relu, phase, target=target)[1]["content"]
    assert "sm_90" in user and "bf16 (torch.bfloat16)" in user and "x: float32[16, 256]" in user
  plain = Q.build_messages(relu, 2)[1]["content"]
  assert "sm_90" not in plain


@pytest.mark.parametrize("kwargs,message", [
    ({"arch": "hopper"}, "arch must look like 'sm_90'"),
    ({"precision": "fp8"}, "precision must be one of"),
])
def test_bad_target_spec(kwargs, message):
  with pytest.raises(ValueError, match=message):
    Q.TargetSpec(**kwargs)


def test_phase1_needs_a_scaffold():
  problem = P.Problem(id="p", reference_source="class Model: pass")
  with pytest.raises(ValueError, match="no prefix/middle/suffix scaffold"):
    Q.build_messages(problem, 1)
  assert Q.build_messages(problem, 2)[1]["content"]
  with pytest.raises(ValueError, match="phase must be 1 or 2"):
    Q.build_messages(problem, 0)


def test_user_templates(relu, tmp_path):
  template = Q.PromptTemplate(user="[{problem_id}] {arch} {{literal}}\n{reference}", system=None)
  messages = Q.build_messages(relu, 2, end_to_end=template, target=Q.TargetSpec(arch="sm_80"))
  content = f"[tiny_relu] sm_80 {{literal}}\n{relu.reference_source.strip()}"
  assert messages == [{"role": "user", "content": content}]
  with pytest.raises(ValueError, match=r"unknown field \{nope\}; available: .*reference"):
    Q.PromptTemplate(user="{nope}").render(reference="r")
  with pytest.raises(ValueError, match="positional field"):
    Q.PromptTemplate(user="{}").render(reference="r")
  with pytest.raises(ValueError, match="malformed"):
    Q.PromptTemplate(user="{reference").render(reference="r")

  path = tmp_path / "t.yaml"
  path.write_text("system: null\nuser: |\n  Fill {scaffold}\n")
  loaded = Q.PromptTemplate.from_yaml(path)
  assert loaded.system is None
  assert Q.build_messages(relu, 1, infilling=loaded)[0]["content"].startswith("Fill import torch")
  path.write_text("usr: x\n")
  with pytest.raises(ValueError, match="mapping with a string field 'user'"):
    Q.PromptTemplate.from_yaml(path)
  path.write_text("user: x\nextra: 1\n")
  with pytest.raises(ValueError, match=r"unknown prompt template keys \['extra'\]"):
    Q.PromptTemplate.from_yaml(path)
  with pytest.raises(ValueError, match="cannot read prompt template"):
    Q.PromptTemplate.from_yaml(tmp_path / "missing.yaml")


def test_every_dice_infilling_item_renders(shared_dir):
  for p in P.load_problems(shared_dir / "data/dice/kernel_infilling_evaluation.json"):
    user = Q.build_messages(p, 1)[1]["content"]
    assert p.middle not in user and Q.MISSING_MARKER in user


def test_prompts_render_through_the_sdar_chat_template(shared_dir, relu):
  """The messages are what the model's own chat template expects (system/user, generation prompt)."""
  from dice_jax.model.tokenizer import load_tokenizer
  tokenizer = load_tokenizer(shared_dir / "models/sdar-4b-chat")
  for phase in (1, 2):
    text = tokenizer.apply_chat_template(Q.build_messages(relu, phase), add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert relu.reference_source.strip() in text
