"""`dice-verifier` as a user runs it: real subprocesses, real compiles (cached across tests)."""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import socket
import subprocess
import sys

import pytest

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service import cli
from verifier_service.service import server as server_lib

import verifier_harness
import verifier_kernels as kernels


def run_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "verifier_service.cli", *args],
                        capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def files(tmp_path):
  paths = {}
  for name, text in [("ref.py", kernels.REFERENCE), ("good.py", kernels.cuda_candidate()),
                     ("broken.py", kernels.BROKEN_CUDA), ("nomodel.py", "import torch\n")]:
    paths[name] = tmp_path / name
    paths[name].write_text(text)
  return paths


def test_help_explains_every_flag():
  parser = cli.build_parser()
  subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # pylint: disable=protected-access
  for name in ("serve", "check"):
    sub = subparsers.choices[name]
    for action in sub._actions:  # pylint: disable=protected-access
      assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
    text = sub.format_help()
    for flag in ("--gpus", "--slots-per-gpu", "--compile-workers", "--cpu-test-mode"):
      assert flag in text
  assert "--listen" in subparsers.choices["serve"].format_help()
  assert "--json" in subparsers.choices["check"].format_help()
  assert "Exit codes" in parser.format_help()


def test_exit_code_policy():
  verdict = lambda outcome: pb.Verdict(outcome=outcome)
  assert cli.exit_code([verdict(pb.OK)]) == 0
  assert cli.exit_code([verdict(pb.OK), verdict(pb.INCORRECT)]) == 1
  assert cli.exit_code([verdict(pb.NO_GPU)]) == 3
  assert cli.exit_code([verdict(pb.NO_GPU), verdict(pb.REJECTED)]) == 1
  assert cli.exit_code([verdict(pb.INCORRECT), verdict(pb.INFRA_ERROR)]) == 4


def test_check_one_candidate_json(files, cache_dir):
  proc = run_cli("check", str(files["ref.py"]), str(files["good.py"]), "--json",
                 "--cache-dir", str(cache_dir))
  assert proc.returncode == cli.EXIT_NO_GPU, proc.stderr[-3000:]
  verdict = json.loads(proc.stdout)
  assert verdict["outcome"] == "NO_GPU"
  assert verdict["compile"]["compiled"] is True
  assert verdict["compile"]["kernel_names"] == ["scaled_add_kernel"]


def test_check_several_candidates_prints_a_summary(files, cache_dir):
  proc = run_cli("check", str(files["ref.py"]), str(files["good.py"]), str(files["broken.py"]),
                 str(files["nomodel.py"]), "--cache-dir", str(cache_dir))
  assert proc.returncode == cli.EXIT_FAILED, proc.stderr[-3000:]
  for text in ("good.py", "NO_GPU", "COMPILE_ERROR", "REJECTED", "does not define ModelNew"):
    assert text in proc.stdout


def test_check_unreadable_inputs_are_usage_errors(files, tmp_path):
  missing = run_cli("check", str(files["ref.py"]), str(tmp_path / "nope.py"))
  assert missing.returncode == cli.EXIT_USAGE
  assert "cannot read" in missing.stderr
  latin = tmp_path / "latin1.py"
  latin.write_bytes(b"# caf\xe9\n")
  binary = run_cli("check", str(files["ref.py"]), str(latin))
  assert binary.returncode == cli.EXIT_USAGE
  assert "not UTF-8" in binary.stderr


def test_check_verifies_the_readable_candidates_when_one_file_is_bad(files, cache_dir, tmp_path):
  """A file that cannot be read or decoded gets its own row; the others are verified; the exit
  code is 2 at the end."""
  missing, latin = tmp_path / "nope.py", tmp_path / "latin1.py"
  latin.write_bytes(b"# caf\xe9\n")
  args = ("check", str(files["ref.py"]), str(files["good.py"]), str(missing), str(latin),
          "--cache-dir", str(cache_dir))
  proc = run_cli(*args, "--json")
  assert proc.returncode == cli.EXIT_USAGE, proc.stderr[-3000:]
  good, nope, undecodable = json.loads(proc.stdout)
  assert (good["candidate"], good["outcome"]) == (str(files["good.py"]), "NO_GPU")
  assert nope == {"candidate": str(missing),
                  "error": f"cannot read {missing}: No such file or directory"}
  assert undecodable["candidate"] == str(latin) and "not UTF-8" in undecodable["error"]
  assert f"cannot read {missing}" in proc.stderr and "not UTF-8" in proc.stderr
  table = run_cli(*args)
  assert table.returncode == cli.EXIT_USAGE, table.stderr[-3000:]
  rows = {line.split()[1]: line for line in table.stdout.splitlines() if line.startswith("│")}
  assert "NO_GPU" in rows["good.py"]
  assert "UNREADABLE" in rows["nope.py"] and "UNREADABLE" in rows["latin1.py"]


def test_check_never_prints_an_included_host_file(files, cache_dir, tmp_path):
  """A candidate whose CUDA source includes a host file: COMPILE_ERROR, and no line of the file
  in the verdict, the JSON or the table (the confined compiler cannot open it)."""
  secret = tmp_path / "host" / "token.txt"
  secret.parent.mkdir()
  secret.write_text("hunter2 TOPSECRET-LINE-ONE\nAWS_SECRET=TOPSECRET-LINE-TWO;\n")
  candidate = tmp_path / "includes_host_file.py"
  candidate.write_text(kernels.cuda_candidate(kernels.CUDA_SOURCE.replace(
      "#include <torch/extension.h>\n", f'#include <torch/extension.h>\n#include "{secret}"\n'),
      name="cli_host_include_ext"))
  for extra in (("--json",), ()):
    proc = run_cli("check", str(files["ref.py"]), str(candidate), "--cache-dir", str(cache_dir),
                   *extra)
    assert proc.returncode == cli.EXIT_FAILED, proc.stderr[-3000:]
    assert "TOPSECRET" not in proc.stdout + proc.stderr and "hunter2" not in proc.stdout
    if extra:
      verdict = json.loads(proc.stdout)
      assert verdict["outcome"] == "COMPILE_ERROR"
      assert verdict["message"].endswith(f"{secret}: Permission denied"), verdict["message"]


def test_serve_refuses_open_listen_without_token():
  proc = run_cli("serve", "--listen", "0.0.0.0:0", timeout=120)
  assert proc.returncode == cli.EXIT_USAGE
  assert "without --auth-token-file" in proc.stderr


def test_check_json_names_each_candidate(files, cache_dir):
  proc = run_cli("check", str(files["ref.py"]), str(files["nomodel.py"]), str(files["broken.py"]), "--json",
                 "--cache-dir", str(cache_dir))
  assert proc.returncode == cli.EXIT_FAILED, proc.stderr[-3000:]
  entries = json.loads(proc.stdout)
  assert [(e["candidate"], e["outcome"]) for e in entries] == [
      (str(files["nomodel.py"]), "REJECTED"), (str(files["broken.py"]), "COMPILE_ERROR")]


def test_empty_candidate_gets_the_clients_verdict(files, tmp_path, cache_dir):
  from dice_jax.verifier import client as client_lib  # the trainer's client; imports no jax
  empty = tmp_path / "empty.py"
  empty.write_text("  \n")
  proc = run_cli("check", str(files["ref.py"]), str(empty), "--json", "--cache-dir", str(cache_dir))
  assert proc.returncode == cli.EXIT_FAILED, proc.stderr[-3000:]
  got = json.loads(proc.stdout)
  want = client_lib._unsendable(client_lib.VerifyItem(kernels.REFERENCE, "  \n"))  # pylint: disable=protected-access
  assert (got["outcome"], got["stage"], got["message"]) == (
      pb.Outcome.Name(want.outcome), pb.Stage.Name(want.stage), want.message) == (
          "REJECTED", "STAGE_PARSE", "candidate_source is empty")


def test_second_serve_on_a_busy_port_is_one_line_and_nothing_starts():
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    proc = run_cli("serve", "--listen", f"127.0.0.1:{port}", timeout=120)
  assert proc.returncode == cli.EXIT_USAGE
  assert proc.stdout == ""
  assert proc.stderr.splitlines() == [
      f"dice-verifier: error: cannot bind --listen 127.0.0.1:{port}: address already in use (another server is "
      "listening there; stop it or choose another port)"]


def test_check_mixed_local_and_server_flags_is_a_usage_error(files):
  proc = run_cli("check", "--server", "127.0.0.1:1", "--gpus", "0", str(files["ref.py"]), str(files["good.py"]))
  assert proc.returncode == cli.EXIT_USAGE and "--gpus: options of a local check" in proc.stderr
  proc = run_cli("check", "--tls-ca", "ca.pem", str(files["ref.py"]), str(files["good.py"]))
  assert proc.returncode == cli.EXIT_USAGE and "--tls-ca: only with --server" in proc.stderr


def test_serve_says_when_it_is_ready_and_check_server_uses_it(files, cache_dir):
  """A real `serve` subprocess: its ready line, `check --server` against it, then its plain logs."""
  proc = subprocess.Popen([sys.executable, "-m", "verifier_service.cli", "serve", "--listen", "127.0.0.1:0",
                           "--cache-dir", str(cache_dir), "--plain-logs", "--log-level", "INFO",
                           "--stop-on-stdin-eof"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    ready = proc.stdout.readline()
    match = re.fullmatch(r"dice-verifier: serving on 127\.0\.0\.1:(\d+); no GPU: compile-only \(verdicts NO_GPU "
                         r"after compiling\); \d+ compile workers; auth: none \(loopback only\)\n", ready)
    assert match, (ready, proc.stderr.read() if proc.poll() is not None else "")
    port = match.group(1)
    done = run_cli("check", "--server", f"127.0.0.1:{port}", str(files["ref.py"]), str(files["good.py"]),
                   str(files["nomodel.py"]), "--json")
    assert done.returncode == cli.EXIT_FAILED, done.stderr[-3000:]
    assert f"server 127.0.0.1:{port}: no GPU (compile-only)" in done.stderr
    good, nomodel = json.loads(done.stdout)
    assert (good["candidate"], good["outcome"], good["compile"]["kernel_names"]) == (
        str(files["good.py"]), "NO_GPU", ["scaled_add_kernel"])
    assert (nomodel["outcome"], nomodel["message"]) == ("REJECTED", "candidate does not define ModelNew")
  finally:
    _, logs = proc.communicate(timeout=120)  # closes stdin: --stop-on-stdin-eof drains and exits
  assert proc.returncode == 0, logs[-3000:]
  # Plain logs carry what the JSON logs carry: the address, each verdict's outcome and message.
  assert re.search(rf"INFO verifier_service\.service\.server: listening listen=127\.0\.0\.1:0 port={port} ", logs), logs
  assert re.search(r"verdict request_id=check:\w+:1 outcome=REJECTED stage=STAGE_STATIC_CHECK .*"
                   r'message="candidate does not define ModelNew"', logs), logs
  assert "outcome=NO_GPU" in logs


def test_check_server_with_a_token(files, cache_dir, toolchain, tmp_path):
  srv = verifier_harness.ServerThread(verifier_harness.make_config(cache_dir, auth_token="s3cret"), toolchain)
  try:
    args = ("check", "--server", srv.target, str(files["ref.py"]), str(files["nomodel.py"]))
    refused = run_cli(*args)
    assert refused.returncode == cli.EXIT_INFRA
    assert refused.stderr.strip().splitlines()[-1] == (
        f"dice-verifier: {srv.target} refused the call: missing or wrong bearer token (give the server's token "
        "with --auth-token-file)")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    done = run_cli(*args, "--auth-token-file", str(token), "--json")
    assert done.returncode == cli.EXIT_FAILED, done.stderr[-3000:]
    assert json.loads(done.stdout)["message"] == "candidate does not define ModelNew"
    token.write_text("")
    empty = run_cli(*args, "--auth-token-file", str(token))
    assert empty.returncode == cli.EXIT_USAGE and "is empty" in empty.stderr
  finally:
    srv.stop()


def test_check_server_unreachable_is_one_clear_error(files):
  with socket.socket() as s:  # a port nobody listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  proc = run_cli("check", "--server", f"127.0.0.1:{port}", "--connect-timeout", "2", str(files["ref.py"]),
                 str(files["good.py"]))
  assert proc.returncode == cli.EXIT_INFRA
  assert proc.stderr.strip().splitlines() == [
      f"dice-verifier: cannot reach the verifier at 127.0.0.1:{port} within 2 s (plaintext): is `dice-verifier "
      "serve` running there, and does it speak plaintext?"]


def test_ready_line_says_address_gpus_slots_and_auth():
  config = lambda **kw: verifier_harness.make_config("/tmp", compile_workers=16, **kw)
  h200 = pb.ServerInfo(compile_workers=16)
  h200.gpus.add(index=0, name="NVIDIA H200", arch="sm_90", slots=1)
  line = server_lib.ready_line(h200, "0.0.0.0:50051", 50051, config(auth_token="t"), insecure=False)
  assert line == ("dice-verifier: serving on 0.0.0.0:50051; GPU 0 NVIDIA H200 (sm_90) x1 slot; 16 compile "
                  "workers; auth: bearer token")
  readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
  assert f"`{line}`" in readme  # the README shows the real line
  nogpu = pb.ServerInfo(compile_workers=2)
  assert server_lib.ready_line(nogpu, "127.0.0.1:0", 41234, config(), insecure=False).endswith(
      "serving on 127.0.0.1:41234; no GPU: compile-only (verdicts NO_GPU after compiling); 2 compile workers; "
      "auth: none (loopback only)")
  tls = config(tls_cert="s.pem", tls_key="s.key", tls_client_ca="ca.pem", metrics_port=9400)
  assert server_lib.ready_line(nogpu, "[::]:50051", 50051, tls, insecure=False).endswith(
      "serving on [::]:50051; no GPU: compile-only (verdicts NO_GPU after compiling); 2 compile workers; "
      "auth: mTLS; metrics http://0.0.0.0:9400/metrics")
  assert "auth: NONE (--insecure-public)" in server_lib.ready_line(nogpu, "0.0.0.0:1", 1, config(), insecure=True)


def test_check_policy_flag_switches_partial_replacement(files, cache_dir, tmp_path):
  """`--policy` per request: the extension adds, torch multiplies; fine by default, TORCH_FALLBACK
  under strict (CPU test mode: C++ only)."""
  partial = tmp_path / "partial.py"
  partial.write_text(kernels.cpp_candidate("scaled_add").replace(
      "    def forward(self, a, b):\n",
      "    def forward(self, a, b):\n        return torch.mul(ext.add_only(a, b, self.scale), self.scale)\n"))
  verdicts = {}
  for policy in ("default", "strict"):
    proc = run_cli("check", str(files["ref.py"]), str(partial), "--json", "--cpu-test-mode",
                   "--cache-dir", str(cache_dir), "--policy", policy, "--skip-timing")
    verdicts[policy] = json.loads(proc.stdout)
  assert verdicts["default"]["outcome"] == "OK" and verdicts["default"]["policy"] == "POLICY_DEFAULT"
  assert verdicts["strict"]["outcome"] == "REJECTED" and verdicts["strict"]["policy"] == "POLICY_STRICT"
  assert [e["kind"] for e in verdicts["strict"]["exploits"]] == ["TORCH_FALLBACK"]


def test_the_timing_core_flag_reaches_the_judges_job_settings():
  """`--no-timing-core` turns off binding both sides to one core: the job settings every worker
  hands its judge (ServerConfig.sandbox_spec, read in trusted/judge.run) say so; by default they
  bind."""
  parse = lambda *flags: cli._config(cli.build_parser().parse_args(["serve", *flags]))  # pylint: disable=protected-access
  assert parse().sandbox_spec("")["timing_core"] is True
  assert parse("--no-timing-core").sandbox_spec("")["timing_core"] is False
