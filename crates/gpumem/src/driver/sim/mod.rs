//! The simulated device (placeholder: being implemented).

use crate::driver::*;
use crate::{Error, Result};

/// Configuration of a simulated device.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Number of devices.
    pub devices: u32,
    /// Memory per device in bytes (default 80 GiB).
    pub capacity: usize,
    /// Back addresses with real host memory so data operations check contents.
    pub backed: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self { devices: 1, capacity: 80 << 30, backed: false }
    }
}

/// The simulated driver.
pub struct SimDriver {
    _config: SimConfig,
}

impl SimDriver {
    /// A new simulated driver.
    pub fn new(config: SimConfig) -> Self {
        Self { _config: config }
    }
}
