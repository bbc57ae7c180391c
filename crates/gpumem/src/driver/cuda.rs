//! The CUDA backend (placeholder: being implemented).

use std::sync::Arc;

use crate::{Error, Result};

/// The CUDA driver backend.
pub struct CudaDriver {}

impl CudaDriver {
    /// The process-wide CUDA driver.
    pub fn get() -> Result<Arc<CudaDriver>> {
        Err(Error::NoDriver { reason: "not implemented".into() })
    }
}
