//! Per-device memory ledger: what this process holds, reserved atomically before the driver is
//! asked, committed on success, rolled back on failure.
//!
//! Owns the `used` counters and the handle → (device, bytes) map that makes every free credit
//! exactly what its allocation charged, and the lifecycle of physical memory whose release is not
//! one call: VMM handles (credited when the last reference is released *and* the last mapping is
//! unmapped, the driver's rule — `cuMemRelease` of a still-mapped handle frees nothing) and memory
//! pools (charged what the pool *reserves*, which a release threshold keeps above what is
//! allocated; see [`Ledger::pool_commit`]). The
//! reservation is one compare-and-swap loop against the cap, so no interleaving of threads can make
//! `used` pass the cap (HAMi's check-then-add could).
//! With a shared ledger (a grant held by several processes, [`crate::shared_ledger`]) the
//! counters are this process's slot of the grant's table and a reservation is checked against
//! what all the grant's live processes hold; the handle map stays per process.
//! Must never: block on the launch path (it is not used there), lose a credit for a handle it
//! charged, credit memory the driver still holds, or refuse a free (the free hooks always forward
//! frees to the driver first).

use crate::limits::MAX_DEVICES;
use crate::shared_ledger::{FirstContext, Group};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::Mutex;

/// Lock shards of the handle map. 64: with 8 allocating threads the chance two of them hit the
/// same shard at once is ~12 % per pair-collision check, and each critical section is one
/// HashMap insert/remove (reasoning; see the bench figures in docs/shim.md).
const SHARDS: usize = 64;

/// What kind of handle a ledger entry is keyed by (they live in different namespaces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A device pointer (cuMemAlloc*, cuMemAllocManaged, cuMemAllocAsync, cuMemAllocFromPoolAsync).
    Ptr,
    /// A `CUmemGenericAllocationHandle` from cuMemCreate.
    Vmm,
    /// A `CUarray`.
    Array,
    /// A `CUmipmappedArray`.
    Mipmap,
    /// The memory-allocation nodes of an instantiated graph on one device (keyed by
    /// [`graph_exec_key`]).
    GraphExec,
    /// A context made by `cuCtxCreate*` (keyed by its `CUcontext`): its footprint.
    Context,
    /// A device's primary context (keyed by the device ordinal): its footprint.
    PrimaryContext,
}

/// Over-cap refusal, with what the log line needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverCap {
    /// The device (CUDA ordinal).
    pub dev: usize,
    /// Its cap, bytes.
    pub cap: u64,
    /// Bytes in use when the request came.
    pub used: u64,
    /// Bytes requested.
    pub request: u64,
}

/// One shard of the handle map: (kind, handle) → (device, bytes charged).
type Shard = Mutex<HashMap<(Kind, u64), (u32, u64)>>;

/// One physical VMM allocation (`cuMemCreate`): the driver frees it when `refs` (the creation plus
/// every `cuMemRetainAllocationHandle`, minus every `cuMemRelease`) and `maps` (live `cuMemMap`s)
/// are both zero (cuda.h, `cuMemRelease` / `cuMemUnmap`).
#[derive(Debug, Clone, Copy)]
struct VmmEntry {
    dev: u32,
    bytes: u64,
    refs: u32,
    maps: u32,
}

/// VMM handles and the address ranges mapped to them.
#[derive(Debug, Default)]
struct VmmTable {
    handles: HashMap<u64, VmmEntry>,
    /// Mapped VA → (handle, size).
    maps: BTreeMap<u64, (u64, u64)>,
}

/// A stream-ordered memory pool (`CUmemoryPool`) this process allocated from.
#[derive(Debug, Clone, Copy)]
struct PoolEntry {
    dev: u32,
    /// Bytes charged for it: what the driver said it reserved when last asked.
    charged: u64,
    /// Bytes of its allocations not yet freed (what it still holds after `cuMemPoolDestroy`).
    live: u64,
    /// Destroyed: its memory goes back as its allocations are freed.
    destroyed: bool,
}

/// Pools and the pointers allocated from them.
#[derive(Debug, Default)]
struct PoolTable {
    pools: HashMap<u64, PoolEntry>,
    /// Pointer → (pool, bytes).
    ptrs: HashMap<u64, (u64, u64)>,
}

/// What a free of a device pointer was, for the pool accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolFree {
    /// Not a pool allocation.
    NotPool,
    /// An allocation of a live pool: its memory stays reserved by the pool (ask the driver how
    /// much the pool reserves now).
    Live(u64),
    /// An allocation of a destroyed pool: credited now.
    Destroyed,
}

/// The ledger key of an instantiated graph's allocations on `dev`: a `CUgraphExec` (8-byte
/// aligned pointer) and a device ordinal < 16 never collide with another pair.
pub fn graph_exec_key(exec: u64, dev: usize) -> u64 {
    exec.wrapping_mul(MAX_DEVICES as u64)
        .wrapping_add(dev as u64)
}

/// Bytes held on each device plus the handle map.
#[derive(Debug)]
pub struct Ledger {
    used: [AtomicU64; MAX_DEVICES],
    /// The grant's shared table, when this process shares its grant (`used` is then unused: the
    /// counters are this process's slot).
    group: Option<Group>,
    /// Per CUDA ordinal: the index of its GPU in the shared table (the grant page's slot of the
    /// same GPU, [`Ledger::map_shared`]; the ordinal itself until told).
    shared_index: [AtomicU8; MAX_DEVICES],
    shards: Vec<Shard>,
    /// VMM lifecycles. One lock: VMM calls are rare (a handful per allocation of a caching
    /// allocator's segment), never on a launch.
    vmm: Mutex<VmmTable>,
    /// Pool charges (one lock: pool calls are stream-ordered allocations, never launches).
    pools: Mutex<PoolTable>,
    /// Live pool allocations (`PoolTable::ptrs.len()`, kept under its lock): a free in a process
    /// that has none takes no pool lock.
    pool_ptrs: AtomicUsize,
    /// Per `CUgraph`: bytes of its memory-allocation nodes per device (charged when it is
    /// instantiated).
    graphs: Mutex<HashMap<u64, [u64; MAX_DEVICES]>>,
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

/// A reservation of `bytes` on `dev`: [`Reservation::commit`] keeps it, dropping it gives the
/// bytes back (so an early return or a panic unwinding through the hook rolls back).
#[must_use]
#[derive(Debug)]
pub struct Reservation<'a> {
    ledger: &'a Ledger,
    dev: usize,
    bytes: u64,
}

impl Reservation<'_> {
    /// Keeps the bytes charged and records `key` so its free credits them.
    pub fn commit(self, kind: Kind, key: u64) {
        let (l, dev, bytes) = (self.ledger, self.dev, self.bytes);
        std::mem::forget(self);
        if kind == Kind::Vmm {
            let entry = VmmEntry {
                dev: dev as u32,
                bytes,
                refs: 1,
                maps: 0,
            };
            if let Some(old) = l.vmm_table().handles.insert(key, entry) {
                // The driver reused a handle value: it had freed the old allocation (its last
                // release or unmap did not reach us).
                l.credit(old.dev as usize, old.bytes);
            }
            return;
        }
        if let Some((odev, obytes)) = l.shard(kind, key).insert((kind, key), (dev as u32, bytes)) {
            // The driver handed out a handle we still had on record: its free never reached us
            // (e.g. freed through a path we do not hook). Credit the stale entry.
            l.credit(odev as usize, obytes);
        }
    }

    /// Changes the reserved amount to `bytes` (pitched allocations learn their size after the
    /// call). Shrinking always succeeds; growing is one more reservation against `cap` and fails
    /// (changing nothing) if it would pass it.
    pub fn try_resize(&mut self, bytes: u64, cap: u64) -> bool {
        if self.ledger.counter(self.dev).is_none() {
            self.bytes = bytes;
            return true;
        }
        if bytes <= self.bytes {
            self.ledger.credit(self.dev, self.bytes - bytes);
            self.bytes = bytes;
            return true;
        }
        let delta = bytes - self.bytes;
        let ok = self.ledger.charge(self.dev, delta, cap).is_ok();
        if ok {
            self.bytes = bytes;
        }
        ok
    }

    /// Changes the reserved amount to `bytes` without a cap check: for memory the driver has
    /// already taken (a context's measured footprint), which must be counted even past the cap.
    pub fn force_resize(&mut self, bytes: u64) {
        if bytes <= self.bytes {
            self.ledger.credit(self.dev, self.bytes - bytes);
        } else {
            self.ledger.force_charge(self.dev, bytes - self.bytes);
        }
        self.bytes = bytes;
    }

    /// Bytes reserved now.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.ledger.credit(self.dev, self.bytes);
    }
}

fn mix(k: u64) -> u64 {
    // splitmix64 finaliser: device pointers share low bits (alignment), so spread them.
    let mut z = k.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Ledger {
    /// Nothing charged on any device.
    pub fn new() -> Ledger {
        Ledger {
            used: std::array::from_fn(|_| AtomicU64::new(0)),
            group: None,
            shared_index: std::array::from_fn(|d| AtomicU8::new(d as u8)),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            vmm: Mutex::new(VmmTable::default()),
            pools: Mutex::new(PoolTable::default()),
            pool_ptrs: AtomicUsize::new(0),
            graphs: Mutex::new(HashMap::new()),
        }
    }

    fn graph_table(&self) -> std::sync::MutexGuard<'_, HashMap<u64, [u64; MAX_DEVICES]>> {
        // Poisoned only by a panic between single-entry updates: the table stays usable.
        self.graphs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `cuGraphAddMemAllocNode` added `bytes` on `dev` to `graph`.
    pub fn graph_alloc_node(&self, graph: u64, dev: usize, bytes: u64) {
        if let Some(slot) = self
            .graph_table()
            .entry(graph)
            .or_insert([0; MAX_DEVICES])
            .get_mut(dev)
        {
            *slot = slot.saturating_add(bytes);
        }
    }

    /// Bytes of `graph`'s memory-allocation nodes per device (zeros for a graph without any).
    pub fn graph_allocs(&self, graph: u64) -> [u64; MAX_DEVICES] {
        self.graph_table()
            .get(&graph)
            .copied()
            .unwrap_or([0; MAX_DEVICES])
    }

    /// `cuGraphDestroy`: its nodes are gone (instantiated copies keep their own charge).
    pub fn graph_destroyed(&self, graph: u64) {
        self.graph_table().remove(&graph);
    }

    fn pool_table(&self) -> std::sync::MutexGuard<'_, PoolTable> {
        // Poisoned only by a panic between single-entry updates: the table stays usable.
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn vmm_table(&self) -> std::sync::MutexGuard<'_, VmmTable> {
        // Poisoned only by a panic between two single-entry updates: the table stays usable.
        self.vmm.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shard(
        &self,
        kind: Kind,
        key: u64,
    ) -> std::sync::MutexGuard<'_, HashMap<(Kind, u64), (u32, u64)>> {
        let i = (mix(key ^ kind as u64) as usize) % SHARDS;
        // A poisoned shard only means a panic happened while it was held; the map is still
        // consistent (single insert/remove), so keep using it.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A ledger whose counters are `group`'s slot: the cap is checked against what every live
    /// process of the grant holds.
    pub fn shared(group: Group) -> Ledger {
        Ledger {
            group: Some(group),
            ..Ledger::new()
        }
    }

    /// Ordinal `dev` is the GPU of grant-page slot `slot`: the shared table counts it there, so
    /// processes of one grant that number their GPUs differently (another
    /// `CUDA_VISIBLE_DEVICES`) charge the same counter. Set before anything is charged on `dev`
    /// (the runtime resolves the slot before every reservation); never changes afterwards for a
    /// GPU's lifetime in the process.
    pub fn map_shared(&self, dev: usize, slot: usize) {
        if let (Some(i), true) = (self.shared_index.get(dev), slot < MAX_DEVICES) {
            i.store(slot as u8, Relaxed);
        }
    }

    /// This process's counter of `dev` (`None` beyond [`MAX_DEVICES`]).
    fn counter(&self, dev: usize) -> Option<&AtomicU64> {
        match &self.group {
            Some(g) => g.counter(self.shared_index.get(dev)?.load(Relaxed) as usize),
            None => self.used.get(dev),
        }
    }

    /// Bytes this process holds on `dev`.
    pub fn used(&self, dev: usize) -> u64 {
        self.counter(dev).map_or(0, |u| u.load(Acquire))
    }

    /// Bytes the cap of `dev` is checked against: what every live process sharing this
    /// process's grant holds (this process's own use without a shared ledger).
    pub fn grant_used(&self, dev: usize) -> u64 {
        match &self.group {
            Some(g) => g.live_sum(
                self.shared_index
                    .get(dev)
                    .map_or(dev, |i| i.load(Relaxed) as usize),
            ),
            None => self.used(dev),
        }
    }

    /// The collision bucket the processes of this grant share on grant-page slot `slot` (none
    /// without a shared ledger: the process keeps a bucket of its own).
    pub fn shared_contention(&self, slot: usize) -> Option<crate::harvest::SharedWords> {
        self.group.as_ref()?.contention(slot)
    }

    /// Whether this process charges its grant's shared ledger (under `smore run`), and so gates
    /// by the raw-share gate and pays the collision bucket its grant's processes share.
    pub fn has_group(&self) -> bool {
        self.group.is_some()
    }

    /// The raw-share gate the processes of this grant share on grant-page slot `slot` (none
    /// without a shared ledger: the process keeps a gate of its own).
    pub fn shared_raw(&self, slot: usize) -> Option<&'static std::sync::atomic::AtomicU64> {
        self.group.as_ref()?.raw(slot)
    }

    /// The context footprint another process of the grant measured on `dev` (0: none, or no
    /// shared ledger).
    pub fn shared_footprint(&self, dev: usize) -> u64 {
        match (&self.group, self.shared_index.get(dev)) {
            (Some(g), Some(i)) => g.footprint(i.load(Relaxed) as usize),
            _ => 0,
        }
    }

    /// Takes (or waits for) the measurement of the grant's first context on `dev`; a process
    /// without a shared ledger measures its own ([`FirstContext::Mine`]).
    pub fn begin_first_context(&self, dev: usize) -> FirstContext {
        match (&self.group, self.shared_index.get(dev)) {
            (Some(g), Some(i)) => g.begin_first_context(i.load(Relaxed) as usize),
            _ => FirstContext::Mine,
        }
    }

    /// Ends this process's measurement of `dev`'s first context.
    pub fn end_first_context(&self, dev: usize) {
        if let (Some(g), Some(i)) = (&self.group, self.shared_index.get(dev)) {
            g.end_first_context(i.load(Relaxed) as usize);
        }
    }

    /// Publishes a measured context footprint of `dev` to the grant's other processes.
    pub fn publish_footprint(&self, dev: usize, bytes: u64) {
        if let (Some(g), Some(i)) = (&self.group, self.shared_index.get(dev)) {
            g.publish_footprint(i.load(Relaxed) as usize, bytes);
        }
    }

    /// Whether the counters are a shared ledger's slot.
    pub fn is_shared(&self) -> bool {
        self.group.is_some()
    }

    /// Adds `bytes` to `dev` unless that would pass `cap` (alone, or with the grant's other
    /// processes); `Err` carries the use the cap was checked against.
    fn charge(&self, dev: usize, bytes: u64, cap: u64) -> Result<(), u64> {
        if let Some(g) = &self.group {
            let i = self
                .shared_index
                .get(dev)
                .map_or(dev, |i| i.load(Relaxed) as usize);
            return g.reserve(i, bytes, cap);
        }
        let Some(u) = self.used.get(dev) else {
            return Ok(());
        };
        u.fetch_update(AcqRel, Acquire, |v| {
            v.checked_add(bytes).filter(|n| *n <= cap)
        })
        .map(|_| ())
    }

    /// Reserves `bytes` on `dev` unless that would pass `cap`. One CAS loop (a shared ledger:
    /// reserve-then-check across processes, [`Group::reserve`]): threads racing for the last
    /// bytes are serialised by the counter itself, never by a check made earlier.
    pub fn reserve(&self, dev: usize, bytes: u64, cap: u64) -> Result<Reservation<'_>, OverCap> {
        if self.counter(dev).is_none() {
            // Untracked ordinal: nothing to charge against (documented limit).
            return Ok(Reservation {
                ledger: self,
                dev,
                bytes: 0,
            });
        }
        match self.charge(dev, bytes, cap) {
            Ok(()) => Ok(Reservation {
                ledger: self,
                dev,
                bytes,
            }),
            Err(used) => Err(OverCap {
                dev,
                cap,
                used,
                request: bytes,
            }),
        }
    }

    /// Charges without a cap check (the context footprint: the context exists already).
    pub fn force_charge(&self, dev: usize, bytes: u64) {
        if let Some(u) = self.counter(dev) {
            u.fetch_add(bytes, AcqRel);
        }
    }

    fn credit(&self, dev: usize, bytes: u64) {
        if let Some(u) = self.counter(dev) {
            // Saturating: a credit can never wrap the counter.
            let _ = u.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(bytes)));
        }
    }

    /// Forgets `key` after the driver freed it and credits what it was charged. Unknown keys
    /// (allocated before the shim loaded, by an unhooked path, or twice freed) credit nothing.
    /// A VMM handle (`cuMemRelease`) drops one reference and is credited only when no reference
    /// and no mapping is left (`None` while it is still held).
    pub fn release(&self, kind: Kind, key: u64) -> Option<(usize, u64)> {
        if kind == Kind::Vmm {
            let mut t = self.vmm_table();
            let e = t.handles.get_mut(&key)?;
            e.refs = e.refs.saturating_sub(1);
            return self.vmm_settle(&mut t, key);
        }
        let entry = self.shard(kind, key).remove(&(kind, key));
        entry.map(|(dev, bytes)| {
            self.credit(dev as usize, bytes);
            (dev as usize, bytes)
        })
    }

    /// Credits and forgets VMM handle `key` if nothing holds it any more.
    fn vmm_settle(&self, t: &mut VmmTable, key: u64) -> Option<(usize, u64)> {
        match t.handles.get(&key) {
            Some(e) if e.refs == 0 && e.maps == 0 => {
                let e = t.handles.remove(&key)?;
                self.credit(e.dev as usize, e.bytes);
                Some((e.dev as usize, e.bytes))
            }
            _ => None,
        }
    }

    /// `cuMemRetainAllocationHandle` returned `key`: one more `cuMemRelease` is needed before the
    /// driver frees it. Unknown handles are ignored.
    pub fn vmm_retained(&self, key: u64) {
        if let Some(e) = self.vmm_table().handles.get_mut(&key) {
            e.refs = e.refs.saturating_add(1);
        }
    }

    /// `cuMemMap(va, size, …, key)` succeeded: the handle's memory stays held while mapped.
    /// Handles the ledger does not know (created before the shim, by an unhooked path) are
    /// ignored.
    pub fn vmm_mapped(&self, va: u64, size: u64, key: u64) {
        let mut t = self.vmm_table();
        let Some(e) = t.handles.get_mut(&key) else {
            return;
        };
        e.maps = e.maps.saturating_add(1);
        if let Some((old, _)) = t.maps.insert(va, (key, size)) {
            // The driver mapped over an address whose unmap we did not see: that mapping is gone.
            if let Some(o) = t.handles.get_mut(&old) {
                o.maps = o.maps.saturating_sub(1);
            }
            self.vmm_settle(&mut t, old);
        }
    }

    /// `cuMemUnmap(va, size)` succeeded: every mapping that starts inside the range is gone, and a
    /// handle with no reference and no mapping left is credited. Returns the bytes credited.
    pub fn vmm_unmapped(&self, va: u64, size: u64) -> u64 {
        let mut t = self.vmm_table();
        let end = va.saturating_add(size.max(1));
        let gone: Vec<u64> = t.maps.range(va..end).map(|(&b, _)| b).collect();
        let mut credited = 0;
        for base in gone {
            let Some((key, _)) = t.maps.remove(&base) else {
                continue;
            };
            if let Some(e) = t.handles.get_mut(&key) {
                e.maps = e.maps.saturating_sub(1);
            }
            credited += self.vmm_settle(&mut t, key).map_or(0, |(_, b)| b);
        }
        credited
    }

    /// A pool created on `dev` (`cuMemPoolCreate` with a device location): allocations from it
    /// are charged there, whatever the current context's device.
    pub fn pool_created(&self, pool: u64, dev: usize) {
        let e = PoolEntry {
            dev: dev as u32,
            charged: 0,
            live: 0,
            destroyed: false,
        };
        if let Some(old) = self.pool_table().pools.insert(pool, e) {
            // A reused handle: the driver had released the old pool.
            self.credit(old.dev as usize, old.charged);
        }
    }

    /// The device a known pool's memory lives on.
    pub fn pool_device(&self, pool: u64) -> Option<usize> {
        self.pool_table().pools.get(&pool).map(|e| e.dev as usize)
    }

    /// Live pools on `dev` (whose reservation may be re-read).
    pub fn pools_on(&self, dev: usize) -> Vec<u64> {
        self.pool_table()
            .pools
            .iter()
            .filter(|(_, e)| e.dev as usize == dev && !e.destroyed)
            .map(|(&p, _)| p)
            .collect()
    }

    /// Sets a live pool's charge to what the driver says it reserves now (`reserved`): a pool that
    /// released memory (a synchronize past its release threshold, `cuMemPoolTrimTo`) is credited,
    /// one that grew by a path the shim does not see is charged (past the cap if need be: the
    /// driver holds it).
    pub fn pool_sync(&self, pool: u64, reserved: u64) {
        let mut t = self.pool_table();
        let Some(e) = t.pools.get_mut(&pool).filter(|e| !e.destroyed) else {
            return;
        };
        let (dev, old) = (e.dev as usize, e.charged);
        e.charged = reserved;
        if reserved < old {
            self.credit(dev, old - reserved);
        } else {
            self.force_charge(dev, reserved - old);
        }
    }

    /// Settles an allocation of `bytes` at `ptr` from `pool` on `dev`, for which `r` reserved the
    /// growth the pool was expected to need. The pool is charged what it reserves now
    /// (`reserved`, from the driver; `None`: unknown, then the allocation itself is charged):
    /// the part beyond its previous charge comes out of `r`, grown against `cap` if the pool grew
    /// more than expected. Returns false when that growth did not fit: the pool's memory is
    /// charged anyway (the driver holds it until the pool releases it) and the caller must free
    /// the allocation and refuse it.
    pub fn pool_commit(
        &self,
        mut r: Reservation<'_>,
        pool: u64,
        ptr: u64,
        bytes: u64,
        reserved: Option<u64>,
        cap: u64,
    ) -> bool {
        let mut t = self.pool_table();
        let dev = r.dev;
        let e = t.pools.entry(pool).or_insert(PoolEntry {
            dev: dev as u32,
            charged: 0,
            live: 0,
            destroyed: false,
        });
        let target = reserved.unwrap_or(e.charged.saturating_add(bytes));
        let mut fits = true;
        if target >= e.charged {
            let growth = target - e.charged;
            if growth > r.bytes() && !r.try_resize(growth, cap) {
                r.force_resize(growth);
                fits = false;
            } else {
                r.force_resize(growth);
            }
            std::mem::forget(r);
        } else {
            // The pool released memory meanwhile: nothing grew.
            drop(r);
            self.credit(e.dev as usize, e.charged - target);
        }
        e.charged = target;
        if fits {
            e.live = e.live.saturating_add(bytes);
            t.ptrs.insert(ptr, (pool, bytes));
            self.pool_ptrs.store(t.ptrs.len(), Release);
        }
        fits
    }

    /// The driver freed `ptr` (`cuMemFreeAsync`, `cuMemFree`): if it came from a pool, forgets it
    /// and says what the pool accounting must do.
    pub fn pool_freed(&self, ptr: u64) -> PoolFree {
        if self.pool_ptrs.load(Acquire) == 0 {
            return PoolFree::NotPool;
        }
        let mut t = self.pool_table();
        let Some((pool, bytes)) = t.ptrs.remove(&ptr) else {
            return PoolFree::NotPool;
        };
        self.pool_ptrs.store(t.ptrs.len(), Release);
        let Some(e) = t.pools.get_mut(&pool) else {
            return PoolFree::NotPool;
        };
        e.live = e.live.saturating_sub(bytes);
        if !e.destroyed {
            return PoolFree::Live(pool);
        }
        let give = bytes.min(e.charged);
        e.charged -= give;
        let (dev, done) = (e.dev as usize, e.live == 0);
        if done {
            t.pools.remove(&pool);
        }
        self.credit(dev, give);
        PoolFree::Destroyed
    }

    /// `cuMemPoolDestroy` succeeded: what the pool reserved beyond its live allocations is
    /// credited; the rest goes as they are freed (the driver keeps a destroyed pool's memory
    /// until its allocations are freed, cuda.h `cuMemPoolDestroy`).
    pub fn pool_destroyed(&self, pool: u64) {
        let mut t = self.pool_table();
        let Some(e) = t.pools.get_mut(&pool) else {
            return;
        };
        let give = e.charged.saturating_sub(e.live);
        e.charged -= give;
        e.destroyed = true;
        let (dev, done) = (e.dev as usize, e.live == 0);
        if done {
            t.pools.remove(&pool);
        }
        self.credit(dev, give);
    }

    /// Whether `key` is on record (e.g. a device's primary context is charged).
    pub fn holds(&self, kind: Kind, key: u64) -> bool {
        if kind == Kind::Vmm {
            return self.vmm_table().handles.contains_key(&key);
        }
        self.shard(kind, key).contains_key(&(kind, key))
    }

    /// Number of live entries (tests, status).
    pub fn entries(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum::<usize>()
            + self.vmm_table().handles.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Barrier};

    #[test]
    fn a_reservation_past_the_cap_is_refused_with_the_numbers() {
        let l = Ledger::new();
        l.reserve(0, 100, 250).unwrap().commit(Kind::Ptr, 0x1000);
        l.reserve(0, 150, 250).unwrap().commit(Kind::Vmm, 0x1000);
        assert_eq!(l.used(0), 250);
        let e = l.reserve(0, 1, 250).unwrap_err();
        assert_eq!((e.cap, e.used, e.request), (250, 250, 1));
        assert_eq!(l.used(1), 0, "devices are separate");
    }

    #[test]
    fn a_release_credits_what_its_commit_charged_once() {
        let l = Ledger::new();
        l.reserve(0, 100, 250).unwrap().commit(Kind::Ptr, 0x1000);
        l.reserve(0, 150, 250).unwrap().commit(Kind::Vmm, 0x1000);
        assert_eq!(l.release(Kind::Ptr, 0x1000), Some((0, 100)));
        assert_eq!(
            l.release(Kind::Ptr, 0x1000),
            None,
            "double free credits nothing"
        );
        assert_eq!(
            l.release(Kind::Array, 0x1000),
            None,
            "namespaces are separate"
        );
        assert_eq!(l.used(0), 150);
    }

    #[test]
    fn a_vmm_handle_is_credited_only_when_released_and_unmapped() {
        let l = Ledger::new();
        l.reserve(0, 4096, u64::MAX)
            .unwrap()
            .commit(Kind::Vmm, 0x50);
        l.vmm_mapped(0x7000_0000, 4096, 0x50);
        assert_eq!(l.release(Kind::Vmm, 0x50), None, "still mapped: held");
        assert_eq!(l.used(0), 4096);
        assert_eq!(l.vmm_unmapped(0x7000_0000, 4096), 4096);
        assert_eq!(l.used(0), 0);
        assert_eq!(l.entries(), 0);

        // Mapped twice, retained once: two unmaps and two releases, in any order.
        l.reserve(1, 100, u64::MAX).unwrap().commit(Kind::Vmm, 0x51);
        l.vmm_mapped(0x1000, 100, 0x51);
        l.vmm_mapped(0x9000, 100, 0x51);
        l.vmm_retained(0x51);
        assert_eq!(l.release(Kind::Vmm, 0x51), None);
        assert_eq!(l.vmm_unmapped(0x1000, 100), 0);
        assert_eq!(l.release(Kind::Vmm, 0x51), None, "one mapping left");
        assert_eq!(l.used(1), 100);
        assert_eq!(l.vmm_unmapped(0x9000, 100), 100);
        assert_eq!(l.used(1), 0);
        assert_eq!(l.release(Kind::Vmm, 0x51), None, "gone: credits nothing");

        // Released before it was ever mapped: freed at once.
        l.reserve(0, 7, u64::MAX).unwrap().commit(Kind::Vmm, 0x52);
        assert_eq!(l.release(Kind::Vmm, 0x52), Some((0, 7)));
        // Mappings of handles the ledger never charged are ignored.
        l.vmm_mapped(0x5000, 10, 0x99);
        assert_eq!(l.vmm_unmapped(0x5000, 10), 0);
        assert_eq!(l.used(0), 0);
    }

    #[test]
    fn a_forced_resize_counts_past_the_cap_and_its_release_credits_it_all() {
        let l = Ledger::new();
        let mut r = l.reserve(0, 300, 500).unwrap();
        r.force_resize(700);
        r.commit(Kind::Context, 0xc7);
        assert_eq!(l.used(0), 700);
        assert!(l.holds(Kind::Context, 0xc7));
        assert!(!l.holds(Kind::PrimaryContext, 0xc7));
        assert!(l.reserve(0, 1, 500).is_err());
        assert_eq!(l.release(Kind::Context, 0xc7), Some((0, 700)));
        assert_eq!(l.used(0), 0);
    }

    #[test]
    fn a_pool_is_charged_what_it_reserves_until_it_releases_it() {
        let l = Ledger::new();
        // 100 B allocated, the pool reserves 128 (its granularity).
        let r = l.reserve(0, 100, 1000).unwrap();
        assert!(l.pool_commit(r, 0xa, 0x1, 100, Some(128), 1000));
        assert_eq!(l.used(0), 128);
        // Freed: the pool keeps it reserved (release threshold).
        assert_eq!(l.pool_freed(0x1), PoolFree::Live(0xa));
        assert_eq!(l.used(0), 128);
        // Reused without growth: the reservation is given back.
        let r = l.reserve(0, 100, 1000).unwrap();
        assert!(l.pool_commit(r, 0xa, 0x2, 100, Some(128), 1000));
        assert_eq!(l.used(0), 128);
        // Grew more than reserved and past the cap: charged anyway, reported.
        let r = l.reserve(0, 10, 1000).unwrap();
        assert!(!l.pool_commit(r, 0xa, 0x3, 10, Some(1128), 1000));
        assert_eq!(l.used(0), 1128);
        assert_eq!(l.pool_freed(0x3), PoolFree::NotPool, "refused: not kept");
        // The pool trimmed: credited.
        l.pool_sync(0xa, 128);
        assert_eq!(l.used(0), 128);
        assert_eq!(l.pools_on(0), vec![0xa]);
        // Destroyed with a live allocation: that stays charged until it is freed.
        l.pool_destroyed(0xa);
        assert_eq!(l.used(0), 100);
        assert!(l.pools_on(0).is_empty());
        assert_eq!(l.pool_freed(0x2), PoolFree::Destroyed);
        assert_eq!(l.used(0), 0);
        // A pool created on device 3 is known there.
        l.pool_created(0xb, 3);
        assert_eq!(l.pool_device(0xb), Some(3));
    }

    #[test]
    fn a_dropped_reservation_rolls_back() {
        let l = Ledger::new();
        {
            let _r = l.reserve(2, 4096, u64::MAX).unwrap();
            assert_eq!(l.used(2), 4096);
        }
        assert_eq!(l.used(2), 0);
    }

    #[test]
    fn a_resize_past_the_cap_is_refused_and_the_committed_size_is_credited() {
        let l = Ledger::new();
        let mut r = l.reserve(2, 1000, 5000).unwrap();
        assert!(r.try_resize(1536, 5000));
        assert!(!r.try_resize(6000, 5000), "growth past the cap is refused");
        assert_eq!(l.used(2), 1536);
        assert!(r.try_resize(1024, 5000));
        assert!(r.try_resize(1536, 5000));
        r.commit(Kind::Ptr, 7);
        assert_eq!(l.used(2), 1536);
        assert_eq!(l.release(Kind::Ptr, 7), Some((2, 1536)));
        assert_eq!(l.used(2), 0);
    }

    #[test]
    fn a_reservation_that_would_overflow_is_refused() {
        let l = Ledger::new();
        l.force_charge(0, u64::MAX - 5);
        assert!(l.reserve(0, 10, u64::MAX).is_err());
    }

    /// Threads race for a cap that is not a multiple of the request: the sum of successful
    /// reservations never exceeds the cap and the cap is used up to the last whole request.
    #[test]
    fn racing_threads_never_pass_the_cap() {
        for round in 0..20 {
            let l = Arc::new(Ledger::new());
            let cap: u64 = 1000 + round * 7;
            let ok = Arc::new(AtomicUsize::new(0));
            let barrier = Arc::new(Barrier::new(8));
            let hs: Vec<_> = (0..8u64)
                .map(|t| {
                    let (l, ok, barrier) = (l.clone(), ok.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        for i in 0..200u64 {
                            if let Ok(r) = l.reserve(0, 10, cap) {
                                // Half of the attempts "fail in the driver" and roll back.
                                if i % 2 == 0 {
                                    r.commit(Kind::Ptr, t << 32 | i);
                                    ok.fetch_add(1, SeqCst);
                                } else {
                                    drop(r);
                                }
                            }
                            assert!(l.used(0) <= cap);
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            let n = ok.load(SeqCst) as u64;
            assert_eq!(l.used(0), n * 10);
            assert!(l.used(0) <= cap);
            assert_eq!(n, (cap / 10).min(800), "the cap is used up");
            assert_eq!(l.entries() as u64, n);
        }
    }
}
