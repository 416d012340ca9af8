//! The arbiter watcher: one background thread per process image holding an arbiter grant. It
//! blocks on the arbiter connection for the hang-up (the arbiter died or restarted), applies the
//! failure policy to the grant meanwhile, reconnects with back-off and re-registers with `resume`,
//! then swaps the new grant page in.
//!
//! While the arbiter is away, under the failure policy: closed when the node's
//! `[arbiter] failure_policy` (announced in the grant) or the process's `SMORE_FAILURE` says so —
//! a function may be stricter than its node, never laxer:
//! - open (default): the last grant stays in force — the old page stays mapped
//!   and keeps the values the arbiter last wrote.
//! - closed: a process-local page with cap 0 on every device (shares copied from
//!   the last grant, contention budgets too) replaces it: every new allocation is refused,
//!   launches keep their pacing.
//!
//! On a re-registration (same instance id, a new page) the new page is swapped in with one atomic
//! store; the old mapping is leaked (4 KiB), so a hook still reading it reads valid memory.
//!
//! Between hang-up checks (every [`REPORT_PERIOD_MS`]) it sends the process's usage counters
//! (estimated GPU and collision time, docs/harvest.md) to the arbiter over a connection of its own
//! ([`Reporter`]); a process that holds a grant without its registration (a fork child or a
//! `close_fds` worker of a `smore run` process, a descendant refused re-registration) gets a
//! thread that reports and follows the grant through that connection ([`spawn_follower`]).
//!
//! Owns the thread and its back-off. Must never: take a lock the hooks take (it only loads and
//! stores the runtime's page pointer, reads the usage counters and writes log lines), read or
//! write the inherited `smore run` connection (it only polls it for the hang-up), panic across
//! its boundary, or keep the host alive (the thread is detached; process exit ends it).

use crate::client::{self, PageNews, Rejoin, ReportError, Reporter, Resume};
use crate::config::{FailurePolicy, Level};
use crate::harvest::Usage;
use crate::limits::{GrantPage, MAX_DEVICES};
use crate::log;
use crate::sys::grant::FileId;
use crate::sys::os::{self, StaticRef};
use smore_protocol::board::TurnBoard;
use smore_protocol::wire::Request;
use std::time::Duration;

/// First retry delay after the connection is lost: 50 ms (reasoning: a restarting arbiter binds
/// its socket within tens of ms of starting; sooner retries would only find it down).
pub const FIRST_RETRY: Duration = Duration::from_millis(50);
/// Longest delay between connection attempts: 1 s (reasoning: how long a function may run on a
/// stale or fail-closed grant after the arbiter is back; one connect per second is nothing).
pub const MAX_RETRY: Duration = Duration::from_secs(1);
/// Delay after the arbiter answered but did not grant: 10 s (reasoning: a refusal is a placement
/// decision; asking every second would flood the arbiter's event log with the same refusal).
pub const REFUSED_RETRY: Duration = Duration::from_secs(10);
/// Period of the usage reports (docs/harvest.md): 1 s, in ms. Reasoning: the arbiter re-splits
/// collision budgets every second and estimates the training slowdown over 10 s; an idle
/// function whose counters did not move sends only a refresh every
/// [`client::REPORT_REFRESH`] (10 s), so the arbiter's cost grows with the functions that run,
/// hardly with those that exist.
pub const REPORT_PERIOD_MS: i32 = 1000;

/// Where the watcher reads this process's usage on a device (the runtime's counters, passed down:
/// this layer does not import the runtime).
pub type UsageOf = fn(usize) -> Usage;

/// Where the watcher hands the turn board of a new grant and its slot (the runtime seats the
/// process on it; this layer does not import the runtime).
pub type BoardTo = fn(Option<&'static TurnBoard>, usize);

/// Starts the watcher of the live limits page `limits` (the runtime's: the watcher swaps pages in
/// it) under failure policy `policy`. If the thread cannot be created the connection stays open
/// (its fd is never closed) and the grant simply cannot be resumed after a restart.
pub fn spawn(
    policy: FailurePolicy,
    limits: &'static StaticRef<GrantPage>,
    r: Resume,
    usage: UsageOf,
    board_to: BoardTo,
) {
    let started = std::thread::Builder::new()
        .name("smore-arbiter".into())
        .stack_size(256 << 10)
        .spawn(move || {
            os::block_signals();
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                watch(policy, limits, r, usage, board_to)
            }));
        });
    if let Err(e) = started {
        log::line(
            Level::Warn,
            format_args!("cannot start the arbiter watcher thread ({e}): the grant will not be resumed if the arbiter restarts"),
        );
    }
}

/// A process-local page refusing every allocation, with the shares, contention budgets,
/// context-switch costs, timing-noise allowances and GPU names (slot UUIDs) of `last`, and no
/// mode.
fn closed_page(last: &GrantPage) -> &'static GrantPage {
    let page: &'static GrantPage = Box::leak(Box::new(GrantPage::unlimited()));
    close_onto(page, last);
    page
}

/// Writes into `page` what [`closed_page`] makes of `last` (its words are atomics: a page in
/// force may be written again).
fn close_onto(page: &GrantPage, last: &GrantPage) {
    for d in 0..MAX_DEVICES {
        page.set(d, 0, last.share(d).clamp(1, 100));
        page.set_contention(d, last.contention(d));
        page.set_switch(d, last.switch(d));
        page.set_timing_noise(d, last.timing_noise(d));
        // No mode: nothing updates this page again (see runtime.rs's closed page).
        page.set_sharing(d, None);
        if let Some(u) = last.slot_uuid(d) {
            page.set_slot_uuid(d, u);
        }
        // Its launches still take turns (a new page's seat is read from the page in force).
        page.set_turn_seat(d, last.turn_seat(d));
    }
}

/// A process that holds a grant it does not own the registration of: a fork child of the
/// process `smore run` registered, a worker started with `close_fds`, a descendant whose
/// registration is another process's. It reports its own launches and follows the grant
/// through its report connection ([`follow`]).
pub struct Follow {
    /// `SMORE_ARBITER_SOCKET`.
    pub socket: std::path::PathBuf,
    /// The instance whose grant the process holds.
    pub instance: u64,
    /// The grant's page slot.
    pub slot: usize,
    /// The file of the page the process holds; None when not known (the first page an attach
    /// hands is then taken).
    pub page: Option<FileId>,
    /// The process's own failure policy (`SMORE_FAILURE`); the node's, announced in the grant
    /// an attach answers with, is a floor.
    pub policy: FailurePolicy,
}

/// Starts a thread that reports usage and follows the grant ([`follow`]).
///
/// `held`: the arbiter's page the process holds (not the closed copy a process that refuses
/// allocations enforces instead).
pub fn spawn_follower(
    f: Follow,
    held: &'static GrantPage,
    limits: &'static StaticRef<GrantPage>,
    usage: UsageOf,
    board_to: BoardTo,
) {
    let started = std::thread::Builder::new()
        .name("smore-report".into())
        .stack_size(128 << 10)
        .spawn(move || {
            os::block_signals();
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                follow(f, limits, usage, board_to, held, false)
            }));
        });
    if let Err(e) = started {
        log::line(
            Level::Warn,
            format_args!("cannot start the usage reporter thread ({e}): this process's launches go unreported and its grant is not followed after an arbiter restart"),
        );
    }
}

/// The loop of a process that only reports (docs/shim.md, "Workers after an arbiter
/// restart"): every [`REPORT_PERIOD_MS`] it reports over a connection attached to the instance,
/// polled for the arbiter's hang-up in between. An attach answers with the instance's page: a
/// page this process does not hold (a restarted arbiter's) is swapped in, with its turn board.
/// The failure policy applies as to a registered process ([`watch`]) when the connection hangs
/// up, or when the arbiter's socket is absent or refuses connections (a process started while
/// the arbiter is away): closed — the node's, from the last grant, or the process's — puts a
/// process-local page refusing every allocation in until an attach succeeds; open keeps the page
/// held. A timeout or a local failure (out of fds) is no outage; a refusal from an arbiter that
/// is up changes nothing, and is asked again only after [`REFUSED_RETRY`].
///
/// `held`: the arbiter's page the process holds; `closed`: whether a closed page is in force
/// already (a descendant refused re-registration under fail-closed).
fn follow(
    f: Follow,
    limits: &'static StaticRef<GrantPage>,
    usage: UsageOf,
    board_to: BoardTo,
    mut held: &'static GrantPage,
    mut closed: bool,
) {
    let mut rep = Reporter::following(f.page);
    let mut node: Option<FailurePolicy> = None;
    // What the process enforces of the page held while the arbiter is there (a closed copy,
    // made once per page, where it refuses every allocation).
    let mut open = own_view(held);
    // One closed page per page held, however often the arbiter goes away.
    let mut closed_of: Option<(*const GrantPage, &'static GrantPage)> = None;
    let mut close = |held: &'static GrantPage, why: &str, node: Option<FailurePolicy>| -> bool {
        if effective(node, f.policy) != FailurePolicy::Closed {
            return false;
        }
        let page = match closed_of {
            // The same copy, with what the arbiter wrote into the held page since.
            Some((of, page)) if std::ptr::eq(of, held) => {
                close_onto(page, held);
                page
            }
            _ => {
                let page = closed_page(held);
                closed_of = Some((held, page));
                page
            }
        };
        limits.set(page);
        log::line(
            Level::Warn,
            format_args!(
                "{why} (instance {}): every device allocation is refused until it is back (failure policy closed)",
                f.instance
            ),
        );
        true
    };
    let mut quiet_until: Option<std::time::Instant> = None;
    // The first attach at once: a process started while the arbiter is away learns it (and the
    // failure policy applies) before its first allocation is likely, not a period later.
    let mut first = true;
    loop {
        match rep.conn_fd() {
            Some(fd) => {
                if os::wait_hangup_for(fd, REPORT_PERIOD_MS) {
                    rep.disconnect();
                    if !closed {
                        closed = close(held, "arbiter connection lost", node);
                    }
                }
            }
            None if first => {}
            None => std::thread::sleep(Duration::from_millis(REPORT_PERIOD_MS as u64)),
        }
        first = false;
        if quiet_until.is_some_and(|t| std::time::Instant::now() < t) {
            continue;
        }
        // Not forced: the preemption notice is the registered process's to say.
        let sent = rep.report(&f.socket, f.instance, usage(f.slot), false);
        if let Some(a) = rep.take_attached() {
            node = a.grant.failure_policy.map(client::policy_of);
            if let PageNews::New(page) = a.page {
                held = page;
                open = own_view(page);
                limits.set(open);
                board_to(a.board, f.slot);
                log::line(
                    Level::Warn,
                    format_args!(
                        "instance {}: following the arbiter's page for it now (the arbiter restarted since this process got its page), cap {} B, share {} %",
                        f.instance, a.grant.memory_cap, a.grant.sm_share
                    ),
                );
                closed = false;
            } else if closed && matches!(a.page, PageNews::Same) {
                // Only when the arbiter said the page held is the instance's: after a restart
                // it is the dead arbiter's, which nothing updates. A closed copy (the process
                // refuses allocations) takes what the arbiter wrote since.
                if !std::ptr::eq(open, held) {
                    close_onto(open, held);
                }
                limits.set(open);
                closed = false;
                log::line(
                    Level::Warn,
                    format_args!(
                        "instance {}: arbiter back; its grant applies again",
                        f.instance
                    ),
                );
            } else if closed {
                // Nothing usable came: ask again on a new connection, later (this one would
                // never be asked again while it stays up).
                rep.disconnect();
                quiet_until = Some(std::time::Instant::now() + REFUSED_RETRY);
                log::line(
                    Level::Debug,
                    format_args!(
                        "the attach handed no usable page; asking again in {} s",
                        REFUSED_RETRY.as_secs()
                    ),
                );
                continue;
            }
        }
        quiet_until = None;
        match sent {
            Err(ReportError::Down(why)) if !closed => {
                closed = close(held, &format!("arbiter unreachable: {why}"), node);
                if !closed {
                    log::line(Level::Debug, format_args!("usage report not sent: {why}"));
                }
            }
            Err(ReportError::Refused(why)) => {
                log::line(
                    Level::Debug,
                    format_args!(
                        "usage report not sent: {why}; asking again in {} s",
                        REFUSED_RETRY.as_secs()
                    ),
                );
                quiet_until = Some(std::time::Instant::now() + REFUSED_RETRY);
            }
            Err(e) => log::line(Level::Debug, format_args!("usage report not sent: {e}")),
            Ok(()) => {}
        }
    }
}

/// Whether this process refuses every allocation whatever its grant says: its runtime could not
/// join the grant's shared ledger (every slot held, a `/proc` of another pid namespace, its
/// namespace or start time unreadable, a table it cannot map: `shared_ledger::ClaimError`), so a
/// page of the arbiter's would let it allocate beside the grant's one cap (found by review,
/// 2026-11-29). Set by the runtime at init (a fork child sets it again).
static ALLOCATIONS_REFUSED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Says whether this process refuses every allocation whatever its grant says (the runtime,
/// at init).
pub fn set_allocations_refused(refused: bool) {
    ALLOCATIONS_REFUSED.store(refused, std::sync::atomic::Ordering::Release);
}

/// What this process enforces of an arbiter's page: the page, or a closed copy of it where the
/// process refuses every allocation ([`set_allocations_refused`]).
fn own_view(page: &'static GrantPage) -> &'static GrantPage {
    if ALLOCATIONS_REFUSED.load(std::sync::atomic::Ordering::Acquire) {
        closed_page(page)
    } else {
        page
    }
}

/// The failure policy in force: the node's (announced in the grant) is a floor; a process may
/// be stricter than its node, never laxer.
fn effective(node: Option<FailurePolicy>, own: FailurePolicy) -> FailurePolicy {
    match (node, own) {
        (Some(FailurePolicy::Closed), _) | (_, FailurePolicy::Closed) => FailurePolicy::Closed,
        _ => FailurePolicy::Open,
    }
}

/// One usage report; a failure is logged at debug level (the arbiter may be restarting).
/// `force`: report even if the usage did not change (the page's cap went to 0: a preempted
/// instance learns why from the reply).
fn report(rep: &mut Reporter, socket: &std::path::Path, instance: u64, u: Usage, force: bool) {
    if let Err(e) = rep.report(socket, instance, u, force) {
        log::line(Level::Debug, format_args!("usage report not sent: {e}"));
    }
}

fn watch(
    policy: FailurePolicy,
    limits: &'static StaticRef<GrantPage>,
    mut r: Resume,
    usage: UsageOf,
    board_to: BoardTo,
) {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let mut rep = Reporter::default();
    loop {
        // Between hang-up checks, report usage (on a connection of its own: see `Reporter`).
        while !os::wait_hangup_for(r.conn, REPORT_PERIOD_MS) {
            let force = limits.get().cap(r.slot) == 0;
            report(&mut rep, &r.socket, r.instance, usage(r.slot), force);
        }
        rep = Reporter::default();
        os::close_fd(r.conn);
        let granted = limits.get();
        let last_cap = granted.cap(r.slot);
        // The node's policy, announced in the grant, is a floor: a node that fails closed does so
        // whatever the process's SMORE_FAILURE says; a process may be stricter than its node.
        match effective(r.policy, policy) {
            FailurePolicy::Open => log::line(
                Level::Warn,
                format_args!(
                    "arbiter connection lost (instance {}): keeping the last grant (failure policy open) and re-registering",
                    r.instance
                ),
            ),
            FailurePolicy::Closed => {
                limits.set(closed_page(granted));
                log::line(
                    Level::Warn,
                    format_args!(
                        "arbiter connection lost (instance {}): every device allocation is refused until it re-registers (failure policy closed)",
                        r.instance
                    ),
                );
            }
        }
        let mut delay = FIRST_RETRY;
        let mut last_refusal = String::new();
        let (conn, page, board, grant) = loop {
            std::thread::sleep(delay);
            match client::reregister(&r, last_cap, visible.as_deref()) {
                Rejoin::Granted {
                    conn,
                    page,
                    board,
                    grant,
                } => break (conn, page, board, grant),
                Rejoin::Unreachable(why) => {
                    log::line(Level::Debug, format_args!("arbiter not back yet: {why}"));
                    delay = (delay * 2).min(MAX_RETRY);
                }
                Rejoin::Refused(why) => {
                    if why != last_refusal {
                        log::line(
                            Level::Error,
                            format_args!("{why}; retrying every {} s", REFUSED_RETRY.as_secs()),
                        );
                        last_refusal = why;
                    }
                    delay = REFUSED_RETRY;
                }
                Rejoin::NotOurs(why) => {
                    // Not ours to resume: the last arbiter page is what this process was granted
                    // (under fail-open; fail-closed stays closed), until an attach hands this
                    // arbiter's page for the instance.
                    let closed = effective(r.policy, policy) == FailurePolicy::Closed;
                    if !closed {
                        limits.set(granted);
                    }
                    log::line(
                        Level::Warn,
                        format_args!("not re-registering: {why}; {}, and following the instance's page once the arbiter hands one", if closed { "allocations stay refused (failure policy closed)" } else { "keeping the last grant" }),
                    );
                    let f = Follow {
                        socket: r.socket.clone(),
                        instance: r.instance,
                        slot: r.slot,
                        // The page held is the arbiter's before the restart: the first one an
                        // attach hands is this arbiter's.
                        page: None,
                        policy,
                    };
                    return follow(f, limits, usage, board_to, granted, closed);
                }
            }
        };
        limits.set(own_view(page));
        let how = if grant.instance == r.instance {
            "re-attached as instance"
        } else {
            "registered afresh (the arbiter no longer knew the old instance) as instance"
        };
        log::line(
            Level::Warn,
            format_args!(
                "arbiter back: {how} {} on GPU {}, cap {} B, share {} %",
                grant.instance, grant.gpu_index, grant.memory_cap, grant.sm_share
            ),
        );
        if let Some(p) = grant.pid {
            os::set_known_as(p);
        }
        r.conn = conn;
        r.instance = grant.instance;
        if !r.exec {
            r.policy = grant.failure_policy.map(crate::client::policy_of);
        }
        r.gpu = Some(grant.gpu_index);
        if !r.exec {
            r.slot = match &r.request {
                Request::Register(reg) => reg.slot_for(grant.gpu_index),
                _ => (grant.gpu_index as usize).min(MAX_DEVICES - 1),
            };
        }
        // After the slot: the seat is the new page's, at the new grant's slot.
        board_to(board, r.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_refuses_allocations_takes_a_new_page_as_a_closed_copy() {
        let page: &'static GrantPage = Box::leak(Box::new(GrantPage::unlimited()));
        page.set(0, 1 << 30, 40);
        assert!(
            std::ptr::eq(own_view(page), page),
            "by default the page itself"
        );
        // The runtime could not join the grant's shared ledger: a restarted arbiter's page must
        // not give it a cap beside the grant's.
        set_allocations_refused(true);
        let seen = own_view(page);
        set_allocations_refused(false);
        assert!(!std::ptr::eq(seen, page));
        assert_eq!(seen.cap(0), 0, "no allocation");
        assert_eq!(seen.share(0), 40, "the share still gates its launches");
        assert!(std::ptr::eq(own_view(page), page));
    }

    #[test]
    fn the_nodes_failure_policy_is_a_floor() {
        use FailurePolicy::{Closed, Open};
        assert_eq!(effective(None, Open), Open);
        assert_eq!(effective(Some(Open), Open), Open);
        assert_eq!(effective(Some(Closed), Open), Closed);
        assert_eq!(
            effective(Some(Open), Closed),
            Closed,
            "a process may be stricter"
        );
        assert_eq!(effective(None, Closed), Closed);
    }
}
