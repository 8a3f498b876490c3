//! The GPU backend against the scalar reference: gates, a data-driven shape table for both `dot4`
//! variants, the shared probe, mutant kernels that the gates and the audit must catch, the weight
//! cache, and the parameter shard (third live layer refused, streamed equal to all-resident).
//!
//! Without an adapter these tests skip with a note on stderr, except under `CI=true`, where a
//! missing adapter is a failure.

use std::sync::Arc;

use daisy_gemm_int8::{
    Backend, BatchItem, CpuBackend, PackedWeights, Quantized, Rhs, exact_gates, gemm, probe,
    quantize_rows, reference_i32, seeded_matrix,
};
use daisy_wgsl::{
    BackendChoice, DOT4_PACKED_WGSL, Error, GEMM_WGSL, GpuBackend, Kernel, LayerResidency,
    MatrixShape, select,
};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The backend for `kernel`, every product on the GPU (none routed to the CPU kernels for its
/// size), or `None` (skip) when there is no adapter outside CI.
fn open(kernel: Kernel) -> Option<GpuBackend> {
    match GpuBackend::with_kernel(kernel) {
        Ok(mut b) => {
            b.set_cpu_below(0);
            Some(b)
        }
        Err(e @ Error::NoAdapter { .. }) => {
            assert!(!in_ci(), "CI=true and no GPU adapter: {e}");
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("the GPU backend did not come up: {e}"),
    }
}

/// A seeded quantized operand with values across -127..=127.
fn seeded_q(seed: u64, rows: usize, k: usize) -> Quantized {
    quantize_rows(&seeded_matrix(seed, rows, k), rows, k).expect("seeded rows are finite")
}

#[test]
fn gates_pass_and_the_adapter_is_named() {
    for kernel in [Kernel::Auto, Kernel::Packed, Kernel::ShiftExtend] {
        let Some(gpu) = open(kernel.clone()) else {
            return;
        };
        let name = gpu.adapter_name();
        eprintln!(
            "adapter: {name}; kernel {:?} -> {}",
            kernel,
            gpu.kernel_name()
        );
        assert!(!name.is_empty());
        assert!(Backend::name(&gpu).starts_with("wgpu:"));
        exact_gates(&gpu).expect("gates pass on a built backend");
        if kernel == Kernel::Auto && gpu.has_packed_dot() {
            assert_eq!(gpu.kernel_name(), "dot4I8Packed");
        }
    }
}

#[test]
fn both_dot4_variants_equal_the_scalar_reference_on_the_table() {
    // T: both sides of `gemv`'s limit (16) and of `tiled`'s 128-row tile; N likewise.
    let ts = [1, 2, 15, 16, 17, 67, 129];
    let ks = [1, 3, 63, 64, 65, 576, 1536, 4864];
    let ns = [1, 2, 63, 129, 130];
    for kernel in [Kernel::Packed, Kernel::ShiftExtend] {
        let Some(gpu) = open(kernel.clone()) else {
            return;
        };
        for (ki, &k) in ks.iter().enumerate() {
            for (ni, &n) in ns.iter().enumerate() {
                let qb = seeded_q(1000 + (ki * 10 + ni) as u64, n, k);
                let packed = PackedWeights::from_quantized(&qb);
                for (ti, &t) in ts.iter().enumerate() {
                    let qa = seeded_q(2000 + (ki * 100 + ni * 10 + ti) as u64, t, k);
                    let mut expected = vec![0; t * n];
                    reference_i32(&qa, Rhs::Activation(&qb), &mut expected).unwrap();
                    for rhs in [Rhs::Weights(&packed), Rhs::Activation(&qb)] {
                        let mut got = vec![0; t * n];
                        gpu.gemm_i32(&qa, rhs, &mut got).unwrap();
                        assert!(got == expected, "{kernel:?} differs at t={t} k={k} n={n}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_batch_is_one_submission_and_equals_each_product_alone() {
    let Some(gpu) = open(Kernel::Auto) else {
        return;
    };
    // (t, n, k): `gemv` and `tiled` rows, weights and activations, K not a multiple of 64.
    let shapes = [
        (1, 64, 70),
        (16, 33, 129),
        (40, 200, 576),
        (3, 7, 5),
        (129, 130, 65),
    ];
    let qa: Vec<Quantized> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(t, _, k))| seeded_q(500 + i as u64, t, k))
        .collect();
    let qb: Vec<Quantized> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(_, n, k))| seeded_q(600 + i as u64, n, k))
        .collect();
    let packed: Vec<PackedWeights> = qb.iter().map(PackedWeights::from_quantized).collect();
    let rhs: Vec<Rhs<'_>> = (0..shapes.len())
        .map(|i| match i % 2 {
            0 => Rhs::Weights(&packed[i]),
            _ => Rhs::Activation(&qb[i]),
        })
        .collect();
    let mut outs: Vec<Vec<i32>> = shapes.iter().map(|&(t, n, _)| vec![0; t * n]).collect();
    // Upload the weights first, so that the batch below is the only submission counted.
    for r in &rhs {
        if let Rhs::Weights(w) = r {
            gpu.weights_for(w).unwrap();
        }
    }
    gpu.reset_profile();
    let mut items: Vec<BatchItem<'_>> = qa
        .iter()
        .zip(&rhs)
        .zip(&mut outs)
        .map(|((a, b), out)| BatchItem { a, b: *b, out })
        .collect();
    gpu.gemm_i32_batch(&mut items).unwrap();
    let profile = gpu.profile();
    assert_eq!(profile.submissions, 1, "{profile}");
    assert_eq!(profile.dispatches(), shapes.len() as u64, "{profile}");
    for (i, out) in outs.iter().enumerate() {
        let mut expected = vec![0; out.len()];
        reference_i32(&qa[i], Rhs::Activation(&qb[i]), &mut expected).unwrap();
        assert!(*out == expected, "batch item {i} {:?} differs", shapes[i]);
    }
}

#[test]
fn extremes_at_the_largest_k_and_the_refusal_above_it() {
    let Some(gpu) = open(Kernel::Auto) else {
        return;
    };
    let k = daisy_wgsl::MAX_K;
    let a: Vec<i8> = (0..2 * k).map(|i| if i < k { 127 } else { -127 }).collect();
    let b: Vec<i8> = (0..3 * k)
        .map(|i| if i % 2 == 0 { 127 } else { -127 })
        .collect();
    let got = gpu.gemm_i8(&a, 2, &b, 3, k).unwrap();
    let expected = daisy_wgsl_reference(&a, 2, &b, 3, k);
    assert_eq!(got, expected);
    assert_eq!(
        got[0],
        127 * 127 * (k as i32 + 1) / 2 - 127 * 127 * (k as i32 - 1) / 2
    );

    let k = k + 1;
    let err = gpu.gemm_i8(&vec![1; k], 1, &vec![1; k], 1, k).unwrap_err();
    assert!(matches!(err, Error::KTooLarge { k: 131_072, .. }), "{err}");
}

fn daisy_wgsl_reference(a: &[i8], t: usize, b: &[i8], n: usize, k: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(t * n);
    for row in a.chunks_exact(k).take(t) {
        for col in b.chunks_exact(k).take(n) {
            out.push(daisy_gemm_int8::reference_cell(row, col));
        }
    }
    out
}

#[test]
fn probe_equals_the_cpu_probe() {
    let Some(gpu) = open(Kernel::Auto) else {
        return;
    };
    let cpu = CpuBackend::new();
    for seed in [1, 0xDA15_7C4A] {
        assert_eq!(probe(&gpu, seed).unwrap(), probe(&cpu, seed).unwrap());
    }
}

fn mutant(replacements: &[(&str, &str)]) -> Kernel {
    let mut source = format!("{GEMM_WGSL}\n{DOT4_PACKED_WGSL}");
    for (from, to) in replacements {
        assert!(
            source.contains(from),
            "the kernel no longer contains {from:?}"
        );
        source = source.replace(from, to);
    }
    Kernel::Wgsl(source)
}

/// `tiled` skips its last K stage (64 int8): wrong whenever a row has values there.
fn tiled_skips_last_stage() -> Kernel {
    mutant(&[(
        "let ntiles = dims.k16 / KV;",
        "let ntiles = (dims.k16 - 1u) / KV;",
    )])
}

/// `gemv` skips the last 64 int8 of each row (the padded row's last K stage, which always holds
/// at least one value).
fn gemv_skips_last_stage() -> Kernel {
    mutant(&[("let kend = dims.k16;", "let kend = dims.k16 - KV;")])
}

/// `tiled`'s split-K slices overwrite the output instead of adding into it: wrong wherever K is
/// split (few output tiles, long K).
fn split_k_overwrites() -> Kernel {
    mutant(&[("let add = slices > 1u;", "let add = false;")])
}

/// Accumulates in f32 in both entry points: exact until a partial sum passes 2²⁴, wrong at ±127
/// with large K.
fn f32_accumulator() -> Kernel {
    let mut swaps: Vec<(String, String)> = Vec::new();
    for c in 0..16 {
        swaps.push((
            format!("var c{c}: vec4<i32> = vec4<i32>(0);"),
            format!("var c{c}: vec4<f32> = vec4<f32>(0.0);"),
        ));
    }
    swaps.push(("+= dot4x4(".into(), "+= vec4<f32>(dot4x4(".into()));
    swaps.push((", b0);".into(), ", b0));".into()));
    swaps.push((", b1);".into(), ", b1));".into()));
    swaps.push((
        "fn store_row(row: u32, col: u32, lo: vec4<i32>, hi: vec4<i32>, add: bool) {".into(),
        "fn store_row(row: u32, col: u32, lo: vec4<f32>, hi: vec4<f32>, add: bool) {".into(),
    ));
    swaps.push((", lo[j], add);".into(), ", i32(lo[j]), add);".into()));
    swaps.push((", hi[j], add);".into(), ", i32(hi[j]), add);".into()));
    for s in 0..4 {
        swaps.push((
            format!("var s{s} = vec4<i32>(0);"),
            format!("var s{s} = vec4<f32>(0.0);"),
        ));
    }
    swaps.push(("+= dot16(".into(), "+= f32(dot16(".into()));
    swaps.push(("w0); }".into(), "w0)); }".into()));
    swaps.push(("w1); }".into(), "w1)); }".into()));
    swaps.push(("a0 + q], w0);".into(), "a0 + q], w0));".into()));
    swaps.push(("a0 + q1], w1);".into(), "a0 + q1], w1));".into()));
    for r in 0..16 {
        let v = format!("s{}.{}", r / 4, ["x", "y", "z", "w"][r % 4]);
        swaps.push((
            format!("partial[{r}u * 256u + li] = {v};"),
            format!("partial[{r}u * 256u + li] = i32({v});"),
        ));
    }
    let pairs: Vec<(&str, &str)> = swaps
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    mutant(&pairs)
}

fn is_gate_failure(e: &Error) -> bool {
    matches!(
        e,
        Error::GateFailed { .. } | Error::Gemm(daisy_gemm_int8::Error::GateMismatch { .. })
    )
}

#[test]
fn mutant_kernels_fail_the_gates() {
    // The real kernel must come up, or the mutants failing proves nothing.
    let Some(_gpu) = open(Kernel::Packed) else {
        return;
    };
    for (name, kernel) in [
        ("tiled skips its last K stage", tiled_skips_last_stage()),
        ("gemv skips its last K stage", gemv_skips_last_stage()),
        ("split K overwrites", split_k_overwrites()),
        ("f32 accumulator", f32_accumulator()),
    ] {
        match GpuBackend::with_kernel(kernel) {
            Ok(_) => panic!("the {name} mutant passed the gates"),
            Err(e) => assert!(
                is_gate_failure(&e),
                "the {name} mutant failed otherwise: {e}"
            ),
        }
    }
}

#[test]
fn mutant_kernels_injected_after_the_gates_fail_the_audit() {
    let Some(_gpu) = open(Kernel::Packed) else {
        return;
    };
    // Live-sized GEMMs (K = 1541 is not a multiple of any K tile) for the stage mutants, at T past
    // and within `gemv`'s limit; ±1 everywhere at K = 131071 for the f32 mutant, whose error needs
    // sums past 2²⁴.
    let cases = [
        (
            "tiled skips its last K stage",
            tiled_skips_last_stage(),
            17,
            1541,
            67,
            false,
        ),
        (
            "gemv skips its last K stage",
            gemv_skips_last_stage(),
            1,
            1541,
            67,
            false,
        ),
        (
            "split K overwrites",
            split_k_overwrites(),
            17,
            1541,
            67,
            false,
        ),
        (
            "f32 accumulator",
            f32_accumulator(),
            2,
            daisy_wgsl::MAX_K,
            3,
            true,
        ),
    ];
    for (name, kernel, t, k, n, ones) in cases {
        let mut gpu = GpuBackend::ungated(kernel).unwrap();
        gpu.set_cpu_below(0);
        let (a, b) = if ones {
            (vec![1.0f32; t * k], vec![1.0f32; n * k])
        } else {
            (seeded_matrix(31, t, k), seeded_matrix(32, n, k))
        };
        let w = PackedWeights::new(&b, n, k).unwrap();
        let err = gemm(&gpu, &a, t, &w).expect_err(name);
        assert!(
            matches!(err, daisy_gemm_int8::Error::AuditMismatch { .. }),
            "the {name} mutant failed otherwise: {err}"
        );
    }
}

#[test]
fn weights_are_uploaded_once_per_handle() {
    let Some(gpu) = open(Kernel::Auto) else {
        return;
    };
    assert_eq!(gpu.cached_bytes(), 0);
    let (t, k, n) = (3, 100, 9);
    let w = PackedWeights::new(&seeded_matrix(5, n, k), n, k).unwrap();
    let a = seeded_matrix(6, t, k);
    let first = gemm(&gpu, &a, t, &w).unwrap();
    let bytes = gpu.cached_bytes();
    // Rows padded to 64 bytes.
    assert_eq!(bytes, (n * k.div_ceil(64) * 64) as u64);
    let second = gemm(&gpu, &a, t, &w).unwrap();
    assert_eq!(gpu.cached_bytes(), bytes);
    assert_eq!(
        first.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        second.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let cpu = gemm(&CpuBackend::new(), &a, t, &w).unwrap();
    assert_eq!(
        first.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        cpu.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    gpu.evict(w.id());
    assert_eq!(gpu.cached_bytes(), 0);
}

/// A stage of `layers` toy layers, each two matrices: up (h -> f) and down (f -> h).
fn toy_stage(layers: usize, h: usize, f: usize) -> (Vec<Vec<i8>>, Vec<Vec<MatrixShape>>) {
    let mut mats = Vec::new();
    let mut shapes = Vec::new();
    for l in 0..layers {
        let up = seeded_q(700 + 2 * l as u64, f, h);
        let down = seeded_q(701 + 2 * l as u64, h, f);
        mats.push(up.q().to_vec());
        mats.push(down.q().to_vec());
        shapes.push(vec![MatrixShape { n: f, k: h }, MatrixShape { n: h, k: f }]);
    }
    (mats, shapes)
}

/// Requantizes accumulators to int8 by an arithmetic shift and clamp (deterministic, integer only).
fn requant(acc: &[i32], shift: u32) -> Vec<i8> {
    acc.iter()
        .map(|&v| (v >> shift).clamp(-127, 127) as i8)
        .collect()
}

/// Runs x through every layer; `weights(l)` gives layer l's (up, down) device weights.
fn forward(
    gpu: &GpuBackend,
    x: &[i8],
    t: usize,
    layers: usize,
    mut weights: impl FnMut(usize) -> Result<Vec<Arc<daisy_wgsl::GpuWeights>>, Error>,
    mut after: impl FnMut(usize),
) -> Result<Vec<Vec<i32>>, Error> {
    let mut x = x.to_vec();
    let mut trace = Vec::new();
    for l in 0..layers {
        let w = weights(l)?;
        let up = gpu.gemm_i8_resident(&x, t, &w[0])?;
        let mid = requant(&up, 10);
        let down = gpu.gemm_i8_resident(&mid, t, &w[1])?;
        x = requant(&down, 10);
        trace.push(up);
        trace.push(down);
        after(l);
    }
    Ok(trace)
}

#[test]
fn a_third_live_layer_is_refused() {
    let Some(gpu) = open(Kernel::Auto) else {
        return;
    };
    let gpu = Arc::new(gpu);
    let (mats, shapes) = toy_stage(4, 32, 48);
    let flat: Vec<i8> = mats.concat();
    let mut shard = LayerResidency::new(Arc::clone(&gpu), flat, &shapes).unwrap();
    assert_eq!(shard.layers(), 4);
    shard.begin(0).unwrap();
    assert_eq!(shard.live_layers(), vec![0, 1]);
    let err = shard.acquire(2).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ThirdLiveLayer {
                requested: 2,
                live: [0, 1]
            }
        ),
        "{err}"
    );
    assert_eq!(shard.live_layers(), vec![0, 1]);
    shard.end(0);
    assert_eq!(shard.live_layers(), vec![1]);
    shard.begin(1).unwrap();
    assert_eq!(shard.live_layers(), vec![1, 2]);
    let err = shard.begin(3).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ThirdLiveLayer {
                requested: 3,
                live: [1, 2]
            }
        ),
        "{err}"
    );
    assert!(matches!(
        shard.acquire(4).unwrap_err(),
        Error::LayerOutOfRange {
            layer: 4,
            layers: 4
        }
    ));
}

#[test]
fn a_single_layer_stage_stays_resident() {
    let Some(gpu) = open(Kernel::Auto) else {
        return;
    };
    let (mats, shapes) = toy_stage(1, 16, 24);
    let mut shard = LayerResidency::new(Arc::new(gpu), mats.concat(), &shapes).unwrap();
    shard.begin(0).unwrap();
    shard.end(0);
    assert_eq!(shard.live_layers(), vec![0]);
}

#[test]
fn the_streamed_run_equals_the_all_resident_run() {
    let Some(gpu) = open(Kernel::Auto) else {
        return;
    };
    let gpu = Arc::new(gpu);
    let (layers, h, f, t) = (5, 64, 96, 7);
    let (mats, shapes) = toy_stage(layers, h, f);
    let x = seeded_q(9, t, h).q().to_vec();

    let resident: Vec<Arc<daisy_wgsl::GpuWeights>> = mats
        .iter()
        .zip(shapes.iter().flatten())
        .map(|(m, s)| Arc::new(gpu.upload(m, s.n, s.k).unwrap()))
        .collect();
    let all_resident = forward(
        &gpu,
        &x,
        t,
        layers,
        |l| Ok(resident[2 * l..2 * l + 2].to_vec()),
        |_| {},
    )
    .unwrap();

    let shard = std::cell::RefCell::new(
        LayerResidency::new(Arc::clone(&gpu), mats.concat(), &shapes).unwrap(),
    );
    let mut peak = 0;
    let streamed = forward(
        &gpu,
        &x,
        t,
        layers,
        |l| {
            let mut s = shard.borrow_mut();
            let w = s.begin(l)?.to_vec();
            peak = peak.max(s.live_layers().len());
            Ok(w)
        },
        |l| shard.borrow_mut().end(l),
    )
    .unwrap();
    assert_eq!(peak, 2);
    assert!(
        streamed == all_resident,
        "the streamed run differs from the all-resident run"
    );

    // Mutation: an off-by-one stream that hands out the prefetched next layer must differ.
    let shard = std::cell::RefCell::new(
        LayerResidency::new(Arc::clone(&gpu), mats.concat(), &shapes).unwrap(),
    );
    let stale = forward(
        &gpu,
        &x,
        t,
        layers,
        |l| {
            let mut s = shard.borrow_mut();
            let own = s.begin(l)?.to_vec();
            Ok(s.weights(l + 1).map_or(own, <[_]>::to_vec))
        },
        |l| shard.borrow_mut().end(l),
    )
    .unwrap();
    assert!(
        stale != all_resident,
        "a stale-layer stream was not told apart"
    );
}

#[test]
fn backend_choices_parse_and_select() {
    assert_eq!("gpu".parse::<BackendChoice>().unwrap(), BackendChoice::Gpu);
    let err = "cuda".parse::<BackendChoice>().unwrap_err();
    assert!(matches!(err, Error::UnknownBackend { .. }), "{err}");

    let cpu = select(BackendChoice::Cpu).unwrap();
    assert!(cpu.backend.name().starts_with("cpu"), "{}", cpu.reason);
    assert_eq!(cpu.adapter, None);

    if open(Kernel::Auto).is_none() {
        return;
    }
    let gpu = select(BackendChoice::Gpu).unwrap();
    assert!(gpu.backend.name().starts_with("wgpu:"));
    assert!(gpu.adapter.is_some());
    let auto = select(BackendChoice::Auto).unwrap();
    eprintln!("{}", auto.reason);
    assert!(auto.reason.starts_with("auto: chose "), "{}", auto.reason);
}

/// Set in the child process that [`gpu_never_falls_back`] starts with no usable adapter.
const NO_ADAPTER_CHILD: &str = "DAISY_WGSL_NO_ADAPTER_CHILD";

#[test]
fn gpu_never_falls_back() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "no_adapter_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(NO_ADAPTER_CHILD, "1")
        .env("WGPU_BACKEND", "gl") // not compiled in: no adapter at all
        .env_remove("WGPU_ADAPTER_NAME")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed: {stderr}");
    assert!(
        stderr.contains("child checked"),
        "the child did not run: {stderr}"
    );
}

/// Runs only inside [`gpu_never_falls_back`]'s child, where no adapter exists.
#[test]
fn no_adapter_child() {
    if std::env::var(NO_ADAPTER_CHILD).is_err() {
        return;
    }
    let err = select(BackendChoice::Gpu).unwrap_err();
    assert!(matches!(err, Error::NoAdapter { .. }), "{err}");
    let auto = select(BackendChoice::Auto).unwrap();
    assert!(auto.backend.name().starts_with("cpu"), "{}", auto.reason);
    assert!(auto.reason.contains("gpu is unusable"), "{}", auto.reason);
    eprintln!("child checked: {}", auto.reason);
}

#[test]
fn keeping_the_card_busy_runs_for_its_budget_and_leaves_products_exact() {
    let Some(gpu) = open(Kernel::Auto) else {
        return;
    };
    let budget = std::time::Duration::from_millis(60);
    let (took, submissions) = gpu.keep_busy(128, 256, 512, budget).unwrap();
    eprintln!("kept busy {took:?} over {submissions} submissions");
    assert!(took >= budget, "stopped after {took:?}, before {budget:?}");
    assert!(submissions >= 2, "one submission is not a sustained load");
    // A K past the kernel's limit is refused by name, not run.
    let too_deep = gpu.keep_busy(1, daisy_wgsl::MAX_K + 64, 1, budget);
    assert!(
        matches!(too_deep, Err(Error::KTooLarge { .. })),
        "{too_deep:?}"
    );
    // The backend's own products are untouched by it.
    let (t, n, k) = (20, 70, 300);
    let (qa, qb) = (seeded_q(41, t, k), seeded_q(42, n, k));
    let mut expected = vec![0; t * n];
    reference_i32(&qa, Rhs::Activation(&qb), &mut expected).unwrap();
    let mut got = vec![0; t * n];
    gpu.gemm_i32(&qa, Rhs::Activation(&qb), &mut got).unwrap();
    assert!(got == expected, "a product after the busy loop differs");
    // On a software adapter the warm-up does nothing (there is no clock to raise).
    if gpu.adapter_name().contains("llvmpipe") {
        assert_eq!(gpu.warm_up(budget).unwrap(), std::time::Duration::ZERO);
    }
}
