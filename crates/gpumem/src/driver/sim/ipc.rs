//! In-process stand-ins for CUDA's IPC handles.
//!
//! An exported pool or physical allocation becomes a real file descriptor: an
//! unlinked temporary file holding a one-line token that names the driver
//! instance, the kind of object and its id. Importing reads the token back
//! through `/proc/self/fd` (Linux), so only the same `SimDriver` in the same
//! process can import it; cross-process sharing is not simulated. Pool
//! pointers are exported as 64 bytes holding the same identity.
//!
//! Costs: a file create, write and unlink per export; a file read per import.

use std::io::Write;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use super::faults::{drv, INVALID_VALUE};
use crate::driver::PoolPtrExport;
use crate::Result;

const MAGIC: &[u8; 8] = b"gpmsim01";

static FILE_SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes `kind uid id` into a fresh unlinked file and returns its descriptor.
pub(super) fn export_token(call: &'static str, kind: &str, uid: u64, id: u64) -> Result<OwnedFd> {
    let os = |_| drv(call, 304);
    let seq = FILE_SEQ.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "gpumem-sim-{}-{uid}-{kind}-{id}-{seq}",
        std::process::id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(os)?;
    let res = writeln!(f, "gpumem-sim {kind} {uid} {id}");
    let _ = std::fs::remove_file(&path);
    res.map_err(os)?;
    Ok(f.into())
}

/// Reads back the token behind `fd`: (kind, uid, id).
pub(super) fn import_token(call: &'static str, fd: BorrowedFd<'_>) -> Result<(String, u64, u64)> {
    let bad = || drv(call, INVALID_VALUE);
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let text = std::fs::read_to_string(path).map_err(|_| bad())?;
    let mut it = text.split_whitespace();
    if it.next() != Some("gpumem-sim") {
        return Err(bad());
    }
    let kind = it.next().ok_or_else(bad)?.to_string();
    let uid = it.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let id = it.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    Ok((kind, uid, id))
}

/// Export data for one pool block.
pub(super) fn pointer_data(uid: u64, pool: u64, addr: u64) -> PoolPtrExport {
    let mut d = [0u8; 64];
    d[..8].copy_from_slice(MAGIC);
    d[8..16].copy_from_slice(&uid.to_le_bytes());
    d[16..24].copy_from_slice(&pool.to_le_bytes());
    d[24..32].copy_from_slice(&addr.to_le_bytes());
    PoolPtrExport(d)
}

/// Reads export data back: (uid, pool, addr).
pub(super) fn parse_pointer_data(data: &PoolPtrExport) -> Option<(u64, u64, u64)> {
    let d = &data.0;
    if &d[..8] != MAGIC {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(d[i..i + 8].try_into().unwrap_or([0; 8]));
    Some((word(8), word(16), word(24)))
}
