//! Planner tests: proportional split, memory cap, excluded probe, the 120 s budget, the head-only rule.

use daisy_ring::{
    DeviceInfo, Error, Exclusion, Layout, ModelFacts, TOKEN_BUDGET_SECONDS, plan_layers,
};
use daisy_wire::{DeviceId, GemmRate, Hash};

const GIB: u64 = 1 << 30;

fn dev(id: &str, rate: f64, memory: Option<u64>) -> DeviceInfo {
    DeviceInfo {
        id: DeviceId::parse(id).unwrap(),
        memory_bytes: memory,
        gemm_rate: GemmRate::new(rate).unwrap(),
        probe_hash: Hash([1; 32]),
    }
}

/// 30 layers of 100 MB, 500 MB of embedding/lm_head on the head; 1e8 MACs per layer per token.
fn model() -> ModelFacts {
    ModelFacts {
        n_layers: 30,
        layer_bytes: 100_000_000,
        head_bytes: 500_000_000,
        layer_macs: 1e8,
        head_macs: 5e7,
    }
}

fn ids(d: &[DeviceId]) -> Vec<&str> {
    d.iter().map(DeviceId::as_str).collect()
}

#[test]
fn layers_follow_the_gemm_rates() {
    // Rates 1:2:1 over 30 layers: quotas 7.5, 15, 7.5; the spare layer goes to the first of the tied
    // halves, the head.
    let devices = [
        dev("head", 1e9, None),
        dev("fast", 2e9, None),
        dev("slow", 1e9, None),
    ];
    let d = plan_layers(&devices, &model()).unwrap();
    assert_eq!(d.layout, Layout::Ring);
    assert_eq!(d.plan.counts(), vec![8, 15, 7]);
    assert_eq!(ids(&d.devices), vec!["head", "fast", "slow"]);
    assert!(d.excluded.is_empty());
    // Estimated time: each stage's layers at its rate, plus the head's lm_head.
    let expected = 8.0 * 1e8 / 1e9 + 15.0 * 1e8 / 2e9 + 7.0 * 1e8 / 1e9 + 5e7 / 1e9;
    assert!(
        (d.seconds_per_token - expected).abs() < 1e-12,
        "{}",
        d.seconds_per_token
    );
    // Deterministic.
    assert_eq!(plan_layers(&devices, &model()).unwrap(), d);
}

#[test]
fn every_split_is_within_one_layer_of_its_exact_share() {
    let rates = [3.1e9, 0.7e9, 1.9e9, 5.3e9, 0.2e9];
    let devices: Vec<DeviceInfo> = rates
        .iter()
        .enumerate()
        .map(|(i, &r)| dev(&format!("d{i}"), r, None))
        .collect();
    for n_layers in 5..=64 {
        let m = ModelFacts {
            n_layers,
            ..model()
        };
        let d = plan_layers(&devices, &m).unwrap();
        let total: f64 = d
            .devices
            .iter()
            .map(|id| rates[id.as_str()[1..].parse::<usize>().unwrap()])
            .sum();
        assert_eq!(d.plan.counts().iter().sum::<usize>(), n_layers);
        for (count, id) in d.plan.counts().iter().zip(&d.devices) {
            let r = rates[id.as_str()[1..].parse::<usize>().unwrap()];
            let exact = n_layers as f64 * r / total;
            assert!(
                (*count as f64 - exact).abs() < 1.0,
                "{n_layers}: {} vs {exact}",
                count
            );
        }
    }
}

#[test]
fn memory_caps_a_device_and_the_rest_is_shared() {
    // Equal rates: 10 each, but "small" holds only 4 layers; the other 26 split 13/13.
    let devices = [
        dev("head", 1e9, None),
        dev("small", 1e9, Some(4 * 100_000_000 + 99)),
        dev("big", 1e9, Some(64 * GIB)),
    ];
    let d = plan_layers(&devices, &model()).unwrap();
    assert_eq!(d.plan.counts(), vec![13, 4, 13]);
    // The head's cap counts its embedding and lm_head first: 500 MB + 3 layers.
    let devices = [
        dev("head", 1e9, Some(800_000_000)),
        dev("a", 1e9, None),
        dev("b", 1e9, None),
    ];
    let d = plan_layers(&devices, &model()).unwrap();
    assert_eq!(d.plan.counts(), vec![3, 14, 13]);
    // Not enough memory anywhere.
    let devices = [
        dev("head", 1e9, Some(800_000_000)),
        dev("a", 1e9, Some(1_000_000_000)),
    ];
    assert_eq!(
        plan_layers(&devices, &model()),
        Err(Error::NotEnoughMemory {
            capacity: 13,
            n_layers: 30
        })
    );
    // A head that cannot hold its own embedding.
    let devices = [dev("head", 1e9, Some(499_999_999)), dev("a", 1e9, None)];
    assert!(matches!(
        plan_layers(&devices, &model()),
        Err(Error::HeadTooSmall { .. })
    ));
}

#[test]
fn a_device_whose_probe_differs_is_left_out() {
    let mut odd = dev("odd", 4e9, None);
    odd.probe_hash = Hash([2; 32]);
    let devices = [dev("head", 1e9, None), odd, dev("b", 1e9, None)];
    let d = plan_layers(&devices, &model()).unwrap();
    assert_eq!(ids(&d.devices), vec!["head", "b"]);
    assert_eq!(d.plan.counts(), vec![15, 15]);
    assert_eq!(d.excluded.len(), 1);
    assert_eq!(d.excluded[0].device.as_str(), "odd");
    assert_eq!(
        d.excluded[0].reason,
        Exclusion::ProbeMismatch {
            expected: Hash([1; 32]),
            got: Hash([2; 32])
        }
    );
}

#[test]
fn devices_that_cannot_take_a_layer_are_left_out() {
    let devices = [
        dev("head", 1e9, None),
        dev("crumb", 1e6, None),
        dev("tiny", 1e9, Some(1000)),
    ];
    let d = plan_layers(&devices, &model()).unwrap();
    assert_eq!(ids(&d.devices), vec!["head"]);
    assert_eq!(d.plan.counts(), vec![30]);
    let reasons: Vec<_> = d
        .excluded
        .iter()
        .map(|e| (e.device.as_str(), e.reason.clone()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("tiny", Exclusion::NoRoom),
            ("crumb", Exclusion::TooSlowForALayer)
        ]
    );
}

#[test]
fn more_than_120_seconds_per_token_is_refused_before_any_download() {
    // 1e9 MACs per layer at 1e8 MAC/s: 10 s per layer.
    let m = ModelFacts {
        n_layers: 12,
        head_macs: 0.0,
        layer_macs: 1e9,
        ..model()
    };
    let devices = [dev("head", 1e8, None), dev("b", 1e8, None)];
    let d = plan_layers(&devices, &m).unwrap();
    assert!(
        (d.seconds_per_token - TOKEN_BUDGET_SECONDS).abs() < 1e-9,
        "{}",
        d.seconds_per_token
    );
    let m = ModelFacts { n_layers: 13, ..m };
    match plan_layers(&devices, &m) {
        Err(Error::TooSlow { seconds, budget }) => {
            assert!((seconds - 130.0).abs() < 1e-9);
            assert_eq!(budget, 120.0);
        }
        other => panic!("{other:?}"),
    }
    // The head alone is held to the same budget.
    let big = [dev("head", 1e8, Some(64 * GIB))];
    assert!(matches!(plan_layers(&big, &m), Err(Error::TooSlow { .. })));
    // A NaN estimate is refused too.
    let m = ModelFacts {
        layer_macs: f64::NAN,
        ..model()
    };
    assert!(matches!(
        plan_layers(&devices, &m),
        Err(Error::TooSlow { .. })
    ));
}

#[test]
fn the_head_runs_alone_when_its_memory_holds_the_whole_model() {
    let whole = 500_000_000 + 30 * 100_000_000;
    let peers = || [dev("a", 9e9, None), dev("b", 9e9, Some(64 * GIB))];
    let with_head = |memory| {
        let mut v = vec![dev("head", 1e9, memory)];
        v.extend(peers());
        v
    };
    let d = plan_layers(&with_head(Some(whole)), &model()).unwrap();
    assert_eq!(d.layout, Layout::HeadAlone);
    assert_eq!(d.plan.counts(), vec![30]);
    assert_eq!(ids(&d.devices), vec!["head"]);
    assert!(d.excluded.iter().all(|e| e.reason == Exclusion::Unneeded));
    // One byte short: a ring.
    let d = plan_layers(&with_head(Some(whole - 1)), &model()).unwrap();
    assert_eq!(d.layout, Layout::Ring);
    assert_eq!(d.devices.len(), 3);
    // Unknown memory: a ring.
    let d = plan_layers(&with_head(None), &model()).unwrap();
    assert_eq!(d.layout, Layout::Ring);
    assert_eq!(d.plan.counts(), vec![2, 14, 14]);
}

#[test]
fn bad_device_lists_are_refused() {
    assert_eq!(plan_layers(&[], &model()), Err(Error::NoDevices));
    let devices = [dev("head", 1e9, None), dev("head", 1e9, None)];
    assert!(matches!(
        plan_layers(&devices, &model()),
        Err(Error::DuplicateDevice(_))
    ));
    let m = ModelFacts {
        n_layers: 0,
        ..model()
    };
    assert_eq!(
        plan_layers(&[dev("head", 1e9, None)], &m),
        Err(Error::NoLayers)
    );
}

#[test]
fn the_decision_becomes_a_plan_message() {
    let devices = [dev("head", 1e9, None), dev("b", 1e9, None)];
    let d = plan_layers(&devices, &model()).unwrap();
    let p = d.placement().unwrap();
    assert_eq!(p.plan(), &d.plan);
    assert_eq!(p.devices(), d.devices.as_slice());
}
