//! One fixed sample of every message type, and proptest strategies for arbitrary valid messages.

use daisy_wire::{
    Activation, Assignment, Cancel, Commit, DeviceId, ErrorReport, Fingerprint, GemmRate, Hash,
    Heartbeat, Hello, HopRecord, LinkIds, Message, PROTOCOL_VERSION, Placement, Plan, Positions,
    ProbeRequest, ProbeResult, Progress, Ready, RepoId, StageTimes, Text, TimesRequest, TurnStart,
    Weights,
};
use proptest::prelude::*;

pub(crate) fn fp(byte: u8) -> Fingerprint {
    Fingerprint([byte; 32])
}

pub(crate) fn device(s: &str) -> DeviceId {
    DeviceId::parse(s).unwrap()
}

pub(crate) fn activation(data: Vec<f32>, cols: usize) -> Activation {
    let rows = data.len() / cols;
    Activation::new(7, 3, 2, Positions::new(5, rows), rows, cols, data, fp(0xab)).unwrap()
}

/// Every message type once, with fixed contents, named for its snapshot.
pub(crate) fn all() -> Vec<(&'static str, Message)> {
    vec![
        (
            "hello",
            Message::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                device: device("laptop-1"),
                memory_bytes: Some(8 << 30),
                backend: Text::new("cpu").unwrap(),
                gemm_rate: GemmRate::new(2.5e10).unwrap(),
                probe_hash: Hash([0x11; 32]),
                software: Text::new("0.1.0").unwrap(),
            }),
        ),
        (
            "hello_unknown_memory",
            Message::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                device: device("phone"),
                memory_bytes: None,
                backend: Text::new("gpu: lavapipe").unwrap(),
                gemm_rate: GemmRate::new(1.0e9).unwrap(),
                probe_hash: Hash([0x22; 32]),
                software: Text::new("0.1.0").unwrap(),
            }),
        ),
        (
            "probe_request",
            Message::ProbeRequest(ProbeRequest { seed: 0x5eed }),
        ),
        (
            "probe_result",
            Message::ProbeResult(ProbeResult {
                seed: 0x5eed,
                hash: Hash([0x33; 32]),
                gemm_rate: GemmRate::new(3.0e10).unwrap(),
            }),
        ),
        (
            "plan",
            Message::Plan(
                Placement::new(
                    Plan::from_counts(&[0, 15, 15], 30).unwrap(),
                    vec![device("head"), device("peer-a"), device("peer-b")],
                )
                .unwrap(),
            ),
        ),
        (
            "assignment",
            Message::Assignment(
                Assignment::new(
                    RepoId::parse("HuggingFaceTB/SmolLM2-135M-Instruct").unwrap(),
                    Commit::parse("12fd25f77366fa6b3b4b768ec3050bf629380bac").unwrap(),
                    fp(0xab),
                    1,
                    10..20,
                )
                .unwrap(),
            ),
        ),
        (
            "assignment_int8x2",
            Message::Assignment(
                Assignment::new(
                    RepoId::parse("HuggingFaceTB/SmolLM2-135M-Instruct").unwrap(),
                    Commit::parse("12fd25f77366fa6b3b4b768ec3050bf629380bac").unwrap(),
                    fp(0xab),
                    2,
                    20..30,
                )
                .unwrap()
                .with_weights(Weights::Int8x2),
            ),
        ),
        (
            "progress",
            Message::Progress(Progress::new(1 << 20, 90 << 20).unwrap()),
        ),
        (
            "ready",
            Message::Ready(Ready {
                fingerprint: fp(0xab),
            }),
        ),
        (
            "activation",
            Message::Activation(activation(vec![1.0, -0.0, 0.5, -2.25, 3.0e-39, 65504.0], 3)),
        ),
        ("cancel", Message::Cancel(Cancel { turn: 7 })),
        (
            "error",
            Message::Error(ErrorReport {
                turn: Some(7),
                message: Text::new("stage 2 lost its connection").unwrap(),
            }),
        ),
        ("heartbeat", Message::Heartbeat(Heartbeat { seq: 42 })),
        (
            "turn",
            Message::Turn(TurnStart {
                turn: 7,
                cached: true,
                continues: Some(6),
            }),
        ),
        (
            "hop",
            Message::Hop(HopRecord {
                turn: 7,
                hop: 1,
                after_layer: 20,
                sha256: Hash([0x44; 32]),
            }),
        ),
        ("links", Message::Links(LinkIds { up: 3, down: 4 })),
        (
            "times_request",
            Message::TimesRequest(TimesRequest { turn: 7 }),
        ),
        (
            "stage_times",
            Message::StageTimes(StageTimes::new(7, 2, vec![1250, 980, 1010]).unwrap()),
        ),
    ]
}

fn repo_part() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_]([A-Za-z0-9_]|[._-][A-Za-z0-9_]){0,20}"
}

fn repo_id() -> impl Strategy<Value = RepoId> {
    (repo_part(), repo_part()).prop_filter_map("not a Hub repo id", |(o, n)| {
        RepoId::parse(&format!("{o}/{n}")).ok()
    })
}

fn device_id() -> impl Strategy<Value = DeviceId> {
    "[A-Za-z0-9._-]{1,64}".prop_map(|s| DeviceId::parse(&s).unwrap())
}

fn text() -> impl Strategy<Value = Text> {
    "[^\\p{Cc}]{0,40}".prop_map(|s| Text::new(&s).unwrap())
}

fn rate() -> impl Strategy<Value = GemmRate> {
    (1e-3f64..1e15).prop_map(|r| GemmRate::new(r).unwrap())
}

fn digest() -> impl Strategy<Value = [u8; 32]> {
    any::<[u8; 32]>()
}

fn plan() -> impl Strategy<Value = Plan> {
    (0usize..5, proptest::collection::vec(1usize..8, 0..6))
        .prop_map(|(head, rest)| {
            let mut counts = vec![head];
            counts.extend(rest);
            let n = counts.iter().sum::<usize>();
            (counts, n)
        })
        .prop_filter_map("a model needs a layer", |(counts, n)| {
            Plan::from_counts(&counts, n).ok()
        })
}

fn finite_f32() -> impl Strategy<Value = f32> {
    any::<u32>()
        .prop_map(f32::from_bits)
        .prop_filter("finite", |x| x.is_finite())
}

fn activation_strategy() -> impl Strategy<Value = Activation> {
    (1usize..6, 1usize..9)
        .prop_flat_map(|(rows, cols)| {
            (
                any::<u64>(),
                0usize..1000,
                0usize..10,
                0usize..100_000,
                Just(rows),
                Just(cols),
                proptest::collection::vec(finite_f32(), rows * cols),
                digest(),
            )
        })
        .prop_map(|(turn, lap, hop, start, rows, cols, data, f)| {
            Activation::new(
                turn,
                lap,
                hop,
                Positions::new(start, rows),
                rows,
                cols,
                data,
                Fingerprint(f),
            )
            .unwrap()
        })
}

pub(crate) fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            any::<bool>(),
            device_id(),
            proptest::option::of(any::<u64>()),
            text(),
            rate(),
            digest(),
            text()
        )
            .prop_map(
                |(_, device, memory_bytes, backend, gemm_rate, h, software)| {
                    Message::Hello(Hello {
                        protocol: PROTOCOL_VERSION,
                        device,
                        memory_bytes,
                        backend,
                        gemm_rate,
                        probe_hash: Hash(h),
                        software,
                    })
                }
            ),
        any::<u64>().prop_map(|seed| Message::ProbeRequest(ProbeRequest { seed })),
        (any::<u64>(), digest(), rate()).prop_map(|(seed, h, gemm_rate)| Message::ProbeResult(
            ProbeResult {
                seed,
                hash: Hash(h),
                gemm_rate
            }
        )),
        plan()
            .prop_flat_map(|plan| {
                let n = plan.len();
                (
                    Just(plan),
                    proptest::collection::btree_set(device_id(), n..=n),
                )
            })
            .prop_map(|(plan, devices)| {
                Message::Plan(Placement::new(plan, devices.into_iter().collect()).unwrap())
            }),
        (
            repo_id(),
            "[0-9a-f]{40}",
            digest(),
            0usize..5,
            0usize..50,
            1usize..50,
            prop_oneof![
                Just(Weights::Int8),
                Just(Weights::F32),
                Just(Weights::Int8x2)
            ]
        )
            .prop_map(|(repo, commit, f, stage, start, len, weights)| {
                Message::Assignment(
                    Assignment::new(
                        repo,
                        Commit::parse(&commit).unwrap(),
                        Fingerprint(f),
                        stage,
                        start..start + len,
                    )
                    .unwrap()
                    .with_weights(weights),
                )
            }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(a, b)| { Message::Progress(Progress::new(a.min(b), a.max(b)).unwrap()) }),
        digest().prop_map(|f| Message::Ready(Ready {
            fingerprint: Fingerprint(f)
        })),
        activation_strategy().prop_map(Message::Activation),
        any::<u64>().prop_map(|turn| Message::Cancel(Cancel { turn })),
        (proptest::option::of(any::<u64>()), text())
            .prop_map(|(turn, message)| Message::Error(ErrorReport { turn, message })),
        any::<u64>().prop_map(|seq| Message::Heartbeat(Heartbeat { seq })),
        (
            any::<u64>(),
            any::<bool>(),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(turn, cached, continues)| Message::Turn(TurnStart {
                turn,
                cached,
                continues
            })),
        (any::<u64>(), 0usize..100, 0usize..1000, digest()).prop_map(
            |(turn, hop, after_layer, h)| Message::Hop(HopRecord {
                turn,
                hop,
                after_layer,
                sha256: Hash(h),
            })
        ),
        (any::<u64>(), any::<u64>()).prop_map(|(up, down)| Message::Links(LinkIds { up, down })),
        any::<u64>().prop_map(|turn| Message::TimesRequest(TimesRequest { turn })),
        (
            any::<u64>(),
            0usize..100,
            proptest::collection::vec(any::<u32>(), 0..64)
        )
            .prop_map(|(turn, hop, us)| Message::StageTimes(
                StageTimes::new(turn, hop, us).unwrap()
            )),
    ]
}
