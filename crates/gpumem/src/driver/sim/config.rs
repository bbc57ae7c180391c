//! Configuration of the simulated device: how many devices, how much memory,
//! whether memory is backed by host RAM, and which CUDA features are present.
//!
//! A `SimConfig` is plain data; building one costs nothing.

/// Configuration of a simulated device.
///
/// The default is one 80 GiB device in address-only mode (no host RAM behind
/// device memory) with every feature on, like an H100.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimConfig {
    /// Number of devices (at most [`SimConfig::MAX_DEVICES`]; more are ignored).
    pub devices: u32,
    /// Memory per device in bytes (default 80 GiB).
    pub capacity: usize,
    /// Back device addresses with real host memory so data operations check
    /// contents. Off, data operations on device memory move no bytes.
    pub backed: bool,
    /// Device name reported by `device_info`.
    pub name: String,
    /// Whether stream-ordered memory pools (`cuMemAllocAsync`, `cuMemPool*`) exist.
    pub memory_pools: bool,
    /// Whether virtual memory management (`cuMemCreate`, `cuMemMap`, ...) exists.
    pub vmm: bool,
    /// VMM granularity in bytes (minimum and recommended); a power of two, at least 256.
    pub granularity: usize,
    /// Whether pools and VMM handles can be exported as POSIX file descriptors.
    pub posix_fd_ipc: bool,
    /// Whether managed memory (`cuMemAllocManaged`) is supported.
    pub managed_memory: bool,
    /// Whether devices access pageable host memory (HMM/ATS); default false.
    /// With it on, preferred-location advice on host memory is accepted.
    pub pageable_memory_access: bool,
    /// Compute capability reported by `device_info`.
    pub compute_capability: (i32, i32),
    /// Whether distinct devices can access each other's memory
    /// (`cuDeviceCanAccessPeer`; default true, as over NVLink). Off, every
    /// `cuCtxEnablePeerAccess` is refused and only copies staged through the
    /// host cross devices.
    pub peer_access: bool,
    /// Whether physical memory can be made RDMA-capable
    /// (`gpu_direct_rdma_vmm` in `device_info`; default true).
    pub gpu_direct_rdma: bool,
}

impl SimConfig {
    /// Most devices one simulated driver has.
    pub const MAX_DEVICES: u32 = 64;

    /// One backed device of `capacity` bytes: device memory is real host memory,
    /// so memset and copies can be checked byte by byte. Keep `capacity` small.
    pub fn backed(capacity: usize) -> Self {
        Self {
            capacity,
            backed: true,
            ..Self::default()
        }
    }

    /// `devices` address-only devices of the default capacity.
    pub fn multi(devices: u32) -> Self {
        Self {
            devices,
            ..Self::default()
        }
    }

    /// The granularity actually used: the configured one rounded up to a power
    /// of two of at least 256 bytes.
    pub(super) fn effective_granularity(&self) -> usize {
        self.granularity
            .max(256)
            .checked_next_power_of_two()
            .unwrap_or(2 << 20)
    }

    /// The number of devices actually simulated.
    pub(super) fn effective_devices(&self) -> u32 {
        self.devices.min(Self::MAX_DEVICES)
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            devices: 1,
            capacity: 80 << 30,
            backed: false,
            name: "gpumem simulated device".into(),
            memory_pools: true,
            vmm: true,
            granularity: 2 << 20,
            posix_fd_ipc: true,
            managed_memory: true,
            pageable_memory_access: false,
            compute_capability: (9, 0),
            peer_access: true,
            gpu_direct_rdma: true,
        }
    }
}
