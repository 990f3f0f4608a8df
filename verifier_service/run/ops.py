"""Which ATen ops compute values, which are glue, and a recorder of the ops a call dispatches.

Shared by both sides of the trust boundary: the candidate's process records what ModelNew.forward
dispatches (`OpRecorder`), the judge records what the reference's forward dispatches, and the
partial-replacement policy (policy.py) compares the two by op family.

The glue allow-list is the principle, not a list of exploits: ModelNew.forward may use torch to
allocate, reshape/view, copy or cast (including `.contiguous()`), concatenate and read scalars.
Anything that computes values (arithmetic, reductions, matmul/conv, activations, normalisation,
indexing/gather, sorting, random numbers) is torch's work, not the candidate's.
"""

from __future__ import annotations

import collections
import time

from torch.utils._python_dispatch import TorchDispatchMode

GLUE_OPS = frozenset("""
empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones
ones_like new_ones full full_like new_full scalar_tensor zero_ fill_ arange lift_fresh
lift_fresh_copy resize_ set_ _to_copy to copy_ _copy_from _copy_from_and_resize clone contiguous
detach detach_ alias view _unsafe_view reshape _reshape_alias as_strided expand expand_as permute
transpose t numpy_T squeeze squeeze_ unsqueeze unsqueeze_ flatten unflatten select slice narrow
split split_with_sizes unsafe_split chunk unbind view_as movedim swapaxes diagonal unfold
view_as_real view_as_complex cat stack hstack vstack constant_pad_nd _local_scalar_dense
is_nonzero record_stream _pin_memory sym_size sym_stride sym_numel sym_storage_offset dim size
stride is_contiguous result_type _has_compatible_shallow_copy_type
""".split())
# Namespaces whose ops are library compute, not the candidate's own (TORCH_LIBRARY) ops.
LIBRARY_NAMESPACES = frozenset({"aten", "prims", "torchvision", "quantized", "_quantized",
                                "mkldnn", "cudnn", "_c10d_functional", "c10d"})

# Ops that do the same work under different names (a reference's nn.Linear is addmm; a candidate
# may call mm and add). Decision: families, not exact names, so that rewriting the reference's
# layers as other torch calls still counts as torch doing that work.
_FAMILIES = {
    "matmul": """mm addmm bmm baddbmm addbmm matmul linear addmv mv dot vdot einsum
                 _addmm_activation _scaled_mm tensordot bilinear""",
    "conv": """convolution _convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d
               conv_transpose3d cudnn_convolution cudnn_convolution_transpose miopen_convolution
               mkldnn_convolution _slow_conv2d_forward slow_conv3d_forward slow_conv_transpose2d
               slow_conv_transpose3d convolution_overrideable slow_conv_dilated2d
               slow_conv_dilated3d thnn_conv2d _conv_depthwise2d conv_depthwise3d
               _nnpack_spatial_convolution""",
    "relu": "relu relu6 clamp clamp_min clamp_max threshold hardtanh",
    "add": "add sub rsub",
    "mul": "mul div",
    "batch_norm": """batch_norm native_batch_norm _native_batch_norm_legit
                     _native_batch_norm_legit_no_training cudnn_batch_norm miopen_batch_norm
                     _batch_norm_impl_index _batch_norm_with_update""",
    "layer_norm": "layer_norm native_layer_norm",
    "group_norm": "group_norm native_group_norm",
    "softmax": "softmax _softmax log_softmax _log_softmax",
    "sum": "sum mean",
    "max_pool": "max_pool1d max_pool2d max_pool3d max_pool2d_with_indices max_pool3d_with_indices",
    "avg_pool": """avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d
                   _adaptive_avg_pool2d adaptive_avg_pool3d _adaptive_avg_pool3d""",
}
_FAMILY_OF = {op: family for family, ops in _FAMILIES.items() for op in ops.split()}


def op_is_glue(name: str) -> bool:
  """`name` is "namespace::op"; candidate-defined namespaces count as the candidate's own."""
  namespace, _, op = name.partition("::")
  return namespace not in LIBRARY_NAMESPACES or op in GLUE_OPS


def family(name: str) -> str:
  """"aten::relu_" -> "relu", "aten::addmm" -> "matmul": what work an op does."""
  op = name.partition("::")[2] or name
  if op.endswith("_") and not op.endswith("__"):
    op = op[:-1]
  return _FAMILY_OF.get(op, op)


def compute_families(names) -> set[str]:
  return {family(n) for n in names if not op_is_glue(n)}


class OpRecorder(TorchDispatchMode):
  """Counts every dispatched op ("aten::addmm") while active, and the CPU time spent in those
  that compute (the CPU test worker's measure of how much of forward torch did)."""

  def __init__(self) -> None:
    super().__init__()
    self.counts: collections.Counter[str] = collections.Counter()
    self.compute_s = 0.0

  # pylint: disable-next=arguments-renamed
  def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
    name = f"{func.namespace}::{func.overloadpacket.__name__}"
    self.counts[name] += 1
    if op_is_glue(name):
      return func(*args, **(kwargs or {}))
    start = time.perf_counter()
    try:
      return func(*args, **(kwargs or {}))
    finally:
      self.compute_s += time.perf_counter() - start

  def summary(self) -> list[str]:
    return [f"{name} x{n}" for name, n in sorted(self.counts.items())]

  def compute_ops(self) -> dict[str, int]:
    return {name: n for name, n in sorted(self.counts.items()) if not op_is_glue(name)}
