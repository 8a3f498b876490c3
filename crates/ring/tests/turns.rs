//! The turn machine and the replay-once policy: one turn owns the ring, a second prompt waits, a
//! failure is replayed once and a second failure is final.

use daisy_ring::{
    Admission, Decision, Error, Event, FailReason, Failure, ReplayPolicy, TurnState, Turns,
};
use daisy_wire::DeviceId;

fn peer(s: &str) -> DeviceId {
    DeviceId::parse(s).unwrap()
}

#[test]
fn a_turn_runs_from_preparing_to_done() {
    let mut t = Turns::new(4);
    assert_eq!(t.state(), &TurnState::Idle);
    assert_eq!(t.submit().unwrap(), Admission::Started(1));
    assert_eq!(t.state(), &TurnState::Preparing { turn: 1 });
    assert_eq!(t.on(Event::Ready).unwrap(), None);
    t.on(Event::LapDone).unwrap();
    t.on(Event::LapDone).unwrap();
    assert_eq!(
        t.state(),
        &TurnState::Running {
            turn: 1,
            lap: 2,
            replayed: false
        }
    );
    t.on(Event::Finished).unwrap();
    assert_eq!(t.state(), &TurnState::Done { turn: 1 });
    assert_eq!(t.advance().unwrap(), None);
    assert_eq!(t.state(), &TurnState::Idle);
}

#[test]
fn a_second_prompt_waits_for_the_first() {
    let mut t = Turns::new(2);
    assert_eq!(t.submit().unwrap(), Admission::Started(1));
    assert_eq!(t.submit().unwrap(), Admission::Queued { turn: 2, ahead: 0 });
    assert_eq!(t.submit().unwrap(), Admission::Queued { turn: 3, ahead: 1 });
    assert_eq!(t.submit(), Err(Error::QueueFull { limit: 2 }));
    // The waiting turn does not disturb the running one.
    t.on(Event::Ready).unwrap();
    assert_eq!(t.state().turn(), Some(1));
    assert!(matches!(t.advance(), Err(Error::Transition { .. })));
    t.on(Event::Finished).unwrap();
    assert_eq!(t.advance().unwrap(), Some(2));
    assert_eq!(t.state(), &TurnState::Preparing { turn: 2 });
    assert_eq!(t.waiting().collect::<Vec<_>>(), vec![3]);
    // While Done and something waits, a new prompt queues behind it.
    t.on(Event::Ready).unwrap();
    t.on(Event::Finished).unwrap();
    assert_eq!(t.submit().unwrap(), Admission::Queued { turn: 4, ahead: 1 });
    assert_eq!(t.advance().unwrap(), Some(3));
}

#[test]
fn a_failure_is_replayed_once_from_the_start() {
    let mut t = Turns::new(1);
    t.submit().unwrap();
    t.on(Event::Ready).unwrap();
    t.on(Event::LapDone).unwrap();
    let d = t
        .on(Event::Failure(Failure::PeerDropped(peer("b"))))
        .unwrap();
    assert_eq!(
        d,
        Some(Decision::ReplanAndReplay {
            without: Some(peer("b"))
        })
    );
    assert_eq!(
        t.state(),
        &TurnState::Replaying {
            turn: 1,
            without: Some(peer("b"))
        }
    );
    t.on(Event::Ready).unwrap();
    // The replay starts from the first lap.
    assert_eq!(
        t.state(),
        &TurnState::Running {
            turn: 1,
            lap: 0,
            replayed: true
        }
    );
    t.on(Event::LapDone).unwrap();
    t.on(Event::Finished).unwrap();
    assert_eq!(t.state(), &TurnState::Done { turn: 1 });
}

#[test]
fn a_second_failure_is_final() {
    let mut t = Turns::new(1);
    t.submit().unwrap();
    t.on(Event::Ready).unwrap();
    t.on(Event::Failure(Failure::LapStalled {
        device: Some(peer("c")),
    }))
    .unwrap();
    t.on(Event::Ready).unwrap();
    let stall = Failure::LapStalled { device: None };
    assert_eq!(
        t.on(Event::Failure(stall.clone())).unwrap(),
        Some(Decision::GiveUp)
    );
    assert_eq!(
        t.state(),
        &TurnState::Failed {
            turn: 1,
            reason: FailReason::Failed(stall)
        }
    );
    // A failure while replanning also ends it.
    let mut t = Turns::new(1);
    t.submit().unwrap();
    t.on(Event::Failure(Failure::PeerDropped(peer("a"))))
        .unwrap();
    assert_eq!(
        t.on(Event::Failure(Failure::PeerDropped(peer("b"))))
            .unwrap(),
        Some(Decision::GiveUp)
    );
    assert!(matches!(t.state(), TurnState::Failed { turn: 1, .. }));
}

#[test]
fn the_next_turn_gets_its_own_replay() {
    let mut t = Turns::new(1);
    t.submit().unwrap();
    t.submit().unwrap();
    t.on(Event::Failure(Failure::PeerDropped(peer("a"))))
        .unwrap();
    t.on(Event::Ready).unwrap();
    t.on(Event::Finished).unwrap();
    assert_eq!(t.advance().unwrap(), Some(2));
    let d = t
        .on(Event::Failure(Failure::PeerDropped(peer("b"))))
        .unwrap();
    assert_eq!(
        d,
        Some(Decision::ReplanAndReplay {
            without: Some(peer("b"))
        })
    );
}

#[test]
fn events_that_do_not_fit_are_refused_and_change_nothing() {
    let mut t = Turns::new(1);
    for e in [Event::Ready, Event::LapDone, Event::Finished, Event::Cancel] {
        assert!(matches!(
            t.on(e),
            Err(Error::Transition {
                state: TurnState::Idle,
                ..
            })
        ));
    }
    t.submit().unwrap();
    assert!(matches!(
        t.on(Event::LapDone),
        Err(Error::Transition { .. })
    ));
    assert!(matches!(
        t.on(Event::Finished),
        Err(Error::Transition { .. })
    ));
    assert_eq!(t.state(), &TurnState::Preparing { turn: 1 });
    t.on(Event::Ready).unwrap();
    assert!(matches!(t.on(Event::Ready), Err(Error::Transition { .. })));
    t.on(Event::Cancel).unwrap();
    assert_eq!(
        t.state(),
        &TurnState::Failed {
            turn: 1,
            reason: FailReason::Cancelled
        }
    );
    assert!(matches!(t.on(Event::Cancel), Err(Error::Transition { .. })));
    assert!(matches!(
        t.on(Event::Failure(Failure::PeerDropped(peer("a")))),
        Err(Error::Transition { .. })
    ));
}

#[test]
fn the_replay_policy_replays_once() {
    let mut p = ReplayPolicy::new();
    assert!(!p.has_replayed());
    let f = Failure::LapStalled {
        device: Some(peer("s")),
    };
    assert_eq!(
        p.on_failure(&f),
        Decision::ReplanAndReplay {
            without: Some(peer("s"))
        }
    );
    assert!(p.has_replayed());
    assert_eq!(p.on_failure(&f), Decision::GiveUp);
    assert_eq!(p.on_failure(&f), Decision::GiveUp);
}
