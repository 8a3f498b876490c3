//! The contract's float operations on the GPU (`floats.wgsl`) against the CPU's bits, with
//! mutants that must differ, and the adapter's own float arithmetic probed and printed: whether it
//! fuses `a * b + c`, flushes subnormals, rounds its f64 division, square root and f64 -> f32
//! conversion correctly. Run with `--nocapture` to see the probe table.
//!
//! Without an adapter these tests skip with a note on stderr, except under `CI=true`, where a
//! missing adapter (or one without 64-bit floats) is a failure.

use std::sync::OnceLock;

use daisy_wgsl::{Error, FLOATS_WGSL, FloatLab, f64_words, quantization_lanes};

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

/// Values of rows quantized against their row's max: (v, the row's 127 / max as the contract
/// computes it, the CPU's int8 of v from `daisy_gemm_int8::quantize_rows` of the row [max, v]).
/// Most are ties, v * inv exactly k + 0.5 in f32 for every k in -127..=126 (a driver's own
/// rounding to an integer may take those the wrong way); the rest are random values of the row.
fn quantize_inputs() -> (Vec<f32>, Vec<u32>, Vec<u32>) {
    let mut rng = Rng(19);
    let maxes: Vec<f32> = (0..64).map(|_| rng.f32_in(-20, 20).abs()).collect();
    quantization_lanes(&maxes, 256, &mut || {
        (rng.next() >> 40) as f32 / 16_777_216.0
    })
}

/// `quantize_f32` on `lab` over [`quantize_inputs`]: the values, the GPU's words and the CPU's.
fn quantize_run(lab: &FloatLab) -> (Vec<f32>, Vec<u32>, Vec<u32>) {
    let (vs, invs, want) = quantize_inputs();
    let words: Vec<u32> = vs.iter().map(|v| v.to_bits()).collect();
    let got = lab
        .run("quantize_f32", vs.len(), [&words, &invs, &[]])
        .unwrap();
    (vs, got, want)
}

#[test]
fn quantization_rounds_ties_to_even_as_the_cpu() {
    let Some(lab) = lab() else { return };
    let (vs, got, want) = quantize_run(lab);
    // The inputs must tell ties to even from ties toward zero (what lavapipe's own f64 `round`
    // does on a host without AVX-512) and from ties away from zero.
    let invs = quantize_inputs().1;
    let other = |away: bool| -> Vec<u32> {
        vs.iter()
            .zip(&invs)
            .map(|(v, inv)| {
                let p = v * f32::from_bits(*inv);
                let r = if p.fract().abs() == 0.5 {
                    if away { p.round() } else { p.trunc() }
                } else {
                    p.round()
                };
                r.clamp(-127.0, 127.0) as i32 as u32
            })
            .collect()
    };
    for away in [false, true] {
        assert!(
            diff(&other(away), &want).0 > vs.len() / 8,
            "the inputs must hold ties of both parities"
        );
    }
    assert_same("quantize_f32", &vs, &got, &want);
    eprintln!("quantize_f32: {} values, all equal to the CPU's", vs.len());
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

/// Lanes where `got` differs from `want` (f64 bits); the first few shown with their operands.
fn differing(what: &str, got: &[u64], want: &[u64], operands: impl Fn(usize) -> String) -> usize {
    let lanes: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
    for &i in lanes.iter().take(4) {
        eprintln!(
            "{what}: {} = {:e}, got {:e} ({:+} ulps)",
            operands(i),
            f64::from_bits(want[i]),
            f64::from_bits(got[i]),
            got[i] as i64 - want[i] as i64
        );
    }
    lanes.len()
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
    let want: Vec<u64> = (0..n).map(|i| (a[i] / b[i]).to_bits()).collect();
    let div_f64 = differing("div_f64", &quot, &want, |i| {
        format!("{:e} / {:e}", a[i], b[i])
    });
    let roots = as_f64(
        &lab.run_wide("sqrt_f64", n, 2, [&words(&a), &[], &[]])
            .unwrap(),
    );
    let want: Vec<u64> = a.iter().map(|v| v.sqrt().to_bits()).collect();
    let sqrt_f64 = differing("sqrt_f64", &roots, &want, |i| format!("sqrt({:e})", a[i]));

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
            "let m = round_even(a * pow2(149));",
            "let m = floor(a * pow2(149));",
        ),
        (
            "the shifter's sum unguarded, which a compiler may cancel",
            "return g(v + ROUND_SHIFTER) - ROUND_SHIFTER;",
            "return (v + ROUND_SHIFTER) - ROUND_SHIFTER;",
        ),
        (
            "ties rounded up",
            "return g(v + ROUND_SHIFTER) - ROUND_SHIFTER;",
            "return floor(v + 0.5lf);",
        ),
    ] {
        let lab = FloatLab::with_source(&mutant(from, to)).unwrap();
        let (_, got, want) = exp_run(&lab);
        let exp_differs = diff(&got, &want).0;
        let (got, want) = mul_add_run(&lab);
        let mul_add_differs = diff(&got, &want).0;
        let (_, got, want) = quantize_run(&lab);
        let quantize_differs = diff(&got, &want).0;
        eprintln!(
            "mutant '{what}': exp_f32 differs on {exp_differs} lanes, mul_add_f32 on \
             {mul_add_differs}, quantize_f32 on {quantize_differs}"
        );
        assert!(
            exp_differs + mul_add_differs + quantize_differs > 0,
            "mutant '{what}' passed every check"
        );
    }
}

#[test]
fn the_float_gate_passes_the_library_and_refuses_its_mutants() {
    let Some(lab) = lab() else { return };
    let start = std::time::Instant::now();
    lab.gate().unwrap();
    eprintln!("the gate passed the library in {:?}", start.elapsed());
    // Each mutant is a way a driver could compute other bits; the gate must refuse it by the
    // operation where it shows first.
    for (what, from, to, operation) in [
        (
            "ties taken toward zero (lavapipe's own f64 round on AVX2)",
            "return g(v + ROUND_SHIFTER) - ROUND_SHIFTER;",
            "return trunc(v + select(0.5lf, -0.5lf, v < 0.0lf) * (1.0lf - pow2(-53)));",
            "quantization",
        ),
        (
            "no guard (products may fuse, the shifter's pair cancel)",
            "return select(x, -x, one < 0.0lf);",
            "return x;",
            "exp",
        ),
        (
            "subnormals flushed on widening",
            "let v = f64(mag) * pow2(-149);",
            "let v = f64(mag) * 0.0lf;",
            "f32 a * b + c",
        ),
        (
            "a quotient 2^-26 off, past what the last steps correct",
            "q = q + remainder(a, q, b) / b;",
            "q = q * (1.0lf + pow2(-26));",
            "f32 a / b",
        ),
    ] {
        let mutant = FloatLab::with_source(&mutant(from, to)).unwrap();
        match mutant.gate() {
            Err(Error::FloatGate(m)) => {
                eprintln!("mutant '{what}': {m}");
                assert_eq!(m.operation, operation, "mutant '{what}'");
                assert!(m.got != m.expected);
            }
            other => panic!("mutant '{what}' was not refused by name: {other:?}"),
        }
    }
}
