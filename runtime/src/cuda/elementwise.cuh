// megac's elementwise formulas, one text for every backend: GeLU and its
// gradient (tanh form, in float), bf16 rounding to nearest even (NaN
// stays NaN, overflow to infinity), and one element of an AdamW update.
//
// Its users:
// - the CUDA backend includes it (compiled by nvcc, or as host C++ on the
//   emulation);
// - the compiler embeds it (at build time) at the top of every kernel it
//   generates for --target cuda, which NVRTC compiles without includes, so
//   it must stand alone: no #include, no macros from elsewhere;
// - the CPU kernels (runtime/src/kernels.h) include it, so that the CPU
//   backend computes the same formulas as the device.
//
// Everything here is plain float arithmetic (AdamW's moments and update
// in double), conversions and selects, with IEEE square roots and
// divisions (nvcc's and NVRTC's defaults, -prec-sqrt and -prec-div):
// loops over it vectorize on the CPU, and the CPU and the emulation give
// the same bits (nvcc may contract products and sums into FMAs, so a GPU's
// bits may differ by rounding).
#ifndef MEGAC_ELEMENTWISE_CUH
#define MEGAC_ELEMENTWISE_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define MEGAC_ELEMENTWISE_FN __device__ __forceinline__
__device__ __forceinline__ unsigned megac_float_bits(float x) {
  return __float_as_uint(x);
}
__device__ __forceinline__ float megac_bits_float(unsigned u) {
  return __uint_as_float(u);
}
__device__ __forceinline__ float megac_sqrtf(float x) { return sqrtf(x); }
#else
#define MEGAC_ELEMENTWISE_FN inline
inline unsigned megac_float_bits(float x) {
  unsigned u;
  __builtin_memcpy(&u, &x, 4);
  return u;
}
inline float megac_bits_float(unsigned u) {
  float x;
  __builtin_memcpy(&x, &u, 4);
  return x;
}
inline float megac_sqrtf(float x) { return __builtin_sqrtf(x); }
#endif

/// e^y within 1.3 ulp for y in [-87.3, 88.7] (measured against long
/// double over the range), 0 below; y above is taken as 88.7. Cody-Waite
/// reduction y = n ln2 + r, |r| <= ln2 / 2, and Taylor's polynomial of
/// degree 7 (its remainder is under 6e-9 relative there).
MEGAC_ELEMENTWISE_FN float megac_exp(float y) {
  const float log2e = 1.44269504088896341f;
  const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer with
  // float arithmetic alone (no floor, which SSE2 lacks).
  const float round_magic = 12582912.0f;
  // Clamped with selects, not fminf and fmaxf, whose NaN rules keep
  // compilers from vectorizing them; a NaN y gives a NaN polynomial.
  const float y_low = y < -87.3f ? -87.3f : y;
  const float yc = y_low > 88.7f ? 88.7f : y_low;
  const float nf = (yc * log2e + round_magic) - round_magic;
  const float r = (yc - nf * ln2_hi) - nf * ln2_lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n as two factors, so that n = 128 does not overflow the exponent.
  const int n = (int)nf, n1 = n >> 1, n2 = n - n1;
  const float e = p * megac_bits_float((unsigned)(n1 + 127) << 23) *
                  megac_bits_float((unsigned)(n2 + 127) << 23);
  return y < -87.3f ? 0.0f : e;
}

/// 1 - tanh(|u|) = 2 / (e^(2|u|) + 1), and 0 for |u| > 44, where it is
/// below float's normal range. GeLU needs 1 + tanh(u) and its gradient
/// 1 - tanh(u) too; taking them from this instead of from tanh avoids the
/// cancellation of 1 + tanh(u) where tanh(u) is near -1.
MEGAC_ELEMENTWISE_FN float megac_one_minus_tanh_abs(float u) {
  const float twice = 2.0f * fabsf(u);
  const float q = 2.0f / (megac_exp(twice) + 1.0f);
  return twice > 88.0f ? 0.0f : q;
}

/// GeLU's tanh approximation, as GPT-2 uses:
/// 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))).
MEGAC_ELEMENTWISE_FN float megac_gelu(float v) {
  const float c = 0.7978845608028654f, a = 0.044715f;
  const float u = c * (v + a * v * v * v);
  const float q = megac_one_minus_tanh_abs(u);
  const float one_plus_t = u >= 0.0f ? 2.0f - q : q;
  return 0.5f * v * one_plus_t;
}

/// dy * gelu'(x) for the tanh approximation:
/// 0.5 (1 + t) + 0.5 x (1 - t)(1 + t) c (1 + 3 a x^2), t = tanh(u).
/// For |u| > 44 (|x| above about 9.6) it is 1 or 0 to within float's
/// range; taking those there also keeps x^2 from overflowing (0 * inf).
MEGAC_ELEMENTWISE_FN float megac_gelu_grad(float x, float dy) {
  const float c = 0.7978845608028654f, a = 0.044715f;
  const float u = c * (x + a * x * x * x);
  const float q = megac_one_minus_tanh_abs(u);
  const float one_plus_t = u >= 0.0f ? 2.0f - q : q;
  const float one_minus_t = u >= 0.0f ? q : 2.0f - q;
  const float d = 0.5f * one_plus_t + 0.5f * x * one_minus_t * one_plus_t *
                                          c * (1.0f + 3.0f * a * x * x);
  const float tail = u >= 0.0f ? 1.0f : 0.0f;
  return dy * (fabsf(u) > 44.0f ? tail : d);
}

/// The value of bf16 bits (fp32's upper half).
MEGAC_ELEMENTWISE_FN float megac_bf16_value(unsigned short bits) {
  return megac_bits_float((unsigned)bits << 16);
}
MEGAC_ELEMENTWISE_FN float megac_round_bf16(float x) {
  unsigned u = megac_float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    if (u & 0x007fffffu)
      u |= 0x00400000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  return megac_bits_float(u & 0xffff0000u);
}

/// One tensor's AdamW constants for a step: the clipping coefficient c,
/// the learning rate, the betas, the weight decay, and the bias
/// corrections' reciprocals 1 / (1 - beta^t) and eps in float.
struct megac_adamw_step {
  double c, lr, beta1, beta2, weight_decay;
  float inv_bc1, inv_bc2, eps;
};

/// One element of an AdamW update (megac.adamw): the moments of gradient
/// g c in double, stored in float; the step's ratio m^ / (sqrt(v^) + eps)
/// in float; the parameter's decay and step in double, stored in float.
/// (The ratio in float, as PyTorch's fused AdamW computes it all: a
/// double square root and two double divisions an element made the
/// update bound by a GPU's double arithmetic, not its memory. The ratio's
/// rounding, about 1e-7 of it, moves the parameter by about 1e-7 of the
/// step lr |ratio|: below the parameter's own float rounding wherever |p|
/// exceeds about that step.)
MEGAC_ELEMENTWISE_FN void megac_adamw(const megac_adamw_step &s, float &param,
                                      float grad, float &m, float &v) {
  const double g = double(grad) * s.c;
  m = float(s.beta1 * m + (1.0 - s.beta1) * g);
  v = float(s.beta2 * v + (1.0 - s.beta2) * g * g);
  const float ratio = (m * s.inv_bc1) / (megac_sqrtf(v * s.inv_bc2) + s.eps);
  const double p = param;
  param = float(p - s.lr * (double(ratio) + s.weight_decay * p));
}

#ifndef __CUDACC_RTC__
/// (Host code, the CPU's kernels and the CUDA backend alike:) step t's
/// constants, given beta1^t and beta2^t.
inline megac_adamw_step megac_adamw_constants(double c, double lr, double beta1,
                                              double beta2, double eps,
                                              double weight_decay,
                                              double beta1_t, double beta2_t) {
  return {c,
          lr,
          beta1,
          beta2,
          weight_decay,
          float(1.0 / (1.0 - beta1_t)),
          float(1.0 / (1.0 - beta2_t)),
          float(eps)};
}
#endif

#endif // MEGAC_ELEMENTWISE_CUH
