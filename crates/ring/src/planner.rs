//! The plan builder: layers in proportion to each device's measured GEMM rate, capped by its memory,
//! devices whose probe disagrees left out, a budget on the estimated time per token, and the head
//! alone when it can hold the whole model (DESIGN §4).

use daisy_wire::{DeviceId, GemmRate, Hash, Hello, Placement, Plan};

use crate::Error;

/// Above this estimated time per token the run stops before any download.
pub const TOKEN_BUDGET_SECONDS: f64 = 120.0;

/// What the planner needs to know about one device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    pub id: DeviceId,
    /// Memory available for weights; `None` when the device cannot tell.
    pub memory_bytes: Option<u64>,
    pub gemm_rate: GemmRate,
    /// SHA-256 of the seeded probe's output; must equal the head's.
    pub probe_hash: Hash,
}

impl From<&Hello> for DeviceInfo {
    fn from(h: &Hello) -> Self {
        Self {
            id: h.device.clone(),
            memory_bytes: h.memory_bytes,
            gemm_rate: h.gemm_rate,
            probe_hash: h.probe_hash,
        }
    }
}

/// What the planner needs to know about the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelFacts {
    pub n_layers: usize,
    /// Bytes one layer's weights take on a device.
    pub layer_bytes: u64,
    /// Bytes the head holds besides its layers: the embedding, the lm_head (counted once when tied),
    /// the final norm.
    pub head_bytes: u64,
    /// Multiply-accumulates per token in one layer.
    pub layer_macs: f64,
    /// Multiply-accumulates per token on the head besides its layers (the lm_head).
    pub head_macs: f64,
}

/// Whether the head runs alone or the model is split around a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    HeadAlone,
    Ring,
}

/// Why a device is not in the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exclusion {
    /// Its probe hash differs from the head's: its arithmetic cannot be trusted.
    ProbeMismatch { expected: Hash, got: Hash },
    /// Its memory cannot hold a single layer.
    NoRoom,
    /// Its share of the layers at its rate rounds to zero (only the head may hold none).
    TooSlowForALayer,
    /// The head holds the whole model and runs alone.
    Unneeded,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Excluded {
    pub device: DeviceId,
    pub reason: Exclusion,
}

/// The planner's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanDecision {
    pub plan: Plan,
    /// The device of each stage, head first.
    pub devices: Vec<DeviceId>,
    pub excluded: Vec<Excluded>,
    pub layout: Layout,
    /// Estimated compute time per token, from the measured rates.
    pub seconds_per_token: f64,
}

impl PlanDecision {
    /// The plan message for the peers.
    pub fn placement(&self) -> Result<Placement, Error> {
        Ok(Placement::new(self.plan.clone(), self.devices.clone())?)
    }
}

/// Splits `total` in proportion to `weights` by largest remainder: each share is the floor of its
/// exact quota, and the layers left over go one each to the largest fractional parts, ties to the
/// lower index. Deterministic for the same inputs.
fn largest_remainder(total: usize, weights: &[f64]) -> Vec<usize> {
    let sum: f64 = weights.iter().sum();
    if weights.is_empty() || sum <= 0.0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<f64> = weights.iter().map(|w| total as f64 * w / sum).collect();
    let mut shares: Vec<usize> = exact
        .iter()
        .map(|e| (e.floor() as usize).min(total))
        .collect();
    let mut given: usize = shares.iter().sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let fa = exact[a] - exact[a].floor();
        let fb = exact[b] - exact[b].floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    // Rounding can leave the floors a layer over the total; take it back from the smallest fractions.
    for &i in order.iter().rev() {
        if given <= total {
            break;
        }
        if shares[i] > 0 {
            shares[i] -= 1;
            given -= 1;
        }
    }
    for &i in order.iter().cycle().take(total - given) {
        shares[i] += 1;
    }
    shares
}

/// Splits `n` layers in proportion to `rates`, no device above its cap: devices whose share exceeds
/// their cap get their cap and the rest is split again among the others. `None` when the caps
/// together hold fewer than `n`.
fn split_capped(n: usize, rates: &[f64], caps: &[usize]) -> Option<Vec<usize>> {
    let mut counts = vec![0; rates.len()];
    let mut fixed = vec![false; rates.len()];
    let mut remaining = n;
    loop {
        let free: Vec<usize> = (0..rates.len()).filter(|&i| !fixed[i]).collect();
        if free.is_empty() {
            return (remaining == 0).then_some(counts);
        }
        let weights: Vec<f64> = free.iter().map(|&i| rates[i]).collect();
        let shares = largest_remainder(remaining, &weights);
        let over: Vec<usize> = free
            .iter()
            .zip(&shares)
            .filter(|&(&i, &s)| s > caps[i])
            .map(|(&i, _)| i)
            .collect();
        if over.is_empty() {
            for (&i, &s) in free.iter().zip(&shares) {
                counts[i] = s;
            }
            return Some(counts);
        }
        for i in over {
            counts[i] = caps[i];
            fixed[i] = true;
            remaining -= caps[i];
        }
    }
}

/// Layers a device can hold besides `reserved` bytes; `usize::MAX` when unknown.
fn capacity(memory: Option<u64>, reserved: u64, layer_bytes: u64) -> usize {
    match memory {
        None => usize::MAX,
        Some(_) if layer_bytes == 0 => usize::MAX,
        Some(m) => usize::try_from(m.saturating_sub(reserved) / layer_bytes).unwrap_or(usize::MAX),
    }
}

/// The plan's estimate of one token's compute: each stage's layers at its measured GEMM rate, plus
/// the head's lm_head (`rates[0]` is the head's).
pub fn seconds_per_token(counts: &[usize], rates: &[f64], model: &ModelFacts) -> f64 {
    let layers: f64 = counts
        .iter()
        .zip(rates)
        .map(|(&c, &r)| c as f64 * model.layer_macs / r)
        .sum();
    layers + model.head_macs / rates[0]
}

fn within_budget(seconds: f64) -> Result<(), Error> {
    if seconds.is_nan() || seconds > TOKEN_BUDGET_SECONDS {
        return Err(Error::TooSlow {
            seconds,
            budget: TOKEN_BUDGET_SECONDS,
        });
    }
    Ok(())
}

/// Builds the plan for `devices` (the head first) and `model`.
///
/// - A device whose probe hash differs from the head's is left out.
/// - If the head's known memory holds the whole model (its layers, embedding and lm_head), it runs
///   alone; unknown memory means a ring.
/// - Otherwise layers go in proportion to each device's GEMM rate (largest remainder), capped by
///   memory (the head's cap counts its embedding and lm_head first); a device other than the head
///   whose share is zero is left out and the split redone.
/// - If the estimated time per token exceeds [`TOKEN_BUDGET_SECONDS`], the plan is refused.
pub fn plan_layers(devices: &[DeviceInfo], model: &ModelFacts) -> Result<PlanDecision, Error> {
    let Some(head) = devices.first() else {
        return Err(Error::NoDevices);
    };
    if model.n_layers == 0 {
        return Err(Error::NoLayers);
    }
    for (i, d) in devices.iter().enumerate() {
        if devices[..i].iter().any(|e| e.id == d.id) {
            return Err(Error::DuplicateDevice(d.id.clone()));
        }
    }
    if let Some(memory) = head.memory_bytes
        && memory < model.head_bytes
    {
        return Err(Error::HeadTooSmall {
            memory,
            needed: model.head_bytes,
        });
    }

    let whole =
        u128::from(model.head_bytes) + model.n_layers as u128 * u128::from(model.layer_bytes);
    if head.memory_bytes.is_some_and(|m| u128::from(m) >= whole) {
        let rates = [head.gemm_rate.get()];
        let seconds = seconds_per_token(&[model.n_layers], &rates, model);
        within_budget(seconds)?;
        return Ok(PlanDecision {
            plan: Plan::single(model.n_layers)?,
            devices: vec![head.id.clone()],
            excluded: devices[1..]
                .iter()
                .map(|d| Excluded {
                    device: d.id.clone(),
                    reason: Exclusion::Unneeded,
                })
                .collect(),
            layout: Layout::HeadAlone,
            seconds_per_token: seconds,
        });
    }

    let mut excluded = Vec::new();
    let mut ring: Vec<&DeviceInfo> = vec![head];
    for d in &devices[1..] {
        if d.probe_hash != head.probe_hash {
            excluded.push(Excluded {
                device: d.id.clone(),
                reason: Exclusion::ProbeMismatch {
                    expected: head.probe_hash,
                    got: d.probe_hash,
                },
            });
        } else if capacity(d.memory_bytes, 0, model.layer_bytes) == 0 {
            excluded.push(Excluded {
                device: d.id.clone(),
                reason: Exclusion::NoRoom,
            });
        } else {
            ring.push(d);
        }
    }

    loop {
        let rates: Vec<f64> = ring.iter().map(|d| d.gemm_rate.get()).collect();
        let caps: Vec<usize> = ring
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let reserved = if i == 0 { model.head_bytes } else { 0 };
                capacity(d.memory_bytes, reserved, model.layer_bytes)
            })
            .collect();
        let Some(counts) = split_capped(model.n_layers, &rates, &caps) else {
            let capacity = caps.iter().fold(0usize, |a, &c| a.saturating_add(c));
            return Err(Error::NotEnoughMemory {
                capacity,
                n_layers: model.n_layers,
            });
        };
        if let Some(idle) = (1..ring.len()).find(|&i| counts[i] == 0) {
            excluded.push(Excluded {
                device: ring[idle].id.clone(),
                reason: Exclusion::TooSlowForALayer,
            });
            ring.remove(idle);
            continue;
        }
        let seconds = seconds_per_token(&counts, &rates, model);
        within_budget(seconds)?;
        return Ok(PlanDecision {
            plan: Plan::from_counts(&counts, model.n_layers)?,
            devices: ring.iter().map(|d| d.id.clone()).collect(),
            excluded,
            layout: Layout::Ring,
            seconds_per_token: seconds,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::largest_remainder;

    #[test]
    fn largest_remainder_sums_to_the_total_and_stays_within_one_of_the_quota() {
        for total in 0..64 {
            for weights in [
                vec![1.0],
                vec![1.0, 2.0, 1.0],
                vec![0.3, 0.3, 0.3],
                vec![1e-9, 1.0, 7.0, 3.5],
            ] {
                let shares = largest_remainder(total, &weights);
                assert_eq!(shares.iter().sum::<usize>(), total, "{total} {weights:?}");
                let sum: f64 = weights.iter().sum();
                for (s, w) in shares.iter().zip(&weights) {
                    let exact = total as f64 * w / sum;
                    assert!(
                        (*s as f64 - exact).abs() < 1.0,
                        "{total} {weights:?} {shares:?}"
                    );
                }
            }
        }
    }
}
