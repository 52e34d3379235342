// megac's elementwise formulas on the device: the same as the CPU kernels
// (runtime/src/kernels.h): GeLU in float with tanh, its gradient in double,
// bf16 rounding to nearest even (NaN stays NaN, overflow to infinity).
//
// One text for both users: the CUDA backend includes this file, and the
// compiler embeds it (at build time) at the top of every kernel it
// generates for --target cuda, which NVRTC compiles without includes. So
// it must stand alone: no #include, no macros from elsewhere.
__device__ __forceinline__ float megac_gelu(float v) {
  const float c = 0.7978845608028654f;
  return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
}
__device__ __forceinline__ float megac_gelu_grad(float x, float dy) {
  const double c = 0.7978845608028654, a = 0.044715;
  const double v = x;
  const double t = tanh(c * (v + a * v * v * v));
  const double d =
      0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * a * v * v);
  return (float)((double)dy * d);
}
/// The value of bf16 bits (fp32's upper half).
__device__ __forceinline__ float megac_bf16_value(unsigned short bits) {
  return __uint_as_float((unsigned)bits << 16);
}
__device__ __forceinline__ float megac_round_bf16(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    if (u & 0x007fffffu)
      u |= 0x00400000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  return __uint_as_float(u & 0xffff0000u);
}
