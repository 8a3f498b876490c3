//! The contract's float operations on the GPU (`floats.wgsl`) against the CPU's bits, with
//! mutants that must differ, and the adapter's own float arithmetic probed and printed: whether it
//! fuses `a * b + c`, flushes subnormals, rounds its f64 division, square root and f64 -> f32
//! conversion correctly. Run with `--nocapture` to see the probe table.
//!
//! Without an adapter these tests skip with a note on stderr, except under `CI=true`, where a
//! missing adapter (or one without 64-bit floats) is a failure.

use std::sync::OnceLock;

use daisy_wgsl::{Error, FLOATS_WGSL, FloatLab, f64_words};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn lab() -> Option<&'static FloatLab> {
    static LAB: OnceLock<Option<FloatLab>> = OnceLock::new();
    LAB.get_or_init(|| match FloatLab::open() {
        Ok(lab) => {
            eprintln!("adapter: {}", lab.adapter_name());
            Some(lab)
        }
        Err(e @ (Error::NoAdapter { .. } | Error::MissingFeature { .. })) => {
            assert!(
                !in_ci(),
                "CI=true and no adapter for the float library: {e}"
            );
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("the float library did not come up: {e}"),
    })
    .as_ref()
}

/// The project's seeded stream (`daisy_gemm_int8::splitmix`), with the draws these tests need.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        daisy_gemm_int8::splitmix(&mut self.0)
    }

    /// An f32 of magnitude in [2^lo, 2^hi), random sign and mantissa.
    fn f32_in(&mut self, lo: i32, hi: i32) -> f32 {
        let r = self.next();
        let e = lo + (r % (hi - lo) as u64) as i32;
        let m = 1.0 + ((r >> 20) as u32 & 0x7f_ffff) as f32 / 8_388_608.0;
        let v = m * 2f32.powi(e);
        if r >> 63 == 1 { -v } else { v }
    }
}

/// Where GPU and CPU words differ: (count, first index).
fn diff(got: &[u32], want: &[u32]) -> (usize, Option<usize>) {
    assert_eq!(got.len(), want.len());
    let mut first = None;
    let mut count = 0;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            count += 1;
            first.get_or_insert(i);
        }
    }
    (count, first)
}

fn assert_same(what: &str, inputs: &[f32], got: &[u32], want: &[u32]) {
    let (count, first) = diff(got, want);
    if let Some(i) = first {
        panic!(
            "{what}: {count} of {} lanes differ from the CPU; first at x = {:e} ({:#010x}): \
             gpu {:#010x}, cpu {:#010x}",
            got.len(),
            inputs.get(i).copied().unwrap_or(f32::NAN),
            inputs.get(i).map(|x| x.to_bits()).unwrap_or(0),
            got[i],
            want[i]
        );
    }
}

/// The arguments of the exponential: every 4099th f32 bit pattern (both signs, zeros,
/// subnormals, infinities; NaNs left out, the contract refuses them earlier), the softmax's range
/// [-110, 0] densely (subnormal results from -87.3 down), and SiLU's [-20, 20].
fn exp_inputs() -> Vec<f32> {
    let mut xs: Vec<f32> = (0..=u32::MAX / 4099)
        .map(|i| f32::from_bits(i * 4099))
        .filter(|x| !x.is_nan())
        .collect();
    xs.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        88.72,
        88.73,
        -87.34,
        -103.97,
    ]);
    let mut rng = Rng(7);
    for _ in 0..200_000 {
        let u = (rng.next() >> 40) as f32 / 16_777_216.0;
        xs.push(-110.0 * u);
        xs.push(40.0 * u - 20.0);
    }
    xs
}

/// `exp_f32` on `lab` over [`exp_inputs`]: the arguments, the GPU's words and the CPU's.
fn exp_run(lab: &FloatLab) -> (Vec<f32>, Vec<u32>, Vec<u32>) {
    let xs = exp_inputs();
    let words: Vec<u32> = xs.iter().map(|x| x.to_bits()).collect();
    let got = lab.run("exp_f32", xs.len(), [&words, &[], &[]]).unwrap();
    let want: Vec<u32> = xs.iter().map(|&x| daisy_model::exp(x).to_bits()).collect();
    (xs, got, want)
}

#[test]
fn exp_equals_the_contracts_on_every_lane() {
    let Some(lab) = lab() else { return };
    let (xs, got, want) = exp_run(lab);
    assert_same("exp_f32", &xs, &got, &want);
    eprintln!("exp_f32: {} arguments, all equal to the CPU's", xs.len());
}

/// Operands for f32 `a * b + c`: subnormal products, subnormal addends, cancellation.
fn mul_add_inputs() -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut rng = Rng(11);
    let (mut a, mut b, mut c) = (vec![], vec![], vec![]);
    for i in 0..1 << 18 {
        let (x, y) = match i % 4 {
            // Products far below f32::MIN_POSITIVE: subnormal or zero results.
            0 => (rng.f32_in(-80, -60), rng.f32_in(-80, -60)),
            _ => (rng.f32_in(-20, 20), rng.f32_in(-20, 20)),
        };
        // c cancels most of the product, so a fused multiply-add shows in the low bits.
        let z = match i % 3 {
            0 => -(x * y) * (1.0 + rng.f32_in(-24, -10).abs()),
            1 => rng.f32_in(-140, -126),
            _ => rng.f32_in(-20, 20),
        };
        a.push(x);
        b.push(y);
        c.push(z);
    }
    (a, b, c)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `mul_add_f32` on `lab`: the GPU's words and the CPU's.
fn mul_add_run(lab: &FloatLab) -> (Vec<u32>, Vec<u32>) {
    let (a, b, c) = mul_add_inputs();
    let got = lab
        .run("mul_add_f32", a.len(), [&bits(&a), &bits(&b), &bits(&c)])
        .unwrap();
    let want = (0..a.len())
        .map(|i| (a[i] * b[i] + c[i]).to_bits())
        .collect();
    (got, want)
}

#[test]
fn f32_multiply_add_is_two_roundings_with_subnormals_kept() {
    let Some(lab) = lab() else { return };
    let (a, b, c) = mul_add_inputs();
    let n = a.len();
    let (got, want) = mul_add_run(lab);
    assert_same("mul_add_f32", &a, &got, &want);
    let (wa, wb, wc) = (bits(&a), bits(&b), bits(&c));

    // The same operation as the driver compiles it when written plainly: reported.
    let fused: Vec<u32> = (0..n).map(|i| a[i].mul_add(b[i], c[i]).to_bits()).collect();
    let plain = lab
        .run("probe_mul_add_f32_plain", n, [&wa, &wb, &wc])
        .unwrap();
    let differs = |x: &[u32], y: &[u32]| diff(x, y).0;
    eprintln!(
        "probe f32 a*b+c as written: {} of {n} lanes differ from two roundings, {} from one (fused)",
        differs(&plain, &want),
        differs(&plain, &fused)
    );
    let products: Vec<u32> = (0..n).map(|i| (a[i] * b[i]).to_bits()).collect();
    let hw = lab.run("probe_mul_f32_plain", n, [&wa, &wb, &[]]).unwrap();
    let subnormal = (0..n)
        .filter(|&i| f32::from_bits(products[i]).is_subnormal())
        .count();
    let flushed = (0..n)
        .filter(|&i| f32::from_bits(products[i]).is_subnormal() && hw[i] & 0x7fff_ffff == 0)
        .count();
    eprintln!(
        "probe f32 a*b in the float unit: {} lanes differ; {flushed} of {subnormal} subnormal products flushed to zero",
        differs(&hw, &products)
    );
}

#[test]
fn f64_multiply_add_is_two_roundings() {
    let Some(lab) = lab() else { return };
    let mut rng = Rng(13);
    let n = 1 << 18;
    let (mut a, mut b, mut c) = (vec![], vec![], vec![]);
    for _ in 0..n {
        let x = f64::from(rng.f32_in(-30, 30)) * (1.0 + (rng.next() >> 12) as f64 / 2f64.powi(60));
        let y = f64::from(rng.f32_in(-30, 30)) * (1.0 + (rng.next() >> 12) as f64 / 2f64.powi(60));
        // c cancels the product down to about an f32 ulp of it, so the rounding of a * b decides
        // the low f32 bits of the result.
        let z = -(x * y) * (1.0 + f64::from(rng.f32_in(-30, -20)));
        a.push(x);
        b.push(y);
        c.push(z);
    }
    let (wa, wb, wc) = (f64_words(&a), f64_words(&b), f64_words(&c));
    let want: Vec<u32> = (0..n)
        .map(|i| ((a[i] * b[i] + c[i]) as f32).to_bits())
        .collect();
    let fused: Vec<u32> = (0..n)
        .map(|i| (a[i].mul_add(b[i], c[i]) as f32).to_bits())
        .collect();
    assert!(
        diff(&want, &fused).0 > n / 100,
        "the inputs must tell a fused multiply-add from two roundings"
    );
    let got = lab.run("mul_add_f64_guarded", n, [&wa, &wb, &wc]).unwrap();
    let as_f32: Vec<f32> = a.iter().map(|&x| x as f32).collect();
    assert_same("mul_add_f64_guarded", &as_f32, &got, &want);
    let plain = lab
        .run("probe_mul_add_f64_plain", n, [&wa, &wb, &wc])
        .unwrap();
    eprintln!(
        "probe f64 a*b+c as written: {} of {n} lanes differ from two roundings, {} from one (fused)",
        diff(&plain, &want).0,
        diff(&plain, &fused).0
    );
}

#[test]
fn f64_division_square_root_and_conversion_are_probed() {
    let Some(lab) = lab() else { return };
    let mut rng = Rng(17);
    let n = 1 << 18;
    // Quotients and roots that lie a hair off an f32 rounding boundary (the midpoint of two
    // neighbouring f32): an f64 result off by an ulp lands on the other side.
    let (mut num, mut den, mut sq, mut conv) = (vec![], vec![], vec![], vec![]);
    for i in 0..n {
        let q32 = rng.f32_in(-20, 20);
        let next = f32::from_bits(q32.to_bits() + 1);
        let midpoint = (f64::from(q32) + f64::from(next)) / 2.0;
        let d = f64::from(rng.f32_in(-10, 10));
        num.push(midpoint * d);
        den.push(d);
        let r = f64::from(rng.f32_in(-20, 20)).abs();
        let r32 = r as f32;
        let rmid = (f64::from(r32) + f64::from(f32::from_bits(r32.to_bits() + 1))) / 2.0;
        sq.push(rmid * rmid);
        // Conversions: exact midpoints (ties), a hair either side, and subnormal-range values.
        let step = f64::from(next) - f64::from(q32);
        conv.push(match i % 4 {
            0 => midpoint,
            1 => midpoint + step * 2f64.powi(-28),
            2 => midpoint - step * 2f64.powi(-28),
            _ => f64::from(rng.f32_in(-149, -127)) * 1.000_000_1,
        });
    }
    let quot: Vec<u32> = (0..n)
        .map(|i| ((num[i] / den[i]) as f32).to_bits())
        .collect();
    let roots: Vec<u32> = sq.iter().map(|&s| (s.sqrt() as f32).to_bits()).collect();
    let narrowed: Vec<u32> = conv.iter().map(|&v| (v as f32).to_bits()).collect();
    let got = lab
        .run(
            "probe_div_f64",
            n,
            [&f64_words(&num), &f64_words(&den), &[]],
        )
        .unwrap();
    let roots_got = lab
        .run("probe_sqrt_f64", n, [&f64_words(&sq), &[], &[]])
        .unwrap();
    let hw = lab
        .run("probe_narrow_hw", n, [&f64_words(&conv), &[], &[]])
        .unwrap();
    eprintln!(
        "probe f64 a/b near f32 boundaries: {} of {n} differ from the correctly rounded quotient",
        diff(&got, &quot).0
    );
    eprintln!(
        "probe f64 sqrt near f32 boundaries: {} of {n} differ from the correctly rounded root",
        diff(&roots_got, &roots).0
    );
    eprintln!(
        "probe f64 -> f32 conversion by the driver (ties, near ties, subnormal results): {} of {n} differ",
        diff(&hw, &narrowed).0
    );
}

/// Positive f64 operands with full 53-bit mantissas across `[2^lo, 2^hi)`.
fn f64_operands(rng: &mut Rng, n: usize, lo: i32, hi: i32) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let m = 1.0 + (rng.next() >> 12) as f64 / 2f64.powi(52);
            m * 2f64.powi(lo + (rng.next() % (hi - lo) as u64) as i32)
        })
        .collect()
}

/// The quotients, roots and f32 quotients of the library on `lab` against the CPU's:
/// (lanes that differ in `div_f64`, `sqrt_f64`, `div_f32`, `inv_rms`).
fn division_run(lab: &FloatLab) -> [usize; 4] {
    let mut rng = Rng(19);
    let n = 1 << 16;
    let a = f64_operands(&mut rng, n, -60, 60);
    let mut b = f64_operands(&mut rng, n, -60, 60);
    // Divisors with short mantissas make exact quotients and ties for the f32 rounding.
    for v in b.iter_mut().step_by(3) {
        *v = f64::from((*v as f32).round().max(1.0));
    }
    let words = |v: &[f64]| f64_words(v);
    let as_f64 = |w: &[u32]| -> Vec<u64> {
        w.chunks_exact(2)
            .map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32))
            .collect()
    };
    let quot = as_f64(
        &lab.run_wide("div_f64", n, 2, [&words(&a), &words(&b), &[]])
            .unwrap(),
    );
    let div_f64 = (0..n)
        .filter(|&i| quot[i] != (a[i] / b[i]).to_bits())
        .count();
    let roots = as_f64(
        &lab.run_wide("sqrt_f64", n, 2, [&words(&a), &[], &[]])
            .unwrap(),
    );
    let sqrt_f64 = (0..n)
        .filter(|&i| roots[i] != a[i].sqrt().to_bits())
        .count();

    let (x, y, _) = mul_add_inputs();
    let y: Vec<f32> = y.iter().map(|v| if *v == 0.0 { 1.0 } else { *v }).collect();
    let got = lab
        .run("div_f32", x.len(), [&bits(&x), &bits(&y), &[]])
        .unwrap();
    let div_f32 = (0..x.len())
        .filter(|&i| got[i] != (x[i] / y[i]).to_bits())
        .count();

    // RMSNorm's row scale from mean squares of every size a row has, and the models' epsilons.
    let ms = f64_operands(&mut rng, n, -40, 40);
    let eps: Vec<f32> = (0..n).map(|i| [1e-5, 1e-6, 1e-12][i % 3]).collect();
    let got = lab
        .run("inv_rms", n, [&words(&ms), &bits(&eps), &[]])
        .unwrap();
    let inv_rms = (0..n)
        .filter(|&i| got[i] != ((1.0 / (ms[i] + f64::from(eps[i])).sqrt()) as f32).to_bits())
        .count();
    [div_f64, sqrt_f64, div_f32, inv_rms]
}

#[test]
fn division_and_square_root_are_correctly_rounded() {
    let Some(lab) = lab() else { return };
    assert_eq!(
        division_run(lab),
        [0; 4],
        "div_f64, sqrt_f64, div_f32, inv_rms"
    );
    // A driver whose division and square root are a couple of ulps off is corrected...
    let sloppy = mutant("var q = a / b;", "var q = (a / b) * (1.0lf + pow2(-30));");
    let sloppy = sloppy.replacen(
        "var s = sqrt(x);",
        "var s = sqrt(x) * (1.0lf - pow2(-30));",
        1,
    );
    let lab = FloatLab::with_source(&sloppy).unwrap();
    assert_eq!(division_run(&lab), [0; 4], "corrected from a sloppy guess");
    // ...and without the correction, it shows.
    let uncorrected = sloppy
        .replace("for (var i = 0; i < 4;", "for (var i = 0; i < 0;")
        .replacen("q = q + remainder(a, q, b) / b;", "", 1)
        .replacen("s = s + remainder(x, s, s) / (2.0lf * s);", "", 1);
    let lab = FloatLab::with_source(&uncorrected).unwrap();
    let counts = division_run(&lab);
    eprintln!("mutant 'sloppy guess, no correction': lanes differ {counts:?}");
    assert!(counts.iter().all(|&c| c > 0), "uncorrected: {counts:?}");
}

/// `residual_norm_quantize` on `lab` against the CPU (`daisy_gemm_int8::dequantize`, the f32
/// addition, `daisy_model::rms_norm`, `daisy_gemm_int8::quantize_rows`) for `t` rows of `h`:
/// lanes that differ in (x', q, scales).
fn residual_norm_run(lab: &FloatLab, t: usize, h: usize, seed: u64) -> [usize; 3] {
    let mut rng = Rng(seed);
    let mut x: Vec<f32> = (0..t * h).map(|_| rng.f32_in(-8, 3)).collect();
    let mut acc: Vec<i32> = (0..t * h)
        .map(|_| (rng.next() % (1 << 22)) as i32 - (1 << 21))
        .collect();
    let sa: Vec<f32> = (0..t).map(|_| rng.f32_in(-12, -6).abs()).collect();
    let sb: Vec<f32> = (0..h).map(|_| rng.f32_in(-12, -6).abs()).collect();
    let w: Vec<f32> = (0..h).map(|_| rng.f32_in(-2, 1)).collect();
    let eps = 1e-5f32;
    // Row 1: all zero (quantizes to zeros with scale 0); row 2: tiny values (subnormal products).
    for j in 0..h {
        x[h + j] = 0.0;
        acc[h + j] = 0;
        x[2 * h + j] = rng.f32_in(-140, -120);
        acc[2 * h + j] = 0;
    }
    let c = daisy_gemm_int8::dequantize(&acc, &sa, &sb).unwrap();
    let xs: Vec<f32> = x.iter().zip(&c).map(|(a, b)| a + b).collect();
    let mut y = xs.clone();
    daisy_model::rms_norm(&mut y, h, &w, eps);
    let q = daisy_gemm_int8::quantize_rows(&y, t, h).unwrap();

    let rw = h.div_ceil(64) * 16;
    let a: Vec<u32> = bits(&x)
        .into_iter()
        .chain(acc.iter().map(|&v| v as u32))
        .collect();
    let b: Vec<u32> = [bits(&sa), bits(&sb), bits(&w)].concat();
    let out = lab
        .run_rows(
            "residual_norm_quantize",
            t,
            2 * t * h + t * rw + t,
            &[h as u32, eps.to_bits(), rw as u32],
            [&a, &b, &[]],
        )
        .unwrap();
    let x_diff = diff(&out[..t * h], &bits(&xs)).0;
    let q_diff = count_diff(&unpack(&out[t * h..t * h + t * rw], t, h, rw), q.q());
    let s_diff = diff(&out[t * h + t * rw..t * h + t * rw + t], &bits(q.scales())).0;
    [x_diff, q_diff, s_diff]
}

#[test]
fn residual_norm_and_quantization_equal_the_cpu() {
    let Some(lab) = lab() else { return };
    // SmolLM2's and the 1.39 B model's widths, and one that is not a multiple of 4 or 64.
    for (t, h, seed) in [(40, 576, 23), (9, 1536, 29), (5, 103, 31)] {
        assert_eq!(
            residual_norm_run(lab, t, h, seed),
            [0; 3],
            "t {t}, h {h}: x', q, scales"
        );
    }
    assert_mutants_caught(
        &[
            (
                "dequantization in one multiply",
                "return mul32(mul32(narrow(f64(bitcast<i32>(acc))), sa), sb);",
                "return narrow(f64(bitcast<i32>(acc)) * widen(mul32(sa, sb)));",
            ),
            (
                "RMSNorm's mean as a sum",
                "let ms = div_rn(sum, f64(h));",
                "let ms = sum;",
            ),
            (
                "rounding by truncation",
                "return i32(clamp(round(p), -127.0lf, 127.0lf));",
                "return i32(clamp(trunc(p), -127.0lf, 127.0lf));",
            ),
        ],
        |lab| residual_norm_run(lab, 40, 576, 23),
    );
}

/// `scores_softmax_quantize` on `lab` against the CPU (`daisy_gemm_int8::dequantize`, the scale,
/// `daisy_model::softmax_visible_rows`, `daisy_gemm_int8::quantize_rows`) for `t` query rows over
/// `n` keys with causal runs (a sliding window on every third row, one empty row): lanes that
/// differ in (p, q, scales).
fn softmax_run(lab: &FloatLab, t: usize, n: usize, seed: u64) -> [usize; 3] {
    let mut rng = Rng(seed);
    let acc: Vec<i32> = (0..t * n)
        .map(|_| (rng.next() % (1 << 19)) as i32 - (1 << 18))
        .collect();
    let sa: Vec<f32> = (0..t).map(|_| rng.f32_in(-9, -5).abs()).collect();
    let sb: Vec<f32> = (0..n).map(|_| rng.f32_in(-9, -5).abs()).collect();
    let scale = 96f64.powf(-0.5) as f32;
    let runs: Vec<std::ops::Range<usize>> = (0..t)
        .map(|r| {
            let qpos = n - t + r;
            let lo = if r % 3 == 1 {
                (qpos + 1).saturating_sub(37)
            } else {
                0
            };
            if r == 2 { 0..0 } else { lo..qpos + 1 }
        })
        .collect();
    let mut p = daisy_gemm_int8::dequantize(&acc, &sa, &sb).unwrap();
    for (row, run) in p.chunks_exact_mut(n).zip(&runs) {
        for v in &mut row[run.clone()] {
            *v *= scale;
        }
    }
    daisy_model::softmax_visible_rows(&mut p, n, &runs);
    let q = daisy_gemm_int8::quantize_rows(&p, t, n).unwrap();

    let rw = n.div_ceil(64) * 16;
    let a: Vec<u32> = acc.iter().map(|&v| v as u32).collect();
    let lo = runs.iter().map(|r| r.start as u32);
    let hi = runs.iter().map(|r| r.end as u32);
    let b: Vec<u32> = [bits(&sa), bits(&sb), lo.collect(), hi.collect()].concat();
    let out = lab
        .run_rows(
            "scores_softmax_quantize",
            t,
            t * n + t * rw + t,
            &[n as u32, scale.to_bits(), rw as u32],
            [&a, &b, &[]],
        )
        .unwrap();
    let p_diff = diff(&out[..t * n], &bits(&p)).0;
    let q_diff = count_diff(&unpack(&out[t * n..t * n + t * rw], t, n, rw), q.q());
    let s_diff = diff(&out[t * n + t * rw..], &bits(q.scales())).0;
    [p_diff, q_diff, s_diff]
}

#[test]
fn scores_softmax_and_quantization_equal_the_cpu() {
    let Some(lab) = lab() else { return };
    for (t, n, seed) in [(16, 300, 37), (7, 64, 41), (3, 1100, 43)] {
        assert_eq!(
            softmax_run(lab, t, n, seed),
            [0; 3],
            "t {t}, n {n}: p, q, scales"
        );
    }
    assert_mutants_caught(
        &[
            (
                "the sum in f32",
                "sum = sum + widen(O[row + j]);",
                "sum = widen(narrow(sum + widen(O[row + j])));",
            ),
            (
                "the scale before the dequantization",
                "v = mul32(dequant(A[row + j], sa, B[rows + j]), P.d1);",
                "v = dequant(A[row + j], mul32(sa, P.d1), B[rows + j]);",
            ),
        ],
        |lab| softmax_run(lab, 16, 300, 37),
    );
}

/// `gate_up_silu_quantize` on `lab` against the CPU (`daisy_gemm_int8::dequantize`,
/// `daisy_model::silu_mul`, `daisy_gemm_int8::quantize_rows`) for `t` rows of `i` activations:
/// lanes that differ in (a, q, scales).
fn silu_run(lab: &FloatLab, t: usize, i: usize, seed: u64) -> [usize; 3] {
    let mut rng = Rng(seed);
    let acc: Vec<i32> = (0..t * 2 * i)
        .map(|_| (rng.next() % (1 << 21)) as i32 - (1 << 20))
        .collect();
    let sa: Vec<f32> = (0..t).map(|_| rng.f32_in(-11, -7).abs()).collect();
    let sb: Vec<f32> = (0..2 * i).map(|_| rng.f32_in(-11, -7).abs()).collect();
    let gu = daisy_gemm_int8::dequantize(&acc, &sa, &sb).unwrap();
    let mut act = Vec::with_capacity(t * i);
    for row in gu.chunks_exact(2 * i) {
        let (g, u) = row.split_at(i);
        daisy_model::silu_mul(g, u, &mut act);
    }
    let q = daisy_gemm_int8::quantize_rows(&act, t, i).unwrap();
    let rw = i.div_ceil(64) * 16;
    let a: Vec<u32> = acc.iter().map(|&v| v as u32).collect();
    let b: Vec<u32> = [bits(&sa), bits(&sb)].concat();
    let out = lab
        .run_rows(
            "gate_up_silu_quantize",
            t,
            t * i + t * rw + t,
            &[i as u32, 0, rw as u32],
            [&a, &b, &[]],
        )
        .unwrap();
    let a_diff = diff(&out[..t * i], &bits(&act)).0;
    let q_diff = count_diff(&unpack(&out[t * i..t * i + t * rw], t, i, rw), q.q());
    let s_diff = diff(&out[t * i + t * rw..], &bits(q.scales())).0;
    [a_diff, q_diff, s_diff]
}

#[test]
fn silu_and_quantization_equal_the_cpu() {
    let Some(lab) = lab() else { return };
    // SmolLM2's and the 1.39 B model's FFN widths.
    for (t, i, seed) in [(20, 1536, 47), (3, 8960, 53)] {
        assert_eq!(
            silu_run(lab, t, i, seed),
            [0; 3],
            "t {t}, i {i}: a, q, scales"
        );
    }
    let lab = FloatLab::with_source(&mutant(
        "let a = mul32(div32(g, narrow(1.0lf + widen(e))), u);",
        "let a = mul32(g, mul32(div32(0x3f800000u, narrow(1.0lf + widen(e))), u));",
    ))
    .unwrap();
    let counts = silu_run(&lab, 20, 1536, 47);
    eprintln!("mutant 'SiLU as g * (1 / (1 + e))': lanes differ (a, q, scales) {counts:?}");
    assert!(counts.iter().sum::<usize>() > 0, "the SiLU mutant passed");
}

/// Packed rows (`rw` words each, four int8 a word) back to `rows × k` int8.
fn unpack(words: &[u32], rows: usize, k: usize, rw: usize) -> Vec<i8> {
    (0..rows)
        .flat_map(|r| (0..k).map(move |j| (words[r * rw + j / 4] >> (8 * (j % 4))) as u8 as i8))
        .collect()
}

fn count_diff<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// The attention half's kernels on `lab` against the CPU for `t` tokens at `pos0`, `heads` query
/// heads over `kv` kv heads of `hd`: `qkv_rope_quantize` (against `dequantize`, the bias,
/// `apply_rope`, `quantize_rows` per head row), `values_transposed_quantize` (against Vᵀ quantized
/// per channel) and `attention_out_quantize` (against the values products dequantized, placed by
/// head, and quantized per token). Lanes that differ: [Q's q, Q's scales, K's q, K's scales, V,
/// Vᵀ's q, Vᵀ's scales, out, out's q, out's scales].
fn attention_half_run(
    lab: &FloatLab,
    (t, pos0, heads, kv, hd): (usize, usize, usize, usize, usize),
    bias: bool,
    seed: u64,
) -> [usize; 10] {
    let mut rng = Rng(seed);
    let w = (heads + 2 * kv) * hd;
    let acc: Vec<i32> = (0..t * w)
        .map(|_| (rng.next() % (1 << 21)) as i32 - (1 << 20))
        .collect();
    let sa: Vec<f32> = (0..t).map(|_| rng.f32_in(-11, -7).abs()).collect();
    let sb: Vec<f32> = (0..w).map(|_| rng.f32_in(-11, -7).abs()).collect();
    let b: Vec<f32> = (0..w).map(|_| rng.f32_in(-6, 0)).collect();
    let inv_freq = daisy_model::rope_inv_freq(1_000_000.0, hd);
    let half = hd / 2;
    let (mut cos, mut sin) = (vec![0f32; t * half], vec![0f32; t * half]);
    for r in 0..t {
        let (c, s) = (
            &mut cos[r * half..(r + 1) * half],
            &mut sin[r * half..(r + 1) * half],
        );
        daisy_model::rope_cos_sin(pos0 + r, &inv_freq, c, s);
    }
    // The CPU: dequantize, bias, split, rotate, quantize each head's rows.
    let mut c = daisy_gemm_int8::dequantize(&acc, &sa, &sb).unwrap();
    if bias {
        for row in c.chunks_exact_mut(w) {
            for (v, b) in row.iter_mut().zip(&b) {
                *v += b;
            }
        }
    }
    let (qd, kvd) = (heads * hd, kv * hd);
    let mut q: Vec<f32> = c.chunks_exact(w).flat_map(|r| r[..qd].to_vec()).collect();
    let mut k: Vec<f32> = c
        .chunks_exact(w)
        .flat_map(|r| r[qd..qd + kvd].to_vec())
        .collect();
    let v: Vec<f32> = c
        .chunks_exact(w)
        .flat_map(|r| r[qd + kvd..].to_vec())
        .collect();
    daisy_model::apply_rope(&mut q, qd, hd, pos0, &inv_freq);
    daisy_model::apply_rope(&mut k, kvd, hd, pos0, &inv_freq);
    let by_head = |x: &[f32], n: usize| -> Vec<f32> {
        (0..n)
            .flat_map(|h| {
                x.chunks_exact(n * hd)
                    .flat_map(move |row| row[h * hd..(h + 1) * hd].to_vec())
            })
            .collect()
    };
    let (qh, kh, vh) = (by_head(&q, heads), by_head(&k, kv), by_head(&v, kv));
    let qq = daisy_gemm_int8::quantize_rows(&qh, heads * t, hd).unwrap();
    let kq = daisy_gemm_int8::quantize_rows(&kh, kv * t, hd).unwrap();

    let rw = hd.div_ceil(64) * 16;
    let a: Vec<u32> = acc.iter().map(|&x| x as u32).collect();
    let inputs: Vec<u32> = [bits(&sa), bits(&sb), bits(&b), bits(&cos), bits(&sin)].concat();
    let out_words = (heads + kv) * t * (rw + 1) + kv * t * hd + t * (heads + kv) * hd;
    let out = lab
        .run_rows(
            "qkv_rope_quantize",
            t,
            out_words,
            &[
                heads as u32,
                kv as u32,
                hd as u32,
                u32::from(bias),
                rw as u32,
            ],
            [&a, &inputs, &[]],
        )
        .unwrap();
    let (qw, rest) = out.split_at(heads * t * rw);
    let (qs, rest) = rest.split_at(heads * t);
    let (kw, rest) = rest.split_at(kv * t * rw);
    let (ks, rest) = rest.split_at(kv * t);
    let v_gpu = &rest[..kv * t * hd];
    let mut counts = [
        count_diff(&unpack(qw, heads * t, hd, rw), qq.q()),
        count_diff(qs, &bits(qq.scales())),
        count_diff(&unpack(kw, kv * t, hd, rw), kq.q()),
        count_diff(ks, &bits(kq.scales())),
        count_diff(v_gpu, &bits(&vh)),
        0,
        0,
        0,
        0,
        0,
    ];

    // Vᵀ over the keys present (here the t new ones), from the CPU's V.
    let nk = t;
    let mut vt = vec![0f32; kv * hd * nk];
    for g in 0..kv {
        for j in 0..nk {
            for ch in 0..hd {
                vt[(g * hd + ch) * nk + j] = vh[(g * nk + j) * hd + ch];
            }
        }
    }
    let vq = daisy_gemm_int8::quantize_rows(&vt, kv * hd, nk).unwrap();
    let rwk = nk.div_ceil(64) * 16;
    let out = lab
        .run_rows(
            "values_transposed_quantize",
            kv * hd,
            kv * hd * (rwk + 1 + nk),
            &[nk as u32, hd as u32, rwk as u32],
            [&bits(&vh), &[], &[]],
        )
        .unwrap();
    counts[5] = count_diff(&unpack(&out, kv * hd, nk, rwk), vq.q());
    counts[6] = count_diff(&out[kv * hd * rwk..kv * hd * (rwk + 1)], &bits(vq.scales()));

    // The values products' accumulators ([h][t][c]) with their A and B scales, dequantized and
    // placed by head on the CPU.
    let pv: Vec<i32> = (0..heads * t * hd)
        .map(|_| (rng.next() % (1 << 20)) as i32 - (1 << 19))
        .collect();
    let pa: Vec<f32> = (0..heads * t).map(|_| rng.f32_in(-9, -6).abs()).collect();
    let vb: Vec<f32> = (0..kv * hd).map(|_| rng.f32_in(-9, -6).abs()).collect();
    let group = heads / kv;
    let mut att = vec![0f32; t * qd];
    for h in 0..heads {
        let g = h / group;
        let o = daisy_gemm_int8::dequantize(
            &pv[h * t * hd..(h + 1) * t * hd],
            &pa[h * t..(h + 1) * t],
            &vb[g * hd..(g + 1) * hd],
        )
        .unwrap();
        for (r, row) in o.chunks_exact(hd).enumerate() {
            att[r * qd + h * hd..r * qd + (h + 1) * hd].copy_from_slice(row);
        }
    }
    let aq = daisy_gemm_int8::quantize_rows(&att, t, qd).unwrap();
    let rwo = qd.div_ceil(64) * 16;
    let pvw: Vec<u32> = pv.iter().map(|&x| x as u32).collect();
    let out = lab
        .run_rows(
            "attention_out_quantize",
            t,
            t * (qd + rwo + 1),
            &[heads as u32, kv as u32, hd as u32, rwo as u32],
            [&pvw, &[bits(&pa), bits(&vb)].concat(), &[]],
        )
        .unwrap();
    counts[7] = count_diff(&out[..t * qd], &bits(&att));
    counts[8] = count_diff(&unpack(&out[t * qd..t * (qd + rwo)], t, qd, rwo), aq.q());
    counts[9] = count_diff(&out[t * (qd + rwo)..], &bits(aq.scales()));
    counts
}

#[test]
fn attention_half_kernels_equal_the_cpu() {
    let Some(lab) = lab() else { return };
    // SmolLM2's heads (9 over 3 of 64, no bias), the 1.39 B model's (12 over 2 of 128, q/k/v
    // bias), at the start of a prompt and further on (a cached chunk).
    for (shape, bias, seed) in [
        ((16, 0, 9, 3, 64), false, 59),
        ((16, 597, 12, 2, 128), true, 61),
        ((5, 40, 14, 2, 64), true, 67),
    ] {
        assert_eq!(
            attention_half_run(lab, shape, bias, seed),
            [0; 10],
            "{shape:?}, bias {bias}"
        );
    }
    assert_mutants_caught(
        &[
            (
                "RoPE's rotation with the sign of sin flipped",
                "O[p] = narrow(widen(mul32(x1, c)) - widen(mul32(x2, s)));",
                "O[p] = narrow(widen(mul32(x1, c)) + widen(mul32(x2, s)));",
            ),
            (
                "an extra rounding after the bias",
                "c = narrow(widen(c) + widen(B[rows + w + j]));",
                "c = mul32(narrow(widen(c) + widen(B[rows + w + j])), 0x3f800001u);",
            ),
            (
                "a head's values scaled by another kv head's channels",
                "B[heads * rows + (h / group) * hd + c]",
                "B[heads * rows + (h % kv) * hd + c]",
            ),
            (
                "Vᵀ read by key instead of channel",
                "let v = A[(g * nk + j) * hd + c];",
                "let v = A[(g * nk + c % nk) * hd + j % hd];",
            ),
        ],
        |lab| attention_half_run(lab, (16, 0, 9, 3, 64), true, 59),
    );
}

/// Each mutant `(what, from, to)` of the library must make `run` report a differing lane.
fn assert_mutants_caught<const N: usize>(
    mutants: &[(&str, &str, &str)],
    run: impl Fn(&FloatLab) -> [usize; N],
) {
    for (what, from, to) in mutants {
        let lab = FloatLab::with_source(&mutant(from, to)).unwrap();
        let counts = run(&lab);
        eprintln!("mutant '{what}': lanes differ {counts:?}");
        assert!(counts.iter().sum::<usize>() > 0, "mutant '{what}' passed");
    }
}

/// The library with one change, for the mutation cases.
fn mutant(from: &str, to: &str) -> String {
    assert!(FLOATS_WGSL.contains(from), "mutation site {from:?} is gone");
    FLOATS_WGSL.replacen(from, to, 1)
}

#[test]
fn mutants_of_the_library_are_caught() {
    let Some(_) = lab() else { return };
    // Each mutant changes one step of the contract; the checks above must see each one.
    for (what, from, to) in [
        (
            "exp without its degree-4 term",
            "p = g(p * r) + EXP_C4;\n",
            "",
        ),
        (
            "exp without the low part of ln 2",
            "- g(k * EXP_LN2_LO)",
            "",
        ),
        (
            "subnormals flushed on widening",
            "let v = f64(mag) * pow2(-149);",
            "let v = f64(mag) * 0.0lf;",
        ),
        (
            "subnormal results truncated",
            "let m = round(a * pow2(149));",
            "let m = floor(a * pow2(149));",
        ),
        (
            "k by the shifter, which a compiler may cancel",
            "let k = round(g(x * EXP_LOG2E));",
            "let k = (g(x * EXP_LOG2E) + 6755399441055744.0lf) - 6755399441055744.0lf;",
        ),
    ] {
        let lab = FloatLab::with_source(&mutant(from, to)).unwrap();
        let (_, got, want) = exp_run(&lab);
        let exp_differs = diff(&got, &want).0;
        let (got, want) = mul_add_run(&lab);
        let mul_add_differs = diff(&got, &want).0;
        eprintln!(
            "mutant '{what}': exp_f32 differs on {exp_differs} lanes, mul_add_f32 on {mul_add_differs}"
        );
        assert!(
            exp_differs + mul_add_differs > 0,
            "mutant '{what}' passed both checks"
        );
    }
}
