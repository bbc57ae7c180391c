//! The bad-free matrix: every way a caller can get a free wrong, tried on one
//! resource. After each bad free, what must hold whatever the resource:
//! - the free is refused with [`Error::InvalidFree`], or it is a documented
//!   no-op (`NULL`) or a valid free (another stream; a size within the
//!   allocation's 256-byte granule where the resource compares sizes at that
//!   granularity);
//! - nothing overlaps afterwards: blocks allocated after the bad free (of the
//!   sizes a wrongly freed chunk would serve) overlap no live block;
//! - the statistics stay consistent: a refused free changes no live count,
//!   an accepted one brings it back to where it was before the allocation;
//! - a refused free lost nothing: the correct free afterwards succeeds; an
//!   accepted one freed the block: freeing it again is refused.
//!
//! [`matrix`] runs every case and returns what each gave, so callers can
//! also assert resource-specific outcomes (which resources must refuse a
//! same-granule size, which know a double free).
//!
//! [`matrix_in_capture`] runs the same cases while the stream captures a
//! graph (Global mode): every free is checked as it would be otherwise, and
//! a block freed in the capture is the graph's from then on. It stays out of
//! reach: nothing allocated later overlaps it, and freeing it again, during
//! the capture or after it, is a double free.

use std::cell::RefCell;

use gpumem::driver::CaptureMode;
use gpumem::resource::MemoryResource;
use gpumem::{DevicePtr, Error, FreeError, Stream};

use super::suite::LiveSet;

/// What a bad free gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Refused with `InvalidFree` and this reason; nothing was freed.
    Refused(FreeError),
    /// Accepted (`Ok`).
    Accepted,
    /// Not tried: the resource cannot allocate what the case needs.
    Skipped,
}

/// The cases, in the order [`matrix`] runs them.
pub const CASES: [&str; 12] = [
    SAME_GRANULE,
    OTHER_CLASS,
    ABOVE_LARGEST_BIN,
    LARGE_FREED_SMALL,
    ZERO_SIZE,
    HUGE_SIZE,
    DOUBLE_FREE,
    INTERIOR,
    FOREIGN,
    NULL,
    WRONG_STREAM,
    WRONG_ALIGNMENT,
];

/// 1000 bytes freed as 1001: the same 256-byte granule.
pub const SAME_GRANULE: &str = "wrong size, same granule";
/// 1000 bytes freed as 40 000: another size class.
pub const OTHER_CLASS: &str = "wrong size, another size class";
/// 1000 bytes freed as 3 MiB: above the largest bin of a binning resource.
pub const ABOVE_LARGEST_BIN: &str = "wrong size, above the largest bin";
/// 3 MiB freed as 1000 bytes.
pub const LARGE_FREED_SMALL: &str = "wrong size, large block freed small";
/// 1000 bytes freed as 0.
pub const ZERO_SIZE: &str = "wrong size, zero";
/// 1000 bytes freed as `isize::MAX` and `usize::MAX`.
pub const HUGE_SIZE: &str = "wrong size, huge";
/// A block freed twice.
pub const DOUBLE_FREE: &str = "double free";
/// A pointer 256 bytes into a live block.
pub const INTERIOR: &str = "interior pointer";
/// A live `cuMemAlloc` pointer this resource never handed out.
pub const FOREIGN: &str = "pointer of another allocator";
/// `deallocate(NULL, 4096)`: a documented no-op.
pub const NULL: &str = "free(NULL, n > 0)";
/// Allocated on one stream, freed on another (after waiting for it): valid.
pub const WRONG_STREAM: &str = "wrong stream";
/// Allocated at alignment 256, freed with alignment 64: the size is what
/// counts; valid.
pub const WRONG_ALIGNMENT: &str = "other alignment";

/// Freed with an alignment of 3 (no power of two): refused, whatever the
/// resource ([`Error::BadAlignment`]).
pub const BAD_ALIGNMENT: &str = "alignment not a power of two";

/// What every case gave.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// `(case, outcome)` in run order.
    pub rows: Vec<(&'static str, Outcome)>,
}

impl Report {
    /// The outcome of `case`.
    pub fn outcome(&self, case: &str) -> Outcome {
        self.rows
            .iter()
            .find(|(c, _)| *c == case)
            .map(|&(_, o)| o)
            .unwrap_or_else(|| panic!("no case {case:?}"))
    }

    /// True when `case` was refused.
    pub fn refused(&self, case: &str) -> bool {
        matches!(self.outcome(case), Outcome::Refused(_))
    }

    /// Cases that were run (not skipped).
    pub fn run(&self) -> usize {
        self.rows
            .iter()
            .filter(|(_, o)| *o != Outcome::Skipped)
            .count()
    }
}

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Sizes allocated after each bad free: what a wrongly freed block, chunk or
/// region would serve next.
const PROBES: [usize; 6] = [1000, 4096, 40_000, 256 * KIB, 2 * MIB, 3 * MIB];

struct Run<'a, R: ?Sized> {
    mr: &'a R,
    stream: Stream,
    other: Stream,
    live_bytes: Option<&'a dyn Fn() -> usize>,
    /// Blocks the matrix holds live, to prove later blocks do not overlap them
    /// (in a capture, also those freed in it: the graph's).
    held: LiveSet,
    /// Whether `stream` captures a graph.
    capture: bool,
    /// Blocks freed in the capture, with the bytes they were freed as.
    parked: RefCell<Vec<(DevicePtr, usize)>>,
    report: Report,
}

impl<R: MemoryResource + ?Sized> Run<'_, R> {
    fn live(&self) -> Option<usize> {
        self.live_bytes.map(|f| f())
    }

    fn alloc(&self, bytes: usize) -> Option<DevicePtr> {
        let p = self.mr.allocate(bytes, 256, &self.stream).ok()?;
        self.held.insert(p, bytes);
        Some(p)
    }

    fn free_ok(&self, p: DevicePtr, bytes: usize, case: &str) {
        self.forget(p, bytes);
        self.mr
            .deallocate(p, bytes, 256, &self.stream)
            .unwrap_or_else(|e| {
                panic!("{case}: the correct free of {p:#x} ({bytes} B) failed: {e}")
            });
    }

    /// A block freed as `bytes`: no longer held, unless the free was captured
    /// (the graph keeps it; nothing may overlap it).
    fn forget(&self, p: DevicePtr, bytes: usize) {
        if self.capture {
            self.parked.borrow_mut().push((p, bytes));
        } else {
            self.held.remove(p);
        }
    }

    /// Allocates one block of each probe size (those the resource serves),
    /// checks that none overlaps a held block, and frees them again.
    fn probe(&self, case: &str) {
        let mut got = Vec::new();
        for bytes in PROBES {
            if let Ok(p) = self.mr.allocate(bytes, 256, &self.stream) {
                // Panics, naming the ranges, on an overlap.
                self.held.insert(p, bytes);
                got.push((p, bytes));
            }
        }
        for (p, bytes) in got {
            self.free_ok(p, bytes, case);
        }
    }

    fn record(&mut self, case: &'static str, r: gpumem::Result<()>) -> Outcome {
        let o = match r {
            Ok(()) => Outcome::Accepted,
            Err(Error::InvalidFree { reason, .. }) => Outcome::Refused(reason),
            Err(e) => panic!("{case}: expected InvalidFree or Ok, got {e}"),
        };
        self.report.rows.push((case, o));
        o
    }

    /// One wrong-size case: allocates `bytes`, frees it as `wrong`.
    fn wrong_size(&mut self, case: &'static str, bytes: usize, wrongs: &[usize], may_accept: bool) {
        let before = self.live();
        let Some(p) = self.alloc(bytes) else {
            self.report.rows.push((case, Outcome::Skipped));
            return;
        };
        let during = self.live();
        let mut outcome = Outcome::Skipped;
        for &wrong in wrongs {
            outcome = self.record_quiet(case, self.mr.deallocate(p, wrong, 256, &self.stream));
            match outcome {
                Outcome::Refused(_) => {
                    assert_eq!(
                        self.live(),
                        during,
                        "{case}: a refused free changed the live count"
                    );
                }
                Outcome::Accepted => {
                    assert!(
                        may_accept,
                        "{case}: freeing {bytes} B as {wrong} B was accepted"
                    );
                    assert_eq!(
                        self.live(),
                        before,
                        "{case}: accepted, but the live count did not go back"
                    );
                    self.forget(p, wrong);
                    self.probe(case);
                    let again = self.mr.deallocate(p, bytes, 256, &self.stream);
                    assert!(
                        matches!(again, Err(Error::InvalidFree { .. })),
                        "{case}: after an accepted wrong-size free the block is free, \
                         so the correct free must be refused, got {again:?}"
                    );
                    self.report.rows.push((case, outcome));
                    return;
                }
                Outcome::Skipped => unreachable!(),
            }
        }
        self.probe(case);
        self.free_ok(p, bytes, case);
        assert_eq!(
            self.live(),
            before,
            "{case}: live count after the correct free"
        );
        self.report.rows.push((case, outcome));
    }

    fn record_quiet(&self, case: &str, r: gpumem::Result<()>) -> Outcome {
        match r {
            Ok(()) => Outcome::Accepted,
            Err(Error::InvalidFree { reason, .. }) => Outcome::Refused(reason),
            Err(e) => panic!("{case}: expected InvalidFree or Ok, got {e}"),
        }
    }

    fn must_refuse(&self, case: &str, o: Outcome) {
        assert!(
            matches!(o, Outcome::Refused(_) | Outcome::Skipped),
            "{case}: must be refused, was {o:?}"
        );
    }
}

/// Runs every case of the matrix on `mr`. `live_bytes` reads the resource's
/// own count of live bytes, when it has one. Panics on the first broken rule;
/// returns what each case gave.
pub fn matrix<R: MemoryResource + ?Sized>(
    mr: &R,
    live_bytes: Option<&dyn Fn() -> usize>,
) -> Report {
    run_matrix(mr, live_bytes, false)
}

/// [`matrix`] with every case made while the stream captures a graph in
/// Global mode (the resource must serve allocations during a capture). A
/// block freed in the capture counts as freed in `live_bytes` and is the
/// graph's from then on: after the capture, each is freed again (refused as
/// a double free) and allocations of every probe size overlap none of them.
pub fn matrix_in_capture<R: MemoryResource + ?Sized>(
    mr: &R,
    live_bytes: Option<&dyn Fn() -> usize>,
) -> Report {
    run_matrix(mr, live_bytes, true)
}

fn run_matrix<R: MemoryResource + ?Sized>(
    mr: &R,
    live_bytes: Option<&dyn Fn() -> usize>,
    capture: bool,
) -> Report {
    let device = mr.device().clone();
    let mut run = Run {
        mr,
        stream: device.create_stream().expect("stream"),
        other: device.create_stream().expect("stream"),
        live_bytes,
        held: LiveSet::default(),
        capture,
        parked: RefCell::default(),
        report: Report::default(),
    };
    let start = run.live();
    // A live pointer of another allocator (cuMemAlloc), taken before this
    // resource frees anything, so its address was never this resource's
    // (and before the capture, which forbids cuMemAlloc).
    let driver = device.driver();
    let foreign = driver
        .mem_alloc(device.ordinal(), 4096)
        .expect("cuMemAlloc");
    run.held.insert(foreign, 4096);
    if capture {
        run.stream
            .begin_capture(CaptureMode::Global)
            .expect("begin capture");
    }
    // A block held across the whole matrix: nothing may ever overlap it.
    let anchor = run.alloc(1000);
    let baseline = run.live();
    run.wrong_size(SAME_GRANULE, 1000, &[1001], true);
    run.wrong_size(OTHER_CLASS, 1000, &[40_000], false);
    run.wrong_size(ABOVE_LARGEST_BIN, 1000, &[3 * MIB], false);
    run.wrong_size(LARGE_FREED_SMALL, 3 * MIB, &[1000], false);
    run.wrong_size(ZERO_SIZE, 1000, &[0], false);
    run.wrong_size(HUGE_SIZE, 1000, &[isize::MAX as usize, usize::MAX], false);
    for case in [
        OTHER_CLASS,
        ABOVE_LARGEST_BIN,
        LARGE_FREED_SMALL,
        ZERO_SIZE,
        HUGE_SIZE,
    ] {
        run.must_refuse(case, run.report.outcome(case));
    }

    // Double free.
    if let Some(p) = run.alloc(4096) {
        run.free_ok(p, 4096, DOUBLE_FREE);
        let during = run.live();
        let o = run.record(DOUBLE_FREE, mr.deallocate(p, 4096, 256, &run.stream));
        run.must_refuse(DOUBLE_FREE, o);
        assert_eq!(run.live(), during, "{DOUBLE_FREE}: live count changed");
        run.probe(DOUBLE_FREE);
    } else {
        run.report.rows.push((DOUBLE_FREE, Outcome::Skipped));
    }

    // Interior pointer.
    if let Some(p) = run.alloc(8192) {
        let during = run.live();
        let o = run.record(
            INTERIOR,
            mr.deallocate(p.offset(256), 256, 256, &run.stream),
        );
        run.must_refuse(INTERIOR, o);
        assert_eq!(run.live(), during, "{INTERIOR}: live count changed");
        run.probe(INTERIOR);
        run.free_ok(p, 8192, INTERIOR);
    } else {
        run.report.rows.push((INTERIOR, Outcome::Skipped));
    }

    // The other allocator's pointer: refused, and still live (its owner
    // frees it, after the capture).
    let during = run.live();
    let o = run.record(FOREIGN, mr.deallocate(foreign, 4096, 256, &run.stream));
    run.must_refuse(FOREIGN, o);
    assert_eq!(run.live(), during, "{FOREIGN}: live count changed");
    run.probe(FOREIGN);

    // NULL with a size: a documented no-op.
    let o = run.record(NULL, mr.deallocate(DevicePtr::NULL, 4096, 256, &run.stream));
    assert_eq!(o, Outcome::Accepted, "{NULL}: the rule is a no-op");
    assert_eq!(run.live(), baseline, "{NULL}: live count changed");

    // Another stream: a valid free, ordered on that stream (in a capture,
    // the wait joins `other` to it, and the stream waits for `other` again
    // so that the capture can end).
    if let Ok(p) = mr.allocate(4096, 256, &run.stream) {
        run.held.insert(p, 4096);
        run.other.wait_for(&run.stream).expect("wait");
        run.forget(p, 4096);
        let o = run.record(WRONG_STREAM, mr.deallocate(p, 4096, 256, &run.other));
        if run.capture {
            run.stream.wait_for(&run.other).expect("join back");
        }
        assert_eq!(
            o,
            Outcome::Accepted,
            "{WRONG_STREAM}: a free on another stream is valid"
        );
        assert_eq!(run.live(), baseline, "{WRONG_STREAM}: live count");
        run.probe(WRONG_STREAM);
    } else {
        run.report.rows.push((WRONG_STREAM, Outcome::Skipped));
    }

    // Another alignment at the free (both at most 256): valid.
    if let Some(p) = run.alloc(4096) {
        run.forget(p, 4096);
        let o = run.record(WRONG_ALIGNMENT, mr.deallocate(p, 4096, 64, &run.stream));
        assert_eq!(
            o,
            Outcome::Accepted,
            "{WRONG_ALIGNMENT}: the alignment does not name the block"
        );
        assert_eq!(run.live(), baseline, "{WRONG_ALIGNMENT}: live count");
    } else {
        run.report.rows.push((WRONG_ALIGNMENT, Outcome::Skipped));
    }

    // An alignment that is no power of two is refused before anything is
    // looked up; the block stays live and its correct free succeeds.
    if let Some(p) = run.alloc(4096) {
        let during = run.live();
        let r = mr.deallocate(p, 4096, 3, &run.stream);
        assert!(
            matches!(r, Err(Error::BadAlignment { alignment: 3 })),
            "{BAD_ALIGNMENT}: {r:?}"
        );
        assert_eq!(run.live(), during, "{BAD_ALIGNMENT}: nothing freed");
        run.free_ok(p, 4096, BAD_ALIGNMENT);
    }

    if let Some(p) = anchor {
        run.free_ok(p, 1000, "anchor");
    }
    if capture {
        let graph = run
            .stream
            .end_capture()
            .expect("the capture ends with a graph");
        run.capture = false;
        run.after_capture();
        drop(graph);
    }
    assert_eq!(run.live(), start, "live count after the matrix");
    run.held.remove(foreign);
    // SAFETY: `foreign` is this run's own `cuMemAlloc` allocation, which the
    // resource under test refused to free; freed once, here.
    unsafe { driver.mem_free(device.ordinal(), foreign) }
        .expect("the foreign pointer was left alone: its owner frees it");
    run.stream.synchronize().expect("synchronize");
    run.other.synchronize().expect("synchronize");
    run.report
}

impl<R: MemoryResource + ?Sized> Run<'_, R> {
    /// Once the capture has ended: every block freed in it is freed again on
    /// both streams, and each is refused as a double free without changing
    /// the live count; allocations of every size then overlap none of them.
    fn after_capture(&self) {
        let live = self.live();
        for &(p, bytes) in self.parked.borrow().iter() {
            for s in [&self.stream, &self.other] {
                assert_eq!(
                    self.mr.deallocate(p, bytes, 256, s),
                    Err(Error::InvalidFree {
                        ptr: p.0,
                        reason: FreeError::DoubleFree
                    }),
                    "{p:#x} ({bytes} B), freed in the capture, freed again after it"
                );
            }
        }
        assert_eq!(self.live(), live, "refused frees changed the live count");
        self.probe("after the capture");
        self.probe("after the capture, again");
    }
}
