#ifndef LOHAN_CLIENT_CHECKPOINT_DTYPE_H_
#define LOHAN_CLIENT_CHECKPOINT_DTYPE_H_

// The element types of safetensors files: their sizes (to check a header's
// offsets against its shapes) and the three lohan reads as fp32.

#include <cstdint>
#include <string_view>

namespace lohan::checkpoint {

// Bits per element of safetensors dtype `name` ("F32": 32, "BF16": 16,
// "F4": 4, ...); 0 for a name the format does not define.
uint32_t DtypeBits(std::string_view name);

// Whether lohan reads tensors of dtype `name` as fp32: F32, BF16, F16.
bool ReadsAsFloat(std::string_view name);

// One bf16 / fp16 value as the fp32 it is, exactly (fp16 subnormals, signed
// zeros, infinities; a NaN stays a NaN of the same sign and payload).
float Bf16ToFloat(uint16_t bits);
float F16ToFloat(uint16_t bits);

// `count` little-endian elements of dtype `name` at `in` into `out`.
// REQUIRES: ReadsAsFloat(name); `in` holds count * DtypeBits(name) / 8
// bytes (any alignment).
void ConvertToFloat(std::string_view name, const void* in, uint64_t count,
                    float* out);

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_DTYPE_H_
