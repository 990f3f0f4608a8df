"""The compile cache folder: sizes, LRU pruning and its bound, the in-use lock, `dice-verifier
cache`, precompiled headers built on demand, and the progress `dice-verifier check` shows."""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from verifier_service import cli
from verifier_service.compile import cache as compile_cache
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import objects as objects_lib
from verifier_service.compile import pch as pch_lib
from verifier_service.compile import procs as compile_procs

import verifier_kernels as kernels

_DAY = 24 * 3600


def _entry(path: pathlib.Path, size: int, age_s: float) -> pathlib.Path:
  """A cache entry of `size` bytes last used `age_s` ago (a folder, or a .json record)."""
  if path.suffix == ".json":
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
  else:
    path.mkdir(parents=True)
    (path / "blob").write_bytes(b"x" * size)
  stamp = time.time() - age_s
  os.utime(path, (stamp, stamp))
  return path


def _fake_cache(root: pathlib.Path) -> dict[str, pathlib.Path]:
  return {
      "pch": _entry(root / "pch" / "p1", 4000, 3 * _DAY),
      "obj_old": _entry(root / "obj" / "aa" / "o1", 1000, 2 * _DAY),
      "record": _entry(root / "builds" / "r1.json", 100, 1.5 * _DAY),
      "so": _entry(root / "so" / "bb" / "s1", 2000, 1 * _DAY),
      "obj_new": _entry(root / "obj" / "aa" / "o2", 1000, 60),  # used a minute ago
      "scratch": _entry(root / "tmp" / "tu-dead", 500, 2 * _DAY),
  }


def test_sizes_parse_and_print():
  assert compile_cache.parse_size("10G") == 10 << 30
  assert compile_cache.parse_size("500m") == 500 << 20
  assert compile_cache.parse_size("1.5GiB") == int(1.5 * (1 << 30))
  assert compile_cache.parse_size("4096") == 4096
  with pytest.raises(Exception, match="expected a size"):
    compile_cache.parse_size("ten gigs")
  assert compile_cache.format_size(3 << 30) == "3.0 GiB"


def test_usage_counts_every_part(tmp_path):
  _fake_cache(tmp_path)
  (tmp_path / "verdicts.sqlite").write_bytes(b"v" * 300)
  parts = compile_cache.usage(tmp_path)
  assert parts["pch"] == (4000, 1) and parts["obj"] == (2000, 2) and parts["so"] == (2000, 1)
  assert parts["builds"] == (100, 1) and parts["headers"] == (0, 0)
  assert parts["verdicts"] == (300, 1) and parts["tmp"] == (500, 1)


def test_prune_removes_least_recently_used_first(tmp_path):
  paths = _fake_cache(tmp_path)
  # 8,100 bytes of entries; keep 3,500: the pch (oldest) goes, then obj_old; the rest fits.
  removed, freed, left = compile_cache.prune(tmp_path, 3500, min_age_s=600)
  assert (removed, freed, left) == (2, 5000, 3100)
  assert not paths["pch"].exists() and not paths["obj_old"].exists()
  assert paths["record"].exists() and paths["so"].exists() and paths["obj_new"].exists()
  assert not paths["scratch"].exists()  # scratch older than a day is always cleared


def test_prune_spares_fresh_and_protected_entries(tmp_path):
  paths = _fake_cache(tmp_path)
  removed, _, left = compile_cache.prune(tmp_path, 0, min_age_s=600, protect={paths["so"]})
  assert removed == 3 and left == 3000
  assert paths["so"].exists() and paths["obj_new"].exists()
  assert compile_cache.prune(tmp_path, 0, min_age_s=0) == (2, 3000, 0)
  assert compile_cache.prune(tmp_path, 0, above=10) == (0, 0, 0)


def test_bound_prunes_in_the_background_past_its_limit(tmp_path):
  paths = _fake_cache(tmp_path)

  async def go():
    bound = compile_cache.Bound(tmp_path, 5000, protect=lambda: {paths["pch"]})
    bound.added(paths["obj_new"])  # first call: measures the folder (8,100 > 5,000) and prunes
    await bound.close()
    return bound
  bound = asyncio.run(go())
  # Down to 90% of the bound, least recently used first, the protected pch kept.
  assert paths["pch"].exists() and paths["obj_new"].exists()
  assert not paths["obj_old"].exists() and not paths["record"].exists()
  assert not paths["so"].exists() and bound.pruned_entries == 3
  unbounded = compile_cache.Bound(tmp_path, 0, protect=set)
  unbounded.added(paths["pch"])  # 0: no bound, never prunes (and needs no event loop)


def test_cache_command_reports_and_prunes_unless_in_use(tmp_path, capsys):
  paths = _fake_cache(tmp_path)
  assert cli.main(["cache", "info", "--cache-dir", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert str(tmp_path) in out and re.search(r"pch\s+3\.9 KiB\s+1 entries", out), out
  held = compile_cache.hold_shared(tmp_path)  # what every running Compiler holds
  try:
    assert cli.main(["cache", "prune", "--cache-dir", str(tmp_path)]) == 2
    assert "in use by a running verifier" in capsys.readouterr().out
    assert paths["pch"].exists()
  finally:
    held.close()
  assert cli.main(["cache", "prune", "--keep", "3K", "--cache-dir", str(tmp_path)]) == 0
  assert "removed 3 entries" in capsys.readouterr().out
  assert not paths["pch"].exists() and paths["obj_new"].exists()
  assert cli.main(["cache", "info", "--cache-dir", str(tmp_path / "none")]) == 0
  assert "no cache yet" in capsys.readouterr().out


def test_precompiled_headers_build_once_report_and_rebuild_when_pruned(toolchain, tmp_path):
  events = []

  async def go():
    runner = compile_procs.ProcessRunner(2, toolchain.build_env())
    (tmp_path / "tmp").mkdir()
    headers = pch_lib.PrecompiledHeaders(tmp_path / "pch", tmp_path / "tmp",
                                         toolchain.fingerprint, runner,
                                         lambda stage, text: events.append((stage, text)))
    cxx, flags = (toolchain.cxx,), ("-DTORCH_EXTENSION_NAME=a", "-std=c++17")
    first, again = await asyncio.gather(*(
        headers.ensure(cxx, flags, "#include <vector>\n", "probe.h", "a probe") for _ in "ab"))
    other_name = await headers.ensure(cxx, ("-DTORCH_EXTENSION_NAME=b", "-std=c++17"),
                                      "#include <vector>\n", "probe.h", "a probe")
    os.unlink(first.path + ".gch")  # pruned behind our back: rebuilt on the next use
    rebuilt = await headers.ensure(cxx, flags, "#include <vector>\n", "probe.h", "a probe")
    broken = await headers.ensure(cxx, flags, "#include <no_such_header.h>\n", "bad.h", "bad")
    await headers.close()
    return first, again, other_name, rebuilt, broken
  first, again, other_name, rebuilt, broken = asyncio.run(go())
  assert first.precompiled and first == again == other_name == rebuilt  # name define ignored
  assert pathlib.Path(first.path + ".gch").is_file()
  assert [stage for stage, _ in events] == ["pch"] * 6  # start and end of three builds
  assert "precompiling a probe" in events[0][1] and "precompiled a probe" in events[1][1]
  assert not broken.precompiled and "no_such_header.h" in broken.error
  assert pathlib.Path(broken.path).is_file()  # still includable: g++ then parses the text


def test_cache_hits_mark_entries_used(toolchain, cache_dir):
  ext = kernels.BROKEN_CUDA

  async def build():
    from verifier_service.compile import checks  # pylint: disable=import-outside-toplevel
    compiler = compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(max_jobs=2))
    try:
      return await compiler.build(checks.check_candidate(ext).extensions[0], 900)
    finally:
      await compiler.close()
  first = asyncio.run(build())
  record = cache_dir / "builds" / f"{first.cache_key}.json"
  os.utime(record, (1, 1))
  again = asyncio.run(build())
  assert again.cache_hit and record.stat().st_mtime > time.time() - 600


def test_check_says_what_it_is_doing(tmp_path, cache_dir):
  (tmp_path / "ref.py").write_text(kernels.REFERENCE)
  fresh = kernels.cuda_candidate(kernels.CUDA_SOURCE + "\n// progress test\n", name="progress_ext")
  (tmp_path / "cand.py").write_text(fresh)
  proc = subprocess.run([sys.executable, "-m", "verifier_service.cli", "check",
                         str(tmp_path / "ref.py"), str(tmp_path / "cand.py"), "--cache-dir",
                         str(cache_dir), "--json"], capture_output=True, text=True, timeout=900,
                        check=False)
  assert proc.returncode == cli.EXIT_NO_GPU, proc.stderr[-3000:]
  lines = [line for line in proc.stderr.splitlines() if re.match(r"^\[\s*\d+\.\d s\] ", line)]
  assert any("compiling progress_ext: main.cpp and cuda.cu" in line for line in lines), lines
  assert any("linking progress_ext" in line for line in lines), lines
  assert any(re.search(r"compiled progress_ext in \d+\.\d s", line) for line in lines), lines


def test_one_text_under_two_file_names_is_two_objects(tmp_path):
  """An object is keyed by its file's name too: the name is in what it compiles to (`__FILE__`)
  and in its log, so the same text and command under another name is not a cache hit."""
  (tmp_path / "tmp").mkdir()
  objects = objects_lib.Objects(tmp_path, "test", compile_procs.ProcessRunner(1, dict(os.environ)),
                                split_nvcc=False, host=None)
  cmd = ["g++", "-c", "{src}", "-o", "{out}"]
  text = 'const char* hostile_name() { return __FILE__; }\n'
  built = {name: asyncio.run(objects.compile(cmd, text, name, nvcc=False))[0]
           for name in ("first.cpp", "second.cpp")}
  assert len({pathlib.Path(p).parent for p in built.values()}) == 2, built
  for name, path in built.items():
    assert pathlib.Path(path).name == name + ".o", built
    assert name.encode() in pathlib.Path(path).read_bytes(), name
