"""The RL data stream: determinism, epochs, sharding, state save/restore, bi-phase batches."""

import json

import pytest

from dice_jax.data import problems as P
from dice_jax.data import rl_data as R

BACKENDS = ["grain", "numpy"]


@pytest.fixture(scope="module")
def tiny():
  return P.load_bundled()


@pytest.fixture(scope="module")
def dice_phase2(shared_dir):
  return P.load_problems(shared_dir / "data/dice/kernel_infilling_evaluation.json")[:20]


def _ids(items):
  return [item["problem_id"] for item in items]


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_order_and_each_epoch_is_a_permutation(tiny, backend):
  a = _ids(R.ProblemStream(tiny, phase=1, seed=3, backend=backend).take(3 * len(tiny)))
  b = _ids(R.ProblemStream(tiny, phase=1, seed=3, backend=backend).take(3 * len(tiny)))
  c = _ids(R.ProblemStream(tiny, phase=1, seed=4, backend=backend).take(3 * len(tiny)))
  assert a == b and a != c
  n = len(tiny)
  epochs = [a[i * n:(i + 1) * n] for i in range(3)]
  assert all(sorted(e) == sorted(p.id for p in tiny) for e in epochs)
  assert epochs[0] != epochs[1] or epochs[1] != epochs[2]  # reshuffled per epoch


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_round_trip_continues_identically(tiny, backend):
  stream = R.ProblemStream(tiny, phase=1, seed=11, backend=backend)
  stream.take(7)
  state = json.loads(json.dumps(stream.get_state()))  # what a checkpoint stores
  expected = stream.take(10)
  resumed = R.ProblemStream(tiny, phase=1, seed=11, backend=backend)
  resumed.set_state(state)
  assert resumed.take(10) == expected


def test_items_have_the_reward_columns(tiny, dice_phase2):
  item = R.ProblemStream(tiny, phase=1, seed=0).take(1)[0]
  assert tuple(item) == R.ITEM_COLUMNS
  problem = next(p for p in tiny if p.id == item["problem_id"])
  assert item["phase"] == 1 and item["level"] == 1
  assert item["prefix"] == problem.prefix and item["suffix"] == problem.suffix
  assert item["messages"][-1]["role"] == "user"
  item2 = R.ProblemStream(dice_phase2, phase=2, seed=0).take(1)[0]
  assert item2["phase"] == 2 and item2["level"] == -1 and item2["prefix"] == item2["suffix"] == ""
  columns = R.collate([item, item2])
  assert columns["phase"] == [1, 2] and set(columns) == set(R.ITEM_COLUMNS)
  grouped = R.collate([item, item2], repeat=3)  # 3 completions per prompt
  assert grouped["phase"] == [1, 1, 1, 2, 2, 2] and len(grouped["messages"]) == 6
  with pytest.raises(ValueError, match="repeat must be >= 1"):
    R.collate([item], repeat=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shards_are_disjoint_and_cover_each_epoch(dice_phase2, backend):
  shards = [R.ProblemStream(dice_phase2, phase=2, seed=5, shard_index=i, shard_count=3, backend=backend)
            for i in range(3)]
  per = [len(range(i, 20, 3)) for i in range(3)]
  ids = [_ids(s.take(n)) for s, n in zip(shards, per)]
  flat = [x for part in ids for x in part]
  assert sorted(flat) == sorted(p.id for p in dice_phase2)


def test_bi_phase_batches_and_state(tiny, dice_phase2):
  def make():
    return R.BiPhaseStream(R.ProblemStream(tiny, phase=1, seed=1),
                           R.ProblemStream(dice_phase2, phase=2, seed=2))
  stream = make()
  batch = stream.next_batch(3, 2)
  assert [i["phase"] for i in batch] == [1, 1, 1, 2, 2]
  state = json.loads(json.dumps(stream.get_state()))
  expected = [stream.next_batch(2, 0), stream.next_batch(1, 4), stream.next_batch(0, 3)]
  resumed = make()
  resumed.set_state(state)
  assert [resumed.next_batch(2, 0), resumed.next_batch(1, 4), resumed.next_batch(0, 3)] == expected


def test_bad_arguments_and_mismatched_states(tiny, dice_phase2):
  with pytest.raises(ValueError, match="phase 1 needs problems with a prefix/middle/suffix"):
    R.ProblemStream(tiny + [P.Problem(id="x", reference_source="r")], phase=1, seed=0)
  with pytest.raises(ValueError, match="no problems"):
    R.ProblemStream([], phase=2, seed=0)
  with pytest.raises(ValueError, match="seed must be"):
    R.ProblemStream(tiny, phase=2, seed=-1)
  with pytest.raises(ValueError, match="cannot be split over 7 shards"):
    R.ProblemStream(tiny, phase=2, seed=0, shard_index=0, shard_count=7)
  with pytest.raises(ValueError, match="backend must be"):
    R.ProblemStream(tiny, phase=2, seed=0, backend="tf")
  state = R.ProblemStream(tiny, phase=1, seed=1).get_state()
  with pytest.raises(ValueError, match="seed=1 but this stream has seed=2"):
    R.ProblemStream(tiny, phase=1, seed=2).set_state(state)
  with pytest.raises(ValueError, match="backend='grain' but this stream has backend='numpy'"):
    R.ProblemStream(tiny, phase=1, seed=1, backend="numpy").set_state(state)
  with pytest.raises(ValueError, match="lacks 'backend'"):
    R.ProblemStream(tiny, phase=1, seed=1).set_state({"next_index": 3})
  only1 = R.BiPhaseStream(R.ProblemStream(tiny, phase=1, seed=1), None)
  with pytest.raises(ValueError, match="no phase-2 stream"):
    only1.next_batch(1, 1)
  with pytest.raises(ValueError, match="is a phase-2 stream"):
    R.BiPhaseStream(R.ProblemStream(dice_phase2, phase=2, seed=1), None)
  both = R.BiPhaseStream(R.ProblemStream(tiny, phase=1, seed=1),
                         R.ProblemStream(dice_phase2, phase=2, seed=1))
  with pytest.raises(ValueError, match="lacks a phase-2 stream but this run does"):
    both.set_state(only1.get_state())


def test_stream_position_survives_an_orbax_checkpoint(tiny, dice_phase2, tmp_path):
  """The trainer's checkpointer stores the stream state as JSON and moves a new stream there."""
  import jax.numpy as jnp
  from dice_jax.checkpoints import Checkpointer

  def make():
    return R.BiPhaseStream(R.ProblemStream(tiny, phase=1, seed=1),
                           R.ProblemStream(dice_phase2, phase=2, seed=2))
  stream = make()
  stream.next_batch(4, 3)
  checkpointer = Checkpointer(str(tmp_path / "ckpt"), every_steps=1, async_save=False)
  assert checkpointer.save(1, {"w": jnp.zeros(2)}, data_iterator=stream)
  expected = [stream.next_batch(2, 2), stream.next_batch(0, 5)]
  resumed = make()
  checkpointer.restore({"w": jnp.zeros(2)}, data_iterator=resumed)
  checkpointer.close()
  assert [resumed.next_batch(2, 2), resumed.next_batch(0, 5)] == expected
