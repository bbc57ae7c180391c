//! `with_*` setters for the pools' configurations, so user code reads as one
//! expression: `PoolConfig::default().with_max_reserved(Some(8 << 30))`.
//! The configurations are `#[non_exhaustive]` (new settings are not a
//! breaking change), so outside this crate they cannot be written as struct
//! literals; each setter sets one field, documented on the field. The
//! tuning fields hidden from the documentation have no setter: they are not
//! part of the stable API.

use super::{CachingPoolConfig, GrowthPolicy, PoolConfig, Spread, VirtualPoolConfig};

macro_rules! with_setters {
    ($config:ident { $($setter:ident => $field:ident: $ty:ty),* $(,)? }) => {
        impl $config {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                #[must_use]
                pub fn $setter(mut self, value: $ty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

with_setters!(PoolConfig {
    with_initial_size => initial_size: usize,
    with_max_reserved => max_reserved: Option<usize>,
    with_growth => growth: GrowthPolicy,
    with_shards => shards: usize,
    with_spread => spread: Spread,
    with_expandable => expandable: bool,
    with_recycle_pieces => recycle_pieces: bool,
});

with_setters!(VirtualPoolConfig {
    with_max_reserved => max_reserved: Option<usize>,
    with_peers => peers: Vec<u32>,
    with_ipc => ipc: bool,
    with_shards => shards: usize,
    with_spread => spread: Spread,
    with_release_threshold => release_threshold: usize,
    with_copy_slice_bytes => copy_slice_bytes: usize,
});

with_setters!(CachingPoolConfig {
    with_max_reserved => max_reserved: Option<usize>,
    with_min_block_size => min_block_size: usize,
    with_max_block_size => max_block_size: usize,
    with_chunk_size => chunk_size: usize,
    with_stream_ordered => stream_ordered: bool,
    with_cross_stream_wait => cross_stream_wait: bool,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setter_sets_its_field_and_nothing_else() {
        let c = PoolConfig::default()
            .with_max_reserved(Some(1 << 30))
            .with_expandable(true);
        let want = PoolConfig {
            max_reserved: Some(1 << 30),
            expandable: true,
            ..PoolConfig::default()
        };
        assert_eq!(c, want);
        let v = VirtualPoolConfig::default()
            .with_peers(vec![1])
            .with_ipc(true);
        let want = VirtualPoolConfig {
            peers: vec![1],
            ipc: true,
            ..VirtualPoolConfig::default()
        };
        assert_eq!(v, want);
        let k = CachingPoolConfig::default().with_stream_ordered(false);
        let want = CachingPoolConfig {
            stream_ordered: false,
            ..CachingPoolConfig::default()
        };
        assert_eq!(k, want);
    }
}
