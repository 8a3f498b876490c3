//! The plan (who holds which layers), its validation, the pure router and the turn state machine.
//! No I/O and no async.
