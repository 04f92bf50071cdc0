// device_util.cuh: small device helpers shared by the kernels (CUDA sources only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace nwor {

// Raw-bits type of N bytes: copies through it move bytes unchanged (fp8 and NaN payloads too).
template <int N> struct RawBits;
template <> struct RawBits<16> { using T = uint4; };
template <> struct RawBits<8> { using T = uint2; };
template <> struct RawBits<4> { using T = uint32_t; };
template <> struct RawBits<2> { using T = uint16_t; };
template <> struct RawBits<1> { using T = uint8_t; };

// Element i of an int32 or int64 index tensor (slots, token ids, offsets).
__device__ __forceinline__ int64_t load_index(const void* p, int is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

// Base of layer l of cache kv (0 = key, 1 = value): an entry of the per-layer table [2, L] when
// the caches are separate tensors, else an offset into the stacked tensor.
__device__ __forceinline__ char* layer_base(void* stacked, const int64_t* layer_ptrs, int kv, int num_layers,
                                            int l, int64_t layer_stride_bytes) {
  if (layer_ptrs != nullptr) return reinterpret_cast<char*>(layer_ptrs[kv * num_layers + l]);
  return static_cast<char*>(stacked) + l * layer_stride_bytes;
}

}  // namespace nwor
