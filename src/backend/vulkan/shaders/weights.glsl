// Weight element (row, k) of a product's chunk, in the variant's format (WEIGHTS_F32 / WEIGHTS_BF16 /
// WEIGHTS_Q8 / WEIGHTS_Q4). Included after the shader declares `w`, `scales` and a push constant with
// `cols`; the layouts are VulkanBackend::prepare_weight's.
#if defined(WEIGHTS_Q4)
// q4: rows of whole blocks of 32 values, 8 nibbles per uint (lowest first) holding q + 8; one f16
// scale per block, two per uint (low half first). Row-major, not the CPU kernels' superblocks: a
// lane reading consecutive k reads consecutive words.
float weight_at(uint row, uint k) {
  const uint blocks = (cols + 31u) / 32u, block = row * blocks + k / 32u;
  const uint code = (w[row * blocks * 4u + k / 8u] >> (4u * (k & 7u))) & 15u;
  const vec2 pair = unpackHalf2x16(scales[block >> 1]);
  return float(int(code) - 8) * ((block & 1u) != 0u ? pair.y : pair.x);
}
#else
float weight_at(uint row, uint k) {
  const uint index = row * cols + k;
#if defined(WEIGHTS_BF16)
  return bf16_at(w[index >> 1], index);
#elif defined(WEIGHTS_Q8)
  return int8_at(w[index >> 2], index) * scales[row * ((cols + 31u) / 32u) + k / 32u];
#else
  return uintBitsToFloat(w[index]);
#endif
}
#endif
