//! Decode's allocations per token, counted by this test binary's global allocator, stay under a
//! bound: the token loop of a serious inference engine should not lean on the allocator, and this
//! keeps what was removed from coming back unnoticed (every thread's allocations count, the GEMM
//! pool's workers included).
//!
//! The tiny Llama fixture (3 layers, 4 query heads over 2 key-value heads) runs one stage with every
//! layer and the head's tensors, int8 on the CPU, greedy on the cached path, as `node run` does; the
//! difference between a long and a short turn divided by their difference in tokens is what one
//! decode token costs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use daisy_gemm_int8::{CpuBackend, Isa};
use daisy_loader::Checkpoint;
use daisy_model::{ForwardPath, GenerateOptions, Pass, Precision, Sampling, Stage, generate};

/// Counts every allocation and reallocation, then hands it to the system allocator.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations of one greedy turn of `new_tokens` after a fixed prompt.
fn turn_allocations(stage: &Stage, new_tokens: usize) -> usize {
    let prompt: Vec<u32> = (0..12).map(|i| 7 + 13 * i).collect();
    let opts = GenerateOptions {
        max_new_tokens: new_tokens,
        eos_token_ids: Vec::new(),
        ignore_eos: true,
        sampling: Sampling {
            temperature: 0.0,
            seed: 0,
            top_p: 1.0,
        },
        path: ForwardPath::Cached,
        lookahead: 0,
    };
    let mut cache = stage.new_cache();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let out = generate(stage, &prompt, &opts, &mut |pass: Pass| {
        let mut x = pass.hidden;
        stage.forward(&mut x, pass.rows, pass.pos0, Some(&mut cache))?;
        Ok::<_, daisy_model::Error>(x)
    })
    .expect("the turn runs");
    let counted = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(out.ids.len(), new_tokens);
    counted
}

#[test]
fn a_decode_token_allocates_under_its_bound() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tiny/llama");
    let ckpt = Checkpoint::open(dir).expect("the tiny Llama fixture");
    let cfg = ckpt.config().clone();
    let stage = Stage::load(&ckpt, &cfg, 0..cfg.num_layers, true, Precision::Int8)
        .expect("the whole model as one stage");
    // Warm: the GEMM pool's threads, the allocator's arenas.
    turn_allocations(&stage, 4);
    let (short, long) = (8, 72);
    let per_token =
        (turn_allocations(&stage, long) - turn_allocations(&stage, short)) / (long - short);
    let per_layer = per_token / cfg.num_layers;
    let isa = CpuBackend::new().isa();
    // AVX-512's kernels take A as u8 (+128), made per weight product: four a layer more and the
    // lm_head's one a token, with room (not measured on such a CPU when the bound was set).
    let bound = match isa {
        Isa::Avx512Vnni | Isa::Amx => MAX_PER_LAYER + 6,
        _ => MAX_PER_LAYER,
    };
    eprintln!(
        "{per_token} allocations a decode token ({per_layer} a layer, {} layers, {})",
        cfg.num_layers,
        isa.name()
    );
    assert!(
        per_layer <= bound,
        "a decode token allocates {per_token} times, {per_layer} a layer (bound {bound})"
    );
}

/// The bound on AVX2 and the scalar kernels: 12 measured when it was set (148 before the audit's
/// cells were held inline, the read-ahead list kept, quantized operands' memory reused and
/// attention's per-head lists held inline; 33 before the products' outputs were reused), with a
/// little room; any of those undone exceeds it.
const MAX_PER_LAYER: usize = 15;
