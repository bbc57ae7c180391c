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
// - allocate / raw_alloc: gpumem_malloc on the current stream. gpumem empties
//   its cache and retries once on out-of-memory; a failure after that raises
//   torch.OutOfMemoryError with gpumem's message, after PyTorch's OOM
//   observers ran. Other failures raise RuntimeError.
// - the DataPtr's context carries (pointer, size, device, stream), so a free
//   is one gpumem_free with the stream of the allocation, as PyTorch's own
//   allocator orders it. raw_delete looks raw allocations up in a small map.
// - statistics, reset, cacheInfo, emptyCache, the memory fraction,
//   recordStream and snapshot map to their gpumem_* counterparts.
// - CUDA graph pools (beginAllocateToPool) and CUDA IPC of tensors are not
//   supported by this mode: they raise an error naming gpumem and the way out
//   (the MemPool mode, gpumem.torch.mempool, supports both).

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

#include "gpumem.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

// The table gpumem.torch fills with the addresses of libgpumem's functions,
// typed after their declarations in gpumem.h. Its order is part of the
// contract with python/gpumem/torch.py (_API there).
struct gpumem_torch_api {
  decltype(&gpumem_malloc) malloc;
  decltype(&gpumem_free) free;
  decltype(&gpumem_last_error) last_error;
  decltype(&gpumem_get_device_stats) get_device_stats;
  decltype(&gpumem_reset_peak_stats) reset_peak_stats;
  decltype(&gpumem_reset_accumulated_stats) reset_accumulated_stats;
  decltype(&gpumem_empty_cache) empty_cache;
  decltype(&gpumem_set_memory_fraction) set_memory_fraction;
  decltype(&gpumem_get_memory_fraction) get_memory_fraction;
  decltype(&gpumem_record_stream) record_stream;
  decltype(&gpumem_snapshot) snapshot;
};

namespace gpumem_torch {

using namespace c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::BlockInfo;
using c10::CachingDeviceAllocator::SegmentInfo;
using c10::CachingDeviceAllocator::Stat;
using c10::CachingDeviceAllocator::StatArray;
using c10::CachingDeviceAllocator::StatType;

// What a DataPtr's context holds: everything gpumem_free needs.
struct Allocation {
  void* ptr;
  size_t size;
  cudaStream_t stream;
  c10::DeviceIndex device;
};

gpumem_torch_api api;

void free_allocation(void* ctx) {
  auto* a = static_cast<Allocation*>(ctx);
  if (a == nullptr) {
    return;
  }
  api.free(a->ptr, static_cast<ssize_t>(a->size), a->device, a->stream);
  delete a;
}

// Messages are formatted with snprintf, never with iostreams: the compiler
// that builds this file may bring another libstdc++ than the one PyTorch
// loaded, and their locale facets (used by every ostream << of a number)
// are not compatible. Strings are passed to PyTorch's checks whole.
std::string format_bytes(uint64_t bytes) {
  char buf[64];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1ull << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

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
void set_all(StatArray& a, const gpumem_stat_t& s) {
  a[static_cast<size_t>(StatType::AGGREGATE)] = to_stat(s);
}

class GpumemAllocator final : public CUDAAllocator {
 public:
  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    c10::Device where(c10::DeviceType::CUDA, device);
    if (size == 0) {
      return {nullptr, nullptr, &free_allocation, where};
    }
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* p = malloc_or_throw(size, device, stream);
    return {p, new Allocation{p, size, stream, device}, &free_allocation, where};
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
    if (ptr == nullptr) {
      return;
    }
    Allocation a{};
    {
      std::lock_guard<std::mutex> lock(raw_mutex_);
      auto it = raw_.find(ptr);
      if (it == raw_.end()) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "gpumem: raw_delete of %p, which raw_alloc did not hand out", ptr);
        fail(buf);
      }
      a = it->second;
      raw_.erase(it);
    }
    api.free(a.ptr, static_cast<ssize_t>(a.size), a.device, a.stream);
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
          "gpumem: invalid memory fraction %g for device %d (expected 0 < fraction <= 1)",
          fraction,
          static_cast<int>(device));
      fail(buf);
    }
  }

  std::vector<StreamSegmentSize> getExpandableSegmentSizes(
      c10::DeviceIndex /*device*/) override {
    return {};
  }

  void enable(bool /*value*/) override {}
  bool isEnabled() const override {
    return true;
  }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    for (c10::DeviceIndex d = 0; d < c10::cuda::device_count(); ++d) {
      api.empty_cache(d);
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
    // Only memory this allocator handed out is tracked (a DataPtr of another
    // allocator, or an empty one, is none of gpumem's business).
    if (ptr.get() == nullptr || ptr.get_deleter() != &free_allocation) {
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
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    api.reset_accumulated_stats(device);
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    api.reset_peak_stats(device);
  }

  SnapshotInfo snapshot(c10::MempoolId_t /*mempool_id*/, bool /*include_traces*/)
      override {
    SnapshotInfo info{};
    c10::DeviceIndex n = c10::cuda::device_count();
    info.device_traces.resize(n);
    for (c10::DeviceIndex d = 0; d < n; ++d) {
      snapshot_device(d, info.segments);
    }
    return info;
  }

  void beginAllocateToPool(
      c10::DeviceIndex /*device*/,
      c10::MempoolId_t /*mempool_id*/,
      std::function<bool(cudaStream_t)> /*filter*/) override {
    fail(graph_message());
  }
  void endAllocateToPool(
      c10::DeviceIndex /*device*/,
      c10::MempoolId_t /*mempool_id*/) override {
    fail(graph_message());
  }
  void releasePool(c10::DeviceIndex /*device*/, c10::MempoolId_t /*mempool_id*/)
      override {
    // Nothing was ever allocated to a pool (beginAllocateToPool refuses).
  }

  ShareableHandle shareIpcHandle(void* /*ptr*/) override {
    fail(ipc_message());
  }
  std::shared_ptr<void> getIpcDevPtr(std::string /*handle*/) override {
    fail(ipc_message());
  }

  bool isHistoryEnabled() override {
    return false;
  }
  void recordHistory(
      bool /*enabled*/,
      CreateContextFn /*context_recorder*/,
      size_t /*alloc_trace_max_entries*/,
      RecordContext /*when*/,
      bool /*clear_history*/,
      const std::vector<std::string>& /*skip_actions*/) override {
    // Snapshots carry segments and live blocks; gpumem records no stack
    // traces, so history recording is accepted and has no effect (use
    // GPUMEM_CONF's log=FILE for an allocation trace).
  }

  void attachOutOfMemoryObserver(OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(AllocatorTraceTracker /*tracker*/) override {
    // No trace entries are produced (see recordHistory).
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
      c10::DeviceIndex /*device*/,
      c10::MempoolId_t /*id*/) override {
    fail(graph_message());
  }
  CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex /*device*/,
      std::shared_ptr<AllocatorState> /*pps*/) override {
    fail(graph_message());
  }

  std::string name() override {
    return "gpumem";
  }

  void copy_data(void* dest, const void* src, std::size_t count) const final {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

 private:
  static std::string graph_message() {
    return "gpumem's native allocator does not support CUDA graph memory pools "
           "(torch.cuda.graph, make_graphed_callables, torch.compile's "
           "reduce-overhead mode) yet; capture under gpumem.torch.mempool() "
           "instead, which routes the graph's memory through PyTorch's pool "
           "with gpumem underneath";
  }

  static std::string ipc_message() {
    return "gpumem's native allocator does not support CUDA IPC of tensors "
           "(torch.multiprocessing sharing a CUDA tensor); allocate tensors "
           "to share under gpumem.torch.mempool() or with PyTorch's allocator";
  }

  void* malloc_or_throw(
      size_t size,
      c10::DeviceIndex device,
      cudaStream_t stream) {
    void* p = api.malloc(static_cast<ssize_t>(size), device, stream);
    if (p != nullptr) {
      return p;
    }
    const char* e = api.last_error();
    std::string why = e != nullptr ? e : "no reason given";
    bool oom = why.find("out of memory") != std::string::npos;
    if (oom) {
      notify_oom(device);
    }
    std::string where = format_bytes(size) + " on device " + std::to_string(static_cast<int>(device));
    if (oom) {
      fail_out_of_memory("CUDA out of memory. Tried to allocate " + where + " through gpumem: " + why);
    }
    fail("gpumem could not allocate " + where + ": " + why);
  }

  void* raw_alloc_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    if (size == 0) {
      return nullptr;
    }
    void* p = malloc_or_throw(size, device, stream);
    std::lock_guard<std::mutex> lock(raw_mutex_);
    raw_[p] = Allocation{p, size, stream, device};
    return p;
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
  // them as free blocks, so every segment is tiled as memory_viz expects.
  static void snapshot_device(
      c10::DeviceIndex device,
      std::vector<SegmentInfo>& out) {
    size_t n_segments = 0;
    size_t n_blocks = 0;
    std::vector<gpumem_segment_t> segments;
    std::vector<gpumem_block_t> blocks;
    for (int attempt = 0; attempt < 4; ++attempt) {
      if (api.snapshot(
              device,
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
      seg.stream = reinterpret_cast<void*>(s.stream);
      seg.is_large = true;
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

  std::mutex raw_mutex_;
  std::unordered_map<void*, Allocation> raw_;
  std::mutex observers_mutex_;
  std::vector<OutOfMemoryObserver> oom_observers_;
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
  if (api == nullptr || api->malloc == nullptr || api->free == nullptr ||
      api->last_error == nullptr || api->get_device_stats == nullptr ||
      api->reset_peak_stats == nullptr ||
      api->reset_accumulated_stats == nullptr || api->empty_cache == nullptr ||
      api->set_memory_fraction == nullptr ||
      api->get_memory_fraction == nullptr || api->record_stream == nullptr ||
      api->snapshot == nullptr) {
    return fail("gpumem_torch_install: the function table is incomplete");
  }
  try {
    gpumem_torch::api = *api;
    static auto allocator = std::make_shared<gpumem_torch::GpumemAllocator>();
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("gpumem_torch_install: unknown C++ exception");
  }
}
