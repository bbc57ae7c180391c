//! A CUDA graph captured with cudarc on a gpumem stream, its temporaries
//! allocated inside the capture from a gpumem `GraphPool`, replayed 100
//! times with a fresh input each time and checked against the host.
//!
//! Each replay computes `out[i] = 2 * (x[i] + 1) + 3` through two
//! temporaries made during the capture: `t = x + 1`, `u = 2 * t`, then
//! `out = u + 3`. The temporaries are freed inside the capture, so the
//! second one can reuse the first one's memory; both keep their addresses
//! for every replay, and nothing outside the graph gets them. The capture is
//! begun by cudarc, so a `CaptureNotice` tells gpumem of it: without one the
//! pool could not tell the capture's allocations from others.
//!
//! ```sh
//! GPUMEM_DEVICE=cuda cargo run --release -p gpumem --example graph_capture
//! compute-sanitizer --tool memcheck target/release/examples/graph_capture
//! ```
//! On the simulated device (the default) it prints a note and exits 0.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use gpumem::captures::CaptureNotice;
use gpumem::driver::sim::SimConfig;
use gpumem::graph_pool::GraphPool;
use gpumem::interop::{cudarc_context, stream_from_cudarc};
use gpumem::pool::Pool;
use gpumem::{Backend, Device, DeviceBuffer};

const KERNELS: &str = r#"
extern "C" __global__ void axpb(float *out, const float *in, unsigned int n, float a, float b) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * in[i] + b;
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
    let ctx = cudarc_context(&device)?;
    let cu_stream = ctx.new_stream()?;
    let stream = stream_from_cudarc(&device, &cu_stream);
    let module = ctx.load_module(cudarc::nvrtc::compile_ptx(KERNELS)?)?;
    let axpb = module.load_function("axpb")?;

    let n: u32 = 1 << 20;
    let cfg = LaunchConfig::for_num_elems(n);
    let pool = GraphPool::new(&device)?;
    // The graph's input and output live across replays: allocated before the
    // capture, from the same pool (its memory for allocations outside
    // captures).
    let mut x = DeviceBuffer::<f32, _>::zeroed(n as usize, &pool, &stream)?;
    let mut out = DeviceBuffer::<f32, _>::zeroed(n as usize, &pool, &stream)?;
    stream.synchronize()?;

    let notice = CaptureNotice::new();
    cu_stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    {
        let launch = |dst: &mut DeviceBuffer<f32, &GraphPool>,
                      src: &DeviceBuffer<f32, &GraphPool>,
                      a: f32,
                      b: f32| {
            let mut l = cu_stream.launch_builder(&axpb);
            l.arg(dst).arg(src).arg(&n).arg(&a).arg(&b);
            // SAFETY: the kernel takes (float*, const float*, unsigned, float,
            // float), as pushed; both buffers hold `n` floats.
            unsafe { l.launch(cfg) }.map(drop)
        };
        let mut t = DeviceBuffer::<f32, _>::new(n as usize, &pool, &stream)?; // grows the pool inside the capture
        launch(&mut t, &x, 1.0, 1.0)?;
        let mut u = DeviceBuffer::<f32, _>::new(n as usize, &pool, &stream)?;
        launch(&mut u, &t, 2.0, 0.0)?;
        drop(t); // freed inside the capture, in stream order
        launch(&mut out, &u, 1.0, 3.0)?;
    } // u freed too
    let graph = cu_stream
        .end_capture(CUgraphInstantiate_flags(0))?
        .ok_or("the capture recorded nothing")?;
    drop(notice);

    let mut checked = 0usize;
    for replay in 0..100u32 {
        let input: Vec<f32> = (0..n).map(|i| ((i ^ replay) % 1000) as f32).collect();
        x.copy_from_host(&input)?;
        graph.launch()?;
        let got = out.to_vec()?;
        let bad = got
            .iter()
            .zip(&input)
            .filter(|&(&o, &v)| o != 2.0 * (v + 1.0) + 3.0)
            .count();
        if bad != 0 {
            return Err(format!("replay {replay}: {bad} wrong values").into());
        }
        checked += got.len();
    }
    drop(graph);
    drop((x, out));
    let reserved = pool.reserved_bytes();
    let given = pool.release()?;
    println!(
        "ok: 100 replays, {checked} values checked; the graph's pool held {reserved} bytes and gave {given} back"
    );
    Ok(())
}
