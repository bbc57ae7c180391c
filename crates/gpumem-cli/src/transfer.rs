//! `gpumem transfer`: host↔device copy bandwidth from pinned-pool memory
//! (the MemoryManager's `PinnedPool`) versus pageable memory (a `Vec`), for
//! sizes from `--min` to `--max` (×4 steps), median of `--repeats` timed
//! copies after one warm-up, as a table or JSON lines (`--json`).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use gpumem::manager::MemoryManager;
use gpumem::resource::DeviceResource;
use gpumem::{Backend, DeviceBuffer, Stream};

use gpumem_cli::target::Target;
use gpumem_cli::units::{count_in, fmt_bytes, parse_nonzero_size};
use gpumem_cli::{outln, output};

/// Options of the `transfer` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct TransferArgs {
    /// Smallest copy (bytes, or 1MiB, 64KiB, ...).
    #[arg(long, default_value = "1MiB", value_parser = parse_nonzero_size)]
    pub min: usize,
    /// Largest copy (capped at 64 MiB on the simulated device).
    #[arg(long, default_value = "1GiB", value_parser = parse_nonzero_size)]
    pub max: usize,
    /// Timed copies per size, direction and memory kind, 1 to 1000 (the
    /// median is reported).
    #[arg(long, default_value_t = 5, value_parser = count_in(1..=1000))]
    pub repeats: usize,
    /// Write JSON lines (with date, device and command) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy)]
enum Dir {
    H2D,
    D2H,
}

/// UTC date and time, ISO 8601, from the system clock.
fn now_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Times one copy kind: returns the median seconds.
fn time_copies(
    repeats: usize,
    stream: &Stream,
    mut copy: impl FnMut() -> gpumem::Result<()>,
) -> gpumem::Result<f64> {
    copy()?;
    stream.synchronize()?;
    let mut t = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = Instant::now();
        copy()?;
        stream.synchronize()?;
        t.push(start.elapsed().as_secs_f64());
    }
    Ok(median(t))
}

/// Runs the benchmark on the target device.
pub fn run(target: &Target, args: &TransferArgs) -> anyhow::Result<()> {
    if args.min > args.max {
        anyhow::bail!(
            "--min {} is larger than --max {}",
            fmt_bytes(args.min as u64),
            fmt_bytes(args.max as u64)
        );
    }
    let device = &target.device;
    let sim = device.backend() == Backend::Sim;
    let max = if sim {
        args.max.min(64 << 20)
    } else {
        args.max
    };
    let min = args.min.min(max);
    if sim {
        output::errln(format_args!(
            "transfer: simulated device: these numbers time the simulator's host memcpy and \
             measure nothing meaningful about a GPU (run with --device cuda); sizes capped at 64 MiB"
        ));
    }
    let name = device.info()?.name;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let date = now_utc();
    let stream = device.create_stream()?;
    let mm = MemoryManager::new(device.clone());
    let pinned = mm.allocate_pinned(max)?;
    let dev = mm.allocate_device(max)?;
    let mut pageable = vec![1u8; max];
    let device_memory = DeviceResource::new(device.clone());

    if !args.json {
        outln!(
            "device: {name} ({}); median of {} copies",
            device.backend(),
            args.repeats
        )?;
        outln!(
            "{:>12} {:>14} {:>14} {:>14} {:>14}",
            "bytes",
            "h2d pinned",
            "h2d pageable",
            "d2h pinned",
            "d2h pageable"
        )?;
    }
    let mut size = min;
    while size <= max {
        let mut staging = DeviceBuffer::<u8, _>::new(size, &device_memory, &stream)?;
        let mut row = Vec::new();
        for dir in [Dir::H2D, Dir::D2H] {
            for kind in ["pinned", "pageable"] {
                let secs = match (dir, kind) {
                    (Dir::H2D, "pinned") => time_copies(args.repeats, &stream, || {
                        mm.copy_to_device_async(dev, pinned, size, &stream)
                    })?,
                    (Dir::D2H, "pinned") => time_copies(args.repeats, &stream, || {
                        mm.copy_to_host_async(pinned, dev, size, &stream)
                    })?,
                    // The buffer's copies return only once the copy has run,
                    // so the vector is never handed back under one.
                    (Dir::H2D, _) => time_copies(args.repeats, &stream, || {
                        staging.copy_from_host(&pageable[..size])
                    })?,
                    (Dir::D2H, _) => time_copies(args.repeats, &stream, || {
                        staging.copy_to_host(&mut pageable[..size])
                    })?,
                };
                let gbps = size as f64 / secs / 1e9;
                row.push(gbps);
                if args.json {
                    outln!(
                        "{{\"date\":\"{date}\",\"device\":{:?},\"backend\":\"{}\",\"command\":{:?},\
                         \"bench\":\"transfer\",\"direction\":\"{}\",\"memory\":\"{kind}\",\"bytes\":{size},\
                         \"repeats\":{},\"median_s\":{secs:.9},\"gb_per_s\":{gbps:.3}}}",
                        name,
                        device.backend(),
                        command,
                        match dir {
                            Dir::H2D => "h2d",
                            Dir::D2H => "d2h",
                        },
                        args.repeats
                    )?;
                }
            }
        }
        if !args.json {
            outln!(
                "{:>12} {:>9.2} GB/s {:>9.2} GB/s {:>9.2} GB/s {:>9.2} GB/s",
                size,
                row[0],
                row[1],
                row[2],
                row[3]
            )?;
        }
        match size.checked_mul(4) {
            Some(s) => size = s,
            None => break,
        }
    }
    drop(pageable);
    mm.free_device(dev)?;
    mm.free_pinned(pinned)?;
    mm.shutdown()?;
    Ok(())
}
