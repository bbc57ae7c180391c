//! The `threads` workload's threads: one per operation sequence, each
//! allocating on a stream of its own, kept across the passes of a repeat.
//!
//! Why kept: a program that allocates from several threads keeps its threads
//! and their streams from one iteration to the next. New threads and streams
//! in every pass measured how a pool meets streams it has never seen (a lane
//! per new stream, threads landing on other lock shards) instead of how it
//! serves the program (`docs/decisions-virtual-pool.md`, "Threads: the
//! same threads and streams in every pass").

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{anyhow, Result};
use gpumem::resource::MemoryResource;
use gpumem::{Device, DevicePtr, Stream};

use crate::workload::{free_all, OpSequence, Timed, ALIGN};

/// When a thread's timed loop started and ended, or why it failed.
type Span = Result<(Instant, Instant)>;

/// Threads that each run their sequence on their own stream once per
/// [`run_pass`](Self::run_pass), all starting together at a barrier. They
/// end when the crew is dropped.
pub struct ThreadCrew {
    device: Device,
    /// One message per pass to each thread; dropped to end them.
    orders: Vec<Sender<()>>,
    spans: Receiver<Span>,
    finish_line: Arc<Barrier>,
    cleanup_line: Arc<Barrier>,
    handles: Vec<JoinHandle<()>>,
    ops: u64,
}

impl ThreadCrew {
    /// Starts one thread per sequence of `seqs`, each with a stream of its
    /// own on `device`, allocating from `r`.
    pub fn new(
        r: &Arc<dyn MemoryResource>,
        device: &Device,
        seqs: &[Arc<OpSequence>],
    ) -> Result<Self> {
        let n = seqs.len();
        let streams: Vec<Stream> = (0..n)
            .map(|_| device.create_stream())
            .collect::<gpumem::Result<_>>()?;
        device.synchronize()?;
        let start_line = Arc::new(Barrier::new(n));
        let finish_line = Arc::new(Barrier::new(n + 1));
        let cleanup_line = Arc::new(Barrier::new(n + 1));
        let (span_tx, spans) = channel();
        let mut orders = Vec::with_capacity(n);
        let mut handles = Vec::with_capacity(n);
        for (seq, stream) in seqs.iter().zip(streams) {
            let (order_tx, order_rx) = channel();
            orders.push(order_tx);
            let worker = Worker {
                r: r.clone(),
                device: device.clone(),
                seq: seq.clone(),
                stream,
                start_line: start_line.clone(),
                finish_line: finish_line.clone(),
                cleanup_line: cleanup_line.clone(),
                spans: span_tx.clone(),
            };
            handles.push(std::thread::spawn(move || worker.serve(order_rx)));
        }
        Ok(Self {
            device: device.clone(),
            orders,
            spans,
            finish_line,
            cleanup_line,
            handles,
            ops: seqs.iter().map(|s| s.ops.len() as u64).sum(),
        })
    }

    /// Runs every thread's sequence once: the wall time from the first
    /// thread's start to the last one's end (each read by the thread itself,
    /// so a late-scheduled main thread does not skew it), plus the device
    /// synchronize after, over the operations of all threads. What a thread
    /// leaves live is freed after the clock stops.
    pub fn run_pass(&self) -> Result<Timed> {
        for order in &self.orders {
            order
                .send(())
                .map_err(|_| anyhow!("a bench thread ended early"))?;
        }
        // The threads reach the finish line after their timed loops; the
        // device synchronize is timed here, then they are let go to clean up.
        self.finish_line.wait();
        let t = Instant::now();
        let synced = self.device.synchronize();
        let sync_time = t.elapsed();
        self.cleanup_line.wait();
        let mut span = None::<(Instant, Instant)>;
        let mut failed = None;
        for _ in 0..self.orders.len() {
            match self.spans.recv() {
                Ok(Ok((a, b))) => {
                    span = Some(span.map_or((a, b), |(f, l)| (f.min(a), l.max(b))));
                }
                Ok(Err(e)) => {
                    failed.get_or_insert(e);
                }
                Err(_) => return Err(anyhow!("a bench thread ended early")),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        synced?;
        self.device.synchronize()?;
        Ok(Timed {
            elapsed: span.map_or(sync_time, |(a, b)| b.duration_since(a) + sync_time),
            ops: self.ops,
        })
    }
}

impl Drop for ThreadCrew {
    fn drop(&mut self) {
        // Without orders, each thread's wait for the next one ends.
        self.orders.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// What one thread of a crew holds.
struct Worker {
    r: Arc<dyn MemoryResource>,
    device: Device,
    seq: Arc<OpSequence>,
    stream: Stream,
    start_line: Arc<Barrier>,
    finish_line: Arc<Barrier>,
    cleanup_line: Arc<Barrier>,
    spans: Sender<Span>,
}

impl Worker {
    /// Runs a pass for each order until the orders end.
    fn serve(self, orders: Receiver<()>) {
        let _ = self
            .device
            .driver()
            .set_current_device(self.device.ordinal());
        let mut table = vec![DevicePtr::NULL; self.seq.slots];
        let mut sizes = vec![0usize; self.seq.slots];
        while orders.recv().is_ok() {
            self.start_line.wait();
            let start = Instant::now();
            // A panic still reaches the barriers below, or the other
            // threads and the crew would wait for ever.
            let result = catch_unwind(AssertUnwindSafe(|| self.run(&mut table, &mut sizes)))
                .unwrap_or_else(|_| Err(anyhow!("a bench thread panicked")));
            let end = Instant::now();
            self.finish_line.wait();
            self.cleanup_line.wait();
            let freed = free_all(
                &*self.r,
                &mut table,
                &sizes,
                std::slice::from_ref(&self.stream),
                &[],
            );
            let span = result.and(freed.map_err(Into::into)).map(|()| (start, end));
            if self.spans.send(span).is_err() {
                return;
            }
        }
    }

    /// The timed loop: the sequence's operations, stopping at the first
    /// error.
    fn run(&self, table: &mut [DevicePtr], sizes: &mut [usize]) -> Result<()> {
        for op in &self.seq.ops {
            let slot = op.slot as usize;
            if op.alloc {
                table[slot] = self.r.allocate(op.size, ALIGN, &self.stream)?;
                sizes[slot] = op.size;
            } else {
                self.r
                    .deallocate(table[slot], op.size, ALIGN, &self.stream)?;
                table[slot] = DevicePtr::NULL;
            }
        }
        Ok(())
    }
}
