"""The sandbox's rules, each tried from inside a sandboxed child, as root and as an ordinary user.

A forked child applies `sandbox.enter_namespaces()` and `sandbox.lock_down()` exactly as a job
child does (as root: drop to a sandbox uid; as an ordinary user: user + network namespace), then
attempts what hostile candidates attempt and reports each attempt's result to the test. No
compiler: this runs in seconds. The same attacks from real candidates, through a real server and
worker, are in test_adversarial_cpu.py.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from verifier_service.run import sandbox

pytestmark = pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux sandbox")


def _attacks(port: int, outside_file: str, job_dir: str, supervised: bool) -> dict[str, str]:
  """Runs inside the sandboxed child; every value says what happened."""
  out: dict[str, str] = {}

  def attempt(name, fn):
    try:
      out[name] = f"ok: {fn()}"
    except OSError as e:
      out[name] = f"{errno.errorcode.get(e.errno, e.errno)}"

  def connect():
    with socket.create_connection(("127.0.0.1", port), timeout=2):
      return "connected"

  attempt("connect_server_port", connect)
  attempt("unix_socket", lambda: socket.socket(socket.AF_UNIX).close())
  attempt("read_outside", lambda: open(outside_file).read())
  attempt("write_job_dir", lambda: open(os.path.join(job_dir, "f.txt"), "w").write("x"))
  attempt("write_tmp", lambda: open("/tmp/dice-sandbox-escape.txt", "w").write("x"))
  attempt("list_tmp", lambda: len(os.listdir("/tmp")))
  attempt("parent_environ", lambda: open(f"/proc/{os.getppid()}/environ", "rb").read(16))
  attempt("parent_mem", lambda: open(f"/proc/{os.getppid()}/mem", "rb").read(1))
  attempt("signal_parent", lambda: os.kill(os.getppid(), 0))
  attempt("read_own_proc", lambda: len(open("/proc/self/status").read()) > 0)
  attempt("import_stdlib", lambda: __import__("colorsys").__name__)  # not imported before
  if not supervised:  # refused calls wait for a supervisor's answer; the probe has none
    attempt("fork", lambda: os.waitpid(os.fork() or os._exit(0), 0) and "forked")  # pylint: disable=protected-access
  out["env_secret"] = "present" if "DICE_SANDBOX_TEST_SECRET" in os.environ else "absent"
  out["uid"] = str(os.getuid())
  return out


def _run_sandboxed(as_user: int | None, port: int, outside_file: str) -> dict:
  """Forks the probe from a fresh interpreter: pytest's own process may have threads (at-fork
  handlers of libraries earlier tests imported restart theirs in the child), and a user namespace
  needs a single-threaded caller, as the verifier's worker is."""
  proc = subprocess.run([sys.executable, __file__, json.dumps([as_user, port, outside_file])],
                        capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout)


def _fork_sandboxed(as_user: int | None, port: int, outside_file: str) -> dict:
  job_dir = tempfile.mkdtemp(prefix="dice-sandbox-test-")
  os.chmod(job_dir, 0o777)
  read_fd, write_fd = os.pipe()
  pid = os.fork()
  if pid == 0:
    code = 1
    try:
      os.close(read_fd)
      if as_user is not None:
        # This interpreter may live where that user cannot read it (a pyenv under /root).
        import colorsys, encodings.idna  # noqa: F401  pylint: disable=import-outside-toplevel,multiple-imports
        os.setgroups([])
        os.setresgid(as_user, as_user, as_user)
        os.setresuid(as_user, as_user, as_user)
        # A process started as this user is dumpable; one that switched to it is not.
        ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
      netns = sandbox.enter_namespaces()
      policy = sandbox.Policy(job_dir=job_dir, read_only=sandbox.default_read_only(),
                              uid=61990, strict=True)
      layers = sandbox.lock_down(policy, netns, None)
      report = {"layers": layers, "attacks": _attacks(port, outside_file, job_dir, False)}
      os.write(write_fd, json.dumps(report).encode())
      code = 0
    except BaseException as e:  # pylint: disable=broad-except
      os.write(write_fd, json.dumps({"error": repr(e)}).encode())
    finally:
      os._exit(code)  # pylint: disable=protected-access
  os.close(write_fd)
  with os.fdopen(read_fd) as f:
    text = f.read()
  os.waitpid(pid, 0)
  shutil.rmtree(job_dir, ignore_errors=True)
  return json.loads(text)


@pytest.fixture
def listener():
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  sock.listen(4)
  yield sock.getsockname()[1]
  sock.close()


@pytest.fixture
def outside_file(tmp_path_factory):
  folder = tempfile.mkdtemp(prefix="dice-sandbox-secret-")
  os.chmod(folder, 0o755)
  path = os.path.join(folder, "secret.txt")
  with open(path, "w") as f:
    f.write("world-readable, but outside the sandbox\n")
  os.chmod(path, 0o644)
  yield path
  shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("as_user", [None, 65534], ids=["root", "ordinary-user"])
def test_every_rule_holds(as_user, listener, outside_file, monkeypatch):
  if os.getuid() != 0 and as_user is not None:
    pytest.skip("switching to another user needs root")
  monkeypatch.setenv("DICE_SANDBOX_TEST_SECRET", "hunter2")
  report = _run_sandboxed(as_user, listener, outside_file)
  assert "error" not in report, report
  layers, attacks = report["layers"], report["attacks"]
  print("\nlayers:", json.dumps(layers, indent=1), "\nattacks:", json.dumps(attacks, indent=1))
  assert all(v.startswith("on") for v in layers.values()), layers
  refused = {"connect_server_port", "read_outside", "write_tmp", "list_tmp", "parent_environ",
             "parent_mem", "signal_parent", "unix_socket", "fork"}
  for name in refused:
    assert not attacks[name].startswith("ok"), (name, attacks[name])
  for name in ("write_job_dir", "read_own_proc", "import_stdlib"):
    assert attacks[name].startswith("ok"), (name, attacks[name])
  assert attacks["env_secret"] == "absent"
  assert attacks["uid"] != "0"
  assert not os.path.exists("/tmp/dice-sandbox-escape.txt")


def test_landlock_reports_its_abi():
  abi = sandbox.landlock_abi()
  assert abi >= 0
  if os.path.exists("/proc/config.gz") and abi == 0:
    pytest.skip("this kernel has no Landlock")
  assert abi >= 1


def test_scrubbed_env_keeps_only_the_allow_list():
  env = sandbox.scrubbed_env("/job", {"AWS_SECRET_ACCESS_KEY": "x", "CUDA_VISIBLE_DEVICES": "0",
                                      "PATH": "/evil", "HOME": "/root", "NCCL_NVLS_ENABLE": "0"})
  assert "AWS_SECRET_ACCESS_KEY" not in env
  assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["NCCL_NVLS_ENABLE"] == "0"
  assert env["HOME"] == "/job" and env["PATH"] == "/usr/bin:/bin"


if __name__ == "__main__":
  print(json.dumps(_fork_sandboxed(*json.loads(sys.argv[1]))))
