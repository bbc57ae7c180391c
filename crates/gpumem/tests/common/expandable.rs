//! Configurations and layouts for `PoolResource`'s expandable heaps, shared
//! by the tests of expandable pools and those of captures.

use gpumem::driver::DevicePtr;
use gpumem::pool::{Pool, PoolConfig, PoolResource};
use gpumem::resource::MemoryResource;

const MIB: usize = 1 << 20;

/// Heaps that grow one range in place.
pub fn expandable() -> PoolConfig {
    let mut config = PoolConfig::default();
    config.expandable = true;
    config
}

/// [`expandable`], moving free pieces of the range to its end when it grows.
pub fn recycling() -> PoolConfig {
    let mut config = expandable();
    config.recycle_pieces = true;
    config
}

/// A heap whose range holds two free 64 MiB pieces in its middle, freed on
/// `s`, and a small block at its end: `[x 128 MiB free][y 4 MiB][16 MiB
/// free]`. Returns y.
pub fn hole_in_the_middle<U: MemoryResource>(
    pool: &PoolResource<U>,
    s: &gpumem::Stream,
) -> DevicePtr {
    let x = pool.allocate(128 * MIB, 256, s).unwrap();
    let y = pool.allocate(4 * MIB, 256, s).unwrap();
    assert_eq!(pool.reserved_bytes(), 148 * MIB, "a 20 MiB step after x");
    pool.deallocate(x, 128 * MIB, 256, s).unwrap();
    y
}
