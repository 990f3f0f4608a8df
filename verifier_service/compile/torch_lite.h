// dice-verifier "lite" torch headers for a CUDA translation unit (see header_tiers.py).
//
// A strict subset of what <torch/types.h> declares: at::Tensor with all its methods, TORCH_CHECK
// and friends, the AT_DISPATCH macros and the factory ops a kernel launcher allocates with.
// header_tiers.py puts every system header the original includes in front of this file and
// appends, taken from the installed torch at run time, the `namespace torch` aliases of
// torch/types.h and torch's own torch:: factory wrappers (all other torch:: factories deleted).
#include <ATen/core/Tensor.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/Dispatch.h>
// The lite tier's factory ops: each `#include <ATen/ops/NAME.h>` below declares at::NAME, and
// header_tiers.LITE_FACTORIES is read from these lines (tier_environment.py keeps torch::NAME's
// own wrapper for exactly these). The cache keys follow: header_tiers.VERSION is a digest of
// this file.
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

namespace dice_lite {
// Stands in for torch::autograd::make_variable (which needs the whole autograd header) inside
// torch's factory wrappers. On a factory's fresh result with requires_grad false it is the
// identity: make_variable would set allow_tensor_metadata_change (already true on a new tensor)
// and clear autograd metadata (never set on one). The lite tier only compiles sources that
// never mention requires_grad, so the check below cannot fire for them.
inline at::Tensor fresh_variable(at::Tensor data, bool requires_grad) {
  TORCH_CHECK(!requires_grad, "dice-verifier lite headers cannot make a tensor that requires grad");
  return data;
}
}  // namespace dice_lite
