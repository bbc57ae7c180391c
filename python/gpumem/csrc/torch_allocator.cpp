// gpumem as PyTorch's CUDA allocator: a CUDAAllocator (PyTorch 2.11's
// c10::cuda::CUDACachingAllocator interface) that forwards every call to
// libgpumem's C ABI (crates/gpumem-capi/include/gpumem.h).
//
// Built against the installed PyTorch by gpumem.torch (torch.utils.
// cpp_extension, cached) and installed with gpumem_torch_install() before
// PyTorch's first CUDA allocation. The C ABI's functions (declared in
// gpumem.h, the header shipped with the package) come in as a table of
// pointers taken from the libgpumem.so that Python already loaded, so this
// library and Python's share one gpumem instance, whatever paths are involved.
//
// What each PyTorch entry point does here:
// - allocate / raw_alloc: gpumem_malloc_rounded on the current stream, of
//   the block PyTorch's own allocator would make for the request
//   (block_size_for: 512-byte steps, roundup_power2_divisions), the request
//   counted in requested_bytes. gpumem empties its cache and retries once on
//   out-of-memory; a failure after that raises torch.OutOfMemoryError with
//   gpumem's message, after PyTorch's OOM observers ran. Other failures
//   raise RuntimeError.
// - the DataPtr's context carries (pointer, sizes, device, stream), so a
//   free is one gpumem_free_rounded with the stream of the allocation, as
//   PyTorch's own
//   allocator orders it. raw_delete looks raw allocations up in a small map.
// - statistics, reset, cacheInfo, emptyCache, the memory fraction,
//   recordStream and snapshot map to their gpumem_* counterparts.
// - CUDA graphs: beginAllocateToPool / endAllocateToPool / releasePool /
//   createOrIncrefPool map to gpumem's graph-private pools
//   (gpumem_graph_pool_*). While a capture into a pool is under way, each
//   allocation's stream is passed to the capture's filter (PyTorch's: "is
//   this stream capturing into this graph?"), and a match allocates from the
//   graph's pool; every gpumem call then runs in relaxed capture mode, as
//   PyTorch's own allocator does around cudaMalloc. A block of the device's
//   pool freed during a capture, on the capturing stream (or by the thread
//   that began the only capture under way), is held for the graph until its
//   pool goes: the captured work may use it in every replay. A block of the
//   capture's own pool that other streams used (recordStream) is not reused
//   before the capture ends, or, with PyTorch's
//   graph_capture_record_stream_reuse setting (passed to gpumem at each
//   capture-time allocation and free, as PyTorch reads it at each), before
//   those streams have joined its stream in the captured graph.
//   Checkpoints (torch.compile's CUDA graph trees) are taken, and restored
//   when nothing has changed since; a restore that would have to re-create
//   blocks is refused with an error.
// - torch.cuda.MemPool is a graph pool too, filled in use_mem_pool (whose
//   filter takes the thread's allocations; nested contexts: the latest).
//   snapshot and emptyCache take its id (gpumem_pool_snapshot,
//   gpumem_pool_empty_cache); no_split, use_on_oom and a MemPool's own
//   allocator (its segments from that allocator's raw_alloc and raw_delete,
//   the allocator kept until the pool's last segment went) map to
//   gpumem_graph_pool_set_no_split, _set_use_on_oom and _retain_foreign.
// - CUDA IPC of tensors is not supported by this mode: it raises an error
//   naming gpumem and the way out (the MemPool mode, gpumem.torch.mempool).

#include <c10/core/Allocator.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

#include "gpumem.h"
#include "memory_history.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

// The table gpumem.torch fills with the addresses of libgpumem's functions,
// typed after their declarations in gpumem.h. Its order is part of the
// contract with python/gpumem/torch.py (_API there).
struct gpumem_torch_api {
  decltype(&gpumem_malloc_rounded) malloc_rounded;
  decltype(&gpumem_free_rounded) free_rounded;
  decltype(&gpumem_last_error) last_error;
  decltype(&gpumem_get_device_stats) get_device_stats;
  decltype(&gpumem_reset_peak_stats) reset_peak_stats;
  decltype(&gpumem_reset_accumulated_stats) reset_accumulated_stats;
  decltype(&gpumem_empty_cache) empty_cache;
  decltype(&gpumem_set_memory_fraction) set_memory_fraction;
  decltype(&gpumem_get_memory_fraction) get_memory_fraction;
  decltype(&gpumem_record_stream) record_stream;
  decltype(&gpumem_snapshot) snapshot;
  decltype(&gpumem_graph_pool_begin) graph_pool_begin;
  decltype(&gpumem_graph_pool_end) graph_pool_end;
  decltype(&gpumem_graph_pool_retain) graph_pool_retain;
  decltype(&gpumem_graph_pool_release) graph_pool_release;
  decltype(&gpumem_graph_pool_use_count) graph_pool_use_count;
  decltype(&gpumem_graph_pool_malloc) graph_pool_malloc;
  decltype(&gpumem_graph_pool_free) graph_pool_free;
  decltype(&gpumem_graph_pool_hold_rounded) graph_pool_hold_rounded;
  decltype(&gpumem_graph_pool_checkpoint) graph_pool_checkpoint;
  decltype(&gpumem_checkpoint_free) checkpoint_free;
  decltype(&gpumem_graph_pool_restore) graph_pool_restore;
  decltype(&gpumem_restored_freed) restored_freed;
  decltype(&gpumem_restored_made) restored_made;
  decltype(&gpumem_restored_free) restored_free;
  decltype(&gpumem_graph_pool_live_blocks) graph_pool_live_blocks;
  decltype(&gpumem_graph_pool_block) graph_pool_block;
  decltype(&gpumem_get_class_stats) get_class_stats;
  decltype(&gpumem_set_graph_capture_reuse) set_graph_capture_reuse;
  decltype(&gpumem_pool_snapshot) pool_snapshot;
  decltype(&gpumem_pool_empty_cache) pool_empty_cache;
  decltype(&gpumem_graph_pool_set_no_split) graph_pool_set_no_split;
  decltype(&gpumem_graph_pool_set_use_on_oom) graph_pool_set_use_on_oom;
  decltype(&gpumem_graph_pool_retain_foreign) graph_pool_retain_foreign;
};

namespace gpumem_torch {

using namespace c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::BlockInfo;
using c10::CachingDeviceAllocator::SegmentInfo;
using c10::CachingDeviceAllocator::Stat;
using c10::CachingDeviceAllocator::StatArray;
using c10::CachingDeviceAllocator::StatType;

using PoolId = c10::MempoolId_t;
constexpr PoolId kDevicePool{0, 0};
// The pool of a raw allocation made while the allocator was disabled: it
// came from cudaMalloc and goes back to cudaFree.
constexpr PoolId kUncached{~0ull, ~0ull};

// What a DataPtr's context holds: everything gpumem_free_rounded needs, and
// the graph pool the block came from ({0, 0}: the device's pool).
struct Allocation {
  void* ptr;
  // The bytes asked for.
  size_t size;
  // The block allocated for them (block_size_for(size) in the device's
  // pool; `size` in a graph pool, which rounds as PyTorch's own does).
  size_t block;
  cudaStream_t stream;
  c10::DeviceIndex device;
  PoolId pool;
};

gpumem_torch_api api;

// torch.cuda.memory._record_memory_history's recording.
MemoryHistory history;

// A capture into a graph pool under way (beginAllocateToPool).
struct Capture {
  c10::DeviceIndex device;
  PoolId pool;
  std::function<bool(cudaStream_t)> filter;
  std::thread::id thread;
};

// The captures under way, and their number for the allocation path's one
// atomic check.
std::mutex captures_mutex;
std::vector<Capture> captures;
std::atomic<int> n_captures{0};

// What raw_alloc handed out, by pointer (raw_delete and raw_deleter() take
// the pointer alone).
std::mutex raw_mutex;
std::unordered_map<void*, Allocation> raw_blocks;

bool capturing() {
  return n_captures.load(std::memory_order_acquire) > 0;
}

// This thread in relaxed capture mode while `on` (PyTorch's allocator does
// the same around cudaMalloc): with a global-mode capture under way on any
// thread, driver allocations and frees would otherwise invalidate it.
class RelaxedMode {
 public:
  explicit RelaxedMode(bool on) : on_(on) {
    if (on_) {
      prev_ = cudaStreamCaptureModeRelaxed;
      C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&prev_));
    }
  }
  ~RelaxedMode() {
    if (on_) {
      (void)cudaThreadExchangeStreamCaptureMode(&prev_);
    }
  }
  RelaxedMode(const RelaxedMode&) = delete;
  RelaxedMode& operator=(const RelaxedMode&) = delete;

 private:
  bool on_;
  cudaStreamCaptureMode prev_{};
};

// The graph pool an allocation on `stream` goes to, if a capture's filter
// takes it: the latest begun that does, as PyTorch chooses (nested
// use_mem_pool contexts on one thread: the innermost).
bool pool_for(c10::DeviceIndex device, cudaStream_t stream, PoolId* pool) {
  std::lock_guard<std::mutex> lock(captures_mutex);
  for (auto c = captures.rbegin(); c != captures.rend(); ++c) {
    if (c->device == device && c->filter(stream)) {
      *pool = c->pool;
      return true;
    }
  }
  return false;
}

// The graph pool that must hold a block of the device's pool freed now: the
// latest one whose capture takes the block's stream, else, if this thread
// began the only capture under way on the device, that one.
bool hold_pool_for(c10::DeviceIndex device, cudaStream_t stream, PoolId* pool) {
  std::lock_guard<std::mutex> lock(captures_mutex);
  const Capture* by_thread = nullptr;
  int on_device = 0;
  for (auto c = captures.rbegin(); c != captures.rend(); ++c) {
    if (c->device != device) {
      continue;
    }
    ++on_device;
    if (c->filter(stream)) {
      *pool = c->pool;
      return true;
    }
    if (c->thread == std::this_thread::get_id()) {
      by_thread = &*c;
    }
  }
  if (on_device == 1 && by_thread != nullptr) {
    *pool = by_thread->pool;
    return true;
  }
  return false;
}

// Passes PyTorch's graph_capture_record_stream_reuse setting
// (torch.cuda.memory._set_allocator_settings or PYTORCH_CUDA_ALLOC_CONF) on
// to gpumem, which applies it to graph-pool blocks freed during captures.
void pass_capture_reuse() {
  api.set_graph_capture_reuse(CUDAAllocatorConfig::graph_capture_record_stream_reuse() ? 1 : 0);
}

// Tells PyTorch's profiler (profile_memory=True) of an allocation (positive
// size) or a free (negative), with the device's totals after it.
void report_to_profiler(void* ptr, int64_t size, c10::DeviceIndex device) {
  gpumem_device_stats_t s{};
  api.get_device_stats(device, &s);
  c10::reportMemoryUsageToProfiler(
      ptr,
      size,
      static_cast<size_t>(std::max<int64_t>(0, s.allocated_bytes.current)),
      static_cast<size_t>(std::max<int64_t>(0, s.reserved_bytes.current)),
      c10::Device(c10::DeviceType::CUDA, device));
}

// Frees memory of cudaMalloc (the allocator disabled).
void uncached_free(void* ptr) {
  if (ptr != nullptr) {
    C10_CUDA_CHECK_WARN(cudaFree(ptr));
  }
}

// The graph-pool block at `ptr`, as gpumem knows it.
bool graph_block(void* ptr, Allocation* a) {
  int device = 0;
  uint64_t id0 = 0;
  uint64_t id1 = 0;
  size_t requested = 0;
  gpumem_stream_t stream = nullptr;
  if (api.graph_pool_block(ptr, &device, &id0, &id1, &requested, &stream) != 0) {
    return false;
  }
  *a = Allocation{
      ptr,
      requested,
      requested,
      static_cast<cudaStream_t>(stream),
      static_cast<c10::DeviceIndex>(device),
      PoolId{id0, id1}};
  return true;
}

// Frees `a` where it came from. During a capture, a block freed on the
// capturing stream (or by the thread that began the only capture) goes to
// gpumem_graph_pool_hold, which holds it for the capture's graph unless the
// capture's own pool owns it.
void free_block(const Allocation& a) {
  if (a.pool == kUncached) {
    uncached_free(a.ptr);
    return;
  }
  if (history.on()) {
    history.freed(a.device, a.ptr, a.size, a.stream, a.pool);
  }
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
    report_to_profiler(a.ptr, -static_cast<int64_t>(a.size), a.device);
  }
  if (!capturing()) {
    if (a.pool != kDevicePool) {
      api.graph_pool_free(a.ptr, a.size, a.device, a.pool.first, a.pool.second, a.stream);
    } else {
      api.free_rounded(a.ptr, a.size, a.block, a.device, a.stream);
    }
    return;
  }
  RelaxedMode relaxed(true);
  pass_capture_reuse();
  PoolId pool;
  if (hold_pool_for(a.device, a.stream, &pool)) {
    api.graph_pool_hold_rounded(a.ptr, a.size, a.block, a.device, pool.first, pool.second, a.stream);
  } else if (a.pool != kDevicePool) {
    api.graph_pool_free(a.ptr, a.size, a.device, a.pool.first, a.pool.second, a.stream);
  } else {
    api.free_rounded(a.ptr, a.size, a.block, a.device, a.stream);
  }
}

// The deleter of graph-pool DataPtrs (context: the pointer) and
// raw_deleter(): frees a raw allocation or a graph-pool block by its pointer.
// Returns false when the pointer is neither.
bool free_by_pointer(void* ptr) {
  Allocation a{};
  {
    std::lock_guard<std::mutex> lock(raw_mutex);
    auto it = raw_blocks.find(ptr);
    if (it != raw_blocks.end()) {
      a = it->second;
      raw_blocks.erase(it);
      free_block(a);
      return true;
    }
  }
  if (!graph_block(ptr, &a)) {
    return false;
  }
  free_block(a);
  return true;
}

void free_pointer(void* ptr) {
  if (ptr != nullptr && !free_by_pointer(ptr)) {
    // A deleter cannot throw: gpumem counts it as a bad free and says so.
    api.free_rounded(ptr, 0, 0, c10::cuda::current_device(), nullptr);
  }
}

void free_allocation(void* ctx) {
  auto* a = static_cast<Allocation*>(ctx);
  if (a == nullptr) {
    return;
  }
  free_block(*a);
  delete a;
}

// The allocator a MemPool was made with (torch.cuda.MemPool(allocator)), as
// the source of its pool's segments: gpumem holds a heap copy of the
// shared_ptr as the source's context and releases it once the pool and its
// last segment are gone, so the allocator outlives the tensors of the pool
// even when Python lets go of it first.
using ForeignAllocator = std::shared_ptr<CUDAAllocator>;

// Why this thread's last segment from a MemPool's allocator failed (for the
// error raised), empty when it did not.
thread_local std::string foreign_error;

// gpumem_segment_source_t's alloc: the allocator's raw_alloc_with_stream on
// the pool's device. No exception may reach gpumem: one is kept as
// foreign_error and the segment is NULL (out of memory to gpumem).
void* foreign_alloc(void* ctx, size_t size, int device, gpumem_stream_t stream) noexcept {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    void* p = (*static_cast<ForeignAllocator*>(ctx))
                  ->raw_alloc_with_stream(size, static_cast<cudaStream_t>(stream));
    if (p == nullptr) {
      foreign_error = "the MemPool's allocator returned NULL";
    }
    return p;
  } catch (const std::exception& e) {
    foreign_error = std::string("the MemPool's allocator failed: ") + e.what();
  } catch (...) {
    foreign_error = "the MemPool's allocator failed (unknown C++ exception)";
  }
  return nullptr;
}

// gpumem_segment_source_t's free: the allocator's raw_delete. A failure is
// reported on stderr (a free cannot fail back into gpumem).
void foreign_free(void* ctx, void* ptr, size_t /*size*/, int device, gpumem_stream_t /*stream*/) noexcept {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    (*static_cast<ForeignAllocator*>(ctx))->raw_delete(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem: the MemPool's allocator could not free %p: %s\n", ptr, e.what());
  } catch (...) {
    std::fprintf(stderr, "gpumem: the MemPool's allocator could not free %p\n", ptr);
  }
}

// gpumem_segment_source_t's release: the pool no longer needs its allocator.
void foreign_release(void* ctx) noexcept {
  delete static_cast<ForeignAllocator*>(ctx);
}

// A checkpoint of a graph pool, saved in gpumem (torch.compile's CUDA graph
// trees take one after recording each graph).
struct Checkpoint final : AllocatorState {
  c10::DeviceIndex device = 0;
  gpumem_checkpoint_t* saved = nullptr;
  ~Checkpoint() override {
    api.checkpoint_free(saved);
  }
};

// Messages are formatted with snprintf, never with iostreams: the compiler
// that builds this file may bring another libstdc++ than the one PyTorch
// loaded, and their locale facets (used by every ostream << of a number)
// are not compatible. Strings are passed to PyTorch's checks whole.
// Sizes as PyTorch's messages print them (tools and users match them): up
// to 1 KiB in bytes, then KiB, MiB and GiB with two decimals.
std::string format_bytes(uint64_t bytes) {
  char buf[64];
  if (bytes <= 1024) {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  } else if (bytes <= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(bytes) / 1024.0);
  } else if (bytes <= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1ull << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  }
  return buf;
}

// Requests from 1 EiB up are refused before anything else, with PyTorch's
// message.
constexpr size_t kOneExaByte = 1152921504606846976ULL;

[[noreturn]] void fail(const std::string& message) {
  TORCH_CHECK(false, message);
  std::abort();  // not reached: the check throws
}

[[noreturn]] void fail_out_of_memory(const std::string& message) {
  TORCH_CHECK_WITH(OutOfMemoryError, false, message);
  std::abort();  // not reached: the check throws
}

Stat to_stat(const gpumem_stat_t& s) {
  Stat out;
  out.current = s.current;
  out.peak = s.peak;
  out.allocated = s.allocated;
  out.freed = s.freed;
  return out;
}

// gpumem's statistics are not split into PyTorch's small and large pools:
// they go to "all" (the aggregate), the others read zero.
// The block PyTorch's own allocator makes for a request of `size` bytes,
// so that its statistics (active_bytes, allocated_bytes) and its
// roundup_power2_divisions setting mean here what they mean there: at
// least 512 bytes, in 512-byte steps; where the setting divides the
// power-of-two interval holding `size` (torch.cuda.memory.
// _set_allocator_settings or PYTORCH_CUDA_ALLOC_CONF, read on every
// request, as PyTorch reads it), up to the next division.
size_t block_size_for(size_t size) {
  constexpr size_t kMinBlock = 512;
  if (size <= kMinBlock) {
    return kMinBlock;
  }
  size_t divisions =
      c10::CachingAllocator::AcceleratorAllocatorConfig::roundup_power2_divisions(size);
  if (divisions > 1 && size > kMinBlock * divisions && (size & (size - 1)) != 0) {
    size_t floor = size_t{1} << (63 - __builtin_clzll(size));
    // The interval's step: the power of two at most `divisions` divides it.
    size_t step = floor >> (63 - __builtin_clzll(divisions));
    if (step == 0) {
      return floor << 1;
    }
    return (size + step - 1) / step * step;
  }
  return (size + kMinBlock - 1) / kMinBlock * kMinBlock;
}

void set_all(StatArray& a, const gpumem_stat_t& s) {
  a[static_cast<size_t>(StatType::AGGREGATE)] = to_stat(s);
}

// PyTorch's small_pool and large_pool entries of a statistic: gpumem's
// blocks of at most 1 MiB and the larger ones (gpumem_get_class_stats).
void set_classes(StatArray& a, const gpumem_stat_t& small, const gpumem_stat_t& large) {
  a[static_cast<size_t>(StatType::SMALL_POOL)] = to_stat(small);
  a[static_cast<size_t>(StatType::LARGE_POOL)] = to_stat(large);
}

class GpumemAllocator final : public CUDAAllocator {
 public:
  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    c10::Device where(c10::DeviceType::CUDA, device);
    if (size == 0) {
      return {nullptr, nullptr, &free_allocation, where};
    }
    check_size(size);
    if (!enabled_.load(std::memory_order_relaxed)) {
      void* p = uncached_malloc(size, device);
      return {p, p, &uncached_free, where};
    }
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    Allocation a = allocate_block(size, device, stream);
    if (a.pool != kDevicePool) {
      return {a.ptr, a.ptr, &free_pointer, where};
    }
    return {a.ptr, new Allocation(a), &free_allocation, where};
  }

  void* raw_alloc(size_t nbytes) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    return raw_alloc_on(
        nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    return raw_alloc_on(nbytes, c10::cuda::current_device(), stream);
  }

  void raw_delete(void* ptr) override {
    if (ptr != nullptr && !free_by_pointer(ptr)) {
      char buf[160];
      std::snprintf(
          buf, sizeof buf, "gpumem: raw_delete of %p, which is neither from raw_alloc nor a graph pool's block", ptr);
      fail(buf);
    }
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pointer;
  }

  void init(int /*device_count*/) override {}
  bool initialized() override {
    return true;
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    return api.get_memory_fraction(device);
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    if (api.set_memory_fraction(device, fraction) != 0) {
      char buf[128];
      std::snprintf(
          buf,
          sizeof buf,
          "gpumem: invalid memory fraction %g for device %d (expected 0 <= fraction <= 1)",
          fraction,
          static_cast<int>(device));
      fail(buf);
    }
  }

  std::vector<StreamSegmentSize> getExpandableSegmentSizes(
      c10::DeviceIndex /*device*/) override {
    return {};
  }

  // Disabled (torch.cuda.caching_allocator_enable(False)), allocations go
  // to cudaMalloc and frees to cudaFree, outside gpumem and its statistics.
  void enable(bool value) override {
    enabled_.store(value, std::memory_order_relaxed);
  }
  bool isEnabled() const override {
    return enabled_.load(std::memory_order_relaxed);
  }

  // Gives cached memory back (PyTorch's emptyCache(mempool_id)): with
  // {0, 0} every device's cache (the device's pool and the graph pools
  // nothing uses; nothing while a capture or a use_mem_pool context is
  // under way), with a MemPool's id that pool's free segments only, once
  // nothing uses it (~MemPool calls it after releasePool). While the memory
  // history records, the segments that went are recorded with this call's
  // stack.
  void emptyCache(c10::MempoolId_t mempool_id) override {
    c10::DeviceIndex n = c10::cuda::device_count();
    if (!history.on()) {
      for (c10::DeviceIndex d = 0; d < n; ++d) {
        api.pool_empty_cache(d, mempool_id.first, mempool_id.second);
      }
      return;
    }
    auto context = history.gather(RecordContext::ALL);
    for (c10::DeviceIndex d = 0; d < n; ++d) {
      std::vector<SegmentInfo> before;
      std::vector<SegmentInfo> after;
      snapshot_device(d, before, mempool_id);
      api.pool_empty_cache(d, mempool_id.first, mempool_id.second);
      snapshot_device(d, after, mempool_id);
      for (const auto& s : before) {
        bool kept = std::any_of(after.begin(), after.end(), [&](const SegmentInfo& a) {
          return a.address == s.address && a.total_size == s.total_size;
        });
        if (!kept) {
          history.segment_freed(d, s.address, s.total_size, s.stream, s.owner_private_pool_id, context);
        }
      }
    }
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override {
    gpumem_device_stats_t s{};
    api.get_device_stats(device, &s);
    *largest_block = static_cast<size_t>(std::max<int64_t>(0, s.largest_free_block));
  }

  void* getBaseAllocation(void* /*ptr*/, size_t* /*size*/) override {
    fail(ipc_message());
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream)
      override {
    // Only memory this allocator handed out is tracked: the device pool's
    // blocks and the graph pools' (whose deleter is free_pointer); a
    // DataPtr of another allocator, or an empty one, is none of gpumem's
    // business. A graph-pool block read by another stream during a capture
    // must be recorded too, or its free would let the capture reuse it
    // before that stream's reads.
    c10::DeleterFnPtr deleter = ptr.get_deleter();
    if (ptr.get() == nullptr || (deleter != &free_allocation && deleter != &free_pointer)) {
      return;
    }
    api.record_stream(ptr.get(), ptr.device().index(), stream.stream());
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) override {
    gpumem_device_stats_t s{};
    api.get_device_stats(device, &s);
    c10::CachingDeviceAllocator::DeviceStats out;
    set_all(out.allocation, s.allocation);
    set_all(out.segment, s.segment);
    set_all(out.active, s.active);
    set_all(out.allocated_bytes, s.allocated_bytes);
    set_all(out.requested_bytes, s.requested_bytes);
    set_all(out.reserved_bytes, s.reserved_bytes);
    set_all(out.active_bytes, s.active_bytes);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    gpumem_device_stats_t small{};
    gpumem_device_stats_t large{};
    if (api.get_class_stats(device, &small, &large) == 0) {
      set_classes(out.allocation, small.allocation, large.allocation);
      set_classes(out.segment, small.segment, large.segment);
      set_classes(out.active, small.active, large.active);
      set_classes(out.allocated_bytes, small.allocated_bytes, large.allocated_bytes);
      set_classes(out.requested_bytes, small.requested_bytes, large.requested_bytes);
      set_classes(out.reserved_bytes, small.reserved_bytes, large.reserved_bytes);
      set_classes(out.active_bytes, small.active_bytes, large.active_bytes);
    }
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    api.reset_accumulated_stats(device);
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    api.reset_peak_stats(device);
  }

  // Every device's segments, or with a MemPool's id that pool's only (with
  // their blocks and, when the memory history records stacks, each live
  // block's allocation stack) and, when asked, the history's trace entries
  // and annotations.
  SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override {
    SnapshotInfo info{};
    c10::DeviceIndex n = c10::cuda::device_count();
    for (c10::DeviceIndex d = 0; d < n; ++d) {
      snapshot_device(d, info.segments, mempool_id);
    }
    if (history.on()) {
      for (auto& seg : info.segments) {
        size_t at = seg.address;
        for (auto& b : seg.blocks) {
          if (b.allocated) {
            auto [context, requested] = history.block_of(reinterpret_cast<void*>(at));
            b.context_when_allocated = std::move(context);
            if (requested != 0) {
              seg.requested_size += requested - b.requested_size;
              b.requested_size = requested;
            }
          } else if (!b.active) {
            // A free block: what last used its start, as PyTorch reports
            // for its inactive blocks (not counted in the segment's total).
            auto [context, requested] = history.last_freed_at(reinterpret_cast<void*>(at));
            b.context_when_allocated = std::move(context);
            b.requested_size = requested;
          }
          at += b.size;
        }
      }
    }
    info.device_traces = include_traces ? history.traces(static_cast<size_t>(n))
                                        : std::vector<std::vector<TraceEntry>>(static_cast<size_t>(n));
    if (include_traces) {
      info.external_annotations = history.annotations();
    }
    return info;
  }

  void beginAllocateToPool(
      c10::DeviceIndex device,
      c10::MempoolId_t mempool_id,
      std::function<bool(cudaStream_t)> filter) override {
    if (api.graph_pool_begin(device, mempool_id.first, mempool_id.second) != 0) {
      fail(std::string("gpumem: beginAllocateToPool: ") + last_error());
    }
    std::lock_guard<std::mutex> lock(captures_mutex);
    captures.push_back(
        Capture{device, mempool_id, std::move(filter), std::this_thread::get_id()});
    n_captures.fetch_add(1, std::memory_order_acq_rel);
  }

  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id)
      override {
    {
      std::lock_guard<std::mutex> lock(captures_mutex);
      auto it = std::find_if(captures.begin(), captures.end(), [&](const Capture& c) {
        return c.device == device && c.pool == mempool_id;
      });
      if (it != captures.end()) {
        captures.erase(it);
        n_captures.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
    if (api.graph_pool_end(device, mempool_id.first, mempool_id.second) != 0) {
      TORCH_WARN(std::string("gpumem: endAllocateToPool: ") + last_error());
    }
  }

  // Called as graphs are destroyed: warns rather than throws.
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id)
      override {
    if (api.graph_pool_release(device, mempool_id.first, mempool_id.second) != 0) {
      TORCH_WARN(std::string("gpumem: releasePool: ") + last_error());
    }
  }

  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id)
      override {
    return api.graph_pool_use_count(device, mempool_id.first, mempool_id.second);
  }

  void createOrIncrefPool(
      c10::DeviceIndex device,
      c10::MempoolId_t mempool_id,
      std::shared_ptr<CUDAAllocator> allocator) override {
    if (allocator != nullptr && allocator.get() != this) {
      // The pool's segments come from that allocator (gpumem releases the
      // copy it is given, on failure at once).
      gpumem_segment_source_t source{
          &foreign_alloc, &foreign_free, &foreign_release, new ForeignAllocator(std::move(allocator))};
      if (api.graph_pool_retain_foreign(device, mempool_id.first, mempool_id.second, &source) != 0) {
        fail(std::string("gpumem: createOrIncrefPool: ") + last_error());
      }
      return;
    }
    if (api.graph_pool_retain(device, mempool_id.first, mempool_id.second) != 0) {
      fail(std::string("gpumem: createOrIncrefPool: ") + last_error());
    }
  }

  // MemPool(use_on_oom=True): when an allocation of the device's pool fails
  // even after gpumem emptied its cache, the free blocks of such pools serve
  // it (in the order they were made; none grows). ~MemPool clears it, after
  // which the pool may be gone already: that only warns.
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom)
      override {
    if (api.graph_pool_set_use_on_oom(device, mempool_id.first, mempool_id.second, use_on_oom ? 1 : 0) == 0) {
      return;
    }
    if (use_on_oom) {
      fail(std::string("gpumem: setUseOnOOM: ") + last_error());
    }
    TORCH_WARN(std::string("gpumem: setUseOnOOM: ") + last_error());
  }

  // MemPool(no_split=True): the pool hands its free blocks out whole, so
  // each of its segments holds one block.
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    if (api.graph_pool_set_no_split(device, mempool_id.first, mempool_id.second) != 0) {
      fail(std::string("gpumem: setNoSplit: ") + last_error());
    }
  }

  bool checkPoolLiveAllocations(
      c10::DeviceIndex device,
      c10::MempoolId_t mempool_id,
      const std::unordered_set<void*>& expected_live_allocations) override {
    std::vector<void*> live = graph_pool_live(device, mempool_id);
    if (live.size() != expected_live_allocations.size()) {
      return false;
    }
    for (void* p : live) {
      if (expected_live_allocations.count(p) == 0) {
        return false;
      }
    }
    return true;
  }

  ShareableHandle shareIpcHandle(void* /*ptr*/) override {
    fail(ipc_message());
  }
  std::shared_ptr<void> getIpcDevPtr(std::string /*handle*/) override {
    fail(ipc_message());
  }

  bool isHistoryEnabled() override {
    return history.on();
  }
  void recordHistory(
      bool enabled,
      CreateContextFn context_recorder,
      size_t alloc_trace_max_entries,
      RecordContext when,
      bool clear_history,
      const std::vector<std::string>& skip_actions) override {
    history.record(enabled, context_recorder, alloc_trace_max_entries, when, clear_history, skip_actions);
  }

  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    history.annotate(c10::cuda::current_device(), md);
  }
  void pushCompileContext(std::string& md) override {
    history.push_compile_context(md);
  }
  void popCompileContext() override {
    history.pop_compile_context();
  }
  void setUserMetadata(const std::string& metadata) override {
    history.set_user_metadata(metadata);
  }
  std::string getUserMetadata() override {
    return history.user_metadata();
  }

  void attachOutOfMemoryObserver(OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) override {
    history.attach(std::move(tracker));
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access)
      override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      C10_CUDA_CHECK(err);
    }
  }

  cudaError_t memcpyAsync(
      void* dst,
      int dst_device,
      const void* src,
      int src_device,
      size_t count,
      cudaStream_t stream,
      bool p2p_enabled) override {
    if (p2p_enabled || dst_device == src_device) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }

  std::shared_ptr<AllocatorState> getCheckpointState(
      c10::DeviceIndex device,
      c10::MempoolId_t id) override {
    auto state = std::make_shared<Checkpoint>();
    state->device = device;
    state->saved = api.graph_pool_checkpoint(device, id.first, id.second);
    if (state->saved == nullptr) {
      fail(std::string("gpumem: getCheckpointState: ") + last_error());
    }
    return state;
  }

  // Puts a graph pool's saved layout back: the blocks made since are freed
  // (their pointers returned), the checkpoint's blocks not live now are made
  // live again at their addresses (returned as DataPtrs whose deleter frees
  // them). Refused, with nothing changed, when a segment of the checkpoint
  // went back to the driver or a block another graph uses would be freed.
  CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device,
      std::shared_ptr<AllocatorState> pps) override {
    auto* state = dynamic_cast<Checkpoint*>(pps.get());
    if (state == nullptr || state->device != device) {
      fail("gpumem: setCheckpointPoolState: not a checkpoint of gpumem's on this device");
    }
    gpumem_restored_t* r = api.graph_pool_restore(state->saved);
    if (r == nullptr) {
      fail(std::string("gpumem: setCheckpointPoolState: ") + last_error());
    }
    std::vector<void*> freed(api.restored_freed(r, nullptr, 0));
    api.restored_freed(r, freed.data(), freed.size());
    std::vector<gpumem_block_t> made(api.restored_made(r, nullptr, 0));
    api.restored_made(r, made.data(), made.size());
    api.restored_free(r);
    CheckpointDelta delta;
    delta.ptrs_freed = std::move(freed);
    c10::Device where(c10::DeviceType::CUDA, device);
    for (const auto& b : made) {
      void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(b.address));
      delta.dataptrs_allocd.emplace_back(p, p, &free_pointer, where);
    }
    return delta;
  }

  std::string name() override {
    return "gpumem";
  }

  void copy_data(void* dest, const void* src, std::size_t count) const final {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

 private:
  static std::string last_error() {
    const char* e = api.last_error();
    return e != nullptr ? e : "no reason given";
  }

  // Allocates from the graph pool a capture's filter takes the stream to, or
  // from the device's pool (recorded in the memory history when it is on).
  Allocation allocate_block(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    Allocation a = route_block(size, device, stream);
    if (history.on()) {
      history.allocated(device, a.ptr, size, a.stream, a.pool);
    }
    if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
      report_to_profiler(a.ptr, static_cast<int64_t>(size), device);
    }
    return a;
  }

  // allocate_block's choice of pool; relaxed capture mode while any capture
  // is under way.
  Allocation route_block(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    if (!capturing()) {
      return device_block(size, device, stream);
    }
    RelaxedMode relaxed(true);
    PoolId pool;
    if (!pool_for(device, stream, &pool)) {
      return device_block(size, device, stream);
    }
    pass_capture_reuse();
    foreign_error.clear();
    void* p = api.graph_pool_malloc(size, device, pool.first, pool.second, stream);
    if (p == nullptr) {
      failed(size, device, " for a CUDA graph or MemPool");
    }
    // A segment refused and then served after gpumem emptied its cache.
    foreign_error.clear();
    return Allocation{p, size, size, stream, device, pool};
  }

  // A block of the device's pool, of the size PyTorch's own allocator
  // would give the request.
  Allocation device_block(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    size_t block = block_size_for(size);
    return Allocation{malloc_or_throw(size, block, device, stream), size, block, stream, device, kDevicePool};
  }

  // The live blocks of a graph pool (none when it does not exist).
  static std::vector<void*> graph_pool_live(c10::DeviceIndex device, PoolId id) {
    std::vector<void*> live;
    for (int attempt = 0; attempt < 4; ++attempt) {
      size_t n = 0;
      if (api.graph_pool_live_blocks(device, id.first, id.second, live.data(), live.size(), &n) != 0) {
        return {};
      }
      if (n <= live.size()) {
        live.resize(n);
        return live;
      }
      live.resize(n + 16);
    }
    return live;
  }

  static std::string ipc_message() {
    return "gpumem's native allocator does not support CUDA IPC of tensors "
           "(torch.multiprocessing sharing a CUDA tensor); allocate tensors "
           "to share under gpumem.torch.mempool() or with PyTorch's allocator";
  }

  void* malloc_or_throw(
      size_t size,
      size_t block,
      c10::DeviceIndex device,
      cudaStream_t stream) {
    void* p = api.malloc_rounded(size, block, device, stream);
    if (p != nullptr) {
      return p;
    }
    failed(block, device, "");
  }

  static void check_size(size_t size) {
    if (size >= kOneExaByte) {
      fail_out_of_memory("CUDA out of memory. Tried to allocate more than 1EB memory.");
    }
  }

  // An allocation gpumem refused: out of memory raises OutOfMemoryError
  // with PyTorch's message (its fields: the request, the GPU's capacity and
  // free memory, what this process allocated and holds), after PyTorch's
  // observers ran, and gpumem's reason; anything else a RuntimeError.
  [[noreturn]] void failed(size_t size, c10::DeviceIndex device, const char* what) {
    std::string why = last_error();
    if (!foreign_error.empty()) {
      why += " (" + foreign_error + ")";
      foreign_error.clear();
    }
    if (why.find("out of memory") == std::string::npos) {
      fail(std::string("gpumem could not allocate ") + format_bytes(size) + what +
           " on device " + std::to_string(static_cast<int>(device)) + ": " + why);
    }
    notify_oom(device);
    gpumem_device_stats_t s{};
    api.get_device_stats(device, &s);
    size_t free = 0;
    size_t total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
        (void)cudaGetLastError();
      }
    }
    if (history.on()) {
      history.out_of_memory(device, free, size, nullptr);
    }
    uint64_t allocated = static_cast<uint64_t>(std::max<int64_t>(0, s.allocated_bytes.current));
    uint64_t reserved = static_cast<uint64_t>(std::max<int64_t>(0, s.reserved_bytes.current));
    std::string allowed;
    double fraction = api.get_memory_fraction(device);
    if (fraction < 1.0) {
      allowed = format_bytes(static_cast<uint64_t>(fraction * static_cast<double>(total))) +
          " allowed; ";
    }
    fail_out_of_memory(
        "CUDA out of memory. Tried to allocate " + format_bytes(size) + what + ". GPU " +
        std::to_string(static_cast<int>(device)) + " has a total capacity of " + format_bytes(total) +
        " of which " + format_bytes(free) + " is free. Including non-PyTorch memory, this process has " +
        format_bytes(total - std::min(free, total)) + " memory in use. " + allowed +
        "Of the allocated memory " + format_bytes(allocated) + " is allocated by PyTorch (gpumem), and " +
        format_bytes(reserved - std::min(allocated, reserved)) +
        " is reserved by gpumem but unallocated. gpumem: " + why);
  }

  static void* uncached_malloc(size_t size, c10::DeviceIndex device) {
    c10::cuda::CUDAGuard guard(device);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      fail_out_of_memory(
          "CUDA out of memory. Tried to allocate " + format_bytes(size) + " with gpumem disabled (cudaMalloc)");
    }
    C10_CUDA_CHECK(err);
    return p;
  }

  void* raw_alloc_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    if (size == 0) {
      return nullptr;
    }
    check_size(size);
    if (!enabled_.load(std::memory_order_relaxed)) {
      void* p = uncached_malloc(size, device);
      std::lock_guard<std::mutex> lock(raw_mutex);
      raw_blocks[p] = Allocation{p, size, size, stream, device, kUncached};
      return p;
    }
    Allocation a = allocate_block(size, device, stream);
    std::lock_guard<std::mutex> lock(raw_mutex);
    raw_blocks[a.ptr] = a;
    return a.ptr;
  }

  void notify_oom(c10::DeviceIndex device) {
    std::vector<OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> lock(observers_mutex_);
      observers = oom_observers_;
    }
    if (observers.empty()) {
      return;
    }
    gpumem_device_stats_t s{};
    api.get_device_stats(device, &s);
    size_t free = 0;
    size_t total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
        (void)cudaGetLastError();
      }
    }
    for (auto& o : observers) {
      o(device, static_cast<size_t>(s.allocated_bytes.current), total, free);
    }
  }

  // Segments with their blocks, live ones from gpumem and the gaps between
  // them as free blocks, so every segment is tiled as memory_viz expects:
  // those of one MemPool, or with kDevicePool all the device holds.
  static void snapshot_device(
      c10::DeviceIndex device,
      std::vector<SegmentInfo>& out,
      PoolId pool = kDevicePool) {
    size_t n_segments = 0;
    size_t n_blocks = 0;
    std::vector<gpumem_segment_t> segments;
    std::vector<gpumem_block_t> blocks;
    for (int attempt = 0; attempt < 4; ++attempt) {
      if (api.pool_snapshot(
              device,
              pool.first,
              pool.second,
              segments.data(),
              segments.size(),
              &n_segments,
              blocks.data(),
              blocks.size(),
              &n_blocks) != 0) {
        return;
      }
      if (n_segments <= segments.size() && n_blocks <= blocks.size()) {
        break;
      }
      // Grown meanwhile: ask again with room to spare.
      segments.resize(n_segments + n_segments / 4 + 16);
      blocks.resize(n_blocks + n_blocks / 4 + 16);
    }
    segments.resize(std::min(n_segments, segments.size()));
    blocks.resize(std::min(n_blocks, blocks.size()));
    size_t b = 0;
    for (const auto& s : segments) {
      SegmentInfo seg;
      seg.device = device;
      seg.address = s.address;
      seg.total_size = s.size;
      seg.stream = reinterpret_cast<cudaStream_t>(s.stream);
      seg.is_large = s.is_large != 0;
      seg.is_expandable = s.is_expandable != 0;
      seg.owner_private_pool_id = PoolId{s.pool_id0, s.pool_id1};
      uint64_t at = s.address;
      uint64_t end = s.address + s.size;
      while (b < blocks.size() && blocks[b].address < s.address) {
        ++b;  // a block outside every segment: not drawn
      }
      for (; b < blocks.size() && blocks[b].address < end; ++b) {
        const auto& blk = blocks[b];
        if (blk.address > at) {
          BlockInfo gap;
          gap.size = blk.address - at;
          seg.blocks.push_back(gap);
        }
        BlockInfo live;
        live.size = blk.size;
        live.requested_size = blk.requested;
        live.allocated = true;
        live.active = true;
        seg.blocks.push_back(live);
        seg.allocated_size += blk.size;
        seg.requested_size += blk.requested;
        seg.active_size += blk.size;
        at = std::max(at, blk.address + blk.size);
      }
      if (at < end) {
        BlockInfo gap;
        gap.size = end - at;
        seg.blocks.push_back(gap);
      }
      out.push_back(std::move(seg));
    }
  }

  std::mutex observers_mutex_;
  std::vector<OutOfMemoryObserver> oom_observers_;
  std::atomic<bool> enabled_{true};
};

}  // namespace gpumem_torch

// Installs the allocator as PyTorch's current CUDA allocator. Must run before
// PyTorch's first CUDA allocation. Returns 0, or -1 with the reason written to
// `error` (at most `error_len` bytes, NUL-terminated). No C++ exception leaves.
extern "C" int gpumem_torch_install(
    const gpumem_torch_api* api,
    char* error,
    size_t error_len) {
  auto fail = [&](const std::string& why) {
    if (error != nullptr && error_len > 0) {
      std::strncpy(error, why.c_str(), error_len - 1);
      error[error_len - 1] = '\0';
    }
    return -1;
  };
  if (api == nullptr || api->malloc_rounded == nullptr || api->free_rounded == nullptr ||
      api->last_error == nullptr || api->get_device_stats == nullptr ||
      api->reset_peak_stats == nullptr ||
      api->reset_accumulated_stats == nullptr || api->empty_cache == nullptr ||
      api->set_memory_fraction == nullptr ||
      api->get_memory_fraction == nullptr || api->record_stream == nullptr ||
      api->snapshot == nullptr || api->graph_pool_checkpoint == nullptr ||
      api->checkpoint_free == nullptr || api->graph_pool_restore == nullptr ||
      api->restored_freed == nullptr || api->restored_made == nullptr ||
      api->restored_free == nullptr || api->graph_pool_live_blocks == nullptr ||
      api->graph_pool_block == nullptr || api->get_class_stats == nullptr ||
      api->set_graph_capture_reuse == nullptr ||
      api->pool_snapshot == nullptr || api->pool_empty_cache == nullptr ||
      api->graph_pool_set_no_split == nullptr || api->graph_pool_set_use_on_oom == nullptr ||
      api->graph_pool_retain_foreign == nullptr) {
    return fail("gpumem_torch_install: the function table is incomplete");
  }
  try {
    gpumem_torch::api = *api;
    static auto allocator = std::make_shared<gpumem_torch::GpumemAllocator>();
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    // torch.accelerator's memory API asks c10's allocator registry, which
    // changeCurrentAllocator leaves at PyTorch's allocator.
    c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), /*priority=*/1);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("gpumem_torch_install: unknown C++ exception");
  }
}
