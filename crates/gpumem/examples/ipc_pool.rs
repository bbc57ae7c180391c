//! Two processes share a memory pool: the parent creates an exportable pool,
//! writes a pattern into an allocation, and sends the pool's file descriptor
//! (over a Unix socket, `SCM_RIGHTS`) and the allocation's export record to a
//! child, itself run again; the child imports both, reads the bytes back and
//! checks them, writes a second pattern over them, frees its mapping and
//! tells the parent, which checks the child's bytes and frees last. Exit
//! status 0 means each process saw the other's bytes.
//!
//! With `--child-device N` the child runs on device `N` (its
//! `GPUMEM_CUDA_DEVICE`): it grants its device read-write access to the
//! imported pool and copies the bytes across devices, the exchange between
//! two GPUs.
//!
//! Needs a GPU: `GPUMEM_DEVICE=cuda cargo run -p gpumem --example ipc_pool
//! [-- --child-device 1]`.
//! On the simulated device (the default) it says it is skipped and exits 0:
//! the simulator lives inside one process, so its in-process export/import is
//! tested by `tests/async_pool.rs` instead.

use std::error::Error;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use gpumem::async_pool::{ipc, AsyncResource, AsyncResourceConfig};
use gpumem::driver::sim::SimConfig;
use gpumem::driver::{AccessFlags, Backend, HandleType, PoolPtrExport};
use gpumem::resource::DeviceResource;
use gpumem::{Device, DeviceBuffer};

type Res<T> = Result<T, Box<dyn Error>>;

/// Bytes shared: a few MiB plus an odd tail.
const LEN: usize = (4 << 20) + 123;
/// Export record (64 bytes), the length (8 bytes, little endian) and the
/// exporter's device ordinal (4 bytes, little endian).
const MSG: usize = 64 + 8 + 4;
const TIMEOUT: Duration = Duration::from_secs(60);

/// The parent's bytes.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 11)) as u8)
        .collect()
}

/// The bytes the child writes back: differ from `pattern` at every byte.
fn reply(len: usize) -> Vec<u8> {
    pattern(len).iter().map(|b| !b).collect()
}

/// Whether `got` is `want`; says where they first differ if not.
fn same(who: &str, got: &[u8], want: &[u8]) -> bool {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None if got.len() == want.len() => {
            println!("{who}: all {} bytes match", want.len());
            true
        }
        first => {
            eprintln!("{who}: data differs (first difference at byte {first:?})");
            false
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("--child"), Some(path)) => child(Path::new(path)),
        (Some("--child-device"), Some(n)) => match n.parse::<u32>() {
            Ok(n) => parent(Some(n)),
            Err(_) => Err(format!("--child-device {n}: not a device ordinal").into()),
        },
        (None, _) => parent(None),
        _ => Err("usage: ipc_pool [--child-device N]".into()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ipc_pool: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parent(child_device: Option<u32>) -> Res<ExitCode> {
    let (device, _) = Device::from_env(SimConfig::default())?;
    if device.backend() == Backend::Sim {
        println!(
            "ipc_pool: skipped: needs GPUMEM_DEVICE=cuda (the simulated device lives in one \
             process; its in-process export/import is covered by tests/async_pool.rs)"
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "parent: device {} {}",
        device.ordinal(),
        device.info()?.name
    );
    let mut config = AsyncResourceConfig::default();
    config.handle_type = HandleType::PosixFd;
    let mr = AsyncResource::new(device.clone(), config)?;
    let stream = device.create_stream()?;
    let data = pattern(LEN);
    // from_slice waits for the copy: the allocation and the bytes are complete
    // before anything is exported.
    let buf = DeviceBuffer::from_slice(&data, &mr, &stream)?;
    stream.synchronize()?;
    let pool_fd = mr.export_fd()?;
    let export = mr.export_pointer(buf.as_device_ptr())?;
    println!(
        "parent: pool exported as fd {pool_fd:?}, allocation {:#x} ({LEN} bytes)",
        buf.as_device_ptr()
    );

    let path: PathBuf =
        std::env::temp_dir().join(format!("gpumem-ipc-pool-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    listener.set_nonblocking(true)?;
    let mut command = Command::new(std::env::current_exe()?);
    command.arg("--child").arg(&path);
    if let Some(n) = child_device {
        command.env(gpumem::device::ORDINAL_ENV, n.to_string());
    }
    let mut child = command.spawn()?;

    let outcome = (|| -> Res<bool> {
        let start = Instant::now();
        let conn = loop {
            match listener.accept() {
                Ok((conn, _)) => break conn,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Some(status) = child.try_wait()? {
                        return Err(format!("child exited before connecting: {status}").into());
                    }
                    if start.elapsed() > TIMEOUT {
                        return Err("child did not connect in time".into());
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e.into()),
            }
        };
        conn.set_nonblocking(false)?;
        conn.set_read_timeout(Some(TIMEOUT))?;
        let mut msg = [0u8; MSG];
        msg[..64].copy_from_slice(&export.0);
        msg[64..72].copy_from_slice(&(LEN as u64).to_le_bytes());
        msg[72..].copy_from_slice(&device.ordinal().to_le_bytes());
        ipc::send_fd(&conn, pool_fd.as_fd(), &msg)?;
        // The child answers once its mapping is freed and synchronized: only
        // then may this process free the allocation.
        let mut ack = [0u8; 1];
        (&conn).read_exact(&mut ack)?;
        // The child's write is complete (it synchronized before answering):
        // this process reads what the other device wrote.
        Ok(ack[0] == 1 && same("parent", &buf.to_vec()?, &reply(LEN)))
    })();
    let status = match &outcome {
        Ok(_) => child.wait()?,
        Err(_) => {
            let _ = child.kill();
            child.wait()?
        }
    };
    let _ = std::fs::remove_file(&path);
    drop(buf);
    stream.synchronize()?;
    let matched = outcome?;
    println!("parent: child exited with {status}; data matched: {matched}");
    Ok(if status.success() && matched {
        println!("ipc_pool: ok");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn child(path: &Path) -> Res<ExitCode> {
    let (device, _) = Device::from_env(SimConfig::default())?;
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(TIMEOUT))?;
    let mut msg = [0u8; MSG];
    let (pool_fd, n) = ipc::recv_fd(&conn, &mut msg)?;
    if n < MSG {
        (&conn).read_exact(&mut msg[n..])?;
    }
    let mut export = [0u8; 64];
    export.copy_from_slice(&msg[..64]);
    let len = u64::from_le_bytes(msg[64..72].try_into()?) as usize;
    let exporter = u32::from_le_bytes(msg[72..].try_into()?);

    let imported = AsyncResource::import_fd(device.clone(), pool_fd.as_fd())?;
    drop(pool_fd);
    if device.ordinal() != exporter {
        // The pool's memory lives on the exporter's device: this device
        // reads it as a peer.
        imported
            .pool()
            .grant_access(device.ordinal(), AccessFlags::ReadWrite)?;
        println!(
            "child: device {} reads the pool of device {exporter} as a peer",
            device.ordinal()
        );
    }
    let ptr = imported.import_pointer(&PoolPtrExport(export))?;
    println!("child: imported the pool and the allocation at {ptr:#x} ({len} bytes)");

    let stream = device.create_stream()?;
    let copy = DeviceBuffer::<u8, _>::new(len, DeviceResource::new(device.clone()), &stream)?;
    // SAFETY: both ranges are device memory (the imported allocation of a
    // device-located pool, and a DeviceResource buffer); no host memory is
    // involved, which is all the contract restricts.
    unsafe {
        device
            .driver()
            .memcpy_dtod_async(copy.as_device_ptr(), ptr, len, stream.raw())?;
    }
    let matched = same("child", &copy.to_vec()?, &pattern(len));
    // Then this device writes the other's memory: the reply pattern,
    // staged in a buffer of its own.
    let answer =
        DeviceBuffer::from_slice(&reply(len), DeviceResource::new(device.clone()), &stream)?;
    // SAFETY: as above, device memory on both sides.
    unsafe {
        device
            .driver()
            .memcpy_dtod_async(ptr, answer.as_device_ptr(), len, stream.raw())?;
    }
    stream.synchronize()?;
    println!("child: wrote {len} bytes of its own into the allocation");
    imported.free_pointer(ptr, &stream)?;
    stream.synchronize()?;
    drop(imported);
    conn.write_all(&[u8::from(matched)])?;
    Ok(if matched {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
