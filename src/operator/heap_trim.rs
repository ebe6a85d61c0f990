//! Gives the heap's free pages back to the system now and then.
//!
//! glibc's allocator returns memory on its own only from the top of a heap (and blocks large
//! enough to be mapped apart): what a burst freed between blocks still live (thousands of
//! reconciles in flight while Apps are created, a failover's cache fills) stays resident, so
//! the replica's RSS stayed near the burst's peak (docs/measurements.md). `malloc_trim` walks
//! the free chunks of every arena and releases the whole pages among them
//! (`MADV_DONTNEED`), locking each arena while it walks it: a trim took 0.1-0.8 ms end to end
//! at a third of 10,000 Apps. Every `--heap-trim-interval`.
//!
//! Other allocators (musl's, in a static build) have no `malloc_trim`; there this task does
//! nothing. The image's build is linked against glibc (its Dockerfile).

use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::debug;

/// Trims the heap every `every` until `stop` turns true.
pub async fn trim_until(every: Duration, mut stop: watch::Receiver<bool>) {
    if !TRIMS || every.is_zero() {
        return;
    }
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // Off the runtime's workers: the walk holds the allocator's locks, not theirs.
        let started = Instant::now();
        match tokio::task::spawn_blocking(trim).await {
            Ok(released) => debug!(released, took = ?started.elapsed(), "heap trimmed"),
            Err(e) => debug!(error = %e, "heap trim did not run"),
        }
    }
}

/// The size from which glibc maps a block apart (and unmaps it when freed): 128 KiB, its own
/// starting value, held there.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Keeps glibc's threshold for mapping a block apart at `MMAP_THRESHOLD`, unless
/// `MALLOC_MMAP_THRESHOLD_` sets it. By default glibc raises the threshold to the size of each
/// mapped block freed, up to 32 MiB, so that after one large block (a list page, an App of
/// 1.2 MiB that a watch delivered and the cache refused) later ones come from the heap, where
/// what is freed among live blocks stayed resident even through `trim`: 32 such Apps left a
/// replica 50 MiB larger in about half of the runs of tests/hostile_sizes.rs, against 4-6 MiB
/// when the threshold is held. Returns whether it was set.
pub fn hold_mmap_threshold() -> bool {
    if !TRIMS || std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
        return false;
    }
    set_mmap_threshold(MMAP_THRESHOLD)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_mmap_threshold(bytes: usize) -> bool {
    let Ok(bytes) = libc::c_int::try_from(bytes) else { return false };
    // SAFETY: mallopt sets one of the allocator's parameters under its own lock.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_mmap_threshold(_bytes: usize) -> bool {
    false
}

/// Whether this build's allocator is one that `trim` trims.
const TRIMS: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

/// Releases the free pages of the heap; true when some were.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim() -> bool {
    // SAFETY: malloc_trim only walks and madvises the allocator's own free chunks; it takes
    // the arenas' locks itself and is safe to call from any thread at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Releases the free pages of the heap; true when some were.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages a burst freed are given back by the trim, not by the frees: a burst of blocks
    /// below the mmap threshold of which every 64th stays live, so that no freed run touches
    /// the top of a heap (which glibc would return on its own), wherever the thread's arena
    /// put them.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_freed_burst_is_given_back() {
        fn rss_kib() -> u64 {
            std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
                .unwrap_or(0)
        }
        // 64 MiB, written so that its pages are resident; 63 MiB of it freed.
        let burst: Vec<Vec<u8>> = (0..2048).map(|i| vec![i as u8 | 1; 32 * 1024]).collect();
        let burst = std::hint::black_box(burst);
        let keep: Vec<Vec<u8>> = burst.into_iter().enumerate().filter(|(i, _)| i % 64 == 63).map(|(_, b)| b).collect();
        let freed = rss_kib();
        assert!(trim(), "the trim released nothing");
        let trimmed = rss_kib();
        assert_eq!(std::hint::black_box(&keep).len(), 32);
        assert!(trimmed + 32 * 1024 < freed, "RSS {freed} KiB once freed, {trimmed} KiB after the trim");
    }
}
