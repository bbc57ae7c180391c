//! Writing to standard output and standard error without panicking, and
//! checking output files before the work that fills them.
//!
//! `println!` panics when standard output is a closed pipe (`gpumem bench |
//! head -1`) or a full disk. Every line the command prints goes through
//! [`outln!`](crate::outln) instead, which returns the failure as a
//! [`StdoutError`]; `main` ends a run whose pipe closed quietly with
//! [`BROKEN_PIPE_STATUS`] and reports any other failure as one line.

use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;

use anyhow::Context as _;

/// Writes one line to standard output, like `println!`, returning
/// `Result<(), StdoutError>` instead of panicking.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}

/// Standard output could not be written: the pipe was closed, the disk is
/// full, and the like.
#[derive(Debug)]
pub struct StdoutError(pub io::Error);

impl fmt::Display for StdoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "writing to standard output: {}", self.0)
    }
}

impl std::error::Error for StdoutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// The exit status of a run whose standard output was a closed pipe: 128 +
/// SIGPIPE, the status a shell shows for a program that SIGPIPE ended.
pub const BROKEN_PIPE_STATUS: i32 = 141;

/// Writes `args` and a line break to standard output.
pub fn line(args: fmt::Arguments<'_>) -> Result<(), StdoutError> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(StdoutError)
}

/// Writes `text` to standard output as it is.
pub fn text(text: &str) -> Result<(), StdoutError> {
    io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(StdoutError)
}

/// Flushes standard output (at the end of a run, so that a write that fails
/// late is still reported).
pub fn flush() -> Result<(), StdoutError> {
    io::stdout().flush().map_err(StdoutError)
}

/// True when `e` comes from writing to a closed pipe on standard output.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<StdoutError>()
            .is_some_and(|s| s.0.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// Checks that `path` can be written, so that a bad output path fails the
/// command before its timed work, not after: opens it for writing (creating
/// it, leaving one that exists as it is) and removes it again if it did not
/// exist.
pub fn check_writable(path: &Path) -> anyhow::Result<()> {
    let existed = path.symlink_metadata().is_ok();
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Writes one line to standard error; a failure to do so is dropped (there is
/// nowhere left to report it).
pub fn errln(args: fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.write_all(b"\n"));
}
