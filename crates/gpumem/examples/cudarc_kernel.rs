//! A cudarc kernel writing into a gpumem `DeviceBuffer<f32>` from a
//! `PoolResource`: NVRTC compiles the kernel, cudarc loads and launches it on
//! its own stream, which gpumem wraps so the buffer is ordered on the same
//! stream; the result comes back both through gpumem and through a cudarc copy
//! (`DevicePtr` interop).
//!
//! ```sh
//! GPUMEM_DEVICE=cuda cargo run --release -p gpumem --example cudarc_kernel
//! ```
//! On the simulated device (the default) it prints a note and exits 0.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use gpumem::driver::sim::SimConfig;
use gpumem::interop::{cudarc_context, stream_from_cudarc};
use gpumem::pool::{Pool, PoolResource};
use gpumem::resource::DeviceResource;
use gpumem::{Backend, Device, DeviceBuffer};

const KERNEL: &str = r#"
extern "C" __global__ void affine(float *out, unsigned int n, float a, float b) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * (float)i + b;
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (device, _) = Device::from_env(SimConfig::default())?;
    if device.backend() != Backend::Cuda {
        println!("skipped: needs GPUMEM_DEVICE=cuda");
        return Ok(());
    }
    // SAFETY: only asks the loader whether libnvrtc can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        println!("skipped: libnvrtc (the CUDA runtime compiler) is not installed");
        return Ok(());
    }
    println!("device: {}", device.info()?.name);

    // One primary context, one stream: cudarc's, wrapped for gpumem. Declared
    // first so it is dropped last (after the buffer and the pool that use it).
    let ctx = cudarc_context(&device)?;
    let cu_stream = ctx.new_stream()?;
    let stream = stream_from_cudarc(&device, &cu_stream);

    let pool = PoolResource::with_defaults(DeviceResource::new(device.clone()))?;
    let n: u32 = 1 << 20;
    let mut buf = DeviceBuffer::<f32, _>::new(n as usize, &pool, &stream)?;

    let ptx = cudarc::nvrtc::compile_ptx(KERNEL)?;
    let module = ctx.load_module(ptx)?;
    let affine = module.load_function("affine")?;
    let (a, b) = (2.0f32, 1.0f32);
    let mut launch = cu_stream.launch_builder(&affine);
    launch.arg(&mut buf).arg(&n).arg(&a).arg(&b);
    // SAFETY: the kernel takes (float*, unsigned, float, float), as pushed; it
    // writes `n` floats, the buffer's length.
    unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;

    // Back through gpumem (synchronizes the shared stream) ...
    let host = buf.to_vec()?;
    // ... and through cudarc, which takes the buffer as a `DevicePtr<f32>`.
    let via_cudarc = cu_stream.clone_dtoh(&buf)?;
    let bad = host
        .iter()
        .enumerate()
        .filter(|&(i, &x)| x != a * i as f32 + b)
        .count();
    if bad != 0 || host != via_cudarc {
        return Err(format!("{bad} wrong values (or the two copies differ)").into());
    }
    println!(
        "ok: {n} values written by a cudarc kernel into a gpumem DeviceBuffer (pool reserved {} bytes)",
        pool.reserved_bytes()
    );
    Ok(())
}
