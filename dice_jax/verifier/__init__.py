"""The trainer's side of the verifier: the gRPC client and everything around reaching a verifier.

  defaults.py     the client's timeouts and in-flight window per use (training, evaluation), why
  channels.py     ClientConfig (how to reach targets: TLS, token, timeouts) and the gRPC channels
  client.py       AsyncVerifierClient: streams to a farm, retries, deadlines, a verdict cache
  sync_client.py  VerifierClient: the same for ordinary code (futures), as the training loop uses
  options.py      VerifyOptions from user-facing names (precision, trials, tolerances, policy)
  local.py        `--verifier local`: a real `dice-verifier serve` child process on loopback
  connect.py      a spec ("local" or HOST:PORT,...) -> a preflighted Connection, or one clear error

Nothing here imports JAX, torch or verifier_service: the wire contract (dice.verifier.v1) is the
only thing the two sides share (ARCHITECTURE.md, "The verifier's trust boundary").
"""
