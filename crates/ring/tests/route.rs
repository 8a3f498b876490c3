//! `walk_lap` over every plan shape, and the mutations it must catch: the guide's bug (stage 0 used
//! for both the lap start and the return), a skipped stage, stages out of order, a lap that loops.

use daisy_ring::{Error, Next, route, walk_lap, walk_lap_with};
use daisy_wire::{Activation, Fingerprint, Message, Plan, Positions, decode_for, encode};
use proptest::prelude::*;

/// Every plan of `n` layers over `stages` stages where only the head may hold zero layers.
fn all_plans(n: usize, stages: usize) -> Vec<Plan> {
    fn rec(
        left: usize,
        stages_left: usize,
        head: bool,
        counts: &mut Vec<usize>,
        out: &mut Vec<Vec<usize>>,
    ) {
        if stages_left == 0 {
            if left == 0 {
                out.push(counts.clone());
            }
            return;
        }
        let min = if head { 0 } else { 1 };
        for c in min..=left {
            counts.push(c);
            rec(left - c, stages_left - 1, false, counts, out);
            counts.pop();
        }
    }
    let mut out = Vec::new();
    rec(n, stages, true, &mut Vec::new(), &mut out);
    out.iter()
        .map(|c| Plan::from_counts(c, n).unwrap())
        .collect()
}

/// The guide's bug: the return leg addressed as stage 0, the same address as the lap start.
fn stage0_for_both(plan: &Plan, hop: usize) -> Result<Next, Error> {
    match route(plan, hop)? {
        Next::Return => Ok(Next::Stage(0)),
        next => Ok(next),
    }
}

#[test]
fn walk_lap_visits_each_stage_once_and_ends_for_every_plan_shape() {
    let mut shapes = 0;
    for n in 1..=8 {
        for stages in 1..=n + 1 {
            for plan in all_plans(n, stages) {
                let visits = walk_lap(&plan).unwrap_or_else(|e| panic!("{plan}: {e}"));
                assert_eq!(visits.len(), plan.len());
                for (i, v) in visits.iter().enumerate() {
                    // The head at the lap start, then stage i delivered by hop i - 1.
                    assert_eq!((v.hop, v.stage), (i.checked_sub(1), i));
                    assert_eq!(v.layers, plan.stages()[i].layers);
                }
                assert_eq!(route(&plan, plan.len() - 1).unwrap(), Next::Return);
                assert!(route(&plan, plan.len()).is_err());
                shapes += 1;
            }
        }
    }
    // Includes heads with no layers ([0, n]) and the unsplit run ([n]).
    assert!(shapes > 200, "{shapes}");
    assert!(walk_lap(&Plan::from_counts(&[0, 15, 15], 30).unwrap()).is_ok());
    assert!(walk_lap(&Plan::from_counts(&[1, 14, 15], 30).unwrap()).is_ok());
    assert!(walk_lap(&Plan::from_counts(&[5, 5, 5, 5, 5, 5], 30).unwrap()).is_ok());
}

#[test]
fn stage_zero_for_both_start_and_return_fails_walk_lap() {
    for n in 1..=6 {
        for stages in 1..=n + 1 {
            for plan in all_plans(n, stages) {
                assert_eq!(
                    walk_lap_with(&plan, stage0_for_both),
                    Err(Error::Revisit {
                        hop: plan.len() - 1,
                        stage: 0
                    }),
                    "{plan}"
                );
            }
        }
    }
}

#[test]
fn other_broken_routers_fail_walk_lap() {
    let plan = Plan::from_counts(&[10, 10, 10], 30).unwrap();
    // Skips stage 1.
    let skip = |p: &Plan, hop: usize| match hop {
        0 => Ok(Next::Stage(2)),
        1 => Ok(Next::Return),
        _ => route(p, hop),
    };
    assert!(matches!(
        walk_lap_with(&plan, skip),
        Err(Error::LayersOutOfOrder {
            hop: 0,
            stage: 2,
            ..
        })
    ));
    // Returns before the last stage.
    let early = |p: &Plan, hop: usize| {
        if hop == 1 {
            Ok(Next::Return)
        } else {
            route(p, hop)
        }
    };
    assert_eq!(
        walk_lap_with(&plan, early),
        Err(Error::ReturnedEarly {
            hop: 1,
            missing: vec![2]
        })
    );
    // Goes round and round.
    let circle = |p: &Plan, hop: usize| Ok(Next::Stage((hop + 1) % p.len()));
    assert_eq!(
        walk_lap_with(&plan, circle),
        Err(Error::Revisit { hop: 2, stage: 0 })
    );
    // Sends the return to a stage that does not exist.
    let past = |_: &Plan, hop: usize| Ok(Next::Stage(hop + 1));
    assert_eq!(
        walk_lap_with(&plan, past),
        Err(Error::NoSuchStage {
            hop: 2,
            stage: 3,
            stages: 3
        })
    );
    // Stages in reverse.
    let reverse = |p: &Plan, hop: usize| match route(p, hop)? {
        Next::Stage(i) => Ok(Next::Stage(p.len() - i)),
        Next::Return => Ok(Next::Return),
    };
    assert!(matches!(
        walk_lap_with(&plan, reverse),
        Err(Error::LayersOutOfOrder {
            hop: 0,
            stage: 2,
            ..
        })
    ));
}

#[test]
fn hops_past_the_return_are_refused() {
    let plan = Plan::from_counts(&[10, 20], 30).unwrap();
    assert_eq!(route(&plan, 0).unwrap(), Next::Stage(1));
    assert_eq!(route(&plan, 1).unwrap(), Next::Return);
    assert_eq!(
        route(&plan, 2),
        Err(Error::HopBeyondLap { hop: 2, stages: 2 })
    );
    assert_eq!(
        route(&plan, usize::MAX),
        Err(Error::HopBeyondLap {
            hop: usize::MAX,
            stages: 2
        })
    );
    // The unsplit run: hop 0 is already the return.
    let single = Plan::from_counts(&[30], 30).unwrap();
    assert_eq!(route(&single, 0).unwrap(), Next::Return);
    assert_eq!(
        walk_lap_with(&single, stage0_for_both),
        Err(Error::Revisit { hop: 0, stage: 0 })
    );
}

#[test]
fn a_lap_through_the_wire_reaches_each_stage_then_returns() {
    // What `node run --stages 0,15,15` does in one process: after the head's own layers, each hop's
    // activation is encoded, decoded against the fingerprint, and routed by its hop.
    let plan = Plan::from_counts(&[0, 15, 15], 30).unwrap();
    let fingerprint = Fingerprint([7; 32]);
    let mut consumers = Vec::new();
    for hop in 0..plan.len() {
        let act = Activation::new(
            1,
            0,
            hop,
            Positions::new(0, 2),
            2,
            3,
            vec![0.25; 6],
            fingerprint,
        )
        .unwrap();
        let bytes = encode(&Message::Activation(act));
        let Message::Activation(got) = decode_for(&bytes, &fingerprint).unwrap() else {
            panic!("not an activation");
        };
        consumers.push(route(&plan, got.hop()).unwrap());
    }
    assert_eq!(
        consumers,
        vec![Next::Stage(1), Next::Stage(2), Next::Return]
    );
}

proptest! {
    #[test]
    fn walk_lap_holds_for_random_large_plans(
        head in 0usize..40,
        rest in proptest::collection::vec(1usize..40, 0..60),
    ) {
        let mut counts = vec![head];
        counts.extend(rest);
        let n: usize = counts.iter().sum();
        prop_assume!(n > 0);
        let plan = Plan::from_counts(&counts, n).unwrap();
        let visits = walk_lap(&plan).unwrap();
        prop_assert_eq!(visits.len(), counts.len());
        prop_assert_eq!(visits.last().map(|v| v.layers.end), Some(n));
        prop_assert_eq!(
            walk_lap_with(&plan, stage0_for_both),
            Err(Error::Revisit { hop: plan.len() - 1, stage: 0 })
        );
    }
}
