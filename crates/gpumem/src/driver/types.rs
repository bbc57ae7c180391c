//! Plain handle and property types shared by every driver backend.
//!
//! Handles are raw integers so that the CUDA backend can pass them straight to
//! the driver and the simulated backend can use them as table keys. They carry
//! no ownership: the safe owners live above this layer (`Stream`, `Event`,
//! resources).

/// A device address (a `CUdeviceptr`). Host-accessible resources return host
/// addresses in the same type, since CUDA's address space is unified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null pointer, returned for zero-byte allocations.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// True for the null pointer.
    #[inline]
    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` further on (wrapping: never panics; callers pass
    /// offsets inside an allocation).
    #[inline]
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes as u64))
    }

    /// The raw address.
    #[inline]
    pub fn addr(self) -> u64 {
        self.0
    }

    /// The address as a raw C pointer (for FFI).
    #[inline]
    pub fn as_mut_ptr<T>(self) -> *mut T {
        self.0 as usize as *mut T
    }
}

impl std::fmt::LowerHex for DevicePtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::LowerHex::fmt(&self.0, f)
    }
}

/// A raw stream handle (a `CUstream`). `0` is the legacy default stream.
pub type RawStream = u64;
/// A raw event handle (a `CUevent`).
pub type RawEvent = u64;
/// A raw memory-pool handle (a `CUmemoryPool`).
pub type RawPool = u64;
/// A raw physical allocation handle (a `CUmemGenericAllocationHandle`).
pub type RawPhys = u64;
/// A raw graph handle (a `CUgraph`), as stream capture returns it.
pub type RawGraph = u64;
/// A raw executable-graph handle (a `CUgraphExec`).
pub type RawGraphExec = u64;
/// A raw graph-node handle (a `CUgraphNode`): a node of the graph a capture
/// under way builds, as its streams' dependency sets name them.
pub type RawGraphNode = u64;

/// The legacy default stream, `CU_STREAM_LEGACY` (same semantics as handle 0).
pub const STREAM_LEGACY: RawStream = 0x1;
/// The per-thread default stream, `CU_STREAM_PER_THREAD`.
pub const STREAM_PER_THREAD: RawStream = 0x2;

/// Which backend a driver is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The real CUDA driver, loaded at run time.
    Cuda,
    /// The simulated device.
    Sim,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Cuda => "cuda",
            Backend::Sim => "sim",
        })
    }
}

/// Free and total device memory, as `cuMemGetInfo` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes free on the device.
    pub free: usize,
    /// Bytes the device has in all.
    pub total: usize,
}

/// What a device can do that gpumem cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: u32,
    /// Marketing name, such as `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Total device memory in bytes.
    pub total_memory: usize,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Whether stream-ordered memory pools (`cuMemAllocAsync`) are supported.
    pub memory_pools: bool,
    /// Whether virtual memory management (`cuMemCreate`, `cuMemMap`) is supported.
    pub vmm: bool,
    /// Whether pools and VMM handles can be exported as POSIX file descriptors.
    pub posix_fd_ipc: bool,
    /// Whether the device supports managed memory.
    pub managed_memory: bool,
    /// Whether the device can access pageable host memory directly (HMM/SAM).
    pub pageable_memory_access: bool,
    /// Whether VMM memory can be made usable by RDMA devices
    /// (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`): what
    /// [`PhysProps::rdma_capable`] needs.
    pub gpu_direct_rdma_vmm: bool,
}

/// Flags for pinned host allocation (`cuMemHostAlloc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostAllocFlags {
    /// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context, not only the current one.
    pub portable: bool,
    /// `CU_MEMHOSTALLOC_DEVICEMAP`: map into the device address space.
    pub device_map: bool,
    /// `CU_MEMHOSTALLOC_WRITECOMBINED`: write-combined (fast to write, slow to read on the host).
    pub write_combined: bool,
}

/// Where memory lives, for pools and VMM allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Device memory on the given ordinal.
    Device(u32),
    /// Host memory (pinned), usable by devices.
    Host,
    /// Host memory on a NUMA node.
    HostNuma(i32),
}

/// Kind of memory a pool hands out (`CUmemAllocationType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllocationType {
    /// Pinned device or host memory (`CU_MEM_ALLOCATION_TYPE_PINNED`).
    Pinned,
    /// Managed memory (`CU_MEM_ALLOCATION_TYPE_MANAGED`, CUDA 13 pools).
    Managed,
}

/// Shareable handle types for IPC (`CUmemAllocationHandleType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HandleType {
    /// No IPC export.
    #[default]
    None,
    /// A POSIX file descriptor that can be sent over a Unix socket.
    PosixFd,
    /// A fabric handle (multi-node NVLink).
    Fabric,
}

/// Properties of new physical memory (the parts of `CUmemAllocationProp`
/// gpumem sets; the memory is always pinned memory of the device named in
/// the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PhysProps {
    /// Which IPC handle the memory can be exported as.
    pub handle_type: HandleType,
    /// `allocFlags.gpuDirectRDMACapable`: RDMA devices (GPUDirect RDMA) may
    /// use the memory. Only where [`DeviceInfo::gpu_direct_rdma_vmm`].
    pub rdma_capable: bool,
}

impl From<HandleType> for PhysProps {
    fn from(handle_type: HandleType) -> Self {
        Self {
            handle_type,
            rdma_capable: false,
        }
    }
}

/// Properties of a new memory pool (`CUmemPoolProps`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolProps {
    /// Pinned or managed memory.
    pub alloc_type: AllocationType,
    /// Where the memory lives.
    pub location: Location,
    /// Which IPC handle the pool can be exported as.
    pub handle_type: HandleType,
    /// Largest the pool may grow to; 0 means the driver's default (no limit).
    pub max_size: usize,
}

impl PoolProps {
    /// Device memory on `device`, no IPC, no size limit.
    pub fn device(device: u32) -> Self {
        Self {
            alloc_type: AllocationType::Pinned,
            location: Location::Device(device),
            handle_type: HandleType::None,
            max_size: 0,
        }
    }
}

/// Memory-pool attributes (`CUmemPool_attribute`). All values are `u64`;
/// booleans are 0 or 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolAttr {
    /// Bytes of cached memory the pool keeps across synchronizations.
    ReleaseThreshold,
    /// Reuse memory freed on another stream once event dependencies show it complete.
    ReuseFollowEventDependencies,
    /// Reuse memory whose free is already complete, without dependencies.
    ReuseAllowOpportunistic,
    /// Insert dependencies on the freeing stream's work to reuse memory.
    ReuseAllowInternalDependencies,
    /// Bytes the pool holds from the device now.
    ReservedMemCurrent,
    /// Highest `ReservedMemCurrent` since the last reset. Writing 0 resets it.
    ReservedMemHigh,
    /// Bytes handed out now.
    UsedMemCurrent,
    /// Highest `UsedMemCurrent` since the last reset. Writing 0 resets it.
    UsedMemHigh,
}

/// Access a device has to a pool or a mapped range (`CUmemAccess_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessFlags {
    /// No access.
    None,
    /// Read-only access.
    Read,
    /// Read and write access.
    ReadWrite,
}

/// Opaque data identifying one allocation of an exported pool
/// (`CUmemPoolPtrExportData`, 64 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPtrExport(pub [u8; 64]);

/// How a stream capture, or a thread, treats calls that are "potentially
/// unsafe" during capture (`CUstreamCaptureMode`): the calls that act at once
/// instead of in stream order, such as `cuMemAlloc`, which a graph could not
/// replay.
///
/// A capture's mode is given when it begins; a thread's mode is set with
/// [`Driver::thread_exchange_capture_mode`](crate::driver::Driver::thread_exchange_capture_mode)
/// (every thread starts in
/// [`CaptureMode::Global`]). A thread in mode `Global` may not make such calls
/// while it has a capture of its own that is not `Relaxed`, or while any
/// thread has a `Global` capture; in mode `ThreadLocal`, only its own captures
/// count; in mode `Relaxed`, it may make them. A refused call fails and
/// invalidates the captures that refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CaptureMode {
    /// `CU_STREAM_CAPTURE_MODE_GLOBAL`, the default.
    #[default]
    Global,
    /// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
    ThreadLocal,
    /// `CU_STREAM_CAPTURE_MODE_RELAXED`.
    Relaxed,
}

impl std::fmt::Display for CaptureMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CaptureMode::Global => "global",
            CaptureMode::ThreadLocal => "thread-local",
            CaptureMode::Relaxed => "relaxed",
        })
    }
}

/// Whether a stream is capturing (`CUstreamCaptureStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureStatus {
    /// Not capturing: work runs when enqueued.
    None,
    /// Capturing: work is recorded into a graph.
    Active,
    /// Capturing, but a forbidden call broke the capture: ending it fails.
    Invalidated,
}

impl std::fmt::Display for CaptureStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CaptureStatus::None => "none",
            CaptureStatus::Active => "active",
            CaptureStatus::Invalidated => "invalidated",
        })
    }
}

/// A stream's capture state, as `cuStreamGetCaptureInfo` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CaptureInfo {
    /// Whether the stream is capturing.
    pub status: CaptureStatus,
    /// The capture's id, unique in the process (0 when not capturing).
    pub id: u64,
}
