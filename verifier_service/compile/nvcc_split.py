"""One nvcc compile with its host and device front ends running at the same time.

nvcc runs its stages one after another: host preprocessing and cudafe++ (the host front end);
device preprocessing, cicc (the device front end), ptxas and fatbinary; then the host compiler on
cudafe++'s output, which includes the device image. Both front ends parse the whole translation
unit (torch's headers included) and share only the module-id file, which cudafe++ writes and cicc
reads. Here that file is written first (any identifier unique to the source will do: it prefixes
the names of internal device symbols), the two chains run concurrently and the host compile
follows, each step exactly as `nvcc --dryrun` prints it. The wall time of a compile drops by the
shorter front end; its CPU time does not change. A dry run of any other shape (relocatable device
code, a new nvcc) returns None and the caller runs nvcc itself.

The caller may hand the two front-end steps (cudafe++, cicc) to a `front_end` hook
(front_ends.py: processes that already parsed the shared headers); a hook that answers None leaves
the step to run here as usual.

The caller may name the module id (an identifier suffix: it names anonymous namespaces, so any
value unique to the process that loads the module will do; compiler.py uses one per header tier so
that host_pch.py can precompile what all candidates' host code shares) and may rewrite the host
compile's input before it runs (`prepare_final`); if the rewritten input fails to compile, the
original input is compiled instead and that result stands.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import pathlib
import re
import shlex
from typing import Awaitable, Callable, Optional, Sequence

from verifier_service.compile import confine as confine_lib
from verifier_service.compile import limits as limits_lib
from verifier_service.compile import procs as compile_procs

# (argv, cwd) -> (return code, combined output).
RunFn = Callable[[list[str], pathlib.Path], Awaitable[tuple[int, str]]]

_ENV_RE = re.compile(r"^#\$ ([A-Za-z_]\w*)=(.*)$")
_VAR_RE = re.compile(r"\$\{?([A-Za-z_]\w*)")
_GEN_MODULE_ID = "--gen_module_id_file"
_MODULE_ID_RE = re.compile(r'--module_id_file_name\s+"?([^"\s]+)"?')
_FRONT_ENDS = ("cudafe++", "cicc")


@dataclasses.dataclass
class Plan:
  """nvcc's steps for one compile, split into the two independent chains and the final step."""
  env: dict[str, str]
  host: list[str]  # host preprocessing, cudafe++
  device: list[str]  # device preprocessing, cicc, ptxas, fatbinary
  final: str  # host compile of cudafe++'s output
  module_id_file: str


def parse_dryrun(text: str) -> Plan | None:
  """Splits `nvcc --dryrun` output; None unless it is the whole-program compile we know."""
  env, commands = {}, []
  for line in text.splitlines():
    if not line.startswith("#$ "):
      continue
    match = _ENV_RE.match(line)
    if match:
      env[match.group(1)] = match.group(2).strip()
    else:
      commands.append(line[3:].strip())
  host, device, final = [], [], []
  for cmd in commands:
    tool = shlex.split(cmd)[0].rsplit("/", 1)[-1] if cmd else ""
    if tool == "cudafe++" or (" -E " in cmd and ".cpp4.ii" in cmd):
      host.append(cmd)
    elif " -c " in cmd and ".cudafe1.cpp" in cmd:
      final.append(cmd)
    elif tool in ("gcc", "g++", "c++", "cc", "cicc", "ptxas", "fatbinary", "rm") or (
        tool.endswith(("gcc", "g++", "clang++"))):
      device.append(cmd)
    else:
      return None  # nvlink, a second host compile, something new: let nvcc do it
  cudafe = [c for c in host if shlex.split(c)[0].endswith("cudafe++")]
  cicc = [c for c in device if shlex.split(c)[0].endswith("cicc")]
  if len(host) != 2 or len(cudafe) != 1 or not cicc or len(final) != 1:
    return None
  ids = {m.group(1) for c in cudafe + cicc for m in _MODULE_ID_RE.finditer(c)}
  if len(ids) != 1 or _GEN_MODULE_ID not in cudafe[0] or any(_GEN_MODULE_ID in c for c in cicc):
    return None
  used = {v for c in commands for v in _VAR_RE.findall(c)}
  simple = {k: v for k, v in env.items() if not re.search(r"[\s\"']", v)}
  if used - set(simple):
    return None  # a command needs a variable whose value is not a plain word
  host = [c.replace(_GEN_MODULE_ID, "") for c in host]
  return Plan(env=simple, host=host, device=device, final=final[0], module_id_file=ids.pop())


def script(plan: Plan, commands: list[str]) -> list[str]:
  """argv running `commands` with the dry run's environment variables (one shell, set -e)."""
  return shell(plan.env, commands)


def shell(env: dict[str, str], commands: list[str]) -> list[str]:
  """argv running `commands` in one shell (set -e) with `env` exported."""
  exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
  return ["/bin/sh", "-c", "set -e\n" + exports + "\n".join(commands) + "\n"]


def front_end_tool(command: str) -> str | None:
  """"cudafe++" or "cicc" for a front-end step of the dry run, else None."""
  try:
    name = shlex.split(command)[0].rsplit("/", 1)[-1]
  except (ValueError, IndexError):
    return None
  return name if name in _FRONT_ENDS else None


def module_id_file(command: str) -> str:
  """The module id file a cudafe++ or cicc step names ("" if none)."""
  match = _MODULE_ID_RE.search(command)
  return match.group(1) if match else ""


# (command, nvcc's environment, cwd) -> (return code, output) of the step, or None to run it here.
FrontEndFn = Callable[[str, dict[str, str], pathlib.Path], Awaitable[Optional[tuple[int, str]]]]
async def _chain(plan: Plan, commands: list[str], cwd: pathlib.Path, run: RunFn,
                 front_end: FrontEndFn | None,
                 preprocess: FrontEndFn | None = None,
                 limits: limits_lib.Limits | None = None) -> tuple[int, str]:
  """One chain's commands in order; its front-end step through `front_end` and the
  preprocessing step before it (when it is one command) through `preprocess`, when they take
  them."""
  at = next((i for i, c in enumerate(commands) if front_end_tool(c)), None)
  if (front_end is None and preprocess is None) or at is None:
    return await run(script(plan, commands), cwd)
  output = ""
  for part, hook in ((commands[:at], preprocess if at == 1 else None), ([commands[at]], front_end),
                     (commands[at + 1:], None)):
    if not part:
      continue
    result = await hook(part[0], plan.env, cwd) if hook is not None else None
    rc, text = result if result is not None else await run(script(plan, part), cwd)
    output += text
    if limits is not None and len(output.encode("utf-8", "replace")) > limits.output_bytes:
      raise compile_procs.LimitExceeded(  # what the chain run as one process would have printed
          limits_lib.Limit.OUTPUT, f"{limits.message(limits_lib.Limit.OUTPUT)}\n{output}")
    if rc != 0:
      return rc, output
  return 0, output


# (plan, cwd) -> None, or a host compile command to run instead of plan.final and a function that
# undoes what was done to the host compile's input for it (called if that command fails).
PrepareFn = Callable[[Plan, pathlib.Path],
                     Awaitable[Optional[tuple[str, Callable[[], None]]]]]


async def compile_split(argv: list[str], source_text: str, cwd: pathlib.Path, run: RunFn,
                        module_id: str | None = None,
                        prepare_final: PrepareFn | None = None,
                        front_end: FrontEndFn | None = None,
                        host_first: bool = False,
                        preprocess: FrontEndFn | None = None,
                        limits: limits_lib.Limits | None = None) -> tuple[int, str] | None:
  """Runs `argv` (an `nvcc ... -c SRC -o OUT` command, run in `cwd`) as two concurrent chains and
  the host compile. Returns (return code, output) as nvcc would, or None to say "run nvcc
  instead". The module id defaults to one derived from the source.

  `host_first`: the device chain starts only once the host chain has succeeded, as in nvcc, for a
  compile that is expected to fail (compiler.py: the retry of a source that failed at a lighter
  header tier): a host failure then costs no device front end. The result is the same either way:
  a host failure is reported alone, and otherwise both chains' outputs in the same order.

  `preprocess`: a hook for each chain's preprocessing step, as `front_end` for the front ends
  (rest_preprocess.py: the split's device halves)."""
  (cwd / "nvcc-steps").mkdir(exist_ok=True)  # relative: the steps run in `cwd`
  rc, text = await run(list(argv) + ["--dryrun", "--keep", "--keep-dir", "nvcc-steps"], cwd)
  plan = parse_dryrun(text) if rc == 0 else None
  if plan is None:
    return None
  if module_id is None:
    digest = hashlib.sha256(source_text.encode()).hexdigest()
    module_id = f"_{digest[:8]}_dice_{digest[8:24]}"
  (cwd / plan.module_id_file).write_text(module_id)
  if host_first:
    host_result = await _chain(plan, plan.host, cwd, run, front_end, preprocess, limits)
    if host_result[0] != 0:
      return host_result
    device_result = await _chain(plan, plan.device, cwd, run, front_end, preprocess, limits)
    return await _finish(plan, cwd, run, [host_result, device_result], prepare_final)
  host, device = (asyncio.ensure_future(_chain(plan, chain, cwd, run, front_end, preprocess,
                                               limits)) for chain in (plan.host, plan.device))
  try:
    done, _ = await asyncio.wait([host, device], return_when=asyncio.FIRST_COMPLETED)
    if host in done and host.result()[0] != 0:
      device.cancel()  # nvcc stops at the host chain's failure: nothing more to report
    # A device chain that fails first waits for the host chain, whose failure nvcc would report
    # (it runs first there): the log and return code do not depend on which chain was faster.
    results = await asyncio.gather(host, device, return_exceptions=True)
  finally:
    for task in (host, device):
      task.cancel()
    await asyncio.gather(host, device, return_exceptions=True)
  return await _finish(plan, cwd, run, results, prepare_final)


async def _finish(plan: Plan, cwd: pathlib.Path, run: RunFn,
                  results: Sequence[tuple[int, str] | BaseException],
                  prepare_final: PrepareFn | None) -> tuple[int, str]:
  """The chains' results (host, device: (rc, output) or the exception) reported as nvcc would,
  then the host compile."""
  # A bound went over, or a step could not be confined: final, whichever chain it was.
  for result in results:
    if isinstance(result, (compile_procs.LimitExceeded, confine_lib.ConfinementError)):
      raise result
  # Report as nvcc would: the host chain runs first there, and nothing after a failing step.
  output = ""
  for result in results:
    if isinstance(result, BaseException):
      continue
    chain_rc, chain_out = result
    output += chain_out
    if chain_rc != 0:
      return chain_rc, output
  prepared = await prepare_final(plan, cwd) if prepare_final is not None else None
  if prepared is not None:
    command, undo = prepared
    rc, final_out = await run(script(plan, [command]), cwd)
    if rc == 0:
      return rc, output + final_out
    undo()  # the input as cudafe++ wrote it decides
  rc, final_out = await run(script(plan, [plan.final]), cwd)
  return rc, output + final_out
