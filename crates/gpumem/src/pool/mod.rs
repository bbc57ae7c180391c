//! Pools: stream-ordered resources that suballocate memory from an upstream resource.

mod arena;
pub use arena::*;
