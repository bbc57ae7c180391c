//! Stream ordering: when memory freed on one stream may be used by another.
//! Every pool of [`crate::pool`] (and the [`PinnedPool`](crate::manager::PinnedPool))
//! takes its stream decisions through this module.
//!
//! # Policy
//!
//! A block freed on stream S is reusable at once by allocations on S: stream
//! order protects it, no event is needed. Another stream T gets it only
//! - once S's work up to the free is known complete: S found idle by a
//!   stream query, or an event recorded on S after the free has completed; or
//! - after T is made to wait for it (`cuStreamWaitEvent(T, event recorded on
//!   S after the free)`); the blocks then belong to T.
//!
//! There is no event per free: `cuEventRecord` and `cuStreamWaitEvent`
//! each exceed the whole budget of an operation (`docs/decisions.md`). Events are recorded only on slow
//! paths or once per stream per batch of frees (sealed when a batch grows
//! past its size, or by `process_deferred`). A pool keeps a clone of the
//! [`Stream`](crate::Stream) of every stream that has free blocks, so a
//! stream the user drops is not destroyed while its blocks sit free (its
//! handle stays valid for queries and records), and forgets it once nothing
//! of it is pending; a foreign stream whose query fails is handled by
//! synchronizing the device before its blocks are reused. The per-thread
//! default stream is queried and recorded on only by its own thread.
//!
//! The clones are pool handles (`Stream::pool_handle`), which do not count
//! as the stream's users, so a stream held by several tables, shards or
//! pools is known dropped once its users' handles are gone. Pools whose
//! stream tables are slots, lanes or copy tracks (`PoolResource`,
//! `VirtualPool`, `PinnedPool`) forget a dropped stream when a query finds
//! its work done: when a new stream takes a slot or lane (its index, lane
//! number and stream bit then serve the new one), on a trim and on a
//! release; a program that makes and drops streams keeps as many as it
//! uses. Pools that cache blocks per stream (the slab pools, the arena,
//! `SegmentPool`, the NCCL-ready `VirtualPool`'s kept blocks) keep a
//! dropped stream's blocks, and the stream, until a trim, an out-of-memory
//! path or a release, as they keep any cache.
//!
//! Graph capture ([`crate::captures`]): while gpumem counts a capture under
//! way, a block freed on a capturing stream is checked as any free, then
//! parked for the graph and never handed out again; a second free of it is
//! a double free, capture or not (`parked.rs`); no event is recorded on a
//! capturing stream and no capturing stream waits for one recorded outside
//! its capture; queries and stream synchronizations run in relaxed capture
//! mode, and device synchronization is refused (CUDA would refuse it and
//! break the capture). A capturing stream counts as busy.
//!
//! Out of memory: every pool first waits for the streams that freed its
//! cached blocks, gives entirely free chunks back to its upstream and retries;
//! then it fails with [`Error::OutOfMemory`](crate::Error::OutOfMemory)
//! carrying the requested, reserved and live bytes and the largest free block.
//! While a capture is counted it waits for nothing
//! ([`may_wait`](streams::may_wait)): it takes what a query finds done and
//! gives back what is free already, then fails the same way.
//! Dropping a pool gives all its upstream memory back.
//!
//! # Parts
//!
//! - `streams.rs`: [`HeldStream`](streams::HeldStream), a pool's clone of a
//!   stream with the known-idle check (one query) and synchronization;
//!   [`Watermark`](streams::Watermark), the number of a stream's latest free
//!   and the highest known complete.
//! - `slots.rs`: [`StreamSlots`](slots::StreamSlots), the kept streams by
//!   small index (lane number, stream bit), pruning dropped streams.
//! - `per_thread.rs`: the per-thread default stream rule.
//! - `events.rs`: the event pool, sealed batches, fences.
//! - `handoff.rs`: handing memory to another stream after one event wait.
//! - `parked.rs`: memory freed on a capturing stream, kept for the graph.
//! - `sync.rs`: the poison-tolerant lock helpers.
//! - The pools' uses of them: `batched.rs` and `free_lists.rs` (the slab
//!   pools: numbered frees, batch events, per-stream free lists),
//!   `heap_lanes.rs` (the `LaneHeap` pools: per-stream lanes moved whole),
//!   `free_streams.rs` (`VirtualPool`: stream bits and one monotone tick per
//!   free, recorded per piece of memory). Outside this folder, the arena's
//!   fenced batches and deferred frees (`pool/arena/`) hold `Fence`s, and
//!   `PinnedPool`'s copy batches (`facade/manager/pinned_pool.rs`) hold `Batches`.
//!
//! # Driver calls
//!
//! The pools never call the driver about streams and events themselves:
//! stream queries and stream or device synchronizations are in `streams.rs`
//! ([`query`](streams::query), [`synchronize`](streams::synchronize),
//! [`synchronize_device`](streams::synchronize_device) and the
//! [`HeldStream`](streams::HeldStream) methods that call them); event
//! creation, records, queries and synchronizations in `events.rs`
//! ([`EventPool`](events::EventPool), [`Batches`](events::Batches),
//! [`Fence`](events::Fence)); stream waits on events in `handoff.rs`.

pub(crate) mod batched;
pub(crate) mod events;
pub(crate) mod free_lists;
pub(crate) mod free_streams;
pub(crate) mod handoff;
pub(crate) mod heap_lanes;
pub(crate) mod parked;
pub(crate) mod per_thread;
pub(crate) mod slots;
pub(crate) mod streams;
pub(crate) mod sync;
