"""CompilerOptions (verifier_service/compile/options.py): the compile stage's settings as one value
that refuses contradictions, and ServerConfig's mapping to it."""

from __future__ import annotations

import pytest

from verifier_service.compile import options as options_lib
from verifier_service.service import config as config_lib


@pytest.mark.parametrize("fields, says", [
    (dict(split=True, light_headers=False), "split needs light_headers and use_pch"),
    (dict(split=True, use_pch=False), "split needs light_headers and use_pch"),
    (dict(warm_front_ends=True, split_nvcc=False), "warm_front_ends needs"),
    (dict(warm_front_ends=True, light_headers=False), "warm_front_ends needs"),
    (dict(max_jobs=0), "max_jobs must be at least 1"),
    (dict(batch_members=-1), "batch_members must be >= 0"),
    (dict(max_log_bytes=10), "max_log_bytes"),
    (dict(cache_max_bytes=-1), "cache_max_bytes"),
])
def test_contradictory_or_invalid_settings_are_refused_with_the_reason(fields, says):
  with pytest.raises(ValueError, match=says):
    options_lib.CompilerOptions(**fields)


def test_layers_idle_without_their_base_are_accepted():
  # On by default, so light_headers=False alone must stay valid: they simply have nothing to do.
  options = options_lib.CompilerOptions(light_headers=False)
  assert options.main_tiers and not options.batching
  assert not options_lib.CompilerOptions(batch_members=1).batching
  assert options_lib.CompilerOptions().batching


def test_a_server_config_with_a_contradiction_fails_where_it_is_made():
  with pytest.raises(ValueError, match="split needs light_headers"):
    config_lib.ServerConfig(compile_split=True, light_headers=False)


def test_server_config_maps_to_the_compilers_options(tmp_path):
  config = config_lib.ServerConfig(cache_dir=tmp_path, compile_workers=3, batch_members=4,
                                   compile_split=True, max_log_bytes=4096)
  options = config.compiler_options(gpus=True)
  assert (options.max_jobs, options.batch_members, options.split, options.max_log_bytes) == (
      3, 4, True, 4096)
  assert options.limits == config.compile_limits and options.confine == config.compile_confine
  # Warm front ends only serve a GPU box's latency, never a CPU-test one, and need header tiers.
  assert options.warm_front_ends
  assert not config.compiler_options(gpus=False).warm_front_ends
  assert not config_lib.ServerConfig(cpu_test_mode=True).compiler_options(gpus=True).warm_front_ends
  assert not config_lib.ServerConfig(light_headers=False).compiler_options(gpus=True).warm_front_ends
