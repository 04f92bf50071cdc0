// write_rows.cu: scatter K/V rows into the paged cache, quantising to fp8 when the cache is fp8.
//
// Kernels
//   write_rows_kernel<Src, Dst, VEC>  one launch writes rows (l, t) of a [L, T, H, D] source into
//       a cache of L layers at slot[t] (block = slot / BS, offset = slot % BS): a stacked tensor
//       [L, NB, BS, H, D] or one tensor per layer through a device table of layer bases.
//       write_kv is L = 1 without a mask; commit is every layer with commit_mask[t] in ONE launch.
//       VEC > 1: 16-byte loads (VEC = 16 / max(sizeof Src, sizeof Dst) elements) when every row
//       start is aligned; VEC = 1: one element per access otherwise (odd head sizes, offsets).
//
// Values: same format -> raw bits; other float format -> round to nearest even (torch .to());
// fp8 -> cvt.rn.satfinite(float(x) / scale), which equals torch's
// (x.float() / scale).clamp(-fmax, fmax).to(fp8) bit for bit (both round to nearest even, and
// saturating equals clamping then rounding). The division is IEEE (no fast math).
//
// Thread mapping: a row has H * D / VEC units; a block of up to 256 threads covers
// rows_per_block rows with threads_per_row threads each (looping when a row has more units).
// Each thread loads its K and V units before storing either, so two loads are in flight.
// (Tried: two units per thread and source loads issued before the slot is known; measured on
// an H200 it cost +0.3 us at 8 tokens and nothing at 4096, so this simpler form stays.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "device_util.cuh"
#include "nwor_kernels.h"

namespace nwor {
namespace {

constexpr int kThreads = 256;

// Formats: Storage is the raw bits; to_float / from_float convert like torch.
struct F32 {
  using Storage = uint32_t;
  static constexpr Elem kElem = Elem::F32;
  __device__ static float to_float(Storage b) { return __uint_as_float(b); }
  __device__ static Storage from_float(float f, float) { return __float_as_uint(f); }
};
struct F16 {
  using Storage = uint16_t;
  static constexpr Elem kElem = Elem::F16;
  __device__ static float to_float(Storage b) { return __half2float(__ushort_as_half(b)); }
  __device__ static Storage from_float(float f, float) { return __half_as_ushort(__float2half_rn(f)); }
};
struct BF16 {
  using Storage = uint16_t;
  static constexpr Elem kElem = Elem::BF16;
  __device__ static float to_float(Storage b) { return __uint_as_float(uint32_t(b) << 16); }
  __device__ static Storage from_float(float f, float) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
};
struct E4M3 {
  using Storage = uint8_t;
  static constexpr Elem kElem = Elem::E4M3;
  __device__ static Storage from_float(float f, float scale) {
    return __nv_cvt_float_to_fp8(f / scale, __NV_SATFINITE, __NV_E4M3);
  }
};
struct E5M2 {
  using Storage = uint8_t;
  static constexpr Elem kElem = Elem::E5M2;
  __device__ static Storage from_float(float f, float scale) {
    return __nv_cvt_float_to_fp8(f / scale, __NV_SATFINITE, __NV_E5M2);
  }
};

template <class Dst> __host__ __device__ constexpr bool is_fp8() {
  return Dst::kElem == Elem::E4M3 || Dst::kElem == Elem::E5M2;
}

template <class Src, class Dst, int VEC>
__global__ void __launch_bounds__(kThreads)
write_rows_kernel(const RowWriteParams p, int threads_per_row, int rows_per_block) {
  using SrcS = typename Src::Storage;
  using DstS = typename Dst::Storage;
  using LoadT = typename RawBits<VEC * sizeof(SrcS)>::T;
  using StoreT = typename RawBits<VEC * sizeof(DstS)>::T;
  constexpr bool kRaw = Src::kElem == Dst::kElem;

  const int r = threadIdx.x / threads_per_row;
  const int lane = threadIdx.x - r * threads_per_row;
  const int64_t row = int64_t(blockIdx.x) * rows_per_block + r;
  if (r >= rows_per_block || row >= int64_t(p.num_layers) * p.num_tokens) return;
  const int l = int(row / p.num_tokens);
  const int t = int(row - int64_t(l) * p.num_tokens);
  if (p.mask != nullptr && !p.mask[t]) return;  // rejected rows are never read
  const int64_t slot = load_index(p.slots, p.slots_is64, t);
  if (slot < 0 || slot >= p.num_slots) return;  // -1 = padding; out of range never written
  const uint32_t us = uint32_t(slot);
  const uint32_t block = us / uint32_t(p.block_size);
  const uint32_t offset = us - block * uint32_t(p.block_size);

  DstS* layer_cache[2];
#pragma unroll
  for (int kv = 0; kv < 2; ++kv)
    layer_cache[kv] = reinterpret_cast<DstS*>(layer_base(p.cache[kv], p.layer_ptrs, kv, p.num_layers, l,
                                                         p.cache_stride[kv][0] * int64_t(sizeof(DstS))));

  const int vecs_per_head = p.head_size / VEC;
  const int row_units = p.num_heads * vecs_per_head;
  for (int u = lane; u < row_units; u += threads_per_row) {
    const int h = u / vecs_per_head;
    const int e = (u - h * vecs_per_head) * VEC;  // element within the head
    alignas(16) SrcS in[2][VEC];
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      const SrcS* src = static_cast<const SrcS*>(p.src[kv]) + l * p.src_stride[kv][0] +
                        t * p.src_stride[kv][1] + h * p.src_stride[kv][2] + e;
      *reinterpret_cast<LoadT*>(in[kv]) = *reinterpret_cast<const LoadT*>(src);
    }
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      DstS* dst = layer_cache[kv] + int64_t(block) * p.cache_stride[kv][1] +
                  int64_t(offset) * p.cache_stride[kv][2] + h * p.cache_stride[kv][3] + e;
      alignas(16) DstS out[VEC];
      if constexpr (kRaw) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] = in[kv][i];
      } else {
        float scale = 1.0f;
        if constexpr (is_fp8<Dst>()) scale = p.scale[kv][l * p.scale_stride[kv][0] + h * p.scale_stride[kv][1]];
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] = Dst::from_float(Src::to_float(in[kv][i]), scale);
      }
      *reinterpret_cast<StoreT*>(dst) = *reinterpret_cast<const StoreT*>(out);
    }
  }
}

// True when every row start of sources and caches (every layer's, through addr_bits) is aligned
// to VEC elements.
template <class Src, class Dst, int VEC>
bool can_vectorise(const RowWriteParams& p) {
  if (p.head_size % VEC != 0) return false;
  for (int kv = 0; kv < 2; ++kv) {
    if (reinterpret_cast<uintptr_t>(p.src[kv]) % (VEC * sizeof(typename Src::Storage)) != 0) return false;
    if (p.addr_bits[kv] % (VEC * sizeof(typename Dst::Storage)) != 0) return false;
    for (int d = 0; d < 3; ++d)
      if (p.src_stride[kv][d] % VEC != 0) return false;
    for (int d = 0; d < 4; ++d)
      if (p.cache_stride[kv][d] % VEC != 0) return false;
  }
  return true;
}

template <class Src, class Dst, int VEC>
cudaError_t launch(const RowWriteParams& p, cudaStream_t stream) {
  const int row_units = p.num_heads * (p.head_size / VEC);
  const int threads_per_row = row_units < kThreads ? row_units : kThreads;
  const int rows_per_block = kThreads / threads_per_row;
  const int64_t rows = int64_t(p.num_layers) * p.num_tokens;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  write_rows_kernel<Src, Dst, VEC>
      <<<dim3(unsigned(blocks)), dim3(rows_per_block * threads_per_row), 0, stream>>>(
          p, threads_per_row, rows_per_block);
  return cudaGetLastError();
}

template <class Src, class Dst>
cudaError_t dispatch_vec(const RowWriteParams& p, cudaStream_t stream) {
  constexpr int kVecBytes = sizeof(typename Src::Storage) > sizeof(typename Dst::Storage)
                                ? sizeof(typename Src::Storage)
                                : sizeof(typename Dst::Storage);
  constexpr int VEC = 16 / kVecBytes;
  if (can_vectorise<Src, Dst, VEC>(p)) return launch<Src, Dst, VEC>(p, stream);
  return launch<Src, Dst, 1>(p, stream);
}

template <class Src>
cudaError_t dispatch_dst(const RowWriteParams& p, cudaStream_t stream) {
  switch (p.cache_elem) {
    case Elem::F32: return dispatch_vec<Src, F32>(p, stream);
    case Elem::F16: return dispatch_vec<Src, F16>(p, stream);
    case Elem::BF16: return dispatch_vec<Src, BF16>(p, stream);
    case Elem::E4M3: return dispatch_vec<Src, E4M3>(p, stream);
    case Elem::E5M2: return dispatch_vec<Src, E5M2>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_write_rows(const RowWriteParams& p, cudaStream_t stream) {
  if (int64_t(p.num_layers) * p.num_tokens == 0 || p.num_heads == 0 || p.head_size == 0) return cudaSuccess;
  switch (p.src_elem) {
    case Elem::F32: return dispatch_dst<F32>(p, stream);
    case Elem::F16: return dispatch_dst<F16>(p, stream);
    case Elem::BF16: return dispatch_dst<BF16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace nwor
