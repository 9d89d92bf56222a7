// Helpers shared by the compute shaders: weight element decoding and bf16 rounding.

// Element `index` of a bf16 array packed two per uint (low half first).
float bf16_at(uint word, uint index) {
  const uint bits = (index & 1u) != 0u ? (word >> 16) : (word & 0xFFFFu);
  return uintBitsToFloat(bits << 16);
}

// Element `index` of an int8 array packed four per uint (lowest byte first), as a signed value.
float int8_at(uint word, uint index) {
  const uint shift = 8u * (index & 3u);
  return float(int(word << (24u - shift)) >> 24);
}

// Round to nearest even bf16 bits (as float_to_bf16 does on the host).
uint bf16_bits(float value) {
  const uint bits = floatBitsToUint(value);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0u) return (bits >> 16) | 0x40u;  // NaN stays NaN
  return (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
}

// GELU with the tanh approximation, as x * sigmoid(2u): equal to 0.5 x (1 + tanh(u)) and safe from
// tanh's overflow for large |u|.
float gelu_tanh(float x) {
  const float u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return x / (1.0 + exp(-2.0 * u));
}
