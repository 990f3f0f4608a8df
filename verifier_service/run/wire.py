"""The bytes that cross the trust boundary between the candidate's process and the judge.

One stream socket (a socketpair the worker makes before forking both). A frame is a 4-byte
big-endian header length, a JSON header, then `nbytes` payload bytes. The judge drives: it sends a
command, the candidate's process answers it, and nothing else is in flight.

The judge treats everything from the candidate's side as hostile input: headers are bounded,
payload sizes are checked against what the judge expects before anything is read, output metadata
(structure, dtype, shape, device) must equal the reference's, which the judge fixed before the
candidate ran, and values are read with the reference's dtype and shape, never the declared ones,
from the judge's own receive buffer (nothing is shared, so nothing changes after the check).
Malformed frames raise `ProtocolError`: the candidate's failure.

Decision: a socket, not CUDA IPC or shared memory. IPC exports whole allocator blocks, keeps the
candidate's write access during the comparison and hands it metadata to forge; a copy through the
kernel costs a few ms per 100 MB and leaves nothing shared.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from collections.abc import Sequence
from typing import Any

import torch

from verifier_service import enums
from verifier_service.run import problem

MAX_HEADER_BYTES = 1 << 20
ALIGN_BYTES = 64  # every tensor's bytes start at a multiple of this in the payload
_LENGTH = struct.Struct(">I")


class ProtocolError(Exception):
  """The peer sent something malformed or too large, or closed the socket mid-exchange."""


class OversizedPayload(ProtocolError):
  """A frame announcing more payload bytes than allowed; its header (unread payload left behind)
  still says what the sender claims to be sending, e.g. an output's dtype."""

  def __init__(self, message: str, header: dict[str, Any]):
    super().__init__(message)
    self.header = header


class Channel:
  """Framed messages over one connected stream socket."""

  def __init__(self, sock: socket.socket):
    self.sock = sock

  def send(self, header: dict[str, Any], buffers: Sequence[Any] = ()) -> None:
    views = [memoryview(b).cast("B") for b in buffers]
    header = dict(header, nbytes=sum(v.nbytes for v in views))
    data = json.dumps(header).encode()
    self.sock.sendall(_LENGTH.pack(len(data)) + data)
    for view in views:
      self.sock.sendall(view)

  def _exact(self, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
      k = self.sock.recv_into(view[got:], n - got)
      if k == 0:
        raise ProtocolError("the other side closed the connection")
      got += k
    return buf

  def recv(self, max_payload: int = 0) -> tuple[dict[str, Any], bytearray]:
    """One frame; refuses payloads larger than `max_payload` bytes before reading them."""
    (length,) = _LENGTH.unpack(self._exact(_LENGTH.size))
    if length > MAX_HEADER_BYTES:
      raise ProtocolError(f"header of {length} bytes (at most {MAX_HEADER_BYTES})")
    try:
      header = json.loads(self._exact(length))
    except ValueError as e:
      raise ProtocolError(f"header is not JSON: {e}") from e
    if not isinstance(header, dict) or not isinstance(header.get("nbytes"), int):
      raise ProtocolError("header is not an object with an integer nbytes")
    if not 0 <= header["nbytes"] <= max_payload:
      raise OversizedPayload(f"payload of {header['nbytes']} bytes (expected at most {max_payload})",
                             header)
    return header, self._exact(header["nbytes"])


# ----------------------------------------------------------------------------- tensors


def _value(leaf: Any) -> Any:
  if leaf is None or isinstance(leaf, (bool, int, str)):
    return leaf
  if isinstance(leaf, float):
    return leaf if math.isfinite(leaf) else repr(leaf)
  return repr(leaf)


def spec(tree: Any) -> list[dict[str, Any]]:
  """The judge's fixed metadata of an output tree: per leaf, kind, dtype, shape, device type."""
  out = []
  for leaf in problem.flatten(tree):
    if isinstance(leaf, torch.Tensor):
      out.append({"kind": "tensor", "dtype": str(leaf.dtype), "shape": list(leaf.shape),
                  "device": leaf.device.type, "nbytes": leaf.numel() * leaf.element_size()})
    else:
      out.append({"kind": "value", "type": type(leaf).__name__})
  return out


def encode(tree: Any) -> tuple[list[dict[str, Any]], list[Any]]:
  """The candidate side: declared metadata and the host bytes of every tensor leaf."""
  leaves: list[dict[str, Any]] = []
  buffers: list[Any] = []
  for leaf in problem.flatten(tree):
    if isinstance(leaf, torch.Tensor):
      exact = type(leaf) is torch.Tensor  # pylint: disable=unidiomatic-typecheck
      plain = leaf if exact else leaf.as_subclass(torch.Tensor)
      data = plain.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
      leaves.append({"kind": "tensor", "dtype": str(leaf.dtype), "shape": list(leaf.shape),
                     "device": leaf.device.type, "nbytes": int(data.nbytes),
                     "subclass": "" if exact else type(leaf).__qualname__})
      buffers.append(data)
      if _padded(data.nbytes) > data.nbytes:
        buffers.append(bytes(_padded(data.nbytes) - data.nbytes))
    else:
      leaves.append({"kind": "value", "type": type(leaf).__name__, "value": _value(leaf)})
  return leaves, buffers


def _padded(nbytes: int) -> int:
  return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


def payload_bytes(expected: list[dict[str, Any]]) -> int:
  return sum(_padded(leaf.get("nbytes", 0)) for leaf in expected)


def decode(expected: list[dict[str, Any]], declared: Any, payload: bytearray | memoryview,
           device: torch.device) -> tuple[list[Any] | None, str, list[tuple[str, str]]]:
  """The judge side: (leaves, "", findings) or (None, why the output is wrong, findings).

  `declared` is the candidate's leaf list, untrusted; tensors are read from `payload` (which must
  stay unchanged while they live) with the expected dtype and shape, and moved to `device`.
  """
  if not isinstance(declared, list) or not all(isinstance(d, dict) for d in declared):
    raise ProtocolError("output metadata is not a list of objects")
  if len(declared) != len(expected):
    return None, f"output has {len(declared)} leaves, the reference has {len(expected)}", []
  leaves, offset = [], 0
  for i, (want, got) in enumerate(zip(expected, declared)):
    where = f"output {i}"
    if got.get("kind") != want["kind"]:
      kind = got.get("type", got.get("kind"))
      wanted = "a tensor" if want["kind"] == "tensor" else want["type"]
      return None, f"{where} is {kind}, expected {wanted}", []
    if want["kind"] == "value":
      value = got.get("value")
      if got.get("type") == "float" and isinstance(value, str):
        try:
          value = float(value)  # non-finite floats travel as their repr
        except ValueError as e:
          raise ProtocolError(f"{where}: {value!r} is not a float") from e
      leaves.append(value)
      continue
    if got.get("subclass"):
      return None, f"{where} is a tensor subclass {got['subclass']}", [
          (enums.TENSOR_SUBCLASS, f"{where}: {str(got['subclass'])[:80]}")]
    if list(got.get("shape", [])) != want["shape"]:
      return None, (f"{where} shape {tuple(got.get('shape', []))} != reference "
                    f"{tuple(want['shape'])}"), []
    if got.get("dtype") != want["dtype"]:
      return None, f"{where} dtype {got.get('dtype')} != reference {want['dtype']}", []
    if got.get("device") != want["device"]:
      return None, f"{where} on {got.get('device')}, reference on {want['device']}", []
    if got.get("nbytes") != want["nbytes"] or offset + _padded(want["nbytes"]) > len(payload):
      raise ProtocolError(f"{where}: declared {got.get('nbytes')} bytes, expected {want['nbytes']}")
    dtype = getattr(torch, want["dtype"].removeprefix("torch."))
    if want["nbytes"]:  # a view of the judge's own receive buffer: no copy on the host
      numel = want["nbytes"] // torch.empty((), dtype=dtype).element_size()
      tensor = torch.frombuffer(payload, dtype=dtype, count=numel, offset=offset)
    else:
      tensor = torch.empty(0, dtype=dtype)
    offset += _padded(want["nbytes"])
    leaves.append(tensor.reshape(want["shape"]).to(device))
  if offset != len(payload):
    raise ProtocolError(f"{len(payload) - offset} payload bytes left over")
  return leaves, "", []
