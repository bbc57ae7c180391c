//! Interop with cudarc 0.19: gpumem buffers in cudarc copies and kernel
//! launches, and streams shared between the two.
//!
//! [`DeviceBuffer`] implements cudarc's [`DeviceSlice`], [`DevicePtr`](cudarc::driver::DevicePtr) and
//! [`DevicePtrMut`], and `&DeviceBuffer` / `&mut DeviceBuffer` are kernel
//! arguments ([`PushKernelArg`]) passing the device pointer.
//!
//! Stream ordering. A gpumem buffer is ordered on its own [`Stream`]; cudarc
//! hands a `&CudaStream` to `device_ptr`/`device_ptr_mut`. When the two are the
//! same stream (share them: [`stream_from_cudarc`] wraps cudarc's stream for
//! gpumem, [`cudarc_stream`] the reverse), nothing is added. When they differ,
//! cudarc's stream is made to wait for the buffer's stream (one event), and the
//! returned [`SyncOnDrop`] synchronizes cudarc's stream when dropped, so the
//! buffer's later work and its free cannot overtake cudarc's use. Kernel
//! arguments cannot add such waits (cudarc keeps its launch builder's event
//! lists private): launch on the buffer's stream, or order the streams first
//! ([`Stream::wait_for`]).
//!
//! [`DeviceSlice::stream`] returns a cudarc wrapper of the buffer's stream
//! (kept in the buffer once asked for). Wrappers come from one cache keyed
//! by device and stream handle, so every device's legacy stream has its own.
//! An entry keeps a clone of the gpumem [`Stream`] next to the wrapper, so the
//! handle stays valid while any clone of the wrapper may be used; an entry
//! whose wrapper and stream are referenced nowhere else is dropped when the
//! next new stream is wrapped, so the cache holds only what is in use. A
//! foreign stream ([`Stream::from_raw`]) stays its owner's to keep alive. On
//! the simulated backend there is no cudarc stream:
//! [`DeviceSlice::stream`] panics there (the trait cannot return an error);
//! everything else returns errors or is never reached, since a `CudaStream`
//! cannot exist without CUDA.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytemuck::Pod;
use cudarc::driver::sys::{CUdeviceptr, CUstream};
use cudarc::driver::{
    CudaContext, CudaStream, DevicePtr as CuDevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs,
    PushKernelArg, SyncOnDrop,
};

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::driver::{Backend, RawStream};
use crate::pool::stream_order::sync::lock;
use crate::resource::MemoryResource;
use crate::stream::{Event, Stream};
use crate::{Error, Result};

static CONTEXTS: Mutex<Option<HashMap<u32, Arc<CudaContext>>>> = Mutex::new(None);
static STREAMS: Mutex<Option<StreamCache<CudaStream>>> = Mutex::new(None);

/// Wrappers `W` of streams, one per (device ordinal, stream handle), each
/// with a clone of the gpumem stream it wraps.
struct StreamCache<W> {
    map: HashMap<(u32, RawStream), (Stream, Arc<W>)>,
}

impl<W> StreamCache<W> {
    fn new() -> Self {
        Self {
            map: HashMap::new(),
        }
    }

    /// The wrapper of `stream`, made by `wrap` on a miss (after dropping the
    /// entries nothing else uses).
    fn get_or_wrap(
        &mut self,
        stream: &Stream,
        wrap: impl FnOnce() -> Result<Arc<W>>,
    ) -> Result<Arc<W>> {
        let key = (stream.device().ordinal(), stream.raw());
        if let Some((_, w)) = self.map.get(&key) {
            return Ok(w.clone());
        }
        self.prune();
        let w = wrap()?;
        self.map.insert(key, (stream.clone(), w.clone()));
        Ok(w)
    }

    /// Drops the entries whose wrapper and stream are held only here.
    fn prune(&mut self) {
        self.map
            .retain(|_, (s, w)| !(s.is_sole_handle() && Arc::strong_count(w) == 1));
    }
}

/// cudarc's context for a CUDA `device`: the device's primary context, the
/// one gpumem's CUDA backend uses. Made once per ordinal.
/// [`Error::Unsupported`] on the simulated backend.
pub fn cudarc_context(device: &Device) -> Result<Arc<CudaContext>> {
    if device.backend() != Backend::Cuda {
        return Err(Error::unsupported(
            "cudarc interop needs the CUDA backend (GPUMEM_DEVICE=cuda)",
        ));
    }
    let mut g = lock(&CONTEXTS);
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(c) = map.get(&device.ordinal()) {
        return Ok(c.clone());
    }
    let ctx = CudaContext::new(device.ordinal() as usize).map_err(|e| Error::Driver {
        call: "cudarc CudaContext::new",
        code: e.0 as i32,
        name: format!("{e:?}"),
    })?;
    map.insert(device.ordinal(), ctx.clone());
    Ok(ctx)
}

/// A cudarc wrapper of a gpumem stream (borrowed: cudarc never destroys it).
/// The same wrapper is returned while any clone of it is held; the gpumem
/// stream is kept alive as long, so the wrapper stays valid.
/// [`Error::Unsupported`] on the simulated backend.
pub fn cudarc_stream(stream: &Stream) -> Result<Arc<CudaStream>> {
    let ctx = cudarc_context(stream.device())?;
    let mut g = lock(&STREAMS);
    g.get_or_insert_with(StreamCache::new)
        .get_or_wrap(stream, || {
            // SAFETY: the handle is a live stream of this device's primary
            // context (gpumem's CUDA backend works in primary contexts, and
            // `ctx` is the same primary context); the cache keeps a clone of
            // the gpumem `Stream` next to the wrapper until no clone of the
            // wrapper is left, so the handle outlives every use of it;
            // ordering with gpumem's work is handled by the trait impls below
            // (see the module documentation).
            Ok(unsafe { ctx.wrap_borrowed_stream(stream.raw() as CUstream) })
        })
}

/// A gpumem handle to cudarc's stream, so gpumem buffers and pools can be
/// ordered on the stream cudarc launches on. The handle keeps a clone of
/// cudarc's `Arc`, so the stream lives as long as the handle (cudarc destroys
/// it after both are gone). Keep one handle per cudarc stream (pools key
/// same-stream reuse by it).
pub fn stream_from_cudarc(device: &Device, stream: &Arc<CudaStream>) -> Stream {
    let keep: Arc<dyn std::any::Any + Send + Sync> = stream.clone();
    // A live cudarc stream of the device's context (cudarc's context is the
    // device's primary context, see `cudarc_context`), kept alive by the
    // handle itself.
    Stream::wrap(device.clone(), stream.cu_stream() as RawStream, Some(keep))
}

/// Makes `theirs` wait for the work enqueued on `ours` so far; on failure,
/// waits on the host instead.
fn order_after(ours: &Stream, theirs: &CudaStream) {
    let waited = (|| -> Result<()> {
        let ev = Event::new(ours.device())?;
        ev.record(ours)?;
        // SAFETY: `theirs` is a live stream of the CUDA driver, borrowed for
        // the call (cudarc destroys it after its last `Arc`), and `ev` a live
        // event of `ours`'s driver. A `CudaStream` exists only with CUDA, and
        // CUDA has one driver per process: when `ours` is a CUDA stream the
        // driver is the same; on the simulator, which keeps handles as table
        // keys, the unknown stream handle is refused, never followed.
        unsafe {
            ours.device()
                .driver()
                .stream_wait_event(theirs.cu_stream() as RawStream, ev.raw())
        }
    })();
    if waited.is_err() {
        // Could not enqueue the wait: make the buffer's work complete instead.
        let _ = ours.synchronize();
    }
}

impl<T: Pod, R: MemoryResource> DeviceSlice<T> for DeviceBuffer<T, R> {
    fn len(&self) -> usize {
        DeviceBuffer::len(self)
    }

    /// The buffer's stream as a cudarc stream.
    ///
    /// # Panics
    /// On the simulated backend, which has no cudarc stream (the trait gives
    /// no way to return an error). Use [`cudarc_stream`] for a fallible form.
    fn stream(&self) -> &Arc<CudaStream> {
        if let Some(s) = self.cudarc_stream.get() {
            return s;
        }
        match cudarc_stream(DeviceBuffer::stream(self)) {
            Ok(s) => self.cudarc_stream.get_or_init(|| s),
            Err(e) => panic!("gpumem DeviceBuffer used as a cudarc DeviceSlice: {e}"),
        }
    }
}

fn guard<'a>(ours: &Stream, theirs: &'a CudaStream) -> SyncOnDrop<'a> {
    if ours.raw() == theirs.cu_stream() as RawStream {
        SyncOnDrop::Record(None)
    } else {
        order_after(ours, theirs);
        SyncOnDrop::sync_stream(theirs)
    }
}

impl<T: Pod, R: MemoryResource> CuDevicePtr<T> for DeviceBuffer<T, R> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        let g = guard(DeviceBuffer::stream(self), stream);
        (self.as_device_ptr().0 as CUdeviceptr, g)
    }
}

impl<T: Pod, R: MemoryResource> DevicePtrMut<T> for DeviceBuffer<T, R> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        let g = guard(DeviceBuffer::stream(self), stream);
        (self.as_device_ptr().0 as CUdeviceptr, g)
    }
}

// SAFETY: the argument pushed is the address of the buffer's `u64` device
// pointer, borrowed for 'b, which outlives the launch builder ('b: 'a), so the
// pointer cudarc passes to cuLaunchKernel is valid at launch; a `CUdeviceptr`
// is a u64, which is how CUDA kernels take pointer parameters. The kernel sees
// device memory the buffer owns while borrowed.
unsafe impl<'a, 'b: 'a, T: Pod, R: MemoryResource> PushKernelArg<&'b DeviceBuffer<T, R>>
    for LaunchArgs<'a>
{
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceBuffer<T, R>) -> &mut Self {
        let p: &'b u64 = &arg.ptr.0;
        self.arg(p)
    }
}

// SAFETY: as for the shared form; the mutable borrow lets the kernel write.
unsafe impl<'a, 'b: 'a, T: Pod, R: MemoryResource> PushKernelArg<&'b mut DeviceBuffer<T, R>>
    for LaunchArgs<'a>
{
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceBuffer<T, R>) -> &mut Self {
        let p: &'b u64 = &arg.ptr.0;
        self.arg(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::SimConfig;

    #[test]
    fn the_simulated_backend_is_an_error_not_a_panic() {
        let d = Device::sim(SimConfig::default());
        assert!(matches!(cudarc_context(&d), Err(Error::Unsupported { .. })));
        assert!(cudarc_stream(&d.create_stream().unwrap()).is_err());
    }

    /// The cache over stand-in wrappers (a cudarc stream needs CUDA).
    fn wrap_count(cache: &mut StreamCache<u32>, stream: &Stream, made: &mut u32) -> Arc<u32> {
        cache
            .get_or_wrap(stream, || {
                *made += 1;
                Ok(Arc::new(*made))
            })
            .unwrap()
    }

    #[test]
    fn each_device_legacy_stream_gets_its_own_wrapper() {
        let d0 = Device::sim(SimConfig::multi(2));
        let d1 = Device::new(d0.driver().clone(), 1).unwrap();
        let (mut cache, mut made) = (StreamCache::new(), 0);
        let w0 = wrap_count(&mut cache, &Stream::legacy(d0.clone()), &mut made);
        let w1 = wrap_count(&mut cache, &Stream::legacy(d1), &mut made);
        assert_ne!(w0, w1, "device 1's legacy stream got device 0's wrapper");
        // The same device and handle share one, whichever gpumem stream asks.
        let again = wrap_count(&mut cache, &Stream::legacy(d0), &mut made);
        assert!(Arc::ptr_eq(&w0, &again));
        assert_eq!(made, 2);
    }

    #[test]
    fn entries_nothing_else_uses_are_dropped() {
        let d = Device::sim(SimConfig::default());
        let (mut cache, mut made) = (StreamCache::new(), 0);
        let kept_stream = d.create_stream().unwrap();
        let _kept = wrap_count(&mut cache, &kept_stream, &mut made);
        let held_wrapper = wrap_count(&mut cache, &d.create_stream().unwrap(), &mut made);
        for _ in 0..100 {
            let s = d.create_stream().unwrap();
            let w = wrap_count(&mut cache, &s, &mut made);
            drop((s, w));
        }
        assert_eq!(made, 102);
        // Kept: the stream still in use, and the wrapper still in use (its
        // stream lives on in the cache); the last unused one waits for the
        // next miss.
        assert_eq!(cache.map.len(), 3, "the cache grew with unused streams");
        drop(held_wrapper);
        cache.prune();
        assert_eq!(cache.map.len(), 1);
        assert!(cache.map.contains_key(&(0, kept_stream.raw())));
    }
}
