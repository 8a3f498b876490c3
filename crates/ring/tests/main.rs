//! Integration tests of `daisy-ring`: the planner, the router and `walk_lap`, the turn machine.

mod planner;
mod route;
mod turns;
