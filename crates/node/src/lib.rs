//! The node's library half: what the `node` binary and the conformance suite share, so the suite
//! exercises the product's own code path rather than a copy of it.

pub mod lap;
