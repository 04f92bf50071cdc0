// nwor_kernels.h: the boundary between the torch bindings (ops.cpp) and the CUDA kernels (*.cu).
//
// The .cu files include only this header and CUDA's own headers (no torch), so nvcc's device
// passes never parse ATen: that keeps the JIT build short. Every parameter block carries raw
// pointers and element strides; ops.cpp checks the tensors and fills them in.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace nwor {

// Element formats the kernels know. Sources are F32/F16/BF16; caches may also be fp8.
enum class Elem : int { F32 = 0, F16 = 1, BF16 = 2, E4M3 = 3, E5M2 = 4 };

// Write rows of a [L, T, H, D] source into a paged cache of L layers, each [NB, BS, H, D] (logical
// NHD, any strides, D contiguous). write_kv is L = 1 with no mask; commit is all layers with a
// mask. Row (l, t) is written iff (mask == nullptr || mask[t]) and 0 <= slots[t] < num_slots.

// Where layer l of a cache starts. Stacked: cache[kv] + l * cache_stride[kv][0]. Per layer (vLLM
// holds one tensor per layer): layer_ptrs[kv * num_layers + l], a device table [2, L] of base
// addresses (int64) that the caller builds once per list of layers, so one launch covers every
// layer and the table can be replayed inside a CUDA graph. `addr_bits[kv]` is the OR of every
// layer's base address: its lowest set bit bounds the alignment the kernels may vectorise at.
struct RowWriteParams {
  const void* src[2];          // key, value sources
  int64_t src_stride[2][3];    // per source: layer, token, head strides (elements)
  void* cache[2];              // key cache, value cache (stacked; unused with layer_ptrs)
  const int64_t* layer_ptrs;   // [2, L] device table of per-layer bases, or nullptr (stacked)
  uintptr_t addr_bits[2];      // OR of the layer base addresses (alignment check)
  int64_t cache_stride[2][4];  // per cache: layer, block, offset-in-block, head strides (elements)
  const float* scale[2];       // fp8 only: k_scale, v_scale, indexed [l * s0 + h * s1]
  int64_t scale_stride[2][2];  // per scale: layer, head strides (0 = broadcast)
  const void* slots;           // [T] int32 or int64
  int slots_is64;
  const bool* mask;            // [T] or nullptr
  int num_layers, num_tokens, num_heads, head_size, block_size;
  int64_t num_slots;           // NB * BS, < 2^31
  Elem src_elem, cache_elem;
};
cudaError_t launch_write_rows(const RowWriteParams& p, cudaStream_t stream);

// Raw-byte copy between cache rows at `slots` (stacked or per-layer caches, as above) and a dense
// log [L, n, H, D] (contiguous).
// restore == 0 (log_slots): log[l, i] = cache[l, slot_i], zero rows for invalid slots.
// restore == 1 (restore_slots): cache[l, slot_i] = log[l, i], invalid slots skipped.
struct SlotCopyParams {
  void* cache[2];              // stacked; unused with layer_ptrs
  const int64_t* layer_ptrs;   // [2, L] per-layer bases (see RowWriteParams), or nullptr
  uintptr_t addr_bits[2];      // OR of the layer base addresses
  int64_t cache_stride[2][4];  // layer, block, offset, head (elements)
  void* log[2];                // [L, n, H, D] contiguous
  const void* slots;
  int slots_is64;
  int num_layers, num_slots_logged, num_heads, head_size, block_size, elem_bytes;
  int64_t num_slots;
  int restore;
};
cudaError_t launch_slot_copy(const SlotCopyParams& p, cudaStream_t stream);

// Speculative-cache validation: acceptance mask from draft and sampled ids (see scv.cu).
struct ScvParams {
  const void* draft; int draft_is64; int64_t num_drafts;             // [Dtot]
  const void* cu; int cu_is64; int num_reqs;                         // [R] inclusive cumsum
  const void* sampled; int sampled_is64; int num_cols;               // [R, C]
  int64_t sampled_stride[2];
  const void* token_req; int token_req_is64;                         // [T] or nullptr
  const void* token_pos; int token_pos_is64; int64_t num_tokens;     // [T]
  bool* draft_mask;      // [Dtot]
  int32_t* accepted_len; // [R]
  bool* commit_mask;     // [T] (untouched when token_req == nullptr)
};
constexpr int kScvMaxRequests = 4096;  // shared-memory capacity of the one-block kernel
cudaError_t launch_scv_mask(const ScvParams& p, cudaStream_t stream);

// An empty kernel: the floor of a custom-op launch, for benchmarks.
cudaError_t launch_noop(cudaStream_t stream);

}  // namespace nwor
