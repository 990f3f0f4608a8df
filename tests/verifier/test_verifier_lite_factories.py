"""The lite tier's factory ops live in one place (torch_lite.h's ATen/ops includes) and the tier's
VERSION is derived from them, so adding an op cannot keep a stale cache key."""

from __future__ import annotations

import re

import pytest

from verifier_service.compile import header_tiers
from verifier_service.compile import tier_environment

_LAST_OP_INCLUDE = "#include <ATen/ops/zeros_like.h>\n"


def _lite_text() -> str:
  return header_tiers.LITE_HEADER.read_text()


def _rule_sources() -> list[str]:
  return [path.read_text() for path in header_tiers.RULE_MODULES]


def test_the_version_is_the_digest_of_the_files_as_they_are():
  assert header_tiers.VERSION == header_tiers.content_version(_lite_text(), _rule_sources())


def test_adding_a_factory_op_changes_the_table_and_the_version():
  lite = _lite_text()
  assert _LAST_OP_INCLUDE in lite
  added = lite.replace(_LAST_OP_INCLUDE, _LAST_OP_INCLUDE + "#include <ATen/ops/rand.h>\n")
  assert header_tiers.lite_factories(added) == header_tiers.LITE_FACTORIES + ("rand",)
  assert header_tiers.content_version(added, _rule_sources()) != header_tiers.VERSION
  removed = lite.replace(_LAST_OP_INCLUDE, "")
  assert "zeros_like" not in header_tiers.lite_factories(removed)
  assert header_tiers.content_version(removed, _rule_sources()) != header_tiers.VERSION


def test_a_rule_change_changes_the_version_and_a_comment_does_not():
  sources = _rule_sources()
  commented = [sources[0] + "\n# a comment says why, and keys no cache\n"] + sources[1:]
  assert header_tiers.content_version(_lite_text(), commented) == header_tiers.VERSION
  ruled = [sources[0] + "\n_EXTRA_RULE = 1\n"] + sources[1:]
  assert header_tiers.content_version(_lite_text(), ruled) != header_tiers.VERSION


def test_the_environment_key_follows_the_version(monkeypatch):
  before = header_tiers.environment_key("toolchain", ["nvcc"], "extension")
  monkeypatch.setattr(header_tiers, "VERSION", header_tiers.VERSION + "x")
  assert header_tiers.environment_key("toolchain", ["nvcc"], "extension") != before


@pytest.mark.parametrize("text, what", [
    ("#include <ATen/core/Tensor.h>\n", "no factory op"),
    ("#include <ATen/ops/empty.h>\n#include <ATen/ops/empty.h>\n", "an op listed twice"),
])
def test_a_lite_header_without_a_clean_op_list_is_refused_naming_the_rule(text, what):
  with pytest.raises(ValueError, match="must include each factory op's ATen/ops header once"):
    header_tiers.lite_factories(text)


def test_the_lite_block_wraps_exactly_the_headers_factory_ops():
  """Real: torch's installed variable_factories.h, cut the way the lite tier cuts it."""
  block = tier_environment._factory_block(tier_environment._torch_include())
  kept = {name for name in re.findall(r"^inline at::Tensor (\w+)\(", block, re.M)}
  assert {name.removesuffix("_symint") for name in kept} == set(header_tiers.LITE_FACTORIES)
  deleted = set(re.findall(r"at::Tensor (\w+)\(Args&&\.\.\.\) = delete;", block))
  assert "tensor" in deleted and "rand" in deleted
  assert not deleted & set(header_tiers.LITE_FACTORIES)
