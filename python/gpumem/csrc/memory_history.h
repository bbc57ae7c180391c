// Memory history for gpumem's native PyTorch allocator:
// torch.cuda.memory._record_memory_history() and the traces and stack
// traces of torch.cuda.memory._snapshot(), which PyTorch's memory viewer
// (torch.cuda._memory_viz, pytorch.org/memory_viz) draws.
//
// PyTorch's recording rules, kept here: while recording, every allocation,
// free and out-of-memory error is a trace entry (at most `max_entries` per
// device, the oldest dropped first; actions in `skip_actions` left out);
// the stack of an allocation is gathered (PyTorch's context recorder) from
// RecordContext::STATE on and kept with the live block for snapshots, and
// trace entries carry stacks from ALLOC on (a free's own stack from ALL
// on, else its allocation's). Entries made outside a compile region say
// "N/A". Turning recording off clears the traces. Segments: the memory
// empty_cache gives back is recorded (the caller diffs the segments);
// gpumem takes memory inside its pools, which the native allocator does
// not see, so no segment allocation is recorded.
//
// Cost while not recording: one relaxed atomic load per allocation and
// free. Stacks are gathered outside the lock (the recorder may take the
// GIL); trace trackers run under it, as PyTorch's do.

#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/ApproximateClock.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace gpumem_torch {

using c10::CachingDeviceAllocator::AllocatorTraceTracker;
using c10::CachingDeviceAllocator::AnnotationEntry;
using c10::CachingDeviceAllocator::CreateContextFn;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;

class MemoryHistory {
 public:
  bool on() const {
    return on_.load(std::memory_order_relaxed);
  }

  void record(
      bool enabled,
      CreateContextFn recorder,
      size_t max_entries,
      RecordContext when,
      bool clear,
      const std::vector<std::string>& skip_actions) {
    std::lock_guard<std::mutex> lock(mutex_);
    recorder_ = enabled ? recorder : nullptr;
    when_ = enabled && recorder != nullptr ? when : RecordContext::NEVER;
    size_t max = std::max<size_t>(1, max_entries);
    if (max != max_entries_) {
      clear = true;  // the rings are laid out for the old length
      max_entries_ = max;
    }
    skip_.clear();
    for (const auto& a : skip_actions) {
      skip_.insert(c10::CachingDeviceAllocator::parseTraceEntryAction(a));
    }
    if (!enabled || clear) {
      traces_.clear();
      next_.clear();
    }
    if (!enabled) {
      blocks_.clear();
      last_freed_.clear();
    }
    on_.store(enabled, std::memory_order_relaxed);
  }

  // The stack of this moment if recording asks for it at `level`.
  std::shared_ptr<c10::GatheredContext> gather(RecordContext level) const {
    CreateContextFn recorder = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (static_cast<int>(when_) < static_cast<int>(level)) {
        return nullptr;
      }
      recorder = recorder_;
    }
    return recorder != nullptr ? recorder() : nullptr;
  }

  void allocated(
      c10::DeviceIndex device,
      void* ptr,
      size_t size,
      void* stream,
      c10::MempoolId_t pool) {
    auto context = gather(RecordContext::STATE);
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[ptr] = Live{context, size};
    add(TraceEntry::ALLOC, device, reinterpret_cast<size_t>(ptr), size, stream, pool, context);
  }

  void freed(
      c10::DeviceIndex device,
      void* ptr,
      size_t size,
      void* stream,
      c10::MempoolId_t pool) {
    auto context = gather(RecordContext::ALL);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ptr);
    std::shared_ptr<c10::GatheredContext> at_alloc;
    if (it != blocks_.end()) {
      at_alloc = it->second.context;
      // A free block keeps its last allocation's requested size; its stack
      // only where stacks outlive their blocks (not with "state"), as in
      // PyTorch's snapshots.
      if (static_cast<int>(when_) < static_cast<int>(RecordContext::ALLOC)) {
        it->second.context = nullptr;
      }
      last_freed_[ptr] = std::move(it->second);
      blocks_.erase(it);
    }
    const auto& ctx = context != nullptr ? context : at_alloc;
    for (auto action : {TraceEntry::FREE_REQUESTED, TraceEntry::FREE_COMPLETED}) {
      add(action, device, reinterpret_cast<size_t>(ptr), size, stream, pool, ctx);
    }
  }

  void out_of_memory(c10::DeviceIndex device, size_t device_free, size_t size, void* stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    add(TraceEntry::OOM, device, device_free, size, stream, {0, 0}, nullptr);
  }

  // A segment given back (by empty_cache), with the stack of the call that
  // gave it back (from ALL on).
  void segment_freed(
      c10::DeviceIndex device,
      size_t addr,
      size_t size,
      void* stream,
      c10::MempoolId_t pool,
      std::shared_ptr<c10::GatheredContext> context) {
    std::lock_guard<std::mutex> lock(mutex_);
    add(TraceEntry::SEGMENT_FREE, device, addr, size, stream, pool, std::move(context));
  }

  // The stack recorded when the live block at `ptr` was allocated (null
  // when none was), and the size it was asked with (0 when unknown).
  std::pair<std::shared_ptr<c10::GatheredContext>, size_t> block_of(void* ptr) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      return {nullptr, 0};
    }
    return {it->second.context, it->second.requested};
  }

  // The stack and requested size of the last block recorded at `ptr`
  // that was freed since (null and 0 when none was): what a snapshot says
  // of a free block starting there, as PyTorch's says of its inactive
  // blocks, so the memory viewer can tell what last used free memory.
  std::pair<std::shared_ptr<c10::GatheredContext>, size_t> last_freed_at(void* ptr) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = last_freed_.find(ptr);
    if (it == last_freed_.end()) {
      return {nullptr, 0};
    }
    return {it->second.context, it->second.requested};
  }

  // Each device's entries, oldest first.
  std::vector<std::vector<TraceEntry>> traces(size_t devices) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::vector<TraceEntry>> out(devices);
    for (size_t d = 0; d < devices && d < traces_.size(); ++d) {
      const auto& ring = traces_[d];
      size_t start = ring.size() < max_entries_ ? 0 : next_[d];
      for (size_t i = 0; i < ring.size(); ++i) {
        out[d].push_back(ring[(start + i) % ring.size()]);
      }
    }
    return out;
  }

  void attach(AllocatorTraceTracker tracker) {
    std::lock_guard<std::mutex> lock(mutex_);
    trackers_.push_back(std::move(tracker));
  }

  void push_compile_context(const std::string& md) {
    std::lock_guard<std::mutex> lock(mutex_);
    compile_contexts_.push_back(md);
  }

  void pop_compile_context() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!compile_contexts_.empty()) {
      compile_contexts_.pop_back();
    }
  }

  void set_user_metadata(const std::string& md) {
    std::lock_guard<std::mutex> lock(mutex_);
    user_metadata_ = md;
  }

  std::string user_metadata() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return user_metadata_;
  }

  void annotate(c10::DeviceIndex device, const std::vector<std::pair<std::string, std::string>>& md) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!on()) {
      return;
    }
    AnnotationEntry a(device, c10::getApproximateTime());
    for (const auto& [k, v] : md) {
      a.recordUserMetadata(k, v);
    }
    annotations_.push_back(std::move(a));
  }

  std::vector<AnnotationEntry> annotations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return annotations_;
  }

 private:
  // Under the lock.
  void add(
      TraceEntry::Action action,
      c10::DeviceIndex device,
      size_t addr,
      size_t size,
      void* stream,
      c10::MempoolId_t pool,
      std::shared_ptr<c10::GatheredContext> context) {
    if (!on() || skip_.count(action) != 0 || device < 0) {
      return;
    }
    if (static_cast<int>(when_) < static_cast<int>(RecordContext::ALLOC)) {
      context = nullptr;
    }
    TraceEntry te(
        action, device, addr, size, stream, pool, c10::getApproximateTime(), std::move(context),
        compile_contexts_.empty() ? std::string("N/A") : compile_contexts_.back(), user_metadata_);
    for (const auto& t : trackers_) {
      t(te);
    }
    size_t d = static_cast<size_t>(device);
    if (traces_.size() <= d) {
      traces_.resize(d + 1);
      next_.resize(d + 1, 0);
    }
    auto& ring = traces_[d];
    if (ring.size() < max_entries_) {
      ring.push_back(std::move(te));
    } else {
      ring[next_[d]] = std::move(te);
      next_[d] = (next_[d] + 1) % max_entries_;
    }
  }

  std::atomic<bool> on_{false};
  mutable std::mutex mutex_;
  CreateContextFn recorder_ = nullptr;
  RecordContext when_ = RecordContext::NEVER;
  size_t max_entries_ = 1;
  std::unordered_set<int> skip_;
  std::vector<std::vector<TraceEntry>> traces_;
  std::vector<size_t> next_;
  // What the history knows of each live block allocated while recording.
  struct Live {
    std::shared_ptr<c10::GatheredContext> context;
    size_t requested;
  };
  std::unordered_map<void*, Live> blocks_;
  // The last freed block recorded at each address (one entry per address
  // a recorded block started at, kept until recording stops).
  std::unordered_map<void*, Live> last_freed_;
  std::vector<AllocatorTraceTracker> trackers_;
  std::vector<std::string> compile_contexts_;
  std::string user_metadata_;
  std::vector<AnnotationEntry> annotations_;
};

}  // namespace gpumem_torch
