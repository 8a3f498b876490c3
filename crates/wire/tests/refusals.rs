//! Must-fail cases, each on its own: bad plans (built directly and decoded from crafted bytes), a
//! one-ulp flip and a −0→+0 deep in an activation, a fingerprint from another model, and the other
//! fields decode checks.

use daisy_wire::{
    Activation, Error, Message, Plan, Positions, StageSpan, Violation, decode, decode_for, encode,
    validate_stages,
};

use crate::samples::{self, fp};

fn stages(ranges: &[(usize, usize)]) -> Vec<StageSpan> {
    ranges
        .iter()
        .map(|&(s, e)| StageSpan { layers: s..e })
        .collect()
}

fn violations(n_layers: usize, ranges: &[(usize, usize)]) -> Vec<Violation> {
    validate_stages(n_layers, &stages(ranges)).expect_err("plan should be refused")
}

/// Postcard bytes of a `Message::Plan` built by hand (every number below 128 is one byte): variant 3,
/// n_layers, the stages, then one device id per stage.
fn plan_message_bytes(n_layers: u8, ranges: &[(u8, u8)]) -> Vec<u8> {
    let mut b = vec![3, n_layers, ranges.len() as u8];
    for &(s, e) in ranges {
        b.extend([s, e]);
    }
    b.push(ranges.len() as u8);
    for i in 0..ranges.len() {
        b.extend([2, b'd', b'0' + i as u8]);
    }
    b
}

fn decode_plan_violations(n_layers: u8, ranges: &[(u8, u8)]) -> Vec<Violation> {
    match decode(&plan_message_bytes(n_layers, ranges)) {
        Err(Error::Plan(v)) => v.0,
        other => panic!("expected a plan refusal, got {other:?}"),
    }
}

#[test]
fn the_hand_built_plan_bytes_decode_when_the_plan_is_valid() {
    // Guards the helper: with a good plan the same bytes are accepted, so the refusals below come
    // from the plan rules and not from a malformed encoding.
    match decode(&plan_message_bytes(30, &[(0, 10), (10, 20), (20, 30)])).unwrap() {
        Message::Plan(p) => assert_eq!(p.plan().counts(), vec![10, 10, 10]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn plan_with_a_gap_is_refused() {
    let expected = vec![Violation::Gap {
        stage: 1,
        missing: 10..11,
    }];
    assert_eq!(violations(30, &[(0, 10), (11, 30)]), expected);
    assert_eq!(decode_plan_violations(30, &[(0, 10), (11, 30)]), expected);
    assert_eq!(
        violations(30, &[(0, 10), (10, 29)]),
        vec![Violation::Uncovered { missing: 29..30 }]
    );
    assert_eq!(
        violations(30, &[(1, 30)]),
        vec![Violation::Gap {
            stage: 0,
            missing: 0..1
        }]
    );
}

#[test]
fn plan_with_an_overlap_is_refused() {
    let expected = vec![Violation::Overlap {
        stage: 1,
        shared: 9..10,
    }];
    assert_eq!(violations(30, &[(0, 10), (9, 30)]), expected);
    assert_eq!(decode_plan_violations(30, &[(0, 10), (9, 30)]), expected);
    assert_eq!(
        violations(30, &[(0, 31)]),
        vec![Violation::Beyond {
            stage: 0,
            end: 31,
            n_layers: 30
        }]
    );
}

#[test]
fn plan_with_stages_out_of_order_is_refused() {
    let ranges = [(0, 10), (20, 30), (10, 20)];
    let found = violations(30, &ranges);
    assert!(
        found.contains(&Violation::OutOfOrder {
            stage: 2,
            layers: 10..20,
            previous: 20..30
        }),
        "{found:?}"
    );
    assert!(
        found.contains(&Violation::Gap {
            stage: 1,
            missing: 10..20
        }),
        "{found:?}"
    );
    assert_eq!(
        decode_plan_violations(30, &[(0, 10), (20, 30), (10, 20)]),
        found
    );
    // The head must come first: a plan that starts at the tail is refused too.
    let found = violations(30, &[(20, 30), (0, 20)]);
    assert!(
        found
            .iter()
            .any(|v| matches!(v, Violation::OutOfOrder { stage: 1, .. })),
        "{found:?}"
    );
}

#[test]
fn plan_with_an_empty_middle_stage_is_refused() {
    let expected = vec![Violation::EmptyStage { stage: 1 }];
    assert_eq!(violations(30, &[(0, 15), (15, 15), (15, 30)]), expected);
    assert_eq!(
        decode_plan_violations(30, &[(0, 15), (15, 15), (15, 30)]),
        expected
    );
    assert_eq!(
        violations(30, &[(0, 30), (30, 30)]),
        vec![Violation::EmptyStage { stage: 1 }]
    );
    assert!(matches!(
        Plan::from_counts(&[10, 0, 20], 30),
        Err(Error::Plan(_))
    ));
}

#[test]
fn only_the_head_may_hold_no_layers() {
    assert!(Plan::from_counts(&[0, 15, 15], 30).is_ok());
    assert!(Plan::from_counts(&[0, 30], 30).is_ok());
    assert_eq!(
        violations(30, &[(0, 0)]),
        vec![Violation::Uncovered { missing: 0..30 }]
    );
}

#[test]
fn plan_validation_returns_every_violation() {
    let found = violations(30, &[(0, 10), (12, 12), (11, 40)]);
    assert_eq!(
        found,
        vec![
            Violation::Gap {
                stage: 1,
                missing: 10..12
            },
            Violation::EmptyStage { stage: 1 },
            Violation::OutOfOrder {
                stage: 2,
                layers: 11..40,
                previous: 12..12
            },
            Violation::Beyond {
                stage: 2,
                end: 40,
                n_layers: 30
            },
        ]
    );
    assert_eq!(
        validate_stages(0, &[]),
        Err(vec![Violation::NoLayers, Violation::NoStages])
    );
    let message = Plan::new(30, stages(&[(0, 10), (11, 30)]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        "plan refused: gap before stage 1: layers 10..11 belong to no stage"
    );
}

#[test]
fn stage_counts_must_sum_to_the_model() {
    assert_eq!(
        Plan::from_counts(&[10, 10, 10], 30).unwrap().counts(),
        vec![10, 10, 10]
    );
    assert!(matches!(
        Plan::from_counts(&[10, 10], 30),
        Err(Error::Plan(_))
    ));
    assert!(matches!(
        Plan::from_counts(&[10, 10, 11], 30),
        Err(Error::Plan(_))
    ));
    assert!(matches!(
        Plan::from_counts(&[usize::MAX, 1], 30),
        Err(Error::Plan(_))
    ));
}

/// An activation of 4096 values whose encoded payload starts at a known offset.
struct Tamper {
    bytes: Vec<u8>,
    payload_at: usize,
}

fn tamperable(data: &[f32]) -> Tamper {
    let message = Message::Activation(
        Activation::new(
            1,
            0,
            1,
            Positions::new(0, 64),
            64,
            64,
            data.to_vec(),
            fp(0xab),
        )
        .unwrap(),
    );
    let bytes = encode(&message);
    let payload: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    let payload_at = bytes
        .windows(payload.len())
        .position(|w| w == payload.as_slice())
        .expect("payload is in the encoding");
    Tamper { bytes, payload_at }
}

fn payload_values(bytes: &[u8], at: usize, n: usize) -> Vec<f32> {
    bytes[at..at + 4 * n]
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn base_payload() -> Vec<f32> {
    (0..4096)
        .map(|i| ((i as f32) * 0.731).cos() * 3.0)
        .collect()
}

#[test]
fn one_ulp_flip_deep_in_the_payload_is_refused() {
    let data = base_payload();
    let mut t = tamperable(&data);
    assert!(decode(&t.bytes).is_ok());
    let k = 4000;
    let at = t.payload_at + 4 * k;
    let flipped = f32::from_bits(data[k].to_bits() + 1);
    t.bytes[at..at + 4].copy_from_slice(&flipped.to_le_bytes());
    let values = payload_values(&t.bytes, t.payload_at, data.len());
    assert_ne!(values[k], data[k]);
    assert!((values[k] - data[k]).abs() <= f32::EPSILON * data[k].abs());
    assert!(
        matches!(decode(&t.bytes), Err(Error::Integrity { .. })),
        "{:?}",
        decode(&t.bytes)
    );
}

#[test]
fn negative_zero_turned_positive_is_refused() {
    let mut data = base_payload();
    let k = 3999;
    data[k] = -0.0;
    let mut t = tamperable(&data);
    assert!(decode(&t.bytes).is_ok());
    let at = t.payload_at + 4 * k;
    assert_eq!(t.bytes[at..at + 4], [0, 0, 0, 0x80]);
    t.bytes[at + 3] = 0;
    // Mutation check: compared by value, the tampered payload equals the original (-0 == +0), so
    // only the bit-exact hash can see it.
    assert_eq!(payload_values(&t.bytes, t.payload_at, data.len()), data);
    assert!(
        matches!(decode(&t.bytes), Err(Error::Integrity { .. })),
        "{:?}",
        decode(&t.bytes)
    );
}

#[test]
fn header_fields_are_covered_by_the_hash() {
    let data = base_payload();
    let t = tamperable(&data);
    // Variant 7 (activation), turn 1, lap 0, hop 1: bump the hop to 2.
    assert_eq!(t.bytes[..4], [7, 1, 0, 1]);
    let mut b = t.bytes.clone();
    b[3] = 2;
    assert!(matches!(decode(&b), Err(Error::Integrity { .. })));
    // The fingerprint is covered too.
    let at = t.payload_at + 4 * data.len();
    let mut b = t.bytes.clone();
    b[at] ^= 1;
    assert!(matches!(decode(&b), Err(Error::Integrity { .. })));
}

#[test]
fn fingerprint_from_another_model_is_refused() {
    let message = Message::Activation(samples::activation(vec![1.0, 2.0], 2));
    let bytes = encode(&message);
    assert_eq!(decode_for(&bytes, &fp(0xab)).unwrap(), message);
    match decode_for(&bytes, &fp(0xac)) {
        Err(Error::Fingerprint { expected, got }) => {
            assert_eq!(expected, fp(0xac));
            assert_eq!(got, fp(0xab));
        }
        other => panic!("{other:?}"),
    }
    for (_, m) in samples::all() {
        let refused = matches!(
            decode_for(&encode(&m), &fp(0xac)),
            Err(Error::Fingerprint { .. })
        );
        assert_eq!(refused, m.fingerprint().is_some(), "{}", m.kind());
    }
}

#[test]
fn shape_positions_and_non_finite_values_are_refused() {
    let f = fp(1);
    let p = Positions::new(0, 2);
    assert!(matches!(
        Activation::new(0, 0, 0, p, 2, 3, vec![0.0; 5], f),
        Err(Error::Shape {
            rows: 2,
            cols: 3,
            len: 5
        })
    ));
    assert!(matches!(
        Activation::new(0, 0, 0, Positions::new(0, 3), 2, 3, vec![0.0; 6], f),
        Err(Error::Positions { .. })
    ));
    assert!(matches!(
        Activation::new(
            0,
            0,
            0,
            Positions::new(usize::MAX, 2),
            2,
            3,
            vec![0.0; 6],
            f
        ),
        Err(Error::Positions { .. })
    ));
    assert!(matches!(
        Activation::new(0, 0, 0, p, usize::MAX, 3, vec![], f),
        Err(Error::Shape { .. })
    ));
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut data = vec![0.5; 6];
        data[4] = bad;
        assert!(matches!(
            Activation::new(0, 0, 0, p, 2, 3, data, f),
            Err(Error::NonFinite { index: 4, .. })
        ));
    }
    // The same refusals on decode: a NaN written into a valid encoding.
    let bytes = encode(&Message::Activation(samples::activation(vec![1.0, 2.0], 2)));
    let at = bytes
        .windows(4)
        .position(|w| w == 2.0f32.to_le_bytes())
        .unwrap();
    let mut b = bytes.clone();
    b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(matches!(decode(&b), Err(Error::NonFinite { index: 1, .. })));
}

#[test]
fn trailing_bytes_truncation_and_unknown_variants_are_refused() {
    let bytes = encode(&samples::all()[0].1);
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(decode(&longer), Err(Error::TrailingBytes { count: 1 }));
    for cut in 0..bytes.len() {
        assert!(
            matches!(decode(&bytes[..cut]), Err(Error::Malformed { .. })),
            "cut at {cut}"
        );
    }
    assert!(matches!(decode(&[11]), Err(Error::Malformed { .. })));
    assert!(matches!(decode(&[200, 1]), Err(Error::Malformed { .. })));
}

#[test]
fn other_protocol_versions_and_bad_fields_are_refused() {
    let hello = encode(&samples::all()[0].1);
    assert_eq!(hello[..2], [0, 1]);
    let mut b = hello.clone();
    b[1] = 2;
    assert_eq!(
        decode(&b),
        Err(Error::Protocol {
            got: 2,
            expected: 1
        })
    );
    // An assignment whose repo id is crafted: variant 4, repo string, then the rest of a valid one.
    let assignment = encode(&samples::all()[5].1);
    let repo = b"HuggingFaceTB/SmolLM2-135M-Instruct";
    assert_eq!(assignment[1] as usize, repo.len());
    let mut b = assignment.clone();
    b[2 + 13] = b'%';
    assert!(
        matches!(decode(&b), Err(Error::RepoId { .. })),
        "{:?}",
        decode(&b)
    );
}

#[test]
fn stage_times_beyond_the_bound_are_refused() {
    use daisy_wire::{MAX_TIMED_STEPS, StageTimes};
    assert!(matches!(
        StageTimes::new(1, 1, vec![0; MAX_TIMED_STEPS + 1]),
        Err(Error::Times { .. })
    ));
    // Crafted bytes: variant 15, turn 1, hop 1, then MAX + 1 steps of 0 µs (one byte each).
    let n = MAX_TIMED_STEPS + 1;
    let mut b = vec![15, 1, 1];
    let mut len = n as u64;
    while len >= 0x80 {
        b.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    b.push(len as u8);
    b.extend(std::iter::repeat_n(0u8, n));
    assert!(matches!(decode(&b), Err(Error::Times { count, .. }) if count == n));
    // The positive control: the bound itself decodes.
    let ok = Message::StageTimes(StageTimes::new(1, 1, vec![0; MAX_TIMED_STEPS]).unwrap());
    assert_eq!(decode(&encode(&ok)).unwrap(), ok);
}

#[test]
fn an_activations_turn_is_read_from_its_first_fields_only() {
    use daisy_wire::peek_activation_turn;
    for m in samples::all() {
        let bytes = encode(&m.1);
        match &m.1 {
            Message::Activation(a) => assert_eq!(peek_activation_turn(&bytes).unwrap(), a.turn()),
            // The mutation: any other message is refused by name.
            _ => assert!(matches!(
                peek_activation_turn(&bytes),
                Err(Error::Malformed { .. })
            )),
        }
    }
    assert!(peek_activation_turn(&[7]).is_err(), "a truncated header");
}

#[test]
fn an_assignment_of_unknown_weights_is_refused() {
    let sample = samples::all()
        .into_iter()
        .find(|(name, _)| *name == "assignment_int8x2")
        .expect("the int8x2 assignment sample")
        .1;
    let mut bytes = encode(&sample);
    // The weights are the assignment's last field, one byte: 0 int8, 1 f32, 2 int8x2.
    assert_eq!(bytes.last(), Some(&2));
    assert_eq!(decode(&bytes).unwrap(), sample);
    *bytes.last_mut().unwrap() = 3;
    match decode(&bytes) {
        Err(Error::Malformed { .. }) => {}
        other => panic!("weights 3 decoded as {other:?}"),
    }
}
