//! Allocation traces in RMM's log format: parse, check, write.
//!
//! RMM's `logging_resource_adaptor` writes one CSV row per call:
//!
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 425,17:01:26.656531,allocate,0x7fe6ba000000,154389504,0x5644c9042ce0
//! ```
//!
//! `Time` is `HH:MM:SS.ffffff` (wall clock of the day), `Action` is `allocate`,
//! `allocate failure` or `free`, `Pointer` and `Stream` are hexadecimal (decimal
//! is accepted too), `Size` is the requested byte count. Rows are in the global
//! order the calls happened in, whatever thread made them; pointers are reused
//! once freed.
//!
//! [`parse`] reads such a log into [`TraceEvent`]s (errors name the line and the
//! column; a UTF-8 byte order mark before the first line is skipped; lines and
//! the number of events are bounded by [`Limits`], so an endless input is an
//! error, not an endless read), [`check`] says whether it can be replayed
//! (frees of unknown pointers, pointers handed out twice, size mismatches,
//! leaks) and computes the peak of live bytes, and [`write_csv`] writes events
//! back in the same format.
//!
//! ```
//! use gpumem::trace::{self, Action};
//!
//! let log = "Thread,Time,Action,Pointer,Size,Stream\n\
//!            1,10:00:00.000001,allocate,0x1000,256,0x0\n\
//!            1,10:00:00.000002,free,0x1000,256,0x0\n";
//! let events = trace::parse_str(log).unwrap();
//! assert_eq!(events[1].action, Action::Free);
//! let report = trace::check(&events).unwrap();
//! assert!(report.is_clean());
//! assert_eq!(report.peak_live, 256);
//! ```

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{self, BufRead, Read, Write};
use std::path::Path;

/// The header line RMM writes and [`write_csv`] writes.
pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// What a trace row records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A successful allocation of `size` bytes at `ptr`.
    Allocate,
    /// An allocation of `size` bytes that failed (the program saw an error).
    AllocateFailure,
    /// A free of `ptr`, allocated with `size` bytes.
    Free,
}

impl Action {
    /// The word RMM writes for this action.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allocate => "allocate",
            Action::AllocateFailure => "allocate failure",
            Action::Free => "free",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceEvent {
    /// The thread that made the call (RMM writes a numeric thread id).
    pub thread: u64,
    /// Time of day in microseconds since midnight.
    pub time_us: u64,
    /// What happened.
    pub action: Action,
    /// The pointer handed out or freed (0 for failures).
    pub ptr: u64,
    /// Bytes requested (for frees: the size passed to deallocate).
    pub size: usize,
    /// The stream the call was ordered on (0 is the legacy default stream).
    pub stream: u64,
}

/// Why a trace could not be read: the line (1-based), the column if one is at
/// fault, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number in the file (0 for I/O errors before any line).
    pub line: usize,
    /// The column at fault, such as `Size`, when one is.
    pub column: Option<&'static str>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            return f.write_str(&self.message);
        }
        write!(f, "line {}", self.line)?;
        if let Some(c) = self.column {
            write!(f, ", column {c}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ParseError {}

const COLUMNS: [&str; 6] = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"];

fn err(line: usize, column: Option<&'static str>, message: impl Into<String>) -> ParseError {
    ParseError {
        line,
        column,
        message: message.into(),
    }
}

/// Parses an unsigned integer written in hexadecimal with a `0x` prefix or in
/// decimal.
fn parse_int(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

/// Parses `HH:MM:SS[.ffffff]` into microseconds since midnight; a plain number
/// is taken as microseconds.
fn parse_time(s: &str) -> Result<u64, String> {
    if !s.contains(':') {
        return s
            .parse()
            .map_err(|_| format!("{s:?} is not a time (expected HH:MM:SS.ffffff)"));
    }
    let bad = || format!("{s:?} is not a time (expected HH:MM:SS.ffffff)");
    let mut parts = s.split(':');
    let (h, m, rest) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(h), Some(m), Some(rest), None) => (h, m, rest),
        _ => return Err(bad()),
    };
    let h: u64 = h.parse().map_err(|_| bad())?;
    let m: u64 = m.parse().map_err(|_| bad())?;
    let (sec, frac) = match rest.split_once('.') {
        Some((s, f)) => (s, f),
        None => (rest, ""),
    };
    let sec: u64 = sec.parse().map_err(|_| bad())?;
    if m >= 60 || sec >= 61 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    // Fraction to microseconds: pad or cut to six digits.
    let mut us = 0u64;
    for i in 0..6 {
        us = us * 10 + frac.as_bytes().get(i).map_or(0, |b| u64::from(b - b'0'));
    }
    h.checked_mul(3600)
        .and_then(|s| s.checked_add(m * 60 + sec))
        .and_then(|s| s.checked_mul(1_000_000))
        .and_then(|t| t.checked_add(us))
        .ok_or_else(|| format!("{s:?} is too large a time (microseconds overflow 64 bits)"))
}

/// Formats microseconds since midnight as `HH:MM:SS.ffffff`.
pub fn format_time(time_us: u64) -> String {
    let us = time_us % 1_000_000;
    let s = time_us / 1_000_000;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        s / 3600,
        (s / 60) % 60,
        s % 60,
        us
    )
}

fn parse_line(line_no: usize, line: &str) -> Result<TraceEvent, ParseError> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    if fields.len() != 6 {
        return Err(err(
            line_no,
            None,
            format!(
                "expected 6 comma-separated fields ({}), found {}",
                COLUMNS.join(","),
                fields.len()
            ),
        ));
    }
    let int = |i: usize| {
        parse_int(fields[i]).ok_or_else(|| {
            err(
                line_no,
                Some(COLUMNS[i]),
                format!(
                    "{:?} is not an integer (hex with 0x, or decimal)",
                    fields[i]
                ),
            )
        })
    };
    let thread = int(0)?;
    let time_us = parse_time(fields[1]).map_err(|m| err(line_no, Some("Time"), m))?;
    let action = match fields[2] {
        "allocate" => Action::Allocate,
        "allocate failure" => Action::AllocateFailure,
        "free" => Action::Free,
        other => {
            return Err(err(
                line_no,
                Some("Action"),
                format!("{other:?} is not an action (allocate, allocate failure or free)"),
            ))
        }
    };
    let ptr = int(3)?;
    let size = int(4)?;
    let size = usize::try_from(size).map_err(|_| {
        err(
            line_no,
            Some("Size"),
            format!("{size} does not fit in usize"),
        )
    })?;
    let stream = int(5)?;
    Ok(TraceEvent {
        thread,
        time_us,
        action,
        ptr,
        size,
        stream,
    })
}

/// Bounds on what [`parse_with_limits`] reads, so that an input that is not an
/// RMM log (a file without line breaks, `/dev/zero`, an endless stream) ends
/// in an error instead of taking all memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest line, in bytes, without its line break. An RMM row is about
    /// 100 bytes.
    pub max_line_bytes: usize,
    /// Most events (rows) read. Each takes 48 bytes, and a replay about as
    /// much again.
    pub max_events: usize,
}

impl Default for Limits {
    /// 4 KiB lines and 2^25 (33.5 million) events: about 1.6 GB of events.
    fn default() -> Self {
        Self {
            max_line_bytes: 4096,
            max_events: 1 << 25,
        }
    }
}

/// Parses an RMM log within the default [`Limits`]. The header line is
/// optional; blank lines are skipped; a UTF-8 byte order mark before the first
/// line is skipped. The first malformed line is an error naming the line and
/// the column.
pub fn parse<R: BufRead>(reader: R) -> Result<Vec<TraceEvent>, ParseError> {
    parse_with_limits(reader, Limits::default())
}

/// [`parse`] within `limits`: a longer line or one event too many is an error
/// naming its line.
pub fn parse_with_limits<R: BufRead>(
    mut reader: R,
    limits: Limits,
) -> Result<Vec<TraceEvent>, ParseError> {
    let mut events = Vec::new();
    let mut buf = Vec::new();
    let mut line_no = 0;
    loop {
        line_no += 1;
        buf.clear();
        // One byte past the limit tells a line of exactly the limit (and its
        // line break) from a longer one, without reading the longer one whole.
        let bound = limits.max_line_bytes.saturating_add(1) as u64;
        let n = (&mut reader)
            .take(bound)
            .read_until(b'\n', &mut buf)
            .map_err(|e| err(line_no, None, format!("read failed: {e}")))?;
        if n == 0 {
            break;
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
        } else if buf.len() > limits.max_line_bytes {
            return Err(err(
                line_no,
                None,
                format!(
                    "longer than {} bytes (an RMM log has short rows; is this one?)",
                    limits.max_line_bytes
                ),
            ));
        }
        let line = std::str::from_utf8(&buf)
            .map_err(|_| err(line_no, None, "not UTF-8 text (is this an RMM log?)"))?;
        let line = if line_no == 1 {
            line.strip_prefix('\u{feff}').unwrap_or(line)
        } else {
            line
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line_no == 1 && line.starts_with("Thread") {
            let cols: Vec<&str> = line.split(',').map(str::trim).collect();
            if cols != COLUMNS {
                return Err(err(1, None, format!("header {line:?} is not {HEADER:?}")));
            }
            continue;
        }
        if events.len() >= limits.max_events {
            return Err(err(
                line_no,
                None,
                format!(
                    "more than {} events: too long a trace to replay",
                    limits.max_events
                ),
            ));
        }
        events.push(parse_line(line_no, line)?);
    }
    Ok(events)
}

/// Parses an RMM log held in a string.
pub fn parse_str(text: &str) -> Result<Vec<TraceEvent>, ParseError> {
    parse(text.as_bytes())
}

/// Reads and parses an RMM log file.
pub fn read_file(path: impl AsRef<Path>) -> Result<Vec<TraceEvent>, ParseError> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(|e| ParseError {
        line: 0,
        column: None,
        message: format!("cannot open {}: {e}", path.display()),
    })?;
    parse(io::BufReader::new(file))
}

/// Writes events as an RMM log, header first.
pub fn write_csv<W: Write>(mut out: W, events: &[TraceEvent]) -> io::Result<()> {
    writeln!(out, "{HEADER}")?;
    for e in events {
        writeln!(
            out,
            "{},{},{},{:#x},{},{:#x}",
            e.thread,
            format_time(e.time_us),
            e.action,
            e.ptr,
            e.size,
            e.stream
        )?;
    }
    Ok(())
}

/// What [`check`] found in a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceReport {
    /// Rows in all.
    pub events: usize,
    /// Successful allocations.
    pub allocations: usize,
    /// Frees (of known and unknown pointers).
    pub frees: usize,
    /// `allocate failure` rows (a replay skips them).
    pub failures: usize,
    /// Frees of pointers that are not live at that point (a replay skips them).
    pub unknown_frees: usize,
    /// Allocations returning a pointer that is still live (a replay treats the
    /// earlier block as leaked).
    pub live_pointer_reused: usize,
    /// Frees whose size differs from the size allocated (a replay frees with
    /// the allocated size).
    pub size_mismatches: usize,
    /// Blocks still live at the end of the trace.
    pub leaked: usize,
    /// Bytes still live at the end of the trace.
    pub leaked_bytes: usize,
    /// Highest sum of live bytes at any point.
    pub peak_live: usize,
    /// Index of the event at which `peak_live` was first reached.
    pub peak_event: usize,
    /// Largest single allocation.
    pub max_size: usize,
    /// Distinct threads.
    pub threads: usize,
    /// Distinct streams.
    pub streams: usize,
    /// Rows whose time is earlier than the row before (out of order or past
    /// midnight).
    pub time_regressions: usize,
}

impl TraceReport {
    /// True when every free matches a live allocation of the same size and
    /// nothing is allocated twice: the trace replays exactly.
    pub fn is_clean(&self) -> bool {
        self.unknown_frees == 0 && self.live_pointer_reused == 0 && self.size_mismatches == 0
    }
}

impl fmt::Display for TraceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} events ({} allocations, {} frees, {} failed allocations), {} threads, {} streams, peak live {} bytes at event {}",
            self.events,
            self.allocations,
            self.frees,
            self.failures,
            self.threads,
            self.streams,
            self.peak_live,
            self.peak_event
        )?;
        if self.unknown_frees > 0 {
            write!(f, ", {} frees of unknown pointers", self.unknown_frees)?;
        }
        if self.live_pointer_reused > 0 {
            write!(
                f,
                ", {} live pointers handed out again",
                self.live_pointer_reused
            )?;
        }
        if self.size_mismatches > 0 {
            write!(f, ", {} frees with a different size", self.size_mismatches)?;
        }
        if self.leaked > 0 {
            write!(
                f,
                ", {} blocks ({} bytes) never freed",
                self.leaked, self.leaked_bytes
            )?;
        }
        Ok(())
    }
}

/// Why [`check`] refused a trace: at some event the bytes live at once no
/// longer fit in 64 bits, which no real program's trace does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverflowError {
    /// Index of the allocation that overflowed (0-based, as
    /// [`TraceReport::peak_event`]).
    pub event: usize,
    /// Bytes live before it.
    pub live_bytes: usize,
    /// Its size.
    pub size: usize,
}

impl fmt::Display for OverflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "event {}: an allocation of {} bytes with {} bytes live takes the live bytes past 64 bits",
            self.event, self.size, self.live_bytes
        )
    }
}

impl std::error::Error for OverflowError {}

/// Checks that a trace can be replayed and measures it: counts, anomalies, the
/// peak of live bytes. Anomalies are counted, not errors; the one error is live
/// bytes that overflow 64 bits.
pub fn check(events: &[TraceEvent]) -> Result<TraceReport, OverflowError> {
    let mut r = TraceReport {
        events: events.len(),
        ..TraceReport::default()
    };
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut live_bytes = 0usize;
    let mut threads = HashSet::new();
    let mut streams = HashSet::new();
    let mut last_time = 0u64;
    for (i, e) in events.iter().enumerate() {
        threads.insert(e.thread);
        streams.insert(e.stream);
        if i > 0 && e.time_us < last_time {
            r.time_regressions += 1;
        }
        last_time = e.time_us;
        match e.action {
            Action::Allocate => {
                r.allocations += 1;
                r.max_size = r.max_size.max(e.size);
                if e.size == 0 {
                    continue;
                }
                if live.insert(e.ptr, e.size).is_some() {
                    // The earlier block stays counted as live: it was never freed.
                    r.live_pointer_reused += 1;
                    r.leaked += 1;
                }
                live_bytes = live_bytes.checked_add(e.size).ok_or(OverflowError {
                    event: i,
                    live_bytes,
                    size: e.size,
                })?;
                if live_bytes > r.peak_live {
                    r.peak_live = live_bytes;
                    r.peak_event = i;
                }
            }
            Action::AllocateFailure => r.failures += 1,
            Action::Free => {
                r.frees += 1;
                if e.ptr == 0 {
                    continue;
                }
                match live.remove(&e.ptr) {
                    Some(size) => {
                        if size != e.size {
                            r.size_mismatches += 1;
                        }
                        live_bytes -= size;
                    }
                    None => r.unknown_frees += 1,
                }
            }
        }
    }
    r.leaked += live.len();
    r.leaked_bytes = live_bytes;
    r.threads = threads.len();
    r.streams = streams.len();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        assert_eq!(parse_time("17:01:26.656531").unwrap(), 61_286_656_531);
        assert_eq!(format_time(61_286_656_531), "17:01:26.656531");
        assert_eq!(parse_time("00:00:01.5").unwrap(), 1_500_000);
        assert_eq!(parse_time("00:00:01").unwrap(), 1_000_000);
        assert_eq!(parse_time("1234").unwrap(), 1234);
        assert!(parse_time("1:2").is_err());
        assert!(parse_time("00:61:00").is_err());
        assert!(parse_time("00:00:0x.1").is_err());
        assert!(parse_time("5124095577:00:00").is_err());
        assert_eq!(
            parse_time("5124095575:00:00").unwrap(),
            18_446_744_070_000_000_000
        );
    }

    #[test]
    fn ints_hex_or_decimal() {
        assert_eq!(parse_int("0x10"), Some(16));
        assert_eq!(parse_int("16"), Some(16));
        assert_eq!(parse_int("0xg"), None);
        assert_eq!(parse_int("-1"), None);
    }
}
