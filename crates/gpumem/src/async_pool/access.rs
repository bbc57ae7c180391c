//! Peer access to a pool's memory (`cuMemPoolSetAccess` / `cuMemPoolGetAccess`).
//!
//! A pool's memory is always readable and writable by the device that owns
//! it; other devices get access per pool, for all of its allocations, past and
//! future. Decisions for the owning device (the only device on a one-GPU
//! machine): granting it read-write is a no-op that succeeds, granting it less
//! is [`Error::InvalidArgument`] (the driver does not allow it), and asking for
//! its access answers read-write without a driver call. A peer that cannot
//! reach the owner (`cuDeviceCanAccessPeer` false) is [`Error::Unsupported`];
//! a peer ordinal that does not exist is [`Error::NoSuchDevice`]. For pools
//! imported from another process the owner is not known here, so every
//! question goes to the driver.

use super::attributes::MemPool;
use crate::driver::{AccessFlags, Location};
use crate::{Error, Result};

impl MemPool {
    /// The device that owns the pool's memory, if it is device memory.
    fn owner(&self) -> Option<u32> {
        if self.is_imported() {
            return None;
        }
        match self.location() {
            Location::Device(d) => Some(d),
            Location::Host | Location::HostNuma(_) => None,
        }
    }

    /// Gives device `peer` the given access to all of the pool's memory. See
    /// the module documentation for the owning device and unreachable peers.
    pub fn grant_access(&self, peer: u32, flags: AccessFlags) -> Result<()> {
        self.device().sibling(peer)?;
        if let Some(owner) = self.owner() {
            if peer == owner {
                return if flags == AccessFlags::ReadWrite {
                    Ok(())
                } else {
                    Err(Error::InvalidArgument(format!(
                        "device {peer} owns the pool and always has read-write access to it"
                    )))
                };
            }
            let driver = self.device().driver();
            if flags != AccessFlags::None && !driver.can_access_peer(peer, owner)? {
                return Err(Error::unsupported(format!(
                    "peer access from device {peer} to memory of device {owner}"
                )));
            }
        }
        // SAFETY: the pool is live while `self` is (see `MemPool`), and this
        // handle decides its access: it owns the pool, or holds the default
        // pool or a foreign one for its user, who asks for the grant.
        unsafe {
            self.device()
                .driver()
                .mempool_set_access(self.raw(), peer, flags)
        }
    }

    /// The access device `peer` has to the pool's memory.
    pub fn access(&self, peer: u32) -> Result<AccessFlags> {
        self.device().sibling(peer)?;
        if self.owner() == Some(peer) {
            return Ok(AccessFlags::ReadWrite);
        }
        // SAFETY: the pool is live while `self` is (see `MemPool`).
        unsafe { self.device().driver().mempool_get_access(self.raw(), peer) }
    }
}
