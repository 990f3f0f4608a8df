"""Authentication beyond loopback: mutual TLS with certificates made here by openssl, and the
refusal to listen publicly with neither a token nor mTLS."""

from __future__ import annotations

import shutil
import subprocess
import sys

import grpc
import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice.verifier.v1 import verifier_pb2_grpc

from verifier_service.service import server as server_lib

import verifier_harness
import verifier_kernels

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _openssl(*args: str, cwd) -> None:
  subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(folder, name: str) -> None:
  _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
           f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=folder)


def _signed(folder, name: str, ca: str, san: str | None = None) -> None:
  _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
           f"{name}.csr", "-subj", f"/CN={name}", cwd=folder)
  extra = []
  if san:
    (folder / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    extra = ["-extfile", f"{name}.ext"]
  _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
           "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *extra, cwd=folder)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
  folder = tmp_path_factory.mktemp("certs")
  _ca(folder, "ca")
  _ca(folder, "other-ca")
  _signed(folder, "server", "ca", "IP:127.0.0.1,DNS:localhost")
  _signed(folder, "client", "ca")
  _signed(folder, "intruder", "other-ca")
  return folder


def _stub(target: str, certs, client: str | None):
  kwargs = {"root_certificates": (certs / "ca.pem").read_bytes()}
  if client:
    kwargs.update(private_key=(certs / f"{client}.key").read_bytes(),
                  certificate_chain=(certs / f"{client}.pem").read_bytes())
  channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(**kwargs))
  return verifier_pb2_grpc.VerifierStub(channel)


def test_mutual_tls_admits_only_clients_the_ca_signed(certs, cache_dir, toolchain):
  config = verifier_harness.make_config(cache_dir, tls_cert=certs / "server.pem",
                                        tls_key=certs / "server.key",
                                        tls_client_ca=certs / "ca.pem")
  srv = verifier_harness.ServerThread(config, toolchain)
  try:
    info = _stub(srv.target, certs, "client").GetInfo(pb.GetInfoRequest(), timeout=30)
    assert info.queue_capacity == config.queue_capacity
    for client in (None, "intruder"):
      with pytest.raises(grpc.RpcError) as err:
        _stub(srv.target, certs, client).GetInfo(pb.GetInfoRequest(), timeout=10)
      assert err.value.code() == grpc.StatusCode.UNAVAILABLE, client
    with pytest.raises(grpc.RpcError):  # and plaintext is not spoken at all
      srv.stub().GetInfo(pb.GetInfoRequest(), timeout=10)
  finally:
    srv.stop()


@pytest.mark.parametrize("overrides, insecure, refused", [
    ({}, False, "without --auth-token-file or mTLS"),
    ({}, True, ""),
    ({"auth_token": "t"}, False, ""),
    ({"tls_cert": "s.pem", "tls_key": "s.key", "tls_client_ca": "ca.pem"}, False, ""),
    ({"tls_cert": "s.pem"}, False, "needs all of --tls-cert, --tls-key and --tls-client-ca"),
])
def test_public_listen_needs_authentication(tmp_path, overrides, insecure, refused):
  config = verifier_harness.make_config(tmp_path, listen="0.0.0.0:0", **overrides)
  if refused:
    with pytest.raises(ValueError, match=refused):
      server_lib.check_exposure(config, insecure)
  else:
    server_lib.check_exposure(config, insecure)


def test_check_server_speaks_mutual_tls(certs, cache_dir, toolchain, tmp_path):
  """`dice-verifier check --server` with --tls-ca/--tls-cert/--tls-key against a real mTLS server."""
  config = verifier_harness.make_config(cache_dir, tls_cert=certs / "server.pem", tls_key=certs / "server.key",
                                        tls_client_ca=certs / "ca.pem")
  srv = verifier_harness.ServerThread(config, toolchain)
  candidate = tmp_path / "nomodel.py"
  candidate.write_text("import torch\n")
  reference = tmp_path / "ref.py"
  reference.write_text(verifier_kernels.REFERENCE)

  def check(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verifier_service.cli", "check", "--server", srv.target,
                           "--connect-timeout", "5", *flags, str(reference), str(candidate)],
                          capture_output=True, text=True, timeout=120, check=False)
  try:
    done = check("--tls-ca", str(certs / "ca.pem"), "--tls-cert", str(certs / "client.pem"),
                 "--tls-key", str(certs / "client.key"))
    assert done.returncode == 1, done.stderr[-3000:]  # REJECTED: the verdict came from the server
    assert "does not define ModelNew" in done.stdout
    for flags in ((), ("--tls-ca", str(certs / "ca.pem")),  # plaintext; TLS without a client certificate
                  ("--tls-ca", str(certs / "ca.pem"), "--tls-cert", str(certs / "intruder.pem"),
                   "--tls-key", str(certs / "intruder.key"))):
      refused = check(*flags)
      assert refused.returncode == 4, (flags, refused.stderr[-3000:])
      assert f"cannot reach the verifier at {srv.target}" in refused.stderr, flags
  finally:
    srv.stop()
