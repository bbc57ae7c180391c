//! The stderr logger that gpumem's own programs install.
//!
//! The library never prints: what it cannot return as a value (a failure in
//! `Drop`, a leak report, a mode it could not honour) goes through the `log`
//! facade, at `error` for failures and `warn` for things lost or refused. An
//! application shows those messages with the logger of its choice. The C ABI
//! (`libgpumem.so`) and the `gpumem` command have no other logger, so they
//! install [`StderrLogger`], which prints gpumem's warnings and errors as
//! `gpumem: {message}` lines.

use std::io::Write;

/// Prints the records of gpumem's crates at `warn` and `error` to stderr,
/// each as `gpumem: {message}`; ignores the rest.
#[derive(Debug, Clone, Copy, Default)]
pub struct StderrLogger;

/// The most verbose level [`StderrLogger`] prints.
pub const STDERR_LEVEL: log::LevelFilter = log::LevelFilter::Warn;

impl StderrLogger {
    /// Makes this the process's logger unless one is installed already (an
    /// application's own logger wins). Returns whether it was installed.
    pub fn install() -> bool {
        static LOGGER: StderrLogger = StderrLogger;
        let installed = log::set_logger(&LOGGER).is_ok();
        if installed {
            log::set_max_level(STDERR_LEVEL);
        }
        installed
    }
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= STDERR_LEVEL && metadata.target().starts_with("gpumem")
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            // A closed stderr is ignored: logging must never fail the caller.
            let _ = writeln!(std::io::stderr().lock(), "gpumem: {}", record.args());
        }
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::{Level, Log, Metadata};

    fn enabled(level: Level, target: &str) -> bool {
        StderrLogger.enabled(&Metadata::builder().level(level).target(target).build())
    }

    #[test]
    fn prints_gpumem_warnings_and_errors_only() {
        assert!(enabled(Level::Error, "gpumem::exit"));
        assert!(enabled(Level::Warn, "gpumem_capi::allocator"));
        assert!(enabled(Level::Warn, "gpumem_cli"));
        assert!(!enabled(Level::Info, "gpumem::exit"));
        assert!(!enabled(Level::Error, "plotters"));
    }
}
