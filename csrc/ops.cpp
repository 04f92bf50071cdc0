// ops.cpp: the nwor_lab operator schemas and their CUDA implementations.
//
// Ops (namespace nwor_lab; every CUDA impl checks its tensors, launches ONE kernel on the
// current stream and never syncs with the host, so all of them can be captured in CUDA graphs):
//   write_kv       -> write_rows.cu  launch_write_rows (L = 1, no mask)
//   commit         -> write_rows.cu  launch_write_rows (all layers, commit_mask)
//   log_slots      -> slot_log.cu    launch_slot_copy (restore = 0)
//   restore_slots  -> slot_log.cu    launch_slot_copy (restore = 1)
//   commit.layers, log_slots.layers, restore_slots.layers: the same three on per-layer caches (a
//                     list of [NB, BS, H, D] tensors, as vLLM holds them) plus `layer_ptrs`, a device
//                     table [2, L] int64 of their base addresses; still ONE launch for all layers.
//   scv_mask       -> scv.cu         launch_scv_mask
//   noop           -> scv.cu         launch_noop (an empty kernel: launch-cost floor)
// Only light headers here (no torch/extension.h, no ATen/cuda/CUDAContext.h): those pull in
// cuSPARSE/cuBLAS headers and cost minutes of compile time on 2 cores (see _ext.py).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <type_traits>

#include "nwor_kernels.h"

namespace nwor {
namespace {

using at::Tensor;

// Error messages without iostream number formatting. Where the host compiler links libstdc++
// statically into the extension (seen on the H200 machines: CXX=/opt/gcc/bin/g++), formatting an
// integer through the extension's own std::ostream meets the process's libstdc++ locale and
// crashes (a segfault instead of the error). std::to_string uses no locale; the message reaches
// TORCH_CHECK as one std::string, which c10 passes through without a stream.
inline void put(std::string& out, const char* s) { out += s; }
inline void put(std::string& out, const std::string& s) { out += s; }
inline void put(std::string& out, char c) { out += c; }
inline void put(std::string& out, bool b) { out += b ? "true" : "false"; }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
inline void put(std::string& out, T v) { out += std::to_string(v); }
inline void put(std::string& out, at::ScalarType t) { out += c10::toString(t); }
inline void put(std::string& out, const c10::Device& d) { out += d.str(); }
inline void put(std::string& out, at::IntArrayRef a) {
  out += "[";
  for (size_t i = 0; i < a.size(); ++i) out += (i ? ", " : "") + std::to_string(a[i]);
  out += "]";
}
template <typename... Args>
std::string msg(const Args&... args) {
  std::string out;
  (put(out, args), ...);
  return out;
}
#define NWOR_CHECK(cond, ...) TORCH_CHECK(cond, ::nwor::msg(__VA_ARGS__))

Elem elem_of(const Tensor& t, const char* name, bool allow_fp8) {
  switch (t.scalar_type()) {
    case at::kFloat: return Elem::F32;
    case at::kHalf: return Elem::F16;
    case at::kBFloat16: return Elem::BF16;
    case at::kFloat8_e4m3fn:
      if (allow_fp8) return Elem::E4M3;
      break;
    case at::kFloat8_e5m2:
      if (allow_fp8) return Elem::E5M2;
      break;
    default: break;
  }
  NWOR_CHECK(false, name, ": dtype ", t.scalar_type(), " is not supported; use float32, float16 or bfloat16",
              allow_fp8 ? " (or float8_e4m3fn / float8_e5m2 for a cache)" : "");
  return Elem::F32;  // unreachable: NWOR_CHECK(false) throws
}

bool is_fp8(Elem e) { return e == Elem::E4M3 || e == Elem::E5M2; }

void check_cuda(const Tensor& t, const char* name, const Tensor& ref) {
  NWOR_CHECK(t.is_cuda(), name, ": must be a CUDA tensor, got ", t.device());
  NWOR_CHECK(t.device() == ref.device(), name, ": is on ", t.device(), " but the cache is on ", ref.device());
}

void check_index(const Tensor& t, const char* name, const Tensor& ref) {
  check_cuda(t, name, ref);
  NWOR_CHECK(t.dim() == 1, name, ": expected a 1-D tensor, got shape ", t.sizes());
  NWOR_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
              ": dtype must be int32 or int64, got ", t.scalar_type());
  NWOR_CHECK(t.numel() <= 1 || t.stride(0) == 1, name, ": must be contiguous (use ", name, ".contiguous())");
}

void check_last_contiguous(const Tensor& t, const char* name) {
  NWOR_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, name,
              ": the last (head_size) dimension must be contiguous, got strides ", t.strides());
}

// A stacked cache [L, NB, BS, H, D] (or one layer [NB, BS, H, D], layer stride 0).
struct CacheView {
  int64_t layers, blocks, block_size, heads, head_size;
  int64_t stride[4];  // layer, block, offset, head
};

CacheView cache_view(const Tensor& c, const char* name, bool stacked) {
  const int64_t want = stacked ? 5 : 4;
  NWOR_CHECK(c.dim() == want, name, ": expected a ", want, "-D cache ",
              stacked ? "[layers, num_blocks, block_size, num_kv_heads, head_size]"
                      : "[num_blocks, block_size, num_kv_heads, head_size]",
              " (logical NHD; HND is a permuted view), got shape ", c.sizes());
  check_last_contiguous(c, name);
  const int o = stacked ? 1 : 0;
  CacheView v;
  v.layers = stacked ? c.size(0) : 1;
  v.blocks = c.size(o);
  v.block_size = c.size(o + 1);
  v.heads = c.size(o + 2);
  v.head_size = c.size(o + 3);
  v.stride[0] = stacked ? c.stride(0) : 0;
  v.stride[1] = c.stride(o);
  v.stride[2] = c.stride(o + 1);
  v.stride[3] = c.stride(o + 2);
  NWOR_CHECK(v.blocks * v.block_size < (int64_t(1) << 31), name, ": more than 2^31 slots are not supported");
  return v;
}

void check_same_shape(const CacheView& a, const CacheView& b) {
  NWOR_CHECK(a.layers == b.layers && a.blocks == b.blocks && a.block_size == b.block_size &&
                  a.heads == b.heads && a.head_size == b.head_size,
              "key_cache and value_cache must have the same shape");
}

// The key and value caches of an op, either stacked tensors or per-layer lists.
struct CacheArgs {
  CacheView view[2];
  void* base[2] = {nullptr, nullptr};  // stacked data_ptr (nullptr with a layer table)
  const int64_t* layer_ptrs = nullptr;  // [2, L] device table (per-layer caches)
  uintptr_t addr_bits[2] = {0, 0};      // OR of every layer's base address
  at::ScalarType dtype;
  int64_t element_size;
  Tensor ref;                           // any cache tensor: its device is the op's device
};

// Stacked [L, NB, BS, H, D] caches (stacked = true) or one layer [NB, BS, H, D] (write_kv).
CacheArgs tensor_caches(const Tensor& key_cache, const Tensor& value_cache, bool stacked) {
  CacheArgs c;
  c.ref = key_cache;
  check_cuda(key_cache, "key_cache", key_cache);
  check_cuda(value_cache, "value_cache", key_cache);
  c.view[0] = cache_view(key_cache, "key_cache", stacked);
  c.view[1] = cache_view(value_cache, "value_cache", stacked);
  check_same_shape(c.view[0], c.view[1]);
  NWOR_CHECK(key_cache.scalar_type() == value_cache.scalar_type(), "key_cache and value_cache dtypes differ: ",
              key_cache.scalar_type(), " vs ", value_cache.scalar_type());
  c.base[0] = key_cache.data_ptr();
  c.base[1] = value_cache.data_ptr();
  c.addr_bits[0] = reinterpret_cast<uintptr_t>(c.base[0]);
  c.addr_bits[1] = reinterpret_cast<uintptr_t>(c.base[1]);
  c.dtype = key_cache.scalar_type();
  c.element_size = int64_t(key_cache.element_size());
  return c;
}

// Per-layer caches: L tensors [NB, BS, H, D] per list, equal in shape, strides and dtype (vLLM
// allocates every layer alike), and their base addresses in `layer_ptrs` [2, L] int64 on the
// device: row 0 the key caches, row 1 the value caches. The table is trusted (reading it back
// would sync); nwor_lab.ops.slots.layer_pointers builds it and checks it on the host.
CacheArgs list_caches(at::TensorList key_caches, at::TensorList value_caches, const Tensor& layer_ptrs) {
  const int64_t L = int64_t(key_caches.size());
  NWOR_CHECK(L > 0, "key_caches: expected one [num_blocks, block_size, num_kv_heads, head_size] tensor per "
              "layer, got an empty list");
  NWOR_CHECK(int64_t(value_caches.size()) == L, "value_caches: has ", int64_t(value_caches.size()),
              " layers but key_caches has ", L, "; pass one key and one value cache per layer");
  CacheArgs c;
  c.ref = key_caches[0];
  at::TensorList lists[2] = {key_caches, value_caches};
  const char* names[2] = {"key_caches", "value_caches"};
  for (int kv = 0; kv < 2; ++kv) {
    const Tensor& first = lists[kv][0];
    c.view[kv] = cache_view(first, names[kv], false);
    c.view[kv].layers = L;
    c.view[kv].stride[0] = 0;  // unused: each layer has its own base
    for (int64_t l = 0; l < L; ++l) {
      const Tensor& t = lists[kv][l];
      check_cuda(t, names[kv], c.ref);
      NWOR_CHECK(t.sizes() == first.sizes() && t.strides() == first.strides(), names[kv], "[", l,
                  "]: shape ", t.sizes(), " strides ", t.strides(), " differ from layer 0's ", first.sizes(), " ",
                  first.strides(), "; every layer must be allocated alike");
      NWOR_CHECK(t.scalar_type() == c.ref.scalar_type(), names[kv], "[", l, "]: dtype ", t.scalar_type(),
                  " differs from key_caches[0]'s ", c.ref.scalar_type());
      c.addr_bits[kv] |= reinterpret_cast<uintptr_t>(t.data_ptr());
    }
  }
  check_same_shape(c.view[0], c.view[1]);
  check_cuda(layer_ptrs, "layer_ptrs", c.ref);
  NWOR_CHECK(layer_ptrs.scalar_type() == at::kLong && layer_ptrs.dim() == 2 && layer_ptrs.size(0) == 2 &&
                  layer_ptrs.size(1) == L && layer_ptrs.is_contiguous(),
              "layer_ptrs: expected a contiguous int64 [2, ", L, "] table of layer base addresses, got ",
              layer_ptrs.scalar_type(), " ", layer_ptrs.sizes(), "; build it with nwor_lab.ops.slots.layer_pointers");
  c.layer_ptrs = layer_ptrs.data_ptr<int64_t>();
  c.dtype = c.ref.scalar_type();
  c.element_size = int64_t(c.ref.element_size());
  return c;
}

// Scale broadcast to [L, H]: accepts [L, H], [H], [1] or a 0-d tensor; size-1 dims broadcast.
void scale_strides(const Tensor& s, const char* name, int64_t L, int64_t H, const Tensor& ref, int64_t out[2]) {
  check_cuda(s, name, ref);
  NWOR_CHECK(s.scalar_type() == at::kFloat, name, ": fp8 scales must be float32, got ", s.scalar_type());
  NWOR_CHECK(s.dim() <= 2, name, ": expected a scale of shape [num_layers, num_kv_heads], [num_kv_heads] or "
              "a scalar, got ", s.sizes());
  int64_t size_l = 1, stride_l = 0, size_h = 1, stride_h = 0;
  if (s.dim() == 2) {
    size_l = s.size(0); stride_l = s.stride(0); size_h = s.size(1); stride_h = s.stride(1);
  } else if (s.dim() == 1) {
    size_h = s.size(0); stride_h = s.stride(0);
  }
  NWOR_CHECK(size_l == 1 || size_l == L, name, ": has ", size_l, " layers, the cache has ", L);
  NWOR_CHECK(size_h == 1 || size_h == H, name, ": has ", size_h, " heads, the cache has ", H);
  out[0] = size_l == 1 ? 0 : stride_l;
  out[1] = size_h == 1 ? 0 : stride_h;
}

cudaStream_t stream_for(const Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

// Shared by write_kv (stacked = false: sources [T, H, D], one-layer caches) and commit (sources
// [L, Tcap, H, D], caches of L layers, stacked or per layer).
void write_rows(const Tensor& key, const Tensor& value, const CacheArgs& c, const Tensor& slot_mapping,
                const std::optional<Tensor>& commit_mask, const std::optional<Tensor>& k_scale,
                const std::optional<Tensor>& v_scale, bool stacked) {
  const CacheView& kc = c.view[0];
  check_cuda(key, stacked ? "staged_key" : "key", c.ref);
  check_cuda(value, stacked ? "staged_value" : "value", c.ref);
  check_index(slot_mapping, "slot_mapping", c.ref);
  const int64_t T = slot_mapping.numel();
  const Tensor* src[2] = {&key, &value};
  const char* src_name[2] = {stacked ? "staged_key" : "key", stacked ? "staged_value" : "value"};

  RowWriteParams p{};
  for (int kv = 0; kv < 2; ++kv) {
    const Tensor& s = *src[kv];
    const int64_t want = stacked ? 4 : 3;
    NWOR_CHECK(s.dim() == want, src_name[kv], ": expected ",
                stacked ? "[num_layers, max_tokens, num_kv_heads, head_size]" : "[num_tokens, num_kv_heads, head_size]",
                ", got shape ", s.sizes());
    const int o = stacked ? 1 : 0;
    NWOR_CHECK(!stacked || s.size(0) == kc.layers, src_name[kv], ": has ", s.size(0), " layers, the cache has ",
                kc.layers);
    NWOR_CHECK(stacked ? s.size(o) >= T : s.size(o) == T, src_name[kv], ": has ", s.size(o),
                " token rows for ", T, " slots");
    NWOR_CHECK(s.size(o + 1) == kc.heads && s.size(o + 2) == kc.head_size, src_name[kv], ": rows are [",
                s.size(o + 1), ", ", s.size(o + 2), "] but the cache holds [num_kv_heads=", kc.heads,
                ", head_size=", kc.head_size, "]");
    check_last_contiguous(s, src_name[kv]);
    p.src[kv] = s.data_ptr();
    p.src_stride[kv][0] = stacked ? s.stride(0) : 0;
    p.src_stride[kv][1] = s.stride(o);
    p.src_stride[kv][2] = s.stride(o + 1);
  }
  NWOR_CHECK(key.scalar_type() == value.scalar_type(), "key and value dtypes differ: ", key.scalar_type(), " vs ",
              value.scalar_type());
  p.src_elem = elem_of(key, src_name[0], false);
  p.cache_elem = elem_of(c.ref, "key_cache", true);
  for (int kv = 0; kv < 2; ++kv) {
    p.cache[kv] = c.base[kv];
    p.addr_bits[kv] = c.addr_bits[kv];
    for (int d = 0; d < 4; ++d) p.cache_stride[kv][d] = c.view[kv].stride[d];
  }
  p.layer_ptrs = c.layer_ptrs;
  if (is_fp8(p.cache_elem)) {
    NWOR_CHECK(k_scale.has_value() && v_scale.has_value(), "an fp8 cache (", c.dtype,
                ") needs k_scale and v_scale (float32, [num_kv_heads] or a scalar per layer)");
    scale_strides(*k_scale, "k_scale", kc.layers, kc.heads, c.ref, p.scale_stride[0]);
    scale_strides(*v_scale, "v_scale", kc.layers, kc.heads, c.ref, p.scale_stride[1]);
    p.scale[0] = k_scale->data_ptr<float>();
    p.scale[1] = v_scale->data_ptr<float>();
  }
  p.slots = slot_mapping.data_ptr();
  p.slots_is64 = slot_mapping.scalar_type() == at::kLong;
  if (commit_mask.has_value()) {
    const Tensor& m = *commit_mask;
    check_cuda(m, "commit_mask", c.ref);
    NWOR_CHECK(m.scalar_type() == at::kBool && m.dim() == 1 && m.numel() == T, "commit_mask: expected a bool [",
                T, "] tensor (one flag per window token), got ", m.scalar_type(), " ", m.sizes());
    NWOR_CHECK(m.numel() <= 1 || m.stride(0) == 1, "commit_mask: must be contiguous");
    p.mask = m.data_ptr<bool>();
  }
  p.num_layers = int(kc.layers);
  p.num_tokens = int(T);
  p.num_heads = int(kc.heads);
  p.head_size = int(kc.head_size);
  p.block_size = int(kc.block_size);
  p.num_slots = kc.blocks * kc.block_size;
  C10_CUDA_CHECK(launch_write_rows(p, stream_for(c.ref)));
}

void write_kv(const Tensor& key, const Tensor& value, const Tensor& key_cache, const Tensor& value_cache,
              const Tensor& slot_mapping, const std::optional<Tensor>& k_scale,
              const std::optional<Tensor>& v_scale) {
  const c10::cuda::CUDAGuard guard(key_cache.device());
  write_rows(key, value, tensor_caches(key_cache, value_cache, false), slot_mapping, std::nullopt, k_scale,
             v_scale, false);
}

void commit(const Tensor& staged_key, const Tensor& staged_value, const Tensor& key_cache,
            const Tensor& value_cache, const Tensor& slot_mapping, const Tensor& commit_mask,
            const std::optional<Tensor>& k_scale, const std::optional<Tensor>& v_scale) {
  const c10::cuda::CUDAGuard guard(key_cache.device());
  write_rows(staged_key, staged_value, tensor_caches(key_cache, value_cache, true), slot_mapping, commit_mask,
             k_scale, v_scale, true);
}

void commit_layers(const Tensor& staged_key, const Tensor& staged_value, at::TensorList key_caches,
                   at::TensorList value_caches, const Tensor& layer_ptrs, const Tensor& slot_mapping,
                   const Tensor& commit_mask, const std::optional<Tensor>& k_scale,
                   const std::optional<Tensor>& v_scale) {
  NWOR_CHECK(!key_caches.empty(), "key_caches: expected one tensor per layer, got an empty list");
  const c10::cuda::CUDAGuard guard(key_caches[0].device());
  write_rows(staged_key, staged_value, list_caches(key_caches, value_caches, layer_ptrs), slot_mapping,
             commit_mask, k_scale, v_scale, true);
}

void slot_copy(const CacheArgs& c, const Tensor& slots, const Tensor& log_k, const Tensor& log_v, bool restore) {
  const CacheView& kc = c.view[0];
  check_index(slots, "slots", c.ref);
  const Tensor* logs[2] = {&log_k, &log_v};
  const char* names[2] = {"log_k", "log_v"};
  const int64_t n = slots.numel();
  for (int kv = 0; kv < 2; ++kv) {
    const Tensor& g = *logs[kv];
    check_cuda(g, names[kv], c.ref);
    NWOR_CHECK(g.dim() == 4 && g.size(0) == kc.layers && g.size(1) == n && g.size(2) == kc.heads &&
                    g.size(3) == kc.head_size,
                names[kv], ": expected shape [", kc.layers, ", ", n, ", ", kc.heads, ", ", kc.head_size,
                "] = [num_layers, num_slots, num_kv_heads, head_size], got ", g.sizes());
    NWOR_CHECK(g.scalar_type() == c.dtype, names[kv], ": dtype ", g.scalar_type(),
                " must equal the cache's storage dtype ", c.dtype);
    NWOR_CHECK(g.is_contiguous(), names[kv], ": must be contiguous");
  }
  SlotCopyParams p{};
  for (int kv = 0; kv < 2; ++kv) {
    p.cache[kv] = c.base[kv];
    p.addr_bits[kv] = c.addr_bits[kv];
    for (int d = 0; d < 4; ++d) p.cache_stride[kv][d] = c.view[kv].stride[d];
  }
  p.layer_ptrs = c.layer_ptrs;
  p.log[0] = log_k.data_ptr();
  p.log[1] = log_v.data_ptr();
  p.slots = slots.data_ptr();
  p.slots_is64 = slots.scalar_type() == at::kLong;
  p.num_layers = int(kc.layers);
  p.num_slots_logged = int(n);
  p.num_heads = int(kc.heads);
  p.head_size = int(kc.head_size);
  p.block_size = int(kc.block_size);
  p.elem_bytes = int(c.element_size);
  p.num_slots = kc.blocks * kc.block_size;
  p.restore = restore ? 1 : 0;
  C10_CUDA_CHECK(launch_slot_copy(p, stream_for(c.ref)));
}

void log_slots(const Tensor& key_cache, const Tensor& value_cache, const Tensor& slots, const Tensor& log_k,
               const Tensor& log_v) {
  const c10::cuda::CUDAGuard guard(key_cache.device());
  slot_copy(tensor_caches(key_cache, value_cache, true), slots, log_k, log_v, false);
}

void restore_slots(const Tensor& key_cache, const Tensor& value_cache, const Tensor& slots, const Tensor& log_k,
                   const Tensor& log_v) {
  const c10::cuda::CUDAGuard guard(key_cache.device());
  slot_copy(tensor_caches(key_cache, value_cache, true), slots, log_k, log_v, true);
}

void log_slots_layers(at::TensorList key_caches, at::TensorList value_caches, const Tensor& layer_ptrs,
                      const Tensor& slots, const Tensor& log_k, const Tensor& log_v) {
  NWOR_CHECK(!key_caches.empty(), "key_caches: expected one tensor per layer, got an empty list");
  const c10::cuda::CUDAGuard guard(key_caches[0].device());
  slot_copy(list_caches(key_caches, value_caches, layer_ptrs), slots, log_k, log_v, false);
}

void restore_slots_layers(at::TensorList key_caches, at::TensorList value_caches, const Tensor& layer_ptrs,
                          const Tensor& slots, const Tensor& log_k, const Tensor& log_v) {
  NWOR_CHECK(!key_caches.empty(), "key_caches: expected one tensor per layer, got an empty list");
  const c10::cuda::CUDAGuard guard(key_caches[0].device());
  slot_copy(list_caches(key_caches, value_caches, layer_ptrs), slots, log_k, log_v, true);
}

bool is64(const Tensor& t) { return t.scalar_type() == at::kLong; }

void scv_mask(const Tensor& draft_token_ids, const Tensor& cu_num_draft_tokens, const Tensor& sampled_token_ids,
              const Tensor& token_req, const Tensor& token_draft_pos, const Tensor& draft_mask,
              const Tensor& accepted_len, const Tensor& commit_mask) {
  const Tensor& ref = sampled_token_ids;
  const c10::cuda::CUDAGuard guard(ref.device());
  check_cuda(ref, "sampled_token_ids", ref);
  check_index(draft_token_ids, "draft_token_ids", ref);
  check_index(cu_num_draft_tokens, "cu_num_draft_tokens", ref);
  NWOR_CHECK(sampled_token_ids.dim() == 2, "sampled_token_ids: expected [num_reqs, max_spec_len + 1], got ",
              sampled_token_ids.sizes());
  NWOR_CHECK(sampled_token_ids.scalar_type() == at::kInt || sampled_token_ids.scalar_type() == at::kLong,
              "sampled_token_ids: dtype must be int32 or int64");
  const int64_t R = cu_num_draft_tokens.numel();
  const int64_t D = draft_token_ids.numel();
  NWOR_CHECK(sampled_token_ids.size(0) == R, "sampled_token_ids: has ", sampled_token_ids.size(0),
              " rows but cu_num_draft_tokens has ", R, " requests");
  NWOR_CHECK(R <= kScvMaxRequests, "scv_mask: at most ", kScvMaxRequests, " requests per call, got ", R);
  NWOR_CHECK(D < (int64_t(1) << 31), "scv_mask: too many draft tokens");
  check_cuda(draft_mask, "draft_mask", ref);
  check_cuda(accepted_len, "accepted_len", ref);
  NWOR_CHECK(draft_mask.scalar_type() == at::kBool && draft_mask.numel() == D && draft_mask.is_contiguous(),
              "draft_mask: expected a contiguous bool [", D, "] tensor, got ", draft_mask.scalar_type(), " ",
              draft_mask.sizes());
  NWOR_CHECK(accepted_len.scalar_type() == at::kInt && accepted_len.numel() == R && accepted_len.is_contiguous(),
              "accepted_len: expected a contiguous int32 [", R, "] tensor, got ", accepted_len.scalar_type(), " ",
              accepted_len.sizes());
  const int64_t T = token_req.numel();
  ScvParams p{};
  if (T > 0) {
    check_index(token_req, "token_req", ref);
    check_index(token_draft_pos, "token_draft_pos", ref);
    NWOR_CHECK(token_draft_pos.numel() == T, "token_draft_pos: has ", token_draft_pos.numel(),
                " entries, token_req has ", T);
    check_cuda(commit_mask, "commit_mask", ref);
    NWOR_CHECK(commit_mask.scalar_type() == at::kBool && commit_mask.numel() == T && commit_mask.is_contiguous(),
                "commit_mask: expected a contiguous bool [", T, "] tensor");
    NWOR_CHECK(T < (int64_t(1) << 31), "scv_mask: too many tokens");
    p.token_req = token_req.data_ptr();
    p.token_req_is64 = is64(token_req);
    p.token_pos = token_draft_pos.data_ptr();
    p.token_pos_is64 = is64(token_draft_pos);
    p.num_tokens = T;
    p.commit_mask = commit_mask.data_ptr<bool>();
  }
  p.draft = draft_token_ids.data_ptr();
  p.draft_is64 = is64(draft_token_ids);
  p.num_drafts = D;
  p.cu = cu_num_draft_tokens.data_ptr();
  p.cu_is64 = is64(cu_num_draft_tokens);
  p.num_reqs = int(R);
  p.sampled = sampled_token_ids.data_ptr();
  p.sampled_is64 = is64(sampled_token_ids);
  p.num_cols = int(sampled_token_ids.size(1));
  p.sampled_stride[0] = sampled_token_ids.stride(0);
  p.sampled_stride[1] = sampled_token_ids.stride(1);
  p.draft_mask = draft_mask.data_ptr<bool>();
  p.accepted_len = accepted_len.data_ptr<int32_t>();
  C10_CUDA_CHECK(launch_scv_mask(p, stream_for(ref)));
}

void noop(const Tensor& x) {
  NWOR_CHECK(x.is_cuda(), "noop: expects a CUDA tensor (it picks the device)");
  const c10::cuda::CUDAGuard guard(x.device());
  C10_CUDA_CHECK(launch_noop(stream_for(x)));
}

}  // namespace
}  // namespace nwor

TORCH_LIBRARY(nwor_lab, m) {
  m.set_python_module("nwor_lab.ops.fake");  // where torch finds the fake (meta) impls
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping, "
        "Tensor? k_scale, Tensor? v_scale) -> ()");
  m.def("log_slots(Tensor key_cache, Tensor value_cache, Tensor slots, Tensor(a!) log_k, Tensor(b!) log_v) -> ()");
  m.def("restore_slots(Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slots, Tensor log_k, Tensor log_v) "
        "-> ()");
  m.def("commit(Tensor staged_key, Tensor staged_value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, Tensor commit_mask, Tensor? k_scale, Tensor? v_scale) -> ()");
  m.def("commit.layers(Tensor staged_key, Tensor staged_value, Tensor(a!)[] key_caches, "
        "Tensor(b!)[] value_caches, Tensor layer_ptrs, Tensor slot_mapping, Tensor commit_mask, Tensor? k_scale, "
        "Tensor? v_scale) -> ()");
  m.def("log_slots.layers(Tensor[] key_caches, Tensor[] value_caches, Tensor layer_ptrs, Tensor slots, "
        "Tensor(a!) log_k, Tensor(b!) log_v) -> ()");
  m.def("restore_slots.layers(Tensor(a!)[] key_caches, Tensor(b!)[] value_caches, Tensor layer_ptrs, "
        "Tensor slots, Tensor log_k, Tensor log_v) -> ()");
  m.def("scv_mask(Tensor draft_token_ids, Tensor cu_num_draft_tokens, Tensor sampled_token_ids, "
        "Tensor token_req, Tensor token_draft_pos, Tensor(a!) draft_mask, Tensor(b!) accepted_len, "
        "Tensor(c!) commit_mask) -> ()");
  m.def("noop(Tensor x) -> ()");
}

TORCH_LIBRARY_IMPL(nwor_lab, CUDA, m) {
  m.impl("write_kv", &nwor::write_kv);
  m.impl("log_slots", &nwor::log_slots);
  m.impl("restore_slots", &nwor::restore_slots);
  m.impl("commit", &nwor::commit);
  m.impl("commit.layers", &nwor::commit_layers);
  m.impl("log_slots.layers", &nwor::log_slots_layers);
  m.impl("restore_slots.layers", &nwor::restore_slots_layers);
  m.impl("scv_mask", &nwor::scv_mask);
  m.impl("noop", &nwor::noop);
}
