// slot_log.cu: copy-on-write support: log cache rows at given slots, and restore them.
//
// Kernels
//   slot_copy_kernel<kBytes, kRestore>  raw-byte copy of rows (l, i) between a cache of L layers
//       (a stacked [L, NB, BS, H, D] tensor, or one [NB, BS, H, D] tensor per layer through a device
//       table of layer bases; logical NHD, any strides, D contiguous) and a contiguous log
//       [L, n, H, D] of the same storage dtype. kRestore = false (log_slots): log <- cache, rows of
//       invalid slots (-1, out of range) become zeros. kRestore = true (restore_slots):
//       cache <- log, invalid slots skipped. Both K and V in one launch, all layers.
//       kBytes (one RawBits access) is the widest of 16/8/4/2/1 bytes that divides the head row's bytes, every stride
//       and both base pointers, so fp8 and odd head sizes stay exact and as wide as alignment allows.
#include <cuda_runtime.h>

#include <cstdint>

#include "device_util.cuh"
#include "nwor_kernels.h"

namespace nwor {
namespace {

constexpr int kThreads = 256;

template <int kBytes, bool kRestore>
__global__ void __launch_bounds__(kThreads)
slot_copy_kernel(const SlotCopyParams p, int threads_per_row, int rows_per_block) {
  using T = typename RawBits<kBytes>::T;
  const int r = threadIdx.x / threads_per_row;
  const int lane = threadIdx.x - r * threads_per_row;
  const int64_t row = int64_t(blockIdx.x) * rows_per_block + r;
  if (r >= rows_per_block || row >= int64_t(p.num_layers) * p.num_slots_logged) return;
  const int l = int(row / p.num_slots_logged);
  const int i = int(row - int64_t(l) * p.num_slots_logged);
  const int64_t slot = load_index(p.slots, p.slots_is64, i);
  const bool valid = slot >= 0 && slot < p.num_slots;
  if (kRestore && !valid) return;
  const uint32_t us = valid ? uint32_t(slot) : 0u;
  const uint32_t block = us / uint32_t(p.block_size);
  const uint32_t offset = us - block * uint32_t(p.block_size);

  const int head_bytes = p.head_size * p.elem_bytes;
  const int chunks_per_head = head_bytes / kBytes;
  const int row_chunks = p.num_heads * chunks_per_head;
  const int64_t log_row = row * int64_t(p.num_heads) * head_bytes;  // byte offset of log[l, i]
  char* layer_cache[2];
#pragma unroll
  for (int kv = 0; kv < 2; ++kv)
    layer_cache[kv] = layer_base(p.cache[kv], p.layer_ptrs, kv, p.num_layers, l,
                                 p.cache_stride[kv][0] * int64_t(p.elem_bytes));
  for (int u = lane; u < row_chunks; u += threads_per_row) {
    const int h = u / chunks_per_head;
    const int64_t byte_in_head = int64_t(u - h * chunks_per_head) * kBytes;
    char* cache[2];
    char* log[2];
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      cache[kv] = layer_cache[kv] + byte_in_head +
                  (int64_t(block) * p.cache_stride[kv][1] + int64_t(offset) * p.cache_stride[kv][2] +
                   h * p.cache_stride[kv][3]) * p.elem_bytes;
      log[kv] = static_cast<char*>(p.log[kv]) + log_row + int64_t(h) * head_bytes + byte_in_head;
    }
    T v[2];
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      if constexpr (kRestore) v[kv] = *reinterpret_cast<const T*>(log[kv]);
      else v[kv] = valid ? *reinterpret_cast<const T*>(cache[kv]) : T{};
    }
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) *reinterpret_cast<T*>(kRestore ? cache[kv] : log[kv]) = v[kv];
  }
}

template <int kBytes>
bool chunk_fits(const SlotCopyParams& p) {
  if ((p.head_size * p.elem_bytes) % kBytes != 0) return false;
  for (int kv = 0; kv < 2; ++kv) {
    if (p.addr_bits[kv] % kBytes != 0) return false;
    if (reinterpret_cast<uintptr_t>(p.log[kv]) % kBytes != 0) return false;
    for (int d = 0; d < 4; ++d)
      if ((p.cache_stride[kv][d] * p.elem_bytes) % kBytes != 0) return false;
  }
  return true;
}

template <int kBytes>
cudaError_t launch(const SlotCopyParams& p, cudaStream_t stream) {
  const int row_chunks = p.num_heads * (p.head_size * p.elem_bytes / kBytes);
  const int threads_per_row = row_chunks < kThreads ? row_chunks : kThreads;
  const int rows_per_block = kThreads / threads_per_row;
  const int64_t rows = int64_t(p.num_layers) * p.num_slots_logged;
  const dim3 grid(unsigned((rows + rows_per_block - 1) / rows_per_block));
  const dim3 block(rows_per_block * threads_per_row);
  if (p.restore)
    slot_copy_kernel<kBytes, true><<<grid, block, 0, stream>>>(p, threads_per_row, rows_per_block);
  else
    slot_copy_kernel<kBytes, false><<<grid, block, 0, stream>>>(p, threads_per_row, rows_per_block);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_slot_copy(const SlotCopyParams& p, cudaStream_t stream) {
  if (int64_t(p.num_layers) * p.num_slots_logged == 0 || p.num_heads == 0 || p.head_size == 0)
    return cudaSuccess;
  if (chunk_fits<16>(p)) return launch<16>(p, stream);
  if (chunk_fits<8>(p)) return launch<8>(p, stream);
  if (chunk_fits<4>(p)) return launch<4>(p, stream);
  if (chunk_fits<2>(p)) return launch<2>(p, stream);
  return launch<1>(p, stream);
}

}  // namespace nwor
