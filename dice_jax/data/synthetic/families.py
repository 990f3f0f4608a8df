"""The synthetic problem families: their parameters, and the PyTorch expression and CUDA body each
parameter set stands for. Which split each problem is in is decided in splits.py.

A family enumerates `Params`: the split `key` (what "never seen in training" means for it), the
shape, and the text pieces `render.py` assembles.
- elementwise: key = the chain of ops applied to `x`, e.g. `mul_y-tanh-add_c`: every chain of
  length 2 and 3 (no op twice in a row, at least one op that reads `y`), and a sample of
  `LONG_CHAINS` of the chains of length 4, drawn by the seed.
- activation: key = the activation.
- bias_act: key = (bias variant, activation): a bias parameter fused with an activation.
- reduction: key = the reduction kind (reductions.py).

Decision: one shape per key (two for the small activation and reduction families), picked by a
hash of the seed and key from a fixed menu, so no key appears under two shapes in different
splits, and the model sees shapes vary without them deciding anything. Every kernel handles any
size (grid-stride loops for rows, `numel` bounds for element-wise), so the verifier's input draws
cannot break them. Everything drawn (the length-4 sample, constants, shapes) is a function of
sha256 of the seed and the key, never of Python's salted hash() or a global RNG.

Decision: fp32 CUDA math that matches PyTorch within the verifier's fp32 tolerance (1e-4): plain
`expf`/`tanhf`/`erff`/`log1pf`, block reductions in shared memory, no fast-math intrinsics.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools

FAMILIES = ("elementwise", "activation", "bias_act", "reduction")
# Ops no training problem of any family uses: the "unseen op" split (splits.py), never the headline.
HELDOUT_ACTIVATIONS = ("relu6", "mish")
HELDOUT_REDUCTIONS = ("min", "log_softmax", "rmsnorm")
# Length-4 chains generated (of 3,858): with every chain of length 2 and 3 (468), about 1,450
# element-wise problems, so that SFT on its ~850 cannot learn them by heart in a few epochs.
LONG_CHAINS = 980
_ROWS = (16, 32, 64, 128)
_COLS = (64, 128, 256, 512, 1024)


@dataclasses.dataclass(frozen=True)
class Params:
  """One synthetic problem's parameters and the text pieces its files are made of."""

  family: str
  key: str  # the split key (see the module docstring)
  rows: int
  cols: int
  forward_args: tuple[str, ...]  # ModelNew/Model forward arguments (tensors)
  torch_expr: str  # what Model.forward returns
  cuda: str  # the kernel(s) and the host function `f` (inside `source`, after the include)
  call_args: tuple[str, ...]  # what ModelNew.forward passes to `ext.f`
  needs_functional: bool = False  # the reference uses `F.` (torch.nn.functional)
  bias: bool = False  # Model/ModelNew own `self.bias = nn.Parameter(torch.randn(c))`
  # The split (splits.SPLITS), set by splits.py: sft, rl, heldout or unseen_op.
  split: str = ""
  # Why a held-out problem is held out: "op" (an activation or reduction kind no training problem
  # uses: the unseen_op split) or "combination" (every op and adjacent op pair is seen in training,
  # never together: the heldout split). None: a training problem.
  novelty: str | None = None

  @property
  def heldout(self) -> bool:
    return self.novelty is not None

  @property
  def problem_id(self) -> str:
    return f"syn_{self.family}_{self.key}_{self.rows}x{self.cols}"

  @property
  def ops(self) -> tuple[str, ...]:
    """The parts the split rules speak of: a chain's ops in order, (variant, activation) of a
    bias_act pair, or the one activation or reduction kind."""
    return tuple(self.key.split("-", 1 if self.family == "bias_act" else -1))


def seeded_hash(seed: int, text: str) -> int:
  """A 64-bit number from sha256 of the seed and `text`: every draw of the generator."""
  return int.from_bytes(hashlib.sha256(f"{seed}:{text}".encode()).digest()[:8], "big")


def shapes(family: str, key: str, count: int, seed: int = 0) -> list[tuple[int, int]]:
  """`count` distinct (rows, cols) from the menu, chosen by a hash of the seed and key."""
  menu = list(itertools.product(_ROWS, _COLS))
  start = seeded_hash(seed, f"shape:{family}:{key}") % len(menu)
  step = 7  # coprime with the menu's 20 entries: distinct shapes
  return [menu[(start + i * step) % len(menu)] for i in range(count)]


# ---------------------------------------------------------------------------------- elementwise
# Each op maps the expression so far, `a` (PyTorch text, CUDA text, precedence), to a new one.
# Precedence: 3 atom/call, 2 product, 1 sum.
_CONSTANTS = {"add_c": ("1.0", "0.5"), "mul_c": ("2.0", "0.5", "3.0")}
_UNARY = {"abs": ("torch.abs", "fabsf"), "tanh": ("torch.tanh", "tanhf"), "sin": ("torch.sin", "sinf"),
          "relu": ("torch.relu", None)}
ELEMENTWISE_OPS = ("add_y", "sub_y", "mul_y", "add_c", "mul_c", "abs", "tanh", "sin", "relu")
_Y_OPS = ("add_y", "sub_y", "mul_y")


def _paren(text: str, prec: int, need: int) -> str:
  return text if prec >= need else f"({text})"


def _apply(op: str, py: str, cu: str, prec: int, const: str) -> tuple[str, str, int]:
  if op in _UNARY:
    fn_py, fn_cu = _UNARY[op]
    return f"{fn_py}({py})", (f"fmaxf({cu}, 0.0f)" if fn_cu is None else f"{fn_cu}({cu})"), 3
  sym, operand_py, operand_cu = {"add_y": ("+", "y", "y[i]"), "sub_y": ("-", "y", "y[i]"),
                                 "mul_y": ("*", "y", "y[i]"), "add_c": ("+", const, const + "f"),
                                 "mul_c": ("*", const, const + "f")}[op]
  need = 2 if sym == "*" else 1
  return (f"{_paren(py, prec, need)} {sym} {operand_py}", f"{_paren(cu, prec, need)} {sym} {operand_cu}", need)


def _valid_chains(n: int) -> list[tuple[str, ...]]:
  return [c for c in itertools.product(ELEMENTWISE_OPS, repeat=n)
          if all(a != b for a, b in zip(c, c[1:])) and set(c) & set(_Y_OPS)]


def elementwise_chains(seed: int = 0) -> list[tuple[str, ...]]:
  """Op chains applied to `x` that use `y` and never repeat an op back to back: every such chain of
  length 2 and 3, and the LONG_CHAINS of length 4 with the smallest seeded hashes."""
  long = sorted(_valid_chains(4), key=lambda c: seeded_hash(seed, "keep4:" + "-".join(c)))[:LONG_CHAINS]
  return _valid_chains(2) + _valid_chains(3) + sorted(long)


_EW_CUDA = """\
__global__ void k(const float* x, const float* y, float* o, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = {expr};
}}

torch::Tensor f(torch::Tensor x, torch::Tensor y) {{
    auto o = torch::empty_like(x);
    int n = x.numel();
    k<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), o.data_ptr<float>(), n);
    return o;
}}"""


def elementwise(seed: int = 0) -> list[Params]:
  out = []
  for chain in elementwise_chains(seed):
    key = "-".join(chain)
    py, cu, prec = "x", "x[i]", 3
    for j, op in enumerate(chain):
      options = _CONSTANTS.get(op, ("",))
      const = options[seeded_hash(seed, f"const:{key}:{j}") % len(options)]
      py, cu, prec = _apply(op, py, cu, prec, const)
    (rows, cols), = shapes("elementwise", key, 1, seed)
    out.append(Params("elementwise", key, rows, cols, ("x", "y"), py, _EW_CUDA.format(expr=cu), ("x", "y")))
  return out


# ----------------------------------------------------------------------------------- activations
# name -> (PyTorch call with {} for the argument, CUDA expression of the float `v`)
ACTIVATIONS = {
    "relu": ("torch.relu({})", "fmaxf(v, 0.0f)"),
    "sigmoid": ("torch.sigmoid({})", "1.0f / (1.0f + expf(-v))"),
    "tanh": ("torch.tanh({})", "tanhf(v)"),
    "gelu": ("F.gelu({})", "0.5f * v * (1.0f + erff(v * 0.70710678f))"),
    "silu": ("F.silu({})", "v / (1.0f + expf(-v))"),
    "leaky_relu": ("F.leaky_relu({}, 0.1)", "v > 0.0f ? v : 0.1f * v"),
    "elu": ("F.elu({})", "v > 0.0f ? v : expf(v) - 1.0f"),
    "softplus": ("F.softplus({})", "log1pf(expf(v))"),
    "hardtanh": ("F.hardtanh({})", "fminf(fmaxf(v, -1.0f), 1.0f)"),
    "hardsigmoid": ("F.hardsigmoid({})", "fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) / 6.0f"),
    "hardswish": ("F.hardswish({})", "v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) / 6.0f"),
    "softsign": ("F.softsign({})", "v / (1.0f + fabsf(v))"),
    "logsigmoid": ("F.logsigmoid({})", "-log1pf(expf(-v))"),
    "relu6": ("F.relu6({})", "fminf(fmaxf(v, 0.0f), 6.0f)"),
    "mish": ("F.mish({})", "v * tanhf(log1pf(expf(v)))"),
}

_ACT_CUDA = """\
__global__ void k(const float* x, float* o, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {{
        float v = x[i];
        o[i] = {expr};
    }}
}}

torch::Tensor f(torch::Tensor x) {{
    auto o = torch::empty_like(x);
    int n = x.numel();
    k<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), o.data_ptr<float>(), n);
    return o;
}}"""


def activation(seed: int = 0) -> list[Params]:
  out = []
  for name, (py, cu) in ACTIVATIONS.items():
    for rows, cols in shapes("activation", name, 2, seed):
      out.append(Params("activation", name, rows, cols, ("x",), py.format("x"), _ACT_CUDA.format(expr=cu), ("x",),
                        needs_functional=py.startswith("F.")))
  return out


# ------------------------------------------------------------------------------ bias + activation
# variant -> (PyTorch text of the pre-activation with {x} {b}, CUDA text with the float `v` = x[i])
BIAS_VARIANTS = {"add": ("x + self.bias", "x[i] + b[i % c]"), "sub": ("x - self.bias", "x[i] - b[i % c]"),
                 "mul": ("x * self.bias", "x[i] * b[i % c]"), "post": None}

_BIAS_CUDA = """\
__global__ void k(const float* x, const float* b, float* o, int n, int c) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {{
        float v = {pre};
        o[i] = {expr};
    }}
}}

torch::Tensor f(torch::Tensor x, torch::Tensor b) {{
    auto o = torch::empty_like(x);
    int n = x.numel();
    k<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), b.data_ptr<float>(), o.data_ptr<float>(), n, b.numel());
    return o;
}}"""


def bias_act(seed: int = 0) -> list[Params]:
  out = []
  for variant, act in itertools.product(BIAS_VARIANTS, ACTIVATIONS):
    act_py, act_cu = ACTIVATIONS[act]
    key = f"{variant}-{act}"
    if variant == "post":  # act(x) + bias
      py, pre, expr = f"{act_py.format('x')} + self.bias", "x[i]", f"{_paren_cuda(act_cu)} + b[i % c]"
    else:
      py_pre, pre = BIAS_VARIANTS[variant]
      py, expr = act_py.format(py_pre), act_cu
    (rows, cols), = shapes("bias_act", key, 1, seed)
    out.append(Params("bias_act", key, rows, cols, ("x",), py,
                      _BIAS_CUDA.format(pre=pre, expr=expr), ("x", "self.bias"),
                      needs_functional=act_py.startswith("F."), bias=True))
  return out


def _paren_cuda(expr: str) -> str:
  """`expr` safe as the left operand of `+`: only the ternaries bind looser (the others' top-level
  operators are `*`, `/` or a unary minus)."""
  return f"({expr})" if "?" in expr else expr
