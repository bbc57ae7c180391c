//! Peer access between the simulated devices, modelled as CUDA does it.
//!
//! A device reaches its own memory. It reaches another device's memory only
//! when that memory was opened to it, and each kind of memory has its own
//! grant:
//! - `cuMemAlloc` memory: peer access enabled from the device to the owner
//!   (`cuCtxEnablePeerAccess`), for all of the owner's such memory;
//! - memory of a stream-ordered pool: the pool's grant to the device
//!   (`cuMemPoolSetAccess`); peer access does not open it;
//! - VMM memory: the mapping's grant to the device (`cuMemSetAccess`).
//!
//! Pinned and managed host memory is reachable by every device.
//!
//! Every memset and copy checks, when it is enqueued, every byte it touches
//! as seen by the device of its stream (which runs it; for
//! `cuMemcpyPeerAsync` too). A touch of another device's memory without the
//! grant is refused with `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED` and recorded as
//! a [`PeerViolation`], so a test can assert that code never made one. (A
//! real GPU faults on such an access from a kernel; its copy engines stage
//! some copies instead, which the simulator does not: code it accepts works
//! on both.)
//!
//! `cuDeviceCanAccessPeer` answers [`SimConfig::peer_access`] for distinct
//! devices (true for a device and itself); enabling peer access where it is
//! false is `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`, for a device and itself
//! [`Error::InvalidArgument`](crate::Error::InvalidArgument), and enabling it twice
//! `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`, which the driver layer answers
//! as success.
//!
//! [`SimConfig::peer_access`]: super::SimConfig::peer_access

use super::faults::{drv, INVALID_VALUE, PEER_ACCESS_NOT_ENABLED, PEER_ACCESS_UNSUPPORTED};
use super::memory::Region;
use super::State;
use crate::Result;

/// Which grant a device lacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Grant {
    /// Peer access to the owner (`cuCtxEnablePeerAccess`).
    PeerAccess,
    /// The pool's access (`cuMemPoolSetAccess`).
    Pool,
    /// The mapping's access (`cuMemSetAccess`).
    Mapping,
}

impl Grant {
    fn describe(self, device: u32, owner: u32) -> String {
        match self {
            Grant::PeerAccess => format!(
                "peer access from device {device} to device {owner} is not enabled (cuCtxEnablePeerAccess)"
            ),
            Grant::Pool => format!(
                "its memory pool gives device {device} no access (cuMemPoolSetAccess)"
            ),
            Grant::Mapping => format!(
                "its mapping gives device {device} no access (cuMemSetAccess)"
            ),
        }
    }
}

/// A byte of another device's memory that a device may not touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PeerDenial {
    pub(super) addr: u64,
    pub(super) owner: u32,
    pub(super) grant: Grant,
}

/// Why a range cannot be used as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Denied {
    /// Not allocated, not live, not mapped, or not accessible on its own device.
    Invalid,
    /// Another device's memory without the grant.
    Peer(PeerDenial),
}

/// A touch of another device's memory that the simulator refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerViolation {
    /// The CUDA name of the call, such as `cuMemcpyDtoDAsync`.
    pub call: &'static str,
    /// The device whose stream would have run it.
    pub device: u32,
    /// The device that owns the memory.
    pub owner: u32,
    /// The first byte it could not touch.
    pub address: u64,
    /// What was missing, in words.
    pub reason: String,
}

impl std::fmt::Display for PeerViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: device {} touched memory of device {} at {:#x}, but {}",
            self.call, self.device, self.owner, self.address, self.reason
        )
    }
}

impl State {
    /// `cuDeviceCanAccessPeer`.
    pub(super) fn can_access_peer(&self, device: u32, peer: u32) -> bool {
        device == peer || self.cfg.peer_access
    }

    /// Whether work of `device` reaches `owner`'s `cuMemAlloc` memory.
    pub(super) fn peer_reaches(&self, device: u32, owner: u32) -> bool {
        device == owner || self.peers_enabled.contains(&(device, owner))
    }

    /// `cuCtxEnablePeerAccess`: true when newly enabled.
    pub(super) fn enable_peer_access(&mut self, device: u32, peer: u32) -> Result<bool> {
        const CALL: &str = "cuCtxEnablePeerAccess";
        self.check_device(device, CALL)?;
        self.check_device(peer, CALL)?;
        if device == peer {
            return Err(crate::driver::peer_access_to_itself(device));
        }
        if !self.can_access_peer(device, peer) {
            return Err(drv(CALL, PEER_ACCESS_UNSUPPORTED));
        }
        Ok(self.peers_enabled.insert((device, peer)))
    }

    /// Checks that work of `device` may touch `[addr, addr+len)` (writing it
    /// if `write`); a refusal of another device's memory is recorded.
    pub(super) fn touch(
        &mut self,
        addr: u64,
        len: u64,
        device: u32,
        write: bool,
        call: &'static str,
    ) -> Result<()> {
        match self.translate(addr, len, device, write) {
            Ok(_) => Ok(()),
            Err(Denied::Peer(d)) => {
                self.peer_violations.push(PeerViolation {
                    call,
                    device,
                    owner: d.owner,
                    address: d.addr,
                    reason: d.grant.describe(device, d.owner),
                });
                Err(drv(call, PEER_ACCESS_NOT_ENABLED))
            }
            Err(Denied::Invalid) => Err(drv(call, INVALID_VALUE)),
        }
    }

    /// The device whose memory holds `addr` (`None` for host memory or an
    /// address nothing holds).
    pub(super) fn owner_of(&self, addr: u64) -> Option<u32> {
        let (&a, r) = self.regions.range(..=addr).next_back()?;
        if addr >= a + r.len() {
            return None;
        }
        match r {
            Region::Plain { device, .. } => Some(*device),
            Region::Pool(b) => Some(b.device),
            Region::Map(m) => self.phys.get(&m.phys).map(|p| p.device),
        }
    }
}
