"""The comparison rules (trusted/compare.py), the problem helpers both sides share
(run/problem.py) and the statistics of run/timing.py, directly on CPU."""

from __future__ import annotations

import math
import time

import pytest
import torch

from verifier_service.run import problem
from verifier_service.run import timing
from verifier_service.trusted import compare


def _cmp(ref, cand, tol=1e-4):
  return compare.compare(ref, cand, tol, tol)


def test_tolerance_follows_allclose():
  ref = torch.tensor([1.0, 2.0, 1000.0])
  ok, max_abs, max_rel, _, _ = _cmp(ref, ref + torch.tensor([5e-5, 0.0, 0.09]))
  assert ok and max_abs == pytest.approx(0.09, rel=1e-3) and max_rel == pytest.approx(9e-5, rel=1e-2)
  ok, _, _, message, _ = _cmp(ref, ref + torch.tensor([3e-4, 0.0, 0.0]))
  assert not ok and "1 of 3 elements exceed" in message


def test_nan_and_inf_must_match_the_reference():
  ref = torch.tensor([1.0, float("nan"), float("inf")])
  assert _cmp(ref, ref.clone())[0]
  ok, _, _, message, _ = _cmp(torch.ones(3), torch.tensor([1.0, float("nan"), 1.0]))
  assert not ok and "NaN in output 0 at 1 positions" in message
  ok, _, _, message, _ = _cmp(ref, torch.tensor([1.0, float("nan"), -math.inf]))
  assert not ok and "Inf" in message


def test_chunked_comparison_gives_the_whole_tensors_answer(monkeypatch):
  """compare.CHUNK bounds the judge's temporaries; the answer must not depend on it. Each case is
  compared in one piece and in chunks of 7 elements, with its NaNs, Infs and out-of-tolerance
  elements spread over several chunks."""
  gen = torch.Generator().manual_seed(0)
  ref = torch.randn(5, 11, generator=gen)
  ref[0, 3] = ref[4, 10] = float("nan")
  ref[2, 2] = math.inf
  close = ref + 1e-6
  off = close.clone()
  off[1, 1] += 1.0
  off[3, 9] -= 0.25
  nan_extra = close.clone()
  nan_extra[2, 5] = nan_extra[4, 1] = float("nan")
  nan_missing = close.clone()
  nan_missing[4, 10] = 0.0
  inf_wrong = close.clone()
  inf_wrong[2, 2] = -math.inf
  ints = torch.arange(55).reshape(5, 11)
  ints_off = ints.clone()
  ints_off[0, 1], ints_off[4, 9] = 4, 99
  bools = ref.nan_to_num() > 0
  cases = [(ref, close), (ref, off), (ref, nan_extra), (ref, nan_missing), (ref, inf_wrong),
           (ints, ints), (ints, ints_off), (bools, bools), (bools, ~bools),
           (ref.double(), off.double()), (torch.empty(0, 3), torch.empty(0, 3))]
  whole = [_cmp(r, c) for r, c in cases]
  monkeypatch.setattr(compare, "CHUNK", 7)
  chunked = [_cmp(r, c) for r, c in cases]
  assert chunked == whole
  assert [w[0] for w in whole] == [True, False, False, False, False, True, False, True, False,
                                   False, True]
  assert "2 of 52 elements exceed" in whole[1][3] and whole[1][1] == pytest.approx(1.0, rel=1e-4)
  assert "NaN in output 0 at 2 positions" in whole[2][3]
  assert "finite where the reference is NaN" in whole[3][3]
  assert whole[6][1] == 46.0  # ints: the largest difference (99 - 53), in the last chunk


def _per_condition(ref, cand, atol, rtol):
  """compare.py's float rules as written before its one-read-back chunks (a condition at a time,
  finite elements picked out by boolean indexing): the oracle the current code must agree with."""
  compute = torch.float64 if ref.dtype == torch.float64 else torch.float32
  tiny = torch.finfo(compute).tiny
  extra_nan = missing_nan = bad = finite = 0
  inf_differs = False
  max_abs = max_rel = 0.0
  for start in range(0, ref.numel(), compare.CHUNK):
    r = ref.reshape(-1)[start:start + compare.CHUNK].to(compute)
    c = cand.reshape(-1)[start:start + compare.CHUNK].to(compute)
    r_nan, c_nan = torch.isnan(r), torch.isnan(c)
    if not torch.equal(r_nan, c_nan):
      extra_nan += int((c_nan & ~r_nan).sum())
      missing_nan += int((r_nan & ~c_nan).sum())
      continue
    r_inf, c_inf = torch.isinf(r), torch.isinf(c)
    if not torch.equal(r_inf, c_inf) or not torch.equal(r[r_inf], c[c_inf]):
      inf_differs = True
      continue
    keep = ~(r_nan | r_inf)
    r, c = r[keep], c[keep]
    if not r.numel():
      continue
    abs_diff = (c - r).abs()
    max_abs = max(max_abs, float(abs_diff.max()))
    max_rel = max(max_rel, float((abs_diff / r.abs().clamp_min(tiny)).max()))
    bad += int((abs_diff > atol + rtol * r.abs()).sum())
    finite += r.numel()
  if extra_nan or missing_nan:
    return ("nan", extra_nan, missing_nan)
  if inf_differs:
    return ("inf",)
  return ("values", bad, finite, max_abs, max_rel)


def _summary(ref, cand, atol, rtol):
  """The current rules' answer in _per_condition's terms."""
  ok, max_abs, max_rel, message, _ = compare.compare(ref, cand, atol, rtol)
  if "NaN" in message:
    counts = [int(n) for n in message.split() if n.isdigit()]
    return ("nan",) + ((counts[-1], 0) if "positions" in message else (0, None))
  if "Inf" in message:
    return ("inf",)
  bad, finite = (0, None) if ok else [int(n) for n in message.split() if n.isdigit()][-2:]
  return ("values", bad, finite, max_abs, max_rel)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("chunk", [7, 64, 1 << 24])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_one_read_back_per_chunk_agrees_with_the_rules_a_condition_at_a_time(
    monkeypatch, dtype, chunk, device):
  """Random outputs near the reference, with NaN and Inf (both signs) put in either or both at
  random places: the verdict, counts and largest errors agree with _per_condition's exactly, on
  the CPU and (device machine) on CUDA tensors, as the judge compares them."""
  monkeypatch.setattr(compare, "CHUNK", chunk)
  gen = torch.Generator().manual_seed(chunk)
  for case in range(40):
    ref = torch.randn(200, generator=gen).to(dtype)
    cand = (ref.double() + 1e-3 * torch.randn(200, generator=gen, dtype=torch.float64)).to(dtype)
    for tensor, share in ((ref, 0.02 * (case % 3)), (cand, 0.02 * (case % 4))):
      for value in (float("nan"), math.inf, -math.inf):
        tensor[torch.rand(200, generator=gen) < share / 3] = value
    if case % 5 == 0:  # the same non-finite values on both sides
      cand[~torch.isfinite(ref)] = ref[~torch.isfinite(ref)]
      stray = ~torch.isfinite(cand) & torch.isfinite(ref)
      cand[stray] = ref[stray]
    atol = rtol = (1e-4, 1e-3, 1e-2)[case % 3]
    ref, cand = ref.to(device), cand.to(device)
    expected, got = _per_condition(ref, cand, atol, rtol), _summary(ref, cand, atol, rtol)
    if expected[0] == "nan":
      assert got[0] == "nan" and (got[1] == expected[1] if expected[1] else True), (expected, got)
      continue
    if expected[0] == "values" and not expected[1]:
      expected = expected[:2] + (None,) + expected[3:]  # an OK verdict names no counts
    assert got == expected, (case, expected, got)


def test_structure_shape_dtype_and_subclass():
  a = torch.ones(2, 3)
  assert "has 1 leaves, the reference has 2" in _cmp((a, a), a)[3]
  assert "shape (3, 2) != reference (2, 3)" in _cmp(a, a.t().contiguous())[3]
  assert "dtype torch.float64 != reference torch.float32" in _cmp(a, a.double())[3]

  class Lazy(torch.Tensor):
    pass

  ok, _, _, message, exploits = _cmp(a, a.clone().as_subclass(Lazy))
  assert not ok and "subclass" in message and exploits[0][0] == "TENSOR_SUBCLASS"
  assert "expected a tensor" in _cmp(a, 3.0)[3]


def test_integer_outputs_must_be_equal_and_scalars_compare():
  idx = torch.tensor([1, 2, 3])
  assert _cmp(idx, idx.clone())[0]
  assert not _cmp(idx, idx + torch.tensor([0, 0, 1]))[0]
  assert _cmp([idx, 2.0, "tag"], [idx.clone(), 2.0 + 1e-6, "tag"])[0]
  assert not _cmp([idx, 2.0], [idx.clone(), 2.1])[0]


def test_integer_inputs_are_never_cast():
  inputs = [torch.randn(2, 2), torch.tensor([0, 1]), {"mask": torch.ones(2, dtype=torch.bool)}, 7]
  moved = problem.to_device(inputs, torch.device("cpu"), torch.float16)
  assert moved[0].dtype == torch.float16
  assert moved[1].dtype == torch.int64
  assert moved[2]["mask"].dtype == torch.bool
  assert moved[3] == 7


def test_state_is_copied_where_names_and_shapes_match():
  torch.manual_seed(0)
  ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
  cand = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 3))
  copied = problem.copy_matching_state(ref, cand)
  assert copied == 3  # 0.weight, 0.bias, 1.bias; 1.weight has another shape
  assert torch.equal(cand[0].weight, ref[0].weight)
  assert torch.equal(cand[1].bias, ref[1].bias)
  assert cand[1].weight.shape == (3, 3)


def test_trial_seeds_are_fresh_and_reproducible():
  seeds = problem.trial_seeds(42, 5)
  assert len(set(seeds)) == 5 and seeds == problem.trial_seeds(42, 5)
  assert seeds != problem.trial_seeds(43, 5)


def test_timing_stats():
  stats = timing.stats([5.0, 1.0, 3.0, 2.0, 4.0])
  assert stats["median_us"] == 3.0 and stats["min_us"] == 1.0 and stats["max_us"] == 5.0
  assert stats["num_trials"] == 5 and stats["p10_us"] == 1.0 and stats["p90_us"] == 5.0


def test_cpu_timer_times_the_call_and_snapshots_after_it():
  timer = timing.Timer(torch.device("cpu"))
  seen = []
  elapsed, out = timer(lambda: time.sleep(0.01) or torch.ones(3), True, seen.append)
  assert 9_000 < elapsed < 1_000_000 and torch.equal(out, torch.ones(3))
  assert len(seen) == 1 and seen[0] is out


def test_inputs_are_the_same_in_every_process_for_a_seed():
  get_inputs = lambda: [torch.randn(4, 5), torch.randint(0, 9, (3,))]
  a = problem.inputs(get_inputs, 7, torch.device("cpu"), torch.float16)
  b = problem.inputs(get_inputs, 7, torch.device("cpu"), torch.float16)
  c = problem.inputs(get_inputs, 8, torch.device("cpu"), torch.float16)
  assert a[0].dtype == torch.float16 and a[1].dtype == torch.int64
  assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])


def test_roll_moves_values_and_keeps_them():
  x = torch.arange(6.0).reshape(2, 3)
  rolled = problem.roll([x, torch.tensor([5.0]), 3], 2)
  assert sorted(rolled[0].flatten().tolist()) == sorted(x.flatten().tolist())
  assert not torch.equal(rolled[0], x) and rolled[1].item() == 5.0 and rolled[2] == 3
