"""Verifier client logic against fault-injecting loopback servers: retries, spreading, cache, deaths."""

import asyncio
import shutil
import subprocess
import time

import grpc
import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.verifier.client import AsyncVerifierClient, ClientConfig, VerifyItem, cache_key
from dice_jax.verifier.sync_client import VerifierClient
from verifier_fakes import FakeVerifier, free_port, run

REF = "class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"
FAST = dict(connect_timeout_s=0.5, backoff_initial_s=0.05, backoff_max_s=0.2, request_timeout_s=5.0)


def items(n, tag="c"):
  return [VerifyItem(REF, f"class ModelNew: pass  # {tag}{i}") for i in range(n)]


async def with_servers(fakes, body, **config):
  targets = [await f.start() if isinstance(f, FakeVerifier) else f for f in fakes]
  client = AsyncVerifierClient(ClientConfig(targets=tuple(targets), **(FAST | config)))
  try:
    return await body(client)
  finally:
    await client.close()
    for f in fakes:
      if isinstance(f, FakeVerifier):
        await f.stop()


def test_verdicts_come_back_in_item_order_with_unique_ids():
  fake = FakeVerifier("a")
  async def body(client):
    batch = items(20) + [VerifyItem(REF, "INCORRECT kernel")]
    return await client.verify(batch)
  verdicts = run(with_servers([fake], body))
  assert [v.outcome for v in verdicts] == [pb.OK] * 20 + [pb.INCORRECT]
  assert len({v.request_id for v in verdicts}) == 21 == len(fake.seen)
  assert all(n == 1 for n in fake.seen.values())


def test_requests_go_out_round_robin_over_problems_and_verdicts_return_in_item_order():
  """An RL step lists its completions problem by problem; the server gets one of each problem in
  turn (its compiler batches one member per problem), and the caller its verdicts in item order."""
  fake = FakeVerifier("a")
  refs = [REF + f"# problem {p}\n" for p in range(3)]
  batch = [VerifyItem(ref, f"class ModelNew: pass  # {p}.{s}" + (" INCORRECT" if p == 1 else ""))
           for p, ref in enumerate(refs) for s in range(3 - p)]  # groups of 3, 2 and 1
  verdicts = run(with_servers([fake], lambda c: c.verify(batch), max_in_flight_per_stream=1))
  assert [v.outcome for v in verdicts] == [pb.OK] * 3 + [pb.INCORRECT] * 2 + [pb.OK]
  sent = {v.request_id: item.candidate_source.split("# ")[1] for v, item in zip(verdicts, batch)}
  assert [sent[rid].split()[0] for rid in fake.seen] == ["0.0", "1.0", "2.0", "0.1", "1.1", "0.2"]


def test_cache_and_deduplication_keep_repeats_off_the_wire():
  fake = FakeVerifier("a")
  async def body(client):
    first = await client.verify(items(5) + items(5))      # duplicates inside one batch
    second = await client.verify(items(5))                 # repeats of an earlier batch
    concurrent = await asyncio.gather(client.verify(items(3, "x")), client.verify(items(3, "x")))
    other_options = await client.verify([VerifyItem(REF, "class ModelNew: pass  # c0",
                                                     pb.VerifyOptions(num_correctness_trials=9))])
    return first, second, concurrent, other_options, client.stats_snapshot()
  first, second, concurrent, other_options, stats = run(with_servers([fake], body))
  assert len(fake.seen) == 5 + 3 + 1  # options are part of the key
  ids = [v.request_id for v in first]
  assert ids[:5] == ids[5:] == [v.request_id for v in second]
  assert [v.request_id for v in concurrent[0]] == [v.request_id for v in concurrent[1]]
  assert stats["cache_hits"] == 5 and stats["deduplicated"] == 5 + 3 and stats["sent"] == 9
  assert other_options[0].outcome == pb.OK


def test_cache_key_covers_reference_candidate_and_options():
  base = cache_key(VerifyItem("r", "c"), pb.VerifyOptions())
  assert base == cache_key(VerifyItem("r", "c"), pb.VerifyOptions())
  assert base != cache_key(VerifyItem("rc", ""), pb.VerifyOptions())   # length-prefixed parts
  assert base != cache_key(VerifyItem("r", "c"), pb.VerifyOptions(precision=pb.FP16))


def test_infra_errors_are_retried_with_the_same_id():
  fake = FakeVerifier("a", infra_first=2)
  verdicts = run(with_servers([fake], lambda c: c.verify(items(4)), max_attempts=3))
  assert [v.outcome for v in verdicts] == [pb.OK] * 4
  assert all(n == 3 for n in fake.seen.values())  # same ids re-sent
  assert [v.attempts for v in verdicts] == [3] * 4


def test_infra_errors_past_the_limit_are_returned_and_not_cached():
  fake = FakeVerifier("a", infra_first=100)
  async def body(client):
    return await client.verify(items(2)), await client.verify(items(2))
  first, second = run(with_servers([fake], body, max_attempts=2))
  for v in first + second:
    assert v.outcome == pb.INFRA_ERROR and v.message.startswith("after 2 attempt(s): verifier INFRA_ERROR")
  # Not cached: the second call asked again (a new request, so a new id), 2 sends each.
  assert len(fake.seen) == 4 and all(n == 2 for n in fake.seen.values())


def test_load_spreads_over_targets():
  fakes = [FakeVerifier("a", delay_s=0.05), FakeVerifier("b", delay_s=0.05)]
  verdicts = run(with_servers(fakes, lambda c: c.verify(items(40)), max_in_flight_per_stream=4))
  answered_by = {v.message for v in verdicts}
  assert answered_by == {"a", "b"}
  assert 10 <= len(fakes[0].seen) <= 30 and len(fakes[0].seen) + len(fakes[1].seen) == 40


def test_survives_a_target_dying_mid_batch():
  fakes = [FakeVerifier("dies", die_after=5, delay_s=0.05), FakeVerifier("lives", delay_s=0.01)]
  verdicts = run(with_servers(fakes, lambda c: c.verify(items(30)), max_in_flight_per_stream=8))
  assert [v.outcome for v in verdicts] == [pb.OK] * 30
  assert {v.message for v in verdicts} == {"lives"}
  assert sum(fakes[0].seen.values()) >= 5


def test_unreachable_target_in_the_list_is_skipped():
  dead = f"127.0.0.1:{free_port()}"
  fake = FakeVerifier("a")
  start = time.monotonic()
  verdicts = run(with_servers([dead, fake], lambda c: c.verify(items(10))))
  assert [v.outcome for v in verdicts] == [pb.OK] * 10
  assert time.monotonic() - start < 5


def test_all_targets_unreachable_gives_infra_errors_in_bounded_time():
  dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
  start = time.monotonic()
  verdicts = run(with_servers(dead, lambda c: c.verify(items(3)), max_attempts=2))
  assert time.monotonic() - start < 10
  for v in verdicts:
    assert v.outcome == pb.INFRA_ERROR and "no verifier reachable" in v.message and "127.0.0.1" in v.message


def test_request_deadline_moves_work_off_a_stalled_server():
  fakes = [FakeVerifier("stalled", delay_s=30), FakeVerifier("fast")]
  async def body(client):
    return await client.verify(items(6))
  verdicts = run(with_servers(fakes, body, request_timeout_s=0.5, max_in_flight_per_stream=2))
  assert {v.message for v in verdicts} == {"fast"} and all(v.outcome == pb.OK for v in verdicts)

  alone = [FakeVerifier("stalled", delay_s=30)]
  verdicts = run(with_servers(alone, body, request_timeout_s=0.3, max_attempts=2))
  assert all(v.outcome == pb.INFRA_ERROR and "no verdict within 0.3s" in v.message for v in verdicts)


def test_bearer_token_is_sent_and_a_wrong_one_fails_clearly(tmp_path):
  token_file = tmp_path / "token"
  token_file.write_text("s3cret\n")
  fake = FakeVerifier("a", require_token="s3cret")
  verdicts = run(with_servers([fake], lambda c: c.verify(items(2)), auth_token_file=str(token_file)))
  assert all(v.outcome == pb.OK for v in verdicts)
  assert fake.metadata[0]["authorization"] == "Bearer s3cret"

  wrong = FakeVerifier("a", require_token="other")
  verdicts = run(with_servers([wrong], lambda c: c.verify(items(2)), auth_token_file=str(token_file)))
  assert all(v.outcome == pb.INFRA_ERROR and "UNAUTHENTICATED" in v.message for v in verdicts), verdicts


def test_unsendable_items_get_local_verdicts():
  fake = FakeVerifier("a")
  batch = [VerifyItem(REF, "x = '\udcff'"), VerifyItem("", "class ModelNew: pass"), VerifyItem(REF, "  ")]
  verdicts = run(with_servers([fake], lambda c: c.verify(batch)))
  assert [v.outcome for v in verdicts] == [pb.REJECTED, pb.BAD_REFERENCE, pb.REJECTED]
  assert "not valid UTF-8" in verdicts[0].message and "is empty" in verdicts[1].message
  assert not fake.seen
  with pytest.raises(TypeError, match="candidate_source must be str"):
    run(with_servers([fake], lambda c: c.verify([VerifyItem(REF, b"bytes")])))


def test_dns_round_robin_target():
  fake = FakeVerifier("a")
  async def body(client):
    return await client.verify(items(3))
  async def main():
    address = await fake.start()
    client = AsyncVerifierClient(ClientConfig(targets=(f"dns:///localhost:{fake.port}",), **FAST))
    try:
      return await body(client)
    finally:
      await client.close()
      await fake.stop()
  assert [v.outcome for v in run(main())] == [pb.OK] * 3


@pytest.mark.parametrize("kwargs,message", [
    ({"targets": ()}, "targets must list"),
    ({"max_attempts": 0}, "max_attempts must be >= 1"),
    ({"backoff_initial_s": 5.0, "backoff_max_s": 1.0}, "backoff_initial_s"),
    ({"tls_client_cert_file": "c.pem"}, "must be given together"),
])
def test_bad_config(kwargs, message):
  with pytest.raises(ValueError, match=message):
    ClientConfig(**kwargs)


def test_sync_facade_from_plain_threads_and_futures():
  fake = FakeVerifier("a", delay_s=0.02)
  address = run(fake.start())
  try:
    with VerifierClient(ClientConfig(targets=(address,), **FAST)) as client:
      future = client.submit(items(5))          # returns at once: the trainer overlaps rollouts
      assert [v.outcome for v in client.verify_batch(items(3, "y"))] == [pb.OK] * 3
      assert [v.outcome for v in future.result(timeout=10)] == [pb.OK] * 5
      assert client.info()[address].server_version == "a"
      assert client.stats()["sent"] == 8
    with pytest.raises(RuntimeError, match="closed"):
      client.submit(items(1))
    with pytest.raises(ValueError, match="cannot read auth token file"):
      VerifierClient(ClientConfig(targets=(address,), auth_token_file="/nonexistent/token"))
  finally:
    run(fake.stop())


def test_tls_with_a_self_signed_certificate(tmp_path):
  if shutil.which("openssl") is None:
    pytest.skip("the openssl command is needed to make a test certificate")
  key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
  subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                  "-out", str(cert), "-days", "1", "-subj", "/CN=verifier.test",
                  "-addext", "subjectAltName=DNS:verifier.test"], check=True, capture_output=True)
  credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
  fake = FakeVerifier("tls")
  async def main():
    address = await fake.start(credentials)
    config = ClientConfig(targets=(address,), tls=True, tls_root_certs_file=str(cert),
                          tls_server_name="verifier.test", **FAST)
    client = AsyncVerifierClient(config)
    plain = AsyncVerifierClient(ClientConfig(targets=(address,), max_attempts=1, **FAST))
    try:
      return await client.verify(items(2)), await plain.verify(items(1, "p"))
    finally:
      await client.close()
      await plain.close()
      await fake.stop()
  secure, plaintext = run(main())
  assert [v.outcome for v in secure] == [pb.OK] * 2
  assert plaintext[0].outcome == pb.INFRA_ERROR  # a plaintext client cannot talk to a TLS server


def _problems(n):
  return [f"class Model: pass\ndef get_inputs(): return [{p}]\ndef get_init_inputs(): return []\n"
          for p in range(n)]


def _group_items(references, samples, tag="g"):
  return [VerifyItem(ref, f"class ModelNew: pass  # {tag}{p}-{s}")
          for p, ref in enumerate(references) for s in range(samples)]


def _served_by(fakes, verdicts, batch):
  """problem (reference) -> the set of servers that answered its requests."""
  out = {}
  for item, verdict in zip(batch, verdicts):
    out.setdefault(item.reference_source, set()).add(verdict.message)
  return out


def test_a_problems_group_goes_to_its_home_target_and_problems_spread():
  """Every request of one problem reaches the same server (rendezvous hashing of its reference:
  the box that holds its caches), the same one for every client; different problems use both."""
  fakes = [FakeVerifier("a"), FakeVerifier("b")]
  references = _problems(12)
  batch = _group_items(references, 4)

  async def body(client):
    first = await client.verify(batch)
    other = AsyncVerifierClient(client.config)  # another trainer host
    try:
      return first, await other.verify(_group_items(references, 2, tag="h"))
    finally:
      await other.close()

  first, second = run(with_servers(fakes, body))
  homes = _served_by(fakes, first, batch)
  assert all(len(servers) == 1 for servers in homes.values()), homes
  assert {s for servers in homes.values() for s in servers} == {"a", "b"}
  assert _served_by(fakes, second, _group_items(references, 2, tag="h")) == homes


def test_a_full_home_spills_to_the_target_with_room():
  """One problem's 24 requests, its home answering slowly with room for 2 at a time: the other
  target's lane, idle, takes what waits (counted as spilled), and every request is answered."""
  fakes = [FakeVerifier("a", delay_s=0.2), FakeVerifier("b", delay_s=0.2)]
  batch = _group_items(_problems(1), 24)

  async def body(client):
    return await client.verify(batch), client.stats_snapshot()

  verdicts, stats = run(with_servers(fakes, body, max_in_flight_per_stream=2))
  assert [v.outcome for v in verdicts] == [pb.OK] * 24
  assert {v.message for v in verdicts} == {"a", "b"} and stats["spilled"] > 0


def test_a_problem_whose_home_is_down_is_verified_elsewhere_at_once():
  dead = f"127.0.0.1:{free_port()}"
  fake = FakeVerifier("alive")
  references = _problems(8)  # some of them have the dead address as their home
  start = time.monotonic()

  async def body(client):
    return await client.verify(_group_items(references, 3))

  verdicts = run(with_servers([dead, fake], body))
  assert [v.outcome for v in verdicts] == [pb.OK] * 24 and {v.message for v in verdicts} == {"alive"}
  assert time.monotonic() - start < 5
