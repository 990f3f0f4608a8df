"""Completions → extraction/assembly → verdicts, with format verdicts filled in locally."""

import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data import problems as P
from dice_jax.data import rl_data
from dice_jax.rewards import candidates
from dice_jax.verifier.channels import ClientConfig
from dice_jax.verifier.sync_client import VerifierClient
from verifier_fakes import FakeVerifier, run


@pytest.fixture(scope="module")
def server():
  fake = FakeVerifier("a")
  address = run(fake.start())
  yield fake, address
  run(fake.stop())


def test_submit_completions_assembles_phase1_and_skips_format_failures(server):
  fake, address = server
  relu = next(p for p in P.load_bundled() if p.id == "tiny_relu")
  items = [rl_data.make_item(relu, 1), rl_data.make_item(relu, 2)]
  columns = rl_data.collate([items[0], items[0], items[1], items[1]])  # 2 completions per prompt
  completions = [f"```python\n{relu.middle}\n```",                   # phase 1, good
                 "I don't know.",                                     # phase 1, no code
                 f"```python\n{relu.known_good}\n```",                # phase 2, whole file
                 "```python\nimport torch\n```"]                      # phase 2, no ModelNew
  with VerifierClient(ClientConfig(targets=(address,))) as client:
    verdicts = candidates.submit_completions(client, completions, **columns).result(timeout=30)
  assert [v.outcome for v in verdicts] == [pb.OK, pb.REJECTED, pb.OK, pb.REJECTED]
  assert verdicts[1].stage == pb.STAGE_PARSE and verdicts[1].message.startswith("format: ")
  assert not verdicts[1].exploits
  # Both good completions assemble to the same known-good file: one request reached the server.
  assert len(fake.seen) == 1


def test_columns_must_be_per_completion():
  with pytest.raises(ValueError, match="item columns must be repeated per completion"):
    candidates.extract_all(["a", "b"], phase=[2], prefix=[""], suffix=[""])
