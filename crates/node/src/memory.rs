//! The allocator's policy, one for loading and one for computing (glibc; elsewhere the allocator's
//! own).
//!
//! Loading streams weights through buffers of several MiB that threads fill and free in turn: each
//! buffer of 1 MiB or more gets its own mapping, given back when it is dropped, so the peak is what
//! is live (glibc would otherwise raise its threshold after the first freed block, and arenas that
//! several threads filled are seldom returned: a member's peak varied from 50 to 120 MB for the
//! same work). Computing is the opposite: a prefill allocates and frees the same few MiB-sized
//! activations, scores and accumulators in every layer, and a fresh mapping each time costs a page
//! fault per 4 KiB — a third of a prefill's time on SmolLM2. So while no load runs, freed blocks
//! stay in the heap for the next layer (up to [`KEPT_FREE`] at its top), and when a load ends
//! what it freed is handed back first. A stage that streams its layers (`--max-resident-layers`)
//! loads while it computes, so for it the loading policy stays: see [`streaming`].

use std::sync::Mutex;

/// Loads in progress (a head may load a new plan's stage while a turn computes elsewhere), and
/// whether a stage of this process streams its layers.
static LOADS: Mutex<(usize, bool)> = Mutex::new((0, false));

/// Blocks from this size get their own mapping while loading.
const LOADING_MMAP_THRESHOLD: i32 = 1 << 20;

/// Free bytes at the top of a heap kept while loading (glibc's default).
const LOADING_TRIM_THRESHOLD: i32 = 128 << 10;

/// Blocks up to this size come from the heap while computing (larger ones are mapped).
const COMPUTING_MMAP_THRESHOLD: i32 = 256 << 20;

/// Free bytes at the top of a heap kept while computing rather than returned.
const KEPT_FREE: i32 = 64 << 20;

/// The policy from the start: loading's, for opening and checking a model comes first;
/// [`loading`] switches to computing when its load ends.
pub(crate) fn init() {
    set_loading();
}

/// Run `load` under the loading policy, then hand back what it freed and compute.
pub(crate) fn loading<T>(load: impl FnOnce() -> T) -> T {
    {
        let mut loads = LOADS.lock().unwrap_or_else(|e| e.into_inner());
        if loads.0 == 0 {
            set_loading();
        }
        loads.0 += 1;
    }
    let out = load();
    let mut loads = LOADS.lock().unwrap_or_else(|e| e.into_inner());
    loads.0 -= 1;
    if loads.0 == 0 && !loads.1 {
        set_computing();
    }
    out
}

/// A stage of this process streams its layers from its shard while it computes: keep the loading
/// policy from now on, so that each layer read is given back when it is dropped and the peak stays
/// below the layers' size.
pub(crate) fn streaming() {
    let mut loads = LOADS.lock().unwrap_or_else(|e| e.into_inner());
    loads.1 = true;
    set_loading();
}

fn set_loading() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` sets allocator parameters under the main arena's lock; other threads read
    // the threshold as one aligned word, the old value or the new.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, LOADING_MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, LOADING_TRIM_THRESHOLD);
    }
}

fn set_computing() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: as in `set_loading`; `malloc_trim` locks each arena it trims.
    unsafe {
        libc::malloc_trim(0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEPT_FREE);
        libc::mallopt(libc::M_MMAP_THRESHOLD, COMPUTING_MMAP_THRESHOLD);
    }
}

/// What follows a node's tag in the line it prints as it exits: `join: peak RSS 57823232 bytes`.
const PEAK_RSS: &str = ": peak RSS ";

/// Print this process's own peak resident memory (`VmHWM`) under `tag`, as it exits, for the
/// user and for `node demo` ([`reported_peak`]). The figure the system gives a parent for a
/// reaped child (`wait4`) would not do: it is the largest of the child's and of every process the
/// child ran and waited for — with `--backend auto`, the adapter probe that loads Mesa's driver
/// (about 70 MB) so that the node does not.
pub(crate) fn print_peak(tag: &str) {
    if let Some(peak) = daisy_engine::peak_rss_bytes() {
        eprintln!("{tag}{PEAK_RSS}{peak} bytes");
    }
}

/// `", peak RSS so far 57.8 MB"` for the end of a line that says a load is done (the peak during
/// loading, apart from the one at exit); empty where the system does not say.
pub(crate) fn peak_so_far() -> String {
    daisy_engine::peak_rss_bytes()
        .map(|b| format!(", peak RSS so far {:.1} MB", b as f64 / 1e6))
        .unwrap_or_default()
}

/// The peak in a line [`print_peak`] wrote under `tag`, in bytes.
pub(crate) fn reported_peak(tag: &str, line: &str) -> Option<u64> {
    line.trim_end()
        .strip_prefix(tag)?
        .strip_prefix(PEAK_RSS)?
        .strip_suffix(" bytes")?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peak_is_read_back_from_its_own_tag_only() {
        assert_eq!(
            reported_peak("join", "join: peak RSS 57823232 bytes\n"),
            Some(57_823_232)
        );
        assert_eq!(reported_peak("head", "join: peak RSS 57823232 bytes"), None);
        assert_eq!(
            reported_peak("demo", "demo: peak RSS head 246.3 MB, stage-1 69.1 MB"),
            None
        );
        assert_eq!(reported_peak("join", "join: peak RSS 12 MB"), None);
    }
}
