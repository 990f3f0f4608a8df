"""The `reduction` family: row reductions over the last dimension of a (rows, cols) float tensor.

Every answer has the same shape: one block of 256 threads per row, a strided loop over the row,
and `red(a, max?)`, a shared-memory tree reduction over the block (written once, identically, in
every answer, so the model learns one helper and the per-kind arithmetic around it). Kinds that
return one value per row write it from thread 0; the others write the whole row.

The unseen-op split (`families.HELDOUT_REDUCTIONS`, splits.py): min, log_softmax and rmsnorm, kinds
never seen in training (each has a seen relative: max, softmax + logsumexp, layernorm + l2norm).
"""

from __future__ import annotations

from dice_jax.data.synthetic import families

_LOOP = "for (int j = threadIdx.x; j < C; j += 256)"
_SUM = f"""    float a = 0.0f;
    {_LOOP} a += {{term}};
"""
_MAX_SUM = f"""    float m = -INFINITY;
    {_LOOP} m = fmaxf(m, r[j]);
    m = red(m, true);
    float a = 0.0f;
    {_LOOP} a += expf(r[j] - m);
    a = red(a, false);
"""
_ONE = "    if (threadIdx.x == 0) o[blockIdx.x] = {value};\n"
_ROW = f"    {_LOOP} q[j] = {{value}};\n"

# kind -> (PyTorch expression of x, writes whole rows?, CUDA body after `r` (and `q`) are set)
KINDS = {
    "sum": ("x.sum(dim=-1)", False, _SUM.format(term="r[j]") + "    a = red(a, false);\n" + _ONE.format(value="a")),
    "mean": ("x.mean(dim=-1)", False,
             _SUM.format(term="r[j]") + "    a = red(a, false);\n" + _ONE.format(value="a / C")),
    "sumsq": ("(x * x).sum(dim=-1)", False,
              _SUM.format(term="r[j] * r[j]") + "    a = red(a, false);\n" + _ONE.format(value="a")),
    "max": ("x.amax(dim=-1)", False,
            f"    float a = -INFINITY;\n    {_LOOP} a = fmaxf(a, r[j]);\n    a = red(a, true);\n"
            + _ONE.format(value="a")),
    "min": ("x.amin(dim=-1)", False,
            f"    float a = INFINITY;\n    {_LOOP} a = fminf(a, r[j]);\n    a = -red(-a, true);\n"
            + _ONE.format(value="a")),
    "logsumexp": ("torch.logsumexp(x, dim=-1)", False, _MAX_SUM + _ONE.format(value="m + logf(a)")),
    "softmax": ("torch.softmax(x, dim=-1)", True, _MAX_SUM + _ROW.format(value="expf(r[j] - m) / a")),
    "log_softmax": ("torch.log_softmax(x, dim=-1)", True,
                    _MAX_SUM + "    float l = m + logf(a);\n" + _ROW.format(value="r[j] - l")),
    "layernorm": ("F.layer_norm(x, x.shape[-1:])", True,
                  _SUM.format(term="r[j]") + "    float m = red(a, false) / C;\n    a = 0.0f;\n"
                  f"    {_LOOP} a += (r[j] - m) * (r[j] - m);\n"
                  "    float s = rsqrtf(red(a, false) / C + 1e-5f);\n" + _ROW.format(value="(r[j] - m) * s")),
    "rmsnorm": ("F.rms_norm(x, x.shape[-1:], eps=1e-5)", True,
                _SUM.format(term="r[j] * r[j]") + "    float s = rsqrtf(red(a, false) / C + 1e-5f);\n"
                + _ROW.format(value="r[j] * s")),
    "l2norm": ("F.normalize(x, dim=-1)", True,
               _SUM.format(term="r[j] * r[j]") + "    float s = 1.0f / fmaxf(sqrtf(red(a, false)), 1e-12f);\n"
               + _ROW.format(value="r[j] * s")),
}

_HELPER = """\
__device__ float red(float a, bool mx) {
    __shared__ float s[256];
    int t = threadIdx.x;
    s[t] = a;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (t < h) s[t] = mx ? fmaxf(s[t], s[t + h]) : s[t] + s[t + h];
        __syncthreads();
    }
    a = s[0];
    __syncthreads();
    return a;
}
"""

_CUDA = """{helper}
__global__ void k(const float* x, float* o, int C) {{
    const float* r = x + (long)blockIdx.x * C;
{row}{body}}}

torch::Tensor f(torch::Tensor x) {{
    int R = x.size(0), C = x.size(1);
    auto o = {alloc};
    k<<<R, 256>>>(x.data_ptr<float>(), o.data_ptr<float>(), C);
    return o;
}}"""


def reduction(seed: int = 0) -> list[families.Params]:
  out = []
  for kind, (py, rows_out, body) in KINDS.items():
    cuda = _CUDA.format(helper=_HELPER, body=body,
                        row="    float* q = o + (long)blockIdx.x * C;\n" if rows_out else "",
                        alloc="torch::empty_like(x)" if rows_out else "torch::empty({R}, x.options())")
    for rows, cols in families.shapes("reduction", kind, 2, seed):
      out.append(families.Params("reduction", kind, rows, cols, ("x",), py, cuda, ("x",),
                                 needs_functional=py.startswith("F.")))
  return out
