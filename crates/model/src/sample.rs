//! Choosing the next token: greedy at temperature 0, otherwise one seeded draw per token position.
//!
//! The draw for position `p` depends only on `(seed, p)`, so a seed gives the same ids whatever the
//! split, the path or the number of laps.

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 is greedy.
    pub temperature: f32,
    pub seed: u64,
    /// Nucleus sampling: the draw is among the most likely tokens whose probabilities add up to at
    /// least `top_p` (1 keeps every token; the draw is then exactly the plain one).
    pub top_p: f32,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            seed: 0,
            top_p: 1.0,
        }
    }
}

/// The lowest id among the largest logits (0 when there are none, or when the first is NaN: no
/// value is larger than it).
///
/// The largest value first, over lanes the compiler keeps in vector registers, then the first
/// position that holds it: the id a plain scan would keep, in a few microseconds over a vocabulary
/// (the plain scan's compare against the best so far took tens, every token).
pub fn argmax(logits: &[f32]) -> u32 {
    if logits.first().is_none_or(|v| v.is_nan()) {
        return 0;
    }
    let max = crate::ops::max_value(logits);
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// The difference between the largest and second-largest logits (0 for fewer than two).
///
/// Each of 16 lanes keeps the two largest of its values; the top two of all are then among those
/// 32, taken in the same way (a value equal to the largest counts as the second).
pub fn top2_margin(logits: &[f32]) -> f32 {
    let (a, b) = crate::ops::top_two(logits);
    if b == f32::NEG_INFINITY { 0.0 } else { a - b }
}

/// SplitMix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The uniform draw in `[0, 1)` for token position `position` under `seed`.
pub fn draw(seed: u64, position: usize) -> f64 {
    let z = mix(mix(seed) ^ (position as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The token for position `position` (the index it will have in the sequence).
pub fn pick(logits: &[f32], sampling: Sampling, position: usize) -> u32 {
    if sampling.temperature.is_nan() || sampling.temperature <= 0.0 || logits.is_empty() {
        return argmax(logits);
    }
    let t = sampling.temperature as f64;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut weights: Vec<f64> = logits
        .iter()
        .map(|&l| libm::exp((l as f64 - max) / t))
        .collect();
    if sampling.top_p < 1.0 {
        keep_nucleus(&mut weights, sampling.top_p as f64);
    }
    let total: f64 = weights.iter().sum();
    let target = draw(sampling.seed, position) * total;
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if acc > target {
            return i as u32;
        }
    }
    argmax(logits)
}

/// Zero every weight outside the nucleus: the most likely tokens (ties: the lower id first) whose
/// weights add up to at least `top_p` of the total; the one most likely token always stays.
fn keep_nucleus(weights: &mut [f64], top_p: f64) {
    let total: f64 = weights.iter().sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    let mut acc = 0.0;
    let mut kept = order.len();
    for (n, &i) in order.iter().enumerate() {
        acc += weights[i];
        if acc >= top_p * total {
            kept = n + 1;
            break;
        }
    }
    for &i in &order[kept..] {
        weights[i] = 0.0;
    }
}

/// The prefill chunk sizes of the cached path: `ceil(t/16)` chunks as even as possible, larger first.
/// They depend on the prompt length only, never on the split.
pub fn prefill_chunks(t: usize) -> Vec<usize> {
    let n = t.div_ceil(16);
    if n == 0 {
        return Vec::new();
    }
    let (base, extra) = (t / n, t % n);
    (0..n).map(|i| base + usize::from(i < extra)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain scans the vectorized ones replace.
    fn scan_argmax(logits: &[f32]) -> u32 {
        let mut best = 0;
        for (i, v) in logits.iter().enumerate() {
            if *v > logits[best] {
                best = i;
            }
        }
        best as u32
    }

    fn scan_top2_margin(logits: &[f32]) -> f32 {
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &v in logits {
            if v > a {
                b = a;
                a = v;
            } else if v > b {
                b = v;
            }
        }
        if b == f32::NEG_INFINITY { 0.0 } else { a - b }
    }

    #[test]
    fn the_largest_logits_are_those_a_plain_scan_finds() {
        let mut cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![1.0],
            vec![2.0, 2.0],
            vec![f32::NEG_INFINITY; 40],
            vec![f32::NAN, 3.0, 5.0],
            vec![1.0, f32::NAN, 5.0, 5.0],
        ];
        // Lengths across the lanes' and remainders' edges, with ties (a coarse grid of values),
        // masked entries and the largest placed early, late and in the remainder.
        let mut z = 7u64;
        for n in [15usize, 16, 17, 31, 33, 100, 1000, 49_152, 49_159] {
            for _ in 0..4 {
                let v: Vec<f32> = (0..n)
                    .map(|_| {
                        z = z
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        match z >> 60 {
                            0 => f32::NEG_INFINITY,
                            r => ((z >> 40) % 64) as f32 * 0.5 - r as f32,
                        }
                    })
                    .collect();
                cases.push(v);
            }
        }
        for v in &cases {
            assert_eq!(argmax(v), scan_argmax(v), "{} values", v.len());
            let (got, want) = (top2_margin(v), scan_top2_margin(v));
            assert!(
                got == want,
                "{} values: margin {got} against {want}",
                v.len()
            );
        }
        // The mutation: the last of equal largest values is not the id.
        let v = vec![1.0, 4.0, 2.0, 4.0];
        assert_eq!(argmax(&v), 1);
        assert_ne!(
            argmax(&v) as usize,
            v.iter().rposition(|&x| x == 4.0).unwrap()
        );
        assert_eq!(top2_margin(&[1.0, 4.0, 2.5, 4.0]), 0.0);
        assert_eq!(top2_margin(&[1.0, 4.0, 2.5]), 1.5);
    }

    #[test]
    fn chunks_are_even_larger_first() {
        assert_eq!(prefill_chunks(0), Vec::<usize>::new());
        assert_eq!(prefill_chunks(16), vec![16]);
        assert_eq!(prefill_chunks(17), vec![9, 8]);
        assert_eq!(prefill_chunks(33), vec![11, 11, 11]);
        assert_eq!(prefill_chunks(50), vec![13, 13, 12, 12]);
        for t in 1..300 {
            let c = prefill_chunks(t);
            assert_eq!(c.iter().sum::<usize>(), t);
            assert!(c.iter().all(|&s| s <= 16));
            assert!(c.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1));
        }
    }

    #[test]
    fn greedy_takes_lowest_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(
            pick(
                &[1.0, 3.0, 3.0],
                Sampling {
                    temperature: 0.0,
                    seed: 9,
                    top_p: 1.0,
                },
                4
            ),
            1
        );
    }

    #[test]
    fn draws_depend_on_seed_and_position_only() {
        assert_eq!(draw(7, 12), draw(7, 12));
        assert_ne!(draw(7, 12), draw(7, 13));
        assert_ne!(draw(7, 12), draw(8, 12));
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let s = Sampling {
            temperature: 0.8,
            seed: 3,
            top_p: 1.0,
        };
        let a: Vec<u32> = (0..40).map(|p| pick(&logits, s, p)).collect();
        let b: Vec<u32> = (0..40)
            .map(|p| pick(&logits, Sampling { seed: 4, ..s }, p))
            .collect();
        assert_ne!(a, b);
        assert!(a.iter().any(|&i| i != argmax(&logits)));
    }

    #[test]
    fn top_p_draws_only_from_the_nucleus() {
        // Probabilities at temperature 1: about 0.64, 0.24, 0.09, 0.03.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let s = |top_p| Sampling {
            temperature: 1.0,
            seed: 11,
            top_p,
        };
        let drawn = |top_p| -> std::collections::BTreeSet<u32> {
            (0..400).map(|p| pick(&logits, s(top_p), p)).collect()
        };
        assert_eq!(drawn(1.0), [0, 1, 2, 3].into());
        assert_eq!(drawn(0.8), [0, 1].into());
        assert_eq!(drawn(0.5), [0].into());
        // top_p 1 is the plain draw, position by position.
        let plain = Sampling {
            temperature: 1.0,
            seed: 11,
            top_p: 1.0,
        };
        for p in 0..50 {
            let w: Vec<f64> = logits.iter().map(|&l| libm::exp(l as f64 - 3.0)).collect();
            let target = draw(11, p) * w.iter().sum::<f64>();
            let mut acc = 0.0;
            let expected = w.iter().position(|x| {
                acc += x;
                acc > target
            });
            assert_eq!(Some(pick(&logits, plain, p) as usize), expected);
        }
    }

    #[test]
    fn margin() {
        assert_eq!(top2_margin(&[1.0, 4.0, 2.5]), 1.5);
    }
}
