//! GPU bench.
fn main() {}
