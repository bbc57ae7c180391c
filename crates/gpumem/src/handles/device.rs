//! `Device`: a driver plus a device ordinal, the handle every resource holds.
//!
//! Choosing the backend: [`Device::cuda`] loads the CUDA driver and fails with
//! [`Error::NoDriver`] when there is none; [`Device::sim`] makes a simulated
//! device; [`Device::auto`] takes CUDA when a GPU is there and the simulated
//! device otherwise; [`Device::from_env`] follows `GPUMEM_DEVICE`
//! (`sim`, `cuda` or `auto`), which is how the test suite runs the same
//! assertions on both backends.

use std::sync::Arc;

use crate::driver::cuda::CudaDriver;
use crate::driver::sim::{SimConfig, SimDriver};
use crate::driver::{Backend, DeviceInfo, Driver, MemInfo};
use crate::stream::Stream;
use crate::{Error, Result};

/// Environment variable that selects the backend: `sim`, `cuda` or `auto`.
pub const DEVICE_ENV: &str = "GPUMEM_DEVICE";
/// Environment variable that selects the CUDA device ordinal (default 0).
pub const ORDINAL_ENV: &str = "GPUMEM_CUDA_DEVICE";

/// A backend `GPUMEM_DEVICE` names. The one parser of that variable: the
/// library's [`Device::from_env`] and the C ABI both read it here, and
/// differ only in the default for an unset variable (the simulated device
/// for the test suite, CUDA for programs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// The simulated device.
    Sim,
    /// The CUDA driver.
    Cuda,
    /// CUDA when a GPU is there, else the simulated device.
    Auto,
}

impl BackendChoice {
    /// Parses a value of `GPUMEM_DEVICE`: `sim`, `cuda` or `auto`, in any
    /// case, surrounding blanks ignored. `Ok(None)` for an empty value (the
    /// caller's default); anything else is an error naming the choices.
    pub fn parse(value: &str) -> Result<Option<Self>> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" => Ok(None),
            "sim" => Ok(Some(Self::Sim)),
            "cuda" => Ok(Some(Self::Cuda)),
            "auto" => Ok(Some(Self::Auto)),
            _ => Err(Error::InvalidArgument(format!(
                "{DEVICE_ENV}={value:?}: expected sim, cuda or auto"
            ))),
        }
    }

    /// [`BackendChoice::parse`] of `GPUMEM_DEVICE` (unset: `Ok(None)`).
    pub fn from_env() -> Result<Option<Self>> {
        Self::parse(&std::env::var(DEVICE_ENV).unwrap_or_default())
    }
}

/// A device of a driver backend. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    driver: Arc<dyn Driver>,
    ordinal: u32,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("backend", &self.driver.backend())
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

impl Device {
    /// Device `ordinal` of `driver`; fails if the ordinal does not exist.
    /// The first device made installs gpumem's exit and fork hooks
    /// ([`crate::exit`], [`crate::fork`]).
    pub fn new(driver: Arc<dyn Driver>, ordinal: u32) -> Result<Self> {
        crate::exit::install_hook();
        let count = driver.device_count()?;
        if ordinal >= count {
            return Err(Error::NoSuchDevice {
                device: ordinal,
                count,
            });
        }
        Ok(Self { driver, ordinal })
    }

    /// CUDA device `ordinal`; [`Error::NoDriver`] when no driver or GPU is present.
    pub fn cuda(ordinal: u32) -> Result<Self> {
        let driver: Arc<dyn Driver> = CudaDriver::get()?;
        Self::new(driver, ordinal)
    }

    /// Device 0 of a new simulated device with the given configuration.
    pub fn sim(config: SimConfig) -> Self {
        Self::sim_with_driver(config).0
    }

    /// Like [`Device::sim`], also returning the simulated driver for test control
    /// (pausing streams, fault injection, accounting).
    pub fn sim_with_driver(config: SimConfig) -> (Self, Arc<SimDriver>) {
        crate::exit::install_hook();
        let sim = Arc::new(SimDriver::new(config));
        let driver: Arc<dyn Driver> = sim.clone();
        (Self { driver, ordinal: 0 }, sim)
    }

    /// CUDA device 0 when a GPU is present, else a default simulated device.
    pub fn auto() -> Self {
        Self::cuda(0).unwrap_or_else(|_| Self::sim(SimConfig::default()))
    }

    /// The backend `GPUMEM_DEVICE` asks for: `cuda` (device `GPUMEM_CUDA_DEVICE`,
    /// default 0), `auto`, or `sim` (the default), in which case `sim` configures
    /// the simulated device. Returns the simulated driver too when it is one.
    pub fn from_env(sim: SimConfig) -> Result<(Self, Option<Arc<SimDriver>>)> {
        let want = BackendChoice::from_env()?.unwrap_or(BackendChoice::Sim);
        let ordinal = match std::env::var(ORDINAL_ENV) {
            Ok(s) => s.trim().parse::<u32>().map_err(|_| {
                Error::InvalidArgument(format!("{ORDINAL_ENV}={s:?} is not a device ordinal"))
            })?,
            Err(_) => 0,
        };
        match want {
            BackendChoice::Sim => {
                let (d, s) = Self::sim_with_driver(sim);
                Ok((d, Some(s)))
            }
            BackendChoice::Cuda => Ok((Self::cuda(ordinal)?, None)),
            BackendChoice::Auto => match Self::cuda(ordinal) {
                Ok(d) => Ok((d, None)),
                Err(_) => {
                    let (d, s) = Self::sim_with_driver(sim);
                    Ok((d, Some(s)))
                }
            },
        }
    }

    /// The driver behind this device.
    #[inline]
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// The device ordinal.
    #[inline]
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Which backend this device runs on.
    pub fn backend(&self) -> Backend {
        self.driver.backend()
    }

    /// The same driver's device `ordinal`.
    pub fn sibling(&self, ordinal: u32) -> Result<Device> {
        Self::new(self.driver.clone(), ordinal)
    }

    /// Name, memory and feature support.
    pub fn info(&self) -> Result<DeviceInfo> {
        self.driver.device_info(self.ordinal)
    }

    /// Free and total memory now.
    pub fn mem_info(&self) -> Result<MemInfo> {
        self.driver.mem_info(self.ordinal)
    }

    /// The legacy default stream of this device (not owned; never destroyed).
    pub fn default_stream(&self) -> Stream {
        Stream::legacy(self.clone())
    }

    /// The per-thread default stream of this device (not owned).
    pub fn per_thread_stream(&self) -> Stream {
        Stream::per_thread(self.clone())
    }

    /// Creates a new non-blocking stream, destroyed when the last clone drops.
    pub fn create_stream(&self) -> Result<Stream> {
        Stream::create(self.clone())
    }

    /// Blocks until all work on the device is complete.
    pub fn synchronize(&self) -> Result<()> {
        self.driver.device_synchronize(self.ordinal)
    }

    /// Lets work of device `peer` use this device's `cuMemAlloc` memory
    /// (peer access from `peer`'s context to this one's, enabled once for
    /// the process): the memory of [`DeviceResource`](crate::resource::DeviceResource)
    /// and of the pools over it. A stream-ordered pool's memory needs its
    /// own grant ([`AsyncResourceConfig::peers`](crate::async_pool::AsyncResourceConfig::peers)),
    /// a virtual pool's its configuration's peers. [`Error::Driver`] with
    /// `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED` where `peer` cannot reach this
    /// device; [`Error::InvalidArgument`] for the device itself.
    pub fn grant_peer_access(&self, peer: u32) -> Result<()> {
        self.driver.enable_peer_access(peer, self.ordinal).map(drop)
    }

    /// True when both handles name the same device of the same driver instance.
    pub fn same_as(&self, other: &Device) -> bool {
        self.same_driver(other) && self.ordinal == other.ordinal
    }

    /// True when both devices are of the same driver instance, so that a
    /// handle of one means the same to the other.
    pub(crate) fn same_driver(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.driver, &other.driver)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One rule for `GPUMEM_DEVICE` everywhere: any case, blanks ignored,
    /// empty for the caller's default, anything else refused by name.
    #[test]
    fn gpumem_device_values_parse_one_way() {
        for (text, want) in [
            ("sim", Some(BackendChoice::Sim)),
            (" CUDA ", Some(BackendChoice::Cuda)),
            ("Auto", Some(BackendChoice::Auto)),
            ("", None),
            ("  ", None),
        ] {
            assert_eq!(BackendChoice::parse(text).unwrap(), want, "{text:?}");
        }
        let e = BackendChoice::parse("gpu").unwrap_err().to_string();
        assert!(
            e.contains("GPUMEM_DEVICE=\"gpu\": expected sim, cuda or auto"),
            "{e}"
        );
    }
}
