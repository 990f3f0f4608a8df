"""deploy/: the verifier's container image and Kubernetes manifests, checked against the code they run.

No Docker engine or cluster here, so what can be checked without one is: every manifest parses;
the container's arguments are accepted by the real `dice-verifier` parser; the health probes name
the service the server registers (read from the server code) on the port it listens on, and a
real server answers that probe SERVING while requiring a token for everything else; the token
Secret is mounted where --auth-token-file points; Prometheus scrapes --metrics-port; and the
Dockerfile copies files that exist and runs a command and an extra the project defines.
"""

from __future__ import annotations

import pathlib
import re
import shlex
import tomllib

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dice.verifier.v1 import verifier_pb2 as pb
from dice.verifier.v1 import verifier_pb2_grpc
from verifier_service import cli as verifier_cli
from verifier_service.service import server as server_lib

import verifier_harness

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "deploy" / "verifier" / "Dockerfile"


def _documents(path: pathlib.Path) -> list[dict]:
  return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@pytest.fixture(scope="module")
def manifests() -> dict[tuple[str, str], dict]:
  kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
  out = {}
  for name in [*kustomization["resources"], "servicemonitor.yaml"]:
    for doc in _documents(K8S / name):
      assert {"apiVersion", "kind", "metadata"} <= set(doc), (name, doc)
      out[(doc["kind"], doc["metadata"]["name"])] = doc
  return out


@pytest.fixture(scope="module")
def container(manifests) -> dict:
  [one] = manifests[("StatefulSet", "dice-verifier")]["spec"]["template"]["spec"]["containers"]
  return one


def _serve_args(container: dict):
  args = verifier_cli.build_parser().parse_args([str(a) for a in container["args"]])  # exits on a bad flag
  assert args.command == "serve"
  return args


def _port(container: dict, name: str) -> int:
  return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


def test_every_manifest_parses_and_the_kustomization_is_complete(manifests):
  kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
  assert all((K8S / name).is_file() for name in kustomization["resources"])
  assert {("Namespace", "dice"), ("Service", "dice-verifier"), ("StatefulSet", "dice-verifier"),
          ("ServiceMonitor", "dice-verifier")} <= set(manifests)
  [image] = kustomization["images"]
  assert image["name"] == manifests[("StatefulSet", "dice-verifier")]["spec"]["template"]["spec"][
      "containers"][0]["image"]
  assert "token" in (K8S / ".gitignore").read_text().split()  # the Secret's source is never committed


def test_container_args_are_real_serve_flags_and_authenticate(container):
  args = _serve_args(container)
  assert args.listen.startswith("0.0.0.0:")  # beyond loopback: serve refuses to start without auth
  config = verifier_cli._config(args, listen=args.listen, auth_token="t")  # pylint: disable=protected-access
  server_lib.check_exposure(config, insecure=args.insecure)
  assert not args.insecure and args.auth_token_file is not None
  assert args.compile_workers == int(container["resources"]["requests"]["cpu"])
  assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1


def test_probes_name_the_real_health_service_and_port(container):
  listen_port = int(_serve_args(container).listen.rsplit(":", 1)[1])
  assert _port(container, "grpc") == listen_port
  for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
    probe = container[kind]["grpc"]
    assert probe["port"] == listen_port, kind
    assert probe["service"] == server_lib.SERVICE_NAME, kind  # the name the server registers health for


def test_a_real_token_server_answers_the_probe_and_refuses_the_rest(container, cache_dir, toolchain):
  service = container["readinessProbe"]["grpc"]["service"]
  srv = verifier_harness.ServerThread(verifier_harness.make_config(cache_dir, auth_token="s3cret"), toolchain)
  try:
    with srv.channel() as channel:  # what the kubelet sends: plaintext, no token
      answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
      assert answer.status == health_pb2.HealthCheckResponse.SERVING
      with pytest.raises(grpc.RpcError) as refused:
        verifier_pb2_grpc.VerifierStub(channel).GetInfo(pb.GetInfoRequest(), timeout=10)
      assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
  finally:
    srv.stop()


def test_token_secret_is_mounted_where_serve_reads_it(manifests, container):
  token_file = pathlib.PurePosixPath(str(_serve_args(container).auth_token_file))
  kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
  [generated] = kustomization["secretGenerator"]
  assert kustomization["generatorOptions"]["disableNameSuffixHash"] is True
  volumes = {v["name"]: v for v in manifests[("StatefulSet", "dice-verifier")]["spec"]["template"]["spec"]["volumes"]}
  mount = next(m for m in container["volumeMounts"] if str(token_file).startswith(m["mountPath"] + "/"))
  assert volumes[mount["name"]]["secret"]["secretName"] == generated["name"]
  assert token_file.name in [pathlib.PurePosixPath(f).name for f in generated["files"]]  # the Secret's key
  assert mount.get("readOnly") is True


def test_prometheus_scrapes_the_metrics_port(manifests, container):
  metrics_port = _serve_args(container).metrics_port
  assert _port(container, "metrics") == metrics_port
  annotations = manifests[("StatefulSet", "dice-verifier")]["spec"]["template"]["metadata"]["annotations"]
  assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == metrics_port
  service_ports = {p["name"]: p for p in manifests[("Service", "dice-verifier")]["spec"]["ports"]}
  assert service_ports["metrics"]["port"] == metrics_port
  [endpoint] = manifests[("ServiceMonitor", "dice-verifier")]["spec"]["endpoints"]
  assert endpoint["port"] == "metrics" and endpoint["path"] == annotations["prometheus.io/path"] == "/metrics"
  labels = manifests[("StatefulSet", "dice-verifier")]["spec"]["template"]["metadata"]["labels"]
  for selector in (manifests[("Service", "dice-verifier")]["spec"]["selector"],
                   manifests[("ServiceMonitor", "dice-verifier")]["spec"]["selector"]["matchLabels"]):
    assert selector.items() <= labels.items()


def _instructions(text: str) -> list[tuple[str, str]]:
  """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
  out, pending = [], ""
  for line in text.splitlines():
    if not pending and (not line.strip() or line.lstrip().startswith("#")):
      continue
    pending += line.rstrip("\\").strip() + " "
    if not line.endswith("\\"):
      word, _, rest = pending.strip().partition(" ")
      out.append((word.upper(), rest.strip()))
      pending = ""
  return out


def test_dockerfile_copies_what_exists_and_runs_what_the_project_defines(container):
  steps = _instructions(DOCKERFILE.read_text())
  assert steps[0][0] == "ARG" and any(w == "FROM" for w, _ in steps)
  assert re.search(r"nvidia/cuda:[\w.]+-devel-", DOCKERFILE.read_text())  # nvcc is needed: a devel image
  copies = [shlex.split(rest) for word, rest in steps if word in ("COPY", "ADD")]
  assert copies
  for *sources, _ in copies:
    for source in sources:
      assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  installs = " ".join(rest for word, rest in steps if word == "RUN")
  for extra in re.findall(r"\.\[(\w+)\]", installs):
    assert extra in project["optional-dependencies"], extra
  assert "jax" not in " ".join(project["optional-dependencies"]["verify"])
  torch_spec = re.search(r'ARG TORCH_SPEC="([^"]+)"', DOCKERFILE.read_text()).group(1)
  assert torch_spec in project["optional-dependencies"]["verify"]  # the same torch range as the extra
  [entrypoint] = [rest for word, rest in steps if word == "ENTRYPOINT"]
  [command] = [rest for word, rest in steps if word == "CMD"]
  assert yaml.safe_load(entrypoint) == ["dice-verifier"] and "dice-verifier" in project["scripts"]
  cmd = yaml.safe_load(command)
  args = verifier_cli.build_parser().parse_args(cmd)
  [expose] = [rest for word, rest in steps if word == "EXPOSE"]
  assert sorted(int(p) for p in expose.split()) == sorted([int(args.listen.rsplit(":", 1)[1]), args.metrics_port])
  # The image's default command and the StatefulSet agree on the address, the token file and metrics.
  deployed = _serve_args(container)
  assert (args.listen, args.auth_token_file, args.metrics_port) == (
      deployed.listen, deployed.auth_token_file, deployed.metrics_port)
